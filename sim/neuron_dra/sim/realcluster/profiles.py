"""What each Kubernetes minor needs switched on (feature gates, API versions) for the DRA
features this project uses."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class MinorProfile:
    """What a minor needs switched on for the DRA features in this project's compass:
    prioritized list, admin access, device taints, partitionable devices, consumable
    capacity. Gates that are GA and locked in a minor must not be set there."""

    feature_gates: Mapping[str, bool]
    runtime_config: Sequence[str]


PROFILES: dict[tuple[int, int], MinorProfile] = {
    # 1.34: prioritized list and admin access are beta (on by default, set for clarity);
    # partitionable devices and consumable capacity are alpha. Device taints stay off, as on
    # every 1.34 cluster users run (EKS sets no alpha gates): the plugin's taints are dropped
    # there and the tests prove that nothing breaks (tests/realnode/test_device_taints.py).
    (1, 34): MinorProfile(
        feature_gates={
            "DRAPrioritizedList": True,
            "DRAAdminAccess": True,
            "DRAPartitionableDevices": True,
            "DRAConsumableCapacity": True,
        },
        runtime_config=("resource.k8s.io/v1beta1=true", "resource.k8s.io/v1beta2=true"),
    ),
    # 1.36 (its kubelet only; 1.35 is 1.34's profile): prioritized list GA, admin access GA
    # and locked; device taints, partitionable devices, consumable capacity beta and on.
    (1, 36): MinorProfile(
        feature_gates={"DRAPartitionableDevices": True, "DRAConsumableCapacity": True},
        runtime_config=("resource.k8s.io/v1beta1=true", "resource.k8s.io/v1beta2=true"),
    ),
    # 1.37: prioritized list and admin access are GA and locked; device taints (and their
    # rules) GA; partitionable devices and consumable capacity beta, on by default.
    (1, 37): MinorProfile(
        feature_gates={"DRAPartitionableDevices": True, "DRAConsumableCapacity": True},
        runtime_config=("resource.k8s.io/v1beta1=true", "resource.k8s.io/v1beta2=true"),
    ),
}


def profile_for(minor: str) -> MinorProfile:
    """The profile of ``minor``, or of the newest profiled minor below it."""
    want = tuple(int(p) for p in minor.removeprefix("v").split(".")[:2])
    known = [k for k in sorted(PROFILES) if k <= want]
    if not known:
        raise ValueError(f"no launch profile for Kubernetes {minor} (oldest known: 1.34)")
    return PROFILES[known[-1]]
