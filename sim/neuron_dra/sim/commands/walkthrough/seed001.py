"""The walkthrough's steps for seed 001 (the Neuron DRA guide): the simulated cluster,
connected devices, whole and half nodes and driver versions, logical NeuronCore size, 4-node
UltraServer groups."""

from __future__ import annotations

from neuron_dra.common import constants as c
from neuron_dra.sim.commands.walkthrough.tables import compact_devices, core_count, mode_label
from neuron_dra.sim.commands.walkthrough.tools import (
    ENV_CORES,
    ENV_LNC,
    ENV_MODE,
    ENV_NODE,
    ENV_SERVER,
    G4,
    G8,
    PodView,
    WalkthroughTools,
    expect,
)


class DeviceSteps(WalkthroughTools):
    """Steps of seed 001 (devices on single nodes and UltraServer groups)."""

    async def cluster(self) -> None:
        rows = []
        for n in self.sim.nodes:
            (s,) = [x for x in self.sim.slices() if x["spec"]["nodeName"] == n.name]
            neuron = [d for d in s["spec"]["devices"] if d["name"].startswith("neurondevice")]
            first = neuron[0]["name"]
            rows.append(
                (
                    n.name,
                    n.instance_type,
                    len(neuron),
                    self.device_attr(n.name, first, "neuronDriverVersion"),
                    n.ultraserver_id or "-",
                    "-" if n.ultraserver_node_id is None else n.ultraserver_node_id,
                )
            )
        self.say(f"  {len(rows)} nodes, each running the kubelet plugin in emulation mode:")
        self.table(("NODE", "INSTANCE TYPE", "DEVICES", "DRIVER", "ULTRASERVER", "NODE ID"), rows)
        expect(len(self.sim.slices()) == len(rows), "one ResourceSlice per node")
        self.say(f"  kubectl get neuronultraservers -n {c.DRIVER_NAMESPACE}")
        await self.server_table(
            f"/apis/{c.CRD_GROUP}/{c.CRD_VERSION}/namespaces/{c.DRIVER_NAMESPACE}/{c.PLURAL_ULTRASERVER}"
        )
        want = {n.ultraserver_id for n in self.sim.nodes if n.ultraserver_id}
        got = {u["metadata"]["name"] for u in self.sim.ultraservers()}
        expect(got == want, f"NeuronUltraServers {sorted(got)}, expected {sorted(want)}")

    async def connected(self) -> None:
        await self.apply_spec("connected-4-devices.yaml")
        await self.create_pod("connected-4", "1x4-connected-neurons")
        (pod,) = await self.running(["connected-4"])
        v = await self.view(pod)
        groups = {self.device_attr(v.node, d, G4) for d in v.devices}
        self.table(
            ("POD", "NODE", "DEVICES", "DEVICEGROUP4_ID", ENV_CORES, "/dev"),
            [
                (
                    v.name,
                    v.node,
                    compact_devices(v.devices),
                    ",".join(map(str, groups)),
                    v.env.get(ENV_CORES),
                    " ".join(v.device_nodes),
                )
            ],
        )
        expect(len(v.devices) == 4, f"4 devices, got {v.devices}")
        expect(len(groups) == 1, f"the 4 devices share one devicegroup4_id, got {groups}")
        expect(len(v.device_nodes) == 4, f"4 device nodes in the container, got {v.device_nodes}")
        await self.delete_pods(["connected-4"])

    async def sizes(self) -> None:
        wanted = {
            "xl": ("all-devices-xl.yaml", "xl-trn2", 16, None),
            "large": ("half-node-l.yaml", "l-trn2", 8, G8),
            "driver-2-24": ("driver-version.yaml", "driver-2.24.7.0-trn2", 8, G8),
        }
        for pod_name, (spec, template, _, _) in wanted.items():
            await self.apply_spec(spec)
            await self.create_pod(pod_name, template)
        pods = await self.running(list(wanted))
        rows = []
        for pod in pods:
            v = await self.view(pod)
            _, _, count, group = wanted[v.name]
            ids = {self.device_attr(v.node, d, group) for d in v.devices} if group else set()
            version = {self.device_attr(v.node, d, "neuronDriverVersion") for d in v.devices}
            rows.append(
                (
                    v.name,
                    v.node,
                    len(v.devices),
                    compact_devices(v.devices),
                    ",".join(sorted(map(str, version))),
                    v.env.get(ENV_CORES),
                )
            )
            expect(len(v.devices) == count, f"{v.name}: {count} devices, got {len(v.devices)}")
            expect(not group or len(ids) == 1, f"{v.name}: one {group}, got {ids}")
        self.table(("POD", "NODE", "COUNT", "DEVICES", "DRIVER", ENV_CORES), rows)
        await self.delete_pods(wanted)

    async def lnc(self) -> None:
        await self.apply_spec("lnc1.yaml")
        await self.create_pod("lnc-1", "all-neurons-lnc-1")
        (pod,) = await self.running(["lnc-1"])
        v = await self.view(pod)
        self.table(
            ("POD", "NODE", "DEVICES", ENV_LNC, ENV_CORES),
            [
                (
                    v.name,
                    v.node,
                    compact_devices(v.devices),
                    v.env.get(ENV_LNC),
                    v.env.get(ENV_CORES),
                )
            ],
        )
        expect(len(v.devices) == 16, f"all 16 devices, got {len(v.devices)}")
        expect(v.env.get(ENV_LNC) == "1", f"{ENV_LNC}=1, got {v.env.get(ENV_LNC)}")
        # trn2: 8 physical cores per device, LNC 1 exposes each as a logical core.
        cores = core_count(v.env.get(ENV_CORES, "0-0"))
        expect(cores == 16 * 8, f"128 logical cores with LNC 1, got {cores}")
        await self.delete_pods(["lnc-1"])

    async def ultraserver_groups(self) -> None:
        await self.apply_spec("ultraserver-4-node.yaml")
        (lws,) = await self.apply_spec("ultraserver-4-node-lws.yaml")
        pods = await self.running_workload(lws)
        rows = []
        groups: dict[str, list[PodView]] = {}
        for pod in pods:
            v = await self.view(pod)
            labels = pod["metadata"]["labels"]
            node = self.sim.view.get("v1", "Node", v.node) or {}
            us = node["metadata"]["labels"].get(c.LABEL_ULTRASERVER_SERVER_ID_4)
            groups.setdefault(labels["leaderworkerset.sigs.k8s.io/group-index"], []).append(v)
            rows.append(
                (
                    v.name,
                    labels.get("role"),
                    v.node,
                    us,
                    mode_label(v.env.get(ENV_MODE)),
                    v.env.get(ENV_SERVER),
                    v.env.get(ENV_NODE),
                )
            )
        self.table(("POD", "ROLE", "NODE", "ULTRASERVER", "MODE", "SERVER ID", "NODE ID"), rows)
        servers = []
        for index, members in sorted(groups.items()):
            ids = {m.env.get(ENV_SERVER) for m in members}
            nodes = sorted(m.env.get(ENV_NODE, "") for m in members)
            expect(len(members) == 4, f"group {index}: 4 pods, got {len(members)}")
            expect(len(ids) == 1, f"group {index}: one UltraServer, got {ids}")
            expect(nodes == ["0", "1", "2", "3"], f"group {index}: node ids 0..3, got {nodes}")
            modes = {m.env.get(ENV_MODE) for m in members}
            expect(modes == {"1"}, f"group {index}: {ENV_MODE}=1 (X4), got {modes}")
            servers.append(ids.pop())
        expect(len(set(servers)) == len(servers), f"one UltraServer per group, got {servers}")
        await self.remove(lws)
