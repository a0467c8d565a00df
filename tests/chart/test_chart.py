"""The Helm chart, checked with the real helm (v3.19, hack/k8s/build --version helm).

Every documented value set is rendered by ``helm template`` (once per session) and passes
``helm lint --strict``; each object is validated against the Kubernetes 1.34 schemas
(kubernetes-validate, strict), the objects the chart promises are checked for their
invariants (seamless plugin upgrades, the downward API, mounts, probes, least-privilege RBAC
matching the code, the admission policies' CEL), and everything (CRDs included) is applied to
the fake API server. Invalid values (values.schema.json, templates/validate.yaml) must fail
with a helm message that says what to change.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cel_expr_python import cel
from cel_expr_python.ext import ext_bindings, ext_optional, ext_strings
from neuron_dra.common import deviceclasses
from neuron_dra.common.k8s import client as k8s
from neuron_dra.common.k8s.client import ApiResource, KubeClient
from neuron_dra.common.profiles import PROFILES
from neuron_dra.controller import main as controller_main
from neuron_dra.nodeplugin import main as plugin_main
from neuron_dra.sim.fakeapi.server import FakeAPIServer

from .api_usage import COMPONENTS, Use
from .conftest import CHART, Helm, HelmError, Overrides, Release

REPO = Path(__file__).resolve().parents[2]
KUBE_SCHEMA_VERSION = "1.34"
PLUGIN_SA = "system:serviceaccount:neuron-dra-driver:neuron-dra-driver-kubelet-plugin"
CONTROLLER_SA = "system:serviceaccount:neuron-dra-driver:neuron-dra-driver-controller"
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "DeviceClass",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "CustomResourceDefinition",
}

#: The documented value sets: (overrides, release). Each must render, validate and apply.
VALUE_SETS: dict[str, tuple[Overrides, Release]] = {
    "default": (Overrides(), Release()),
    "emulation": (
        Overrides.of(
            "kubeletPlugin.emulation.enabled=true",
            "kubeletPlugin.emulation.instanceType=trn2u.48xlarge",
            "kubeletPlugin.coreSharing.enabled=true",
            values={"kubeletPlugin.nodeSelector": {"neuron-dra/emulate": "true"}},
        ),
        Release(),
    ),
    "no-controller": (Overrides.of("controller.enabled=false"), Release()),
    "kube-1.37": (Overrides(), Release(kube_version="v1.37.2")),
    "custom-namespace-image": (
        Overrides.of(
            "namespace.create=true",
            "image.repository=registry.example.com/ml/neuron-dra",
            "image.tag=1.2.3",
            "image.pullPolicy=Always",
            "controller.replicas=3",
            "logging.format=json",
            "logging.verbosity=4",
            values={"imagePullSecrets": [{"name": "regcred"}]},
        ),
        Release(name="neuron", namespace="neuron-system"),
    ),
    "single-controller": (
        Overrides.of(
            "controller.replicas=1",
            "controller.leaderElection.enabled=false",
            "admissionPolicy.validationActions={Warn,Audit}",
        ),
        Release(),
    ),
}


@pytest.fixture(scope="module")
def rendered_text(helm: Helm) -> dict[str, str]:
    """``helm template --include-crds`` of each value set, run once."""
    return {name: helm.template_text(*VALUE_SETS[name], include_crds=True) for name in VALUE_SETS}


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


@pytest.fixture(scope="module")
def rendered(rendered_text: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    """The chart's objects of each value set, without the CRDs (crds/)."""
    return {
        name: [d for d in _docs(text) if d["kind"] != "CustomResourceDefinition"]
        for name, text in rendered_text.items()
    }


@pytest.fixture(scope="module")
def crds(rendered_text: dict[str, str]) -> list[dict[str, Any]]:
    return [d for d in _docs(rendered_text["default"]) if d["kind"] == "CustomResourceDefinition"]


def one(objects: list[dict[str, Any]], kind: str, name_part: str = "") -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and name_part in o["metadata"]["name"]]
    assert len(found) == 1, (
        f"expected one {kind} *{name_part}*, got {[o['metadata'] for o in found]}"
    )
    return found[0]


def kinds(objects: list[dict[str, Any]]) -> list[str]:
    return sorted(o["kind"] for o in objects)


def container(obj: dict[str, Any]) -> dict[str, Any]:
    (c,) = obj["spec"]["template"]["spec"]["containers"]
    return c


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


