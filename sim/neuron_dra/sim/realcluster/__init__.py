"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager
and kube-scheduler built from the modules pinned under ``hack/k8s`` (see :mod:`.kubebuild`).

    with RealControlPlane(bin_dir, "1.34") as cp:
        kubeconfig = cp.kubeconfig(ADMIN)
        node_kubeconfig = cp.kubeconfig(node_identity("trn2-0"))

What users run is what this runs: ``Node,RBAC`` authorization with ``NodeRestriction``
admission, service-account signing keys (the controller-manager runs each controller under
its own service account), the DRA API versions and feature gates of the minor, the
resourceclaim controller turning templates into claims, the real scheduler's DRA allocator.
Every identity is an X.509 client certificate signed by a CA made for the run (``openssl``),
so a kubeconfig for any user/groups — a node's ``system:node:<name>`` — can be issued at any
time. The serving certificate is signed by the same CA: clients verify TLS.

The class is synchronous on purpose: a pytest session shares one control plane among tests
that each run their own event loop. Children die with the process that started them
(``PR_SET_PDEATHSIG``), so a killed test run leaves no process behind.

The package's parts: :mod:`.controlplane` (the launcher), :mod:`.identities` (identities and
the CA), :mod:`.kubeconfig`, :mod:`.processes` (the child processes), :mod:`.profiles` (what
each minor needs) and :mod:`.shared` (one control plane per minor for a test session); this
module is their API.
"""

from .controlplane import RealControlPlane
from .identities import (
    ADMIN,
    KUBE_CONTROLLER_MANAGER,
    KUBE_SCHEDULER,
    SA_ISSUER,
    CertificateAuthority,
    Identity,
    node_identity,
)
from .processes import (
    APISERVER,
    COMPONENTS,
    CONTROLLER_MANAGER,
    ETCD,
    SCHEDULER,
    ControlPlaneError,
    free_port,
    process_alive,
)
from .profiles import PROFILES, MinorProfile, profile_for
from .shared import (
    MINORS_ENV,
    RealTierUnavailable,
    bin_dir_for,
    enabled_minors,
    shared_control_plane,
    stop_shared_control_planes,
)

__all__ = [
    "ADMIN",
    "APISERVER",
    "COMPONENTS",
    "CONTROLLER_MANAGER",
    "ETCD",
    "KUBE_CONTROLLER_MANAGER",
    "KUBE_SCHEDULER",
    "MINORS_ENV",
    "PROFILES",
    "SA_ISSUER",
    "SCHEDULER",
    "CertificateAuthority",
    "ControlPlaneError",
    "Identity",
    "MinorProfile",
    "RealControlPlane",
    "RealTierUnavailable",
    "bin_dir_for",
    "enabled_minors",
    "free_port",
    "node_identity",
    "process_alive",
    "profile_for",
    "shared_control_plane",
    "stop_shared_control_planes",
]