# --- rendering and schemas -------------------------------------------------------------------


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_every_object_is_valid_kubernetes_134(
    rendered: dict[str, list[dict[str, Any]]], crds: list[dict[str, Any]], value_set: str
) -> None:
    objects = rendered[value_set]
    assert objects
    for obj in [*crds, *objects]:
        where = f"{obj['kind']} {obj['metadata'].get('name')}"
        try:
            kubernetes_validate.validate(obj, KUBE_SCHEMA_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{value_set}: {where}: {exc.message} at {list(exc.path)}")
        release = VALUE_SETS[value_set][1]
        if obj["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in obj["metadata"], where
        else:
            assert obj["metadata"]["namespace"] == release.namespace, where
        if obj["kind"] != "CustomResourceDefinition":
            assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == release.name, where


def test_crds_are_the_chart_crds(crds: list[dict[str, Any]]) -> None:
    on_disk = sorted(
        yaml.safe_load(p.read_text())["metadata"]["name"] for p in (CHART / "crds").glob("*.yaml")
    )
    assert sorted(c["metadata"]["name"] for c in crds) == on_disk
    assert len(on_disk) >= 2


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_helm_lint_strict(helm: Helm, value_set: str) -> None:
    out = helm.lint(*VALUE_SETS[value_set])
    assert "0 chart(s) failed" in out
    assert not [line for line in out.splitlines() if line.startswith(("[WARNING]", "[ERROR]"))]


def test_helm_lint_strict_fails_on_a_broken_template(helm: Helm, tmp_path: Path) -> None:
    chart = tmp_path / "neuron-dra-driver"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "typo.yaml").write_text(
        "# {{ .Values.kubeletPlugin.emulaton.enabled }}\n"
    )
    proc = helm.run("lint", "--strict", str(chart), "--namespace", "neuron-dra-driver")
    assert proc.returncode != 0
    assert re.search(r"\[ERROR\] templates/: .*typo\.yaml.*emulaton", proc.stdout), proc.stdout


_VALUES_REF = re.compile(r"(\$\w+|\.Values)((?:\.[A-Za-z_]\w*)+)")
_ASSIGN = re.compile(r"(\$\w+) :?= \.Values((?:\.[A-Za-z_]\w*)+)\s*-?}}")


def _value_paths(text: str) -> set[tuple[str, ...]]:
    """Every value path a template reads as ``.Values.a.b`` or ``$v.b`` after
    ``$v := .Values.a`` (the chart's only two forms)."""
    bound = {m[1]: tuple(m[2].strip(".").split(".")) for m in _ASSIGN.finditer(text)}
    out = set()
    for m in _VALUES_REF.finditer(text):
        head = m[1]
        if head != ".Values" and head not in bound:
            continue  # a variable not bound to values (e.g. a range item)
        base = () if head == ".Values" else bound[head]
        out.add((*base, *m[2].strip(".").split(".")))
    return out


def test_templates_read_only_values_that_exist() -> None:
    """Real helm renders a misspelt leaf value (.Values.a.typo) as nothing, even under
    ``helm lint --strict``; so every value path the templates read must be in values.yaml."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    paths: set[tuple[str, ...]] = set()
    for path in (CHART / "templates").iterdir():
        paths |= _value_paths(path.read_text())
    assert len(paths) > 40, sorted(paths)
    missing = []
    for path in sorted(paths):
        node: Any = values
        for key in path:
            if not isinstance(node, dict):
                break  # below a leaf that is itself an object (resources, affinity, ...)
            if key not in node:
                missing.append(".".join(path))
                break
            node = node[key]
    assert not missing, f"templates read values that values.yaml does not have: {missing}"


def test_misspelt_value_paths_are_found() -> None:
    text = "{{- $p := .Values.kubeletPlugin }}\n{{ $p.httpPrt }} {{ .Values.image.tag }}"
    assert _value_paths(text) == {
        ("kubeletPlugin",),
        ("kubeletPlugin", "httpPrt"),
        ("image", "tag"),
    }


def test_kubernetes_validate_ships_the_schemas_we_check_against() -> None:
    from kubernetes_validate.utils import all_versions

    assert any(v.startswith(KUBE_SCHEMA_VERSION + ".") for v in all_versions())
    bad = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "x"},
        "spec": {"selector": {}, "template": {}, "bogus": 1},
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBE_SCHEMA_VERSION, strict=True)


def test_default_objects(rendered: dict[str, list[dict[str, Any]]]) -> None:
    assert kinds(rendered["default"]) == sorted(
        ["ClusterRole"] * 4  # the plugin's, the controller's, workloads-edit and -view
        + ["ClusterRoleBinding"] * 2
        + ["Role"] * 2
        + ["RoleBinding"] * 2
        + ["ServiceAccount"] * 2
        + ["DeviceClass"] * 2
        # own-node, ultraservers, capacity-block-id
        + ["ValidatingAdmissionPolicy"] * 3
        + ["ValidatingAdmissionPolicyBinding"] * 3
        + ["DaemonSet", "Deployment", "Service", "PodDisruptionBudget"]
    )


@pytest.mark.parametrize("render", ["default", "kube-1.37"])
def test_device_classes_are_the_codes(
    rendered: dict[str, list[dict[str, Any]]], render: str
) -> None:
    got = [
        {k: v for k, v in o.items() if k != "metadata"}
        | {"metadata": {"name": o["metadata"]["name"]}}
        for o in rendered[render]
        if o["kind"] == "DeviceClass"
    ]
    want = deviceclasses.default_device_classes()
    if render == "default":
        # 1.34: no class for the extended resource (the API server would drop the field).
        want = [c for c in want if "extendedResourceName" not in c["spec"]]
        assert len(want) == 2
    assert got == want


def test_values_match_the_profiles() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["kubeletPlugin"]["instanceTypes"] == list(PROFILES)
    schema = json.loads((CHART / "values.schema.json").read_text())
    emulation = schema["properties"]["kubeletPlugin"]["properties"]["emulation"]
    assert emulation["properties"]["instanceType"]["enum"] == ["", *PROFILES]


def _declared_leaves(schema: dict[str, Any], prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Paths of the values the schema declares that are not sections of other values."""
    out = set()
    for key, sub in schema.get("properties", {}).items():
        path = (*prefix, key)
        if "properties" in sub and key != "resources":  # resources: a Kubernetes object
            out |= _declared_leaves(sub, path)
        else:
            out.add(path)
    return out


def _key_paths(lines: list[str]) -> Iterator[tuple[int, int, tuple[str, ...]]]:
    """(line index, indent, dotted path) of every mapping key in a block-style YAML file."""
    stack: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        m = re.match(r"^( *)([A-Za-z][\w.-]*):", line)
        if not m:
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, m.group(2)))
        yield i, indent, tuple(k for _, k in stack)


def test_every_value_is_documented() -> None:
    """Each value in values.yaml has a comment above it, alone or heading a group of sibling
    one-line values."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    schema = json.loads((CHART / "values.schema.json").read_text())
    leaves = _declared_leaves(schema)
    seen, undocumented = set(), []
    for i, indent, path in _key_paths(lines):
        if path not in leaves:
            continue
        seen.add(path)
        j = i - 1
        while j >= 0:
            prev = lines[j]
            prev_indent = len(prev) - len(prev.lstrip())
            if prev.strip().startswith("#") and prev_indent == indent:
                break
            if not (prev_indent == indent and re.match(r"^\s*[\w.-]+: \S", prev)):
                undocumented.append(".".join(path))
                break
            j -= 1
    assert not undocumented, f"values.yaml values without a comment: {undocumented}"
    assert seen == leaves - {("global",)}, "every declared value is in values.yaml"


# --- the kubelet plugin ----------------------------------------------------------------------


def test_plugin_daemonset(rendered: dict[str, list[dict[str, Any]]]) -> None:
    ds = one(rendered["default"], "DaemonSet")
    spec = ds["spec"]
    assert spec["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = spec["template"]["spec"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    # A host port or host network would collide with the surge pod on the same node.
    assert not pod.get("hostNetwork")
    c = container(ds)
    assert all("hostPort" not in p for p in c["ports"])
    env = env_of(c)
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["CDI_ROOT"] == "/var/run/cdi"
    assert c["securityContext"]["privileged"] is False
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    # Host paths at the same path inside: the kubelet and the runtime read what we report.
    for path in (
        "/var/lib/kubelet/plugins/neuron.aws.com",
        "/var/lib/kubelet/plugins_registry",
        "/var/run/cdi",
        "/sys",
        "/dev",
        "/opt/aws",
    ):
        assert volumes[mounts[path]["name"]]["hostPath"]["path"] == path
    assert mounts["/sys"]["readOnly"] and mounts["/dev"]["readOnly"]
    assert all(m.get("mountPropagation") != "Bidirectional" for m in mounts.values())
    assert not c["terminationMessagePath"].startswith("/dev/")
    port = c["ports"][0]
    assert port["name"] == "http" and port["containerPort"] == 8081
    for probe, path in (
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
        ("startupProbe", "/healthz"),
    ):
        assert c[probe]["httpGet"] == {"path": path, "port": "http"}
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    exprs = {e["key"]: e for e in term["matchExpressions"]}
    assert exprs["node.kubernetes.io/instance-type"]["values"] == list(PROFILES)
    assert exprs["eks.amazonaws.com/compute-type"]["operator"] == "NotIn"
    assert {"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"} in (
        pod["tolerations"]
    )
    assert pod["priorityClassName"] == "system-node-critical"


def test_plugin_emulation_mode(rendered: dict[str, list[dict[str, Any]]]) -> None:
    ds = one(rendered["emulation"], "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    c = container(ds)
    assert "--emulation-mode=trn2u.48xlarge" in c["args"]
    assert "affinity" not in pod, "emulation runs on nodes without Neuron instance types"
    assert pod["nodeSelector"] == {"neuron-dra/emulate": "true"}
    paths = {m["mountPath"] for m in c["volumeMounts"]}
    assert not paths & {"/sys", "/dev", "/opt/aws"}, "no host hardware mounts when emulating"
    assert "/var/lib/kubelet/plugins/neuron.aws.com" in paths
    default = container(one(rendered["default"], "DaemonSet"))
    assert not any(a.startswith("--emulation-mode") for a in default["args"])


def test_a_neuron_ls_capture_is_mounted_and_passed_to_the_plugin(
    helm: Helm, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NODE_NAME", "n1")  # from the pod's spec.nodeName on a node
    objects = _docs(
        helm.template_text(
            Overrides.of("kubeletPlugin.pciLocation.neuronLsJson=/run/neuron-dra/neuron-ls.json")
        )
    )
    ds = one(objects, "DaemonSet")
    c = container(ds)
    args = plugin_main.build_parser().parse_args(c["args"])
    config = plugin_main.config_from_args(args)
    assert str(config.pci_sources.neuron_ls_json) == "/run/neuron-dra/neuron-ls.json"
    # The chart's default: no kernel log, which a plain container cannot read.
    assert config.pci_sources.kernel_log is None
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "neuron-ls"]
    assert mount == {"name": "neuron-ls", "mountPath": "/run/neuron-dra", "readOnly": True}
    (volume,) = [v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "neuron-ls"]
    assert volume["hostPath"] == {"path": "/run/neuron-dra", "type": "DirectoryOrCreate"}


def test_plugin_args_and_env_are_what_the_plugin_reads(
    rendered: dict[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The DaemonSet's flags parse with the plugin's own parser and its env vars land in the
    plugin's config (so a renamed flag or env var fails here, not on a node)."""
    c = container(one(rendered["emulation"], "DaemonSet"))
    assert c["command"] == ["neuron-dra-kubelet-plugin"]
    for name, value in env_of(c).items():
        monkeypatch.setenv(name, value if isinstance(value, str) else f"from-{name.lower()}")
    args = plugin_main.build_parser().parse_args(c["args"])
    config = plugin_main.config_from_args(args)
    assert config.node_name == "from-node_name"
    assert config.pod_uid == "from-pod_uid"
    assert str(config.cdi_root) == "/var/run/cdi"
    assert str(config.registrar_dir) == "/var/lib/kubelet/plugins_registry"
    assert str(config.data_dir) == "/var/lib/kubelet/plugins/neuron.aws.com"
    assert config.emulation_mode == "trn2u.48xlarge"
    assert config.http_port == 8081
    assert config.device_taint_effect == "NoSchedule"
    assert config.core_sharing is True
    assert args.verbosity == 2 and args.logging_format == "text"
    default = container(one(rendered["default"], "DaemonSet"))
    assert not plugin_main.config_from_args(
        plugin_main.build_parser().parse_args([*default["args"], "--node-name", "n"])
    ).core_sharing, "core sharing is opt-in"


# --- the controller --------------------------------------------------------------------------


def test_controller_deployment(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["default"]
    deploy = one(objects, "Deployment")
    assert deploy["spec"]["replicas"] == 2
    c = container(deploy)
    assert c["command"] == ["neuron-dra-controller"]
    args = controller_main.build_parser().parse_args(c["args"])
    assert args.leader_elect and args.namespace == "neuron-dra-driver" and args.http_port == 8080
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert c[probe]["httpGet"] == {"path": path, "port": "http"}
    pod = deploy["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (pref,) = pod["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert "m5.24xlarge" in pref["preference"]["matchExpressions"][0]["values"]
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    svc = one(objects, "Service")
    assert svc["spec"]["selector"].items() <= labels.items()
    assert svc["spec"]["ports"] == [
        {"name": "metrics", "port": 8080, "targetPort": "http", "protocol": "TCP"}
    ]
    # The plugin's pods must not be selected by the controller's Service or budget.
    plugin_labels = one(objects, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert not svc["spec"]["selector"].items() <= plugin_labels.items()


def test_single_controller_without_leader_election(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objects = rendered["single-controller"]
    c = container(one(objects, "Deployment"))
    assert "--leader-elect" not in c["args"]
    assert "PodDisruptionBudget" not in kinds(objects), "a 1-replica budget blocks drains"
    for binding in (o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"):
        assert binding["spec"]["validationActions"] == ["Warn", "Audit"]


def test_controller_disabled(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["no-controller"]
    assert not [o for o in objects if "controller" in o["metadata"]["name"]]
    assert "Deployment" not in kinds(objects) and "PodDisruptionBudget" not in kinds(objects)
    assert one(objects, "DaemonSet") and len([o for o in objects if o["kind"] == "DeviceClass"])
    policies = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"]
    # The Node label keeps its protection: the plugin publishes it, with or without the
    # controller.
    assert {p["metadata"]["name"] for p in policies} == {
        "neuron-dra-driver-kubelet-plugin-own-node",
        "neuron-dra-driver-capacity-block-id",
    }


def test_custom_namespace_and_image(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["custom-namespace-image"]
    ns = one(objects, "Namespace")
    assert ns["metadata"]["name"] == "neuron-system"
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    for workload in (one(objects, "DaemonSet"), one(objects, "Deployment")):
        c = container(workload)
        assert c["image"] == "registry.example.com/ml/neuron-dra:1.2.3"
        assert c["imagePullPolicy"] == "Always"
        assert "--logging-format=json" in c["args"] and "--v=4" in c["args"]
        assert workload["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert "--namespace=neuron-system" in container(one(objects, "Deployment"))["args"]
    for binding in (o for o in objects if o["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        assert binding["subjects"][0]["namespace"] == "neuron-system"
    assert (
        one(objects, "DaemonSet")["metadata"]["name"] == "neuron-neuron-dra-driver-kubelet-plugin"
    )
    default_image = container(one(rendered["default"], "DaemonSet"))["image"]
    assert default_image == "neuron-dra:0.1.0", "the tag defaults to the appVersion"


# --- RBAC ------------------------------------------------------------------------------------


def _granted(objects: list[dict[str, Any]], component: str) -> set[tuple[Any, ...]]:
    """(scope, group, resource, verb, resourceNames) the component's roles grant."""
    out = set()
    for obj in objects:
        if obj["kind"] not in ("ClusterRole", "Role"):
            continue
        if obj["metadata"]["labels"].get("app.kubernetes.io/component") != component:
            continue
        scope = "cluster" if obj["kind"] == "ClusterRole" else "namespace"
        for rule in obj["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        names = frozenset(rule.get("resourceNames", []))
                        out.add((scope, group, resource, verb, names))
    return out


def _expected(uses: tuple[Use, ...], minor: tuple[int, int]) -> set[tuple[Any, ...]]:
    return {
        (u.scope, u.group, u.resource, verb, u.resource_names)
        for u in uses
        if u.since <= minor
        for verb in u.verbs
    }


@pytest.mark.parametrize("component", sorted(COMPONENTS))
@pytest.mark.parametrize(("render", "minor"), [("default", (1, 34)), ("kube-1.37", (1, 37))])
def test_rbac_is_exactly_what_the_code_uses(
    rendered: dict[str, list[dict[str, Any]]],
    component: str,
    render: str,
    minor: tuple[int, int],
) -> None:
    granted = _granted(rendered[render], component)
    expected = _expected(COMPONENTS[component][1], minor)
    assert expected - granted == set(), "missing from the chart's RBAC"
    assert granted - expected == set(), "granted but not used (least privilege)"
    # Each role is bound to the component's own service account, in the release namespace.
    sa = one(rendered["default"], "ServiceAccount", component)["metadata"]
    for binding in (o for o in rendered["default"] if o["kind"].endswith("RoleBinding")):
        if binding["metadata"]["labels"]["app.kubernetes.io/component"] == component:
            assert binding["subjects"] == [
                {"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}
            ]
            assert binding["roleRef"]["name"] == binding["metadata"]["name"]


def _code_resources(packages: tuple[str, ...]) -> set[tuple[str, str]]:
    """(group, plural) of every API resource constant (neuron_dra.common.k8s.client) the
    packages' code names, plus what the shared helpers they use touch."""
    constants = {name: value for name, value in vars(k8s).items() if isinstance(value, ApiResource)}
    helpers = {"EventRecorder": k8s.EVENTS, "LeaderElector": k8s.LEASES}
    found = set()
    for package in packages:
        for path in (REPO / package).rglob("*.py"):
            text = path.read_text()
            for name, res in [*constants.items(), *helpers.items()]:
                if re.search(rf"\b{name}\b", text):
                    found.add((res.group, res.plural))
    return found


@pytest.mark.parametrize("component", sorted(COMPONENTS))
def test_api_usage_table_covers_every_resource_the_code_names(component: str) -> None:
    packages, uses = COMPONENTS[component]
    in_code = _code_resources(packages)
    in_table = {(u.group, u.resource.split("/")[0]) for u in uses}
    assert in_code == in_table


# --- admission policies ----------------------------------------------------------------------


_CEL_ENV = cel.NewEnv(
    variables={name: cel.Type.DYN for name in ("request", "object", "oldObject", "variables")},
    extensions=[ext_strings.ExtStrings(), ext_optional.ExtOptional(), ext_bindings.ExtBindings()],
)


def _cel(expression: str, data: dict[str, Any]) -> Any:
    return _CEL_ENV.compile(expression).eval(data=data).plain_value()


def admit(policy: dict[str, Any], request: dict[str, Any], obj: Any, old: Any = None) -> str | None:
    """Evaluate a ValidatingAdmissionPolicy as the API server does: None when admitted,
    else the denial message."""
    spec = policy["spec"]
    op, res = request["operation"], request["resource"]
    rules = spec["matchConstraints"]["resourceRules"]
    if not any(
        op in r["operations"]
        and res["group"] in r["apiGroups"]
        and res["resource"] in r["resources"]
        for r in rules
    ):
        return None
    data: dict[str, Any] = {"request": request, "object": obj, "oldObject": old, "variables": {}}
    for cond in spec.get("matchConditions", []):
        if not _cel(cond["expression"], data):
            return None
    for var in spec.get("variables", []):
        data["variables"] = {**data["variables"], var["name"]: _cel(var["expression"], data)}
    for rule in spec["validations"]:
        if not _cel(rule["expression"], data):
            message = _cel(rule["messageExpression"], data)
            assert isinstance(message, str) and message
            return message
    return None


def _request(
    user: str,
    operation: str,
    group: str,
    resource: str,
    name: str,
    *,
    node: str | None = None,
    groups: list[str] | None = None,
) -> dict[str, Any]:
    info: dict[str, Any] = {"username": user}
    if node is not None:
        info["extra"] = {NODE_NAME_KEY: [node], "authentication.kubernetes.io/pod-name": ["p"]}
    if groups is not None:
        info["groups"] = groups
    return {
        "operation": operation,
        "name": name,
        "userInfo": info,
        "resource": {"group": group, "version": "v1", "resource": resource},
    }


def _slice(node: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"driver": "neuron.aws.com", "pool": {"name": node or "all"}}
    if node:
        spec["nodeName"] = node
    else:
        spec["allNodes"] = True
    return {"metadata": {"name": f"{node}-neuron.aws.com-0"}, "spec": spec}


def test_plugin_writes_only_its_own_node(rendered: dict[str, list[dict[str, Any]]]) -> None:
    policy = one(rendered["default"], "ValidatingAdmissionPolicy", "own-node")

    def slice_write(op: str, user: str, node: str | None, target: str | None) -> str | None:
        req = _request(user, op, "resource.k8s.io", "resourceslices", "s", node=node)
        obj = None if op == "DELETE" else _slice(target)
        old = None if op == "CREATE" else _slice(target)
        return admit(policy, req, obj, old)

    for op in ("CREATE", "UPDATE", "DELETE"):
        assert slice_write(op, PLUGIN_SA, "n1", "n1") is None
        denied = slice_write(op, PLUGIN_SA, "n1", "n2")
        assert denied and "on node n1" in denied and "node n2" in denied
        assert "bound to no node" in (slice_write(op, PLUGIN_SA, "n1", None) or "")
        assert "token bound to its node" in (slice_write(op, PLUGIN_SA, None, "n1") or "")
        # Anyone else is not this policy's business (RBAC decides).
        assert slice_write(op, "system:serviceaccount:other:sa", "n1", "n2") is None
    node_patch = _request(PLUGIN_SA, "UPDATE", "", "nodes", "n2", node="n1")
    assert "node n2" in (admit(policy, node_patch, {"metadata": {"name": "n2"}}) or "")
    own = _request(PLUGIN_SA, "UPDATE", "", "nodes", "n1", node="n1")
    assert admit(policy, own, {"metadata": {"name": "n1"}}) is None


def test_only_the_controller_writes_ultraservers(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    policy = one(rendered["default"], "ValidatingAdmissionPolicy", "ultraservers")
    nus = {"metadata": {"name": "us-1", "namespace": "neuron-dra-driver"}, "spec": {}}

    def write(
        user: str, resource: str = "neuronultraservers", groups: list[str] | None = None
    ) -> str | None:
        req = _request(user, "UPDATE", "neuron.aws.com", resource, "us-1", groups=groups)
        return admit(policy, req, nus, nus)

    assert write(CONTROLLER_SA) is None
    assert write(CONTROLLER_SA, "neuronultraservers/status") is None
    assert write("system:serviceaccount:kube-system:namespace-controller") is None
    assert write("system:serviceaccount:kube-system:generic-garbage-collector") is None
    assert write("admin", groups=["system:masters", "system:authenticated"]) is None
    for user, groups in ((PLUGIN_SA, None), ("alice", ["system:authenticated"])):
        for resource in ("neuronultraservers", "neuronultraservers/status"):
            denied = write(user, resource, groups)
            assert denied and user in denied and CONTROLLER_SA in denied
    # Workloads are the users' to write.
    req = _request("alice", "UPDATE", "neuron.aws.com", "neuronultraserverworkloads", "w")
    assert admit(policy, req, nus, nus) is None


def test_the_capacity_block_label_of_a_node_never_changes(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """As AWS's operator's policy protect-capacity-block-id-label: set at creation only."""
    policy = one(rendered["default"], "ValidatingAdmissionPolicy", "capacity-block-id")
    label = "topology.k8s.aws/capacity-block-id"

    def node(value: str | None, **labels: str) -> dict[str, Any]:
        if value is not None:
            labels[label] = value
        meta: dict[str, Any] = {"name": "n1"}
        if labels:
            meta["labels"] = labels
        return {"metadata": meta}

    def update(old: dict[str, Any], new: dict[str, Any], user: str = "admin") -> str | None:
        req = _request(user, "UPDATE", "", "nodes", "n1", groups=["system:masters"])
        return admit(policy, req, new, old)

    assert update(node("cr-1"), node("cr-1", team="a")) is None  # other labels: free
    assert update(node(None), node(None, team="a")) is None
    assert update(node(None), {"metadata": {"name": "n1"}}) is None  # no labels at all
    for old, new, said in (
        (node("cr-1"), node("cr-2"), "'cr-1' -> 'cr-2'"),
        (node(None, team="a"), node("cr-1", team="a"), "unset -> 'cr-1'"),
        (node("cr-1"), node(None, team="a"), "'cr-1' -> unset"),
        ({"metadata": {"name": "n1"}}, node(""), "unset -> ''"),
    ):
        for user in ("admin", PLUGIN_SA, CONTROLLER_SA):
            denied = update(old, new, user)
            assert denied and label in denied and f"node n1: {said}" in denied, denied
    # Creating a Node with it is how it is meant to be set; other kinds are not matched.
    create = _request("system:node:n1", "CREATE", "", "nodes", "n1")
    assert admit(policy, create, node("cr-1")) is None
    pod = _request("admin", "UPDATE", "", "pods", "p")
    assert admit(policy, pod, node("cr-2"), node("cr-1")) is None


# --- values that must be refused -------------------------------------------------------------


@pytest.mark.parametrize(
    ("sets", "release", "message"),
    [
        (
            ["controller.replicas=2", "controller.leaderElection.enabled=false"],
            Release(),
            "controller.replicas is 2 but controller.leaderElection.enabled is false",
        ),
        (
            ["kubeletPlugin.emulation.enabled=true"],
            Release(),
            "kubeletPlugin.emulation.instanceType is empty: set the instance type to emulate",
        ),
        (
            ["kubeletPlugin.emulation.instanceType=trn1.32xlarge"],
            Release(),
            "set kubeletPlugin.emulation.enabled=true",
        ),
        (
            ["controller.replicas=2", "controller.podDisruptionBudget.minAvailable=2"],
            Release(),
            "minAvailable (2) must be lower than controller.replicas (2)",
        ),
        (
            ["kubeletPlugin.updateStrategy.maxSurge=0"],
            Release(),
            "maxSurge and maxUnavailable are both 0",
        ),
        (
            # helm's --set reads {} as [""] (the schema refuses that); an empty list is JSON
            Overrides.of(values={"kubeletPlugin.instanceTypes": []}),
            Release(),
            "kubeletPlugin.instanceTypes is empty",
        ),
        ([], Release(namespace="default"), "install with --namespace neuron-dra-driver"),
    ],
)
def test_invalid_values_fail_with_what_to_change(
    helm: Helm, sets: list[str] | Overrides, release: Release, message: str
) -> None:
    overrides = sets if isinstance(sets, Overrides) else Overrides.of(*sets)
    with pytest.raises(HelmError) as exc:
        helm.template(overrides, release)
    text = str(exc.value)
    assert message in text
    assert text.startswith(
        "Error: execution error at (neuron-dra-driver/templates/validate.yaml:"
    ), text


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        # an unknown key
        (
            ["controller.replica=3"],
            "- at '/controller': additional properties 'replica' not allowed",
        ),
        # bad enums
        (
            ["kubeletPlugin.emulation.instanceType=trn9.huge"],
            "- at '/kubeletPlugin/emulation/instanceType': value must be one of '', 'inf1.xlarge'",
        ),
        (["logging.format=xml"], "- at '/logging/format': value must be one of 'text', 'json'"),
        (
            ["admissionPolicy.validationActions={Block}"],
            "- at '/admissionPolicy/validationActions/0': value must be one of 'Deny', 'Warn'",
        ),
        # wrong types
        (["controller.replicas=two"], "- at '/controller/replicas': got string, want integer"),
        (["controller.enabled=yes"], "- at '/controller/enabled': got string, want boolean"),
        # a minimum and a pattern
        (["controller.replicas=0"], "- at '/controller/replicas': minimum: got 0, want 1"),
        (
            ["kubeletPlugin.kubeletDir=relative/path"],
            "- at '/kubeletPlugin/kubeletDir': 'relative/path' does not match pattern '^/'",
        ),
    ],
)
def test_schema_violations_are_refused(helm: Helm, sets: list[str], message: str) -> None:
    """values.schema.json refuses them, in helm's words, naming the value."""
    for run in (helm.template, helm.lint):
        with pytest.raises(HelmError) as exc:
            run(Overrides.of(*sets))
        text = str(exc.value)
        assert "values don't meet the specifications of the schema(s)" in text, text
        assert message in text, text


def test_kubernetes_older_than_134_is_refused(helm: Helm) -> None:
    with pytest.raises(HelmError, match=r"requires kubeVersion: >=1\.34\.0-0"):
        helm.template(release=Release(kube_version="v1.33.5"))
    assert helm.template(release=Release(kube_version="v1.34.1-eks-abcdef"))


def test_values_file_set_and_namespace(helm: Helm, tmp_path: Path) -> None:
    """What a user types: ``-f values.yaml --set ... -n NS``, merged by helm itself."""
    values = tmp_path / "values.yaml"
    values.write_text("controller:\n  enabled: false\n")
    docs = helm.template(
        Overrides.of("deviceClasses.enabled=false"),
        Release(namespace="neuron-x"),
        include_crds=True,
        extra=["-f", str(values)],
    )
    assert {d["kind"] for d in docs} >= {"CustomResourceDefinition", "DaemonSet"}
    assert not {"Deployment", "DeviceClass"} & {d["kind"] for d in docs}
    assert {d["metadata"].get("namespace") for d in docs} <= {None, "neuron-x"}


# --- NOTES -----------------------------------------------------------------------------------


def _notes(helm: Helm, tmp_path: Path, overrides: Overrides | None = None) -> str:
    """templates/NOTES.txt rendered by helm's engine with the release's values.

    ``helm template`` leaves NOTES.txt out and ``helm install --dry-run`` needs a cluster, so
    a copy of the chart renders it through ``tpl`` into a ConfigMap."""
    chart = tmp_path / "neuron-dra-driver"
    if not chart.exists():
        shutil.copytree(CHART, chart)
        shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes.txt")
        (chart / "templates" / "zz-notes.yaml").write_text(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\n"
            'data:\n  notes: {{ tpl (.Files.Get "notes.txt") . | toJson }}\n'
        )
    (cm,) = helm.template(overrides, chart=chart, extra=["--show-only", "templates/zz-notes.yaml"])
    notes = cm["data"]["notes"]
    assert isinstance(notes, str)
    return notes


def test_notes(helm: Helm, tmp_path: Path) -> None:
    notes = _notes(helm, tmp_path)
    assert "installed in namespace neuron-dra-driver" in notes
    assert "deployment/neuron-dra-driver-controller" in notes
    assert "<no value>" not in notes
    emulated = _notes(helm, tmp_path, VALUE_SETS["emulation"][0])
    assert "EMULATION MODE" in emulated and "trn2u.48xlarge" in emulated
    assert "CORE SHARING" in emulated and "CORE SHARING" not in notes
    without = _notes(helm, tmp_path, Overrides.of("controller.enabled=false"))
    assert "controller is disabled" in without


# --- applying to the fake API server ---------------------------------------------------------


@pytest.mark.parametrize("value_set", ["default", "custom-namespace-image", "emulation"])
async def test_applies_to_the_fake_apiserver(
    rendered: dict[str, list[dict[str, Any]]], crds: list[dict[str, Any]], value_set: str
) -> None:
    """CRDs first (as Helm installs crds/), then every rendered object, through the API."""
    objects = rendered[value_set]
    namespace = VALUE_SETS[value_set][1].namespace
    async with FakeAPIServer(crd_paths=[]) as server:
        from kubernetes_asyncio import client as k8s_client

        api = k8s_client.ApiClient(configuration=server.client_configuration())
        async with KubeClient(api, owned=True) as kube:
            first = [o for o in objects if o["kind"] == "Namespace"]
            rest = [o for o in objects if o["kind"] != "Namespace"]
            for obj in [*crds, *first, *rest]:
                rt = server.resource_type(obj["apiVersion"], obj["kind"])
                res = ApiResource(rt.group, rt.version, rt.plural, rt.kind, rt.namespaced)
                created = await kube.resource(res).create(obj)
                assert created["metadata"]["uid"]
                assert created["metadata"].get("labels") == obj["metadata"].get("labels")
            for obj in objects:
                meta = obj["metadata"]
                stored = server.get(
                    obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace")
                )
                assert stored is not None, f"{obj['kind']} {meta['name']} not stored"
            # The CRDs are served now: the controller's objects can be created there.
            assert server.resource_type("neuron.aws.com/v1beta1", "NeuronUltraServer")
            ds = one(objects, "DaemonSet")
            stored_ds = server.get("apps/v1", "DaemonSet", ds["metadata"]["name"], namespace)
            assert stored_ds is not None
            assert stored_ds["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] == 1


@pytest.mark.kubectl
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not on PATH")
async def test_kubectl_applies_the_rendered_chart(
    rendered_text: dict[str, str], tmp_path: Path
) -> None:
    """`helm template --include-crds | kubectl apply -f -`, with the real kubectl:
    everything is created, and applying again changes nothing."""
    manifest = tmp_path / "chart.yaml"
    manifest.write_text(rendered_text["default"])
    async with FakeAPIServer(crd_paths=[]) as server:
        kubeconfig = tmp_path / "kubeconfig"
        server.write_kubeconfig(kubeconfig)

        async def kubectl(*args: str) -> str:
            proc = await asyncio.create_subprocess_exec(
                "kubectl",
                "--kubeconfig",
                str(kubeconfig),
                "--cache-dir",
                str(tmp_path / "c"),
                *args,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )  # awaited: the fake server runs on this event loop
            async with asyncio.timeout(60):
                out, err = await proc.communicate()
            assert proc.returncode == 0, f"kubectl {' '.join(args)}: {err.decode()}"
            return out.decode()

        first = await kubectl("apply", "-f", str(manifest))
        assert first.count(" created") == len(_docs(rendered_text["default"]))
        second = await kubectl("apply", "-f", str(manifest))
        # kubectl always re-sends a PodDisruptionBudget's selector (its patch strategy is
        # "replace"), so that one reports "configured" against a real API server too.
        changed = [
            line
            for line in second.splitlines()
            if not line.endswith(" unchanged")
            and line != "poddisruptionbudget.policy/neuron-dra-driver-controller configured"
        ]
        assert not changed, second
        assert len(second.splitlines()) == first.count(" created")
        listed = await kubectl("get", "ds,deploy,svc,pdb", "-n", "neuron-dra-driver", "-o", "name")
        assert sorted(listed.split()) == [
            "daemonset.apps/neuron-dra-driver-kubelet-plugin",
            "deployment.apps/neuron-dra-driver-controller",
            "poddisruptionbudget.policy/neuron-dra-driver-controller",
            "service/neuron-dra-driver-controller-metrics",
        ]
