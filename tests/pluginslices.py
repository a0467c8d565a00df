"""The kubelet plugin's own ResourceSlices of one trn2u.48xlarge node, for tests that need
slices as the plugin publishes them (the controller's caches, the protobuf contract)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inventories import profile_inventory
from neuron_dra.common.profiles import UltraServerMode
from neuron_dra.nodeplugin.discovery.model import UltraServerInfo
from neuron_dra.nodeplugin.publish.slices import build_resource_slices


def trn2u_slices(
    node_name: str,
    node_uid: str,
    *,
    node_id_4: int,
    unhealthy: tuple[int, ...] = (),
    workload_ids: Mapping[int | str, str] | None = None,
) -> list[dict[str, Any]]:
    """The slices of node ``node_id_4`` of UltraServer ``a1b2c3d4e5f60719`` (modes X4, X2V,
    X1), its devices in ``unhealthy`` reported unhealthy, tagged with ``workload_ids``."""
    # No chip name: the slices these tests have always compared.
    inventory = profile_inventory(
        "trn2u.48xlarge",
        node_name,
        chip_name=False,
        unhealthy=unhealthy,
        ultraserver=UltraServerInfo(
            modes=(UltraServerMode.X4, UltraServerMode.X2V, UltraServerMode.X1),
            server_id_4="a1b2c3d4e5f60719",
            node_id_4=node_id_4,
        ),
    )
    return build_resource_slices(
        inventory,
        node_name=node_name,
        node_uid=node_uid,
        node_labels={},
        dra_driver_version="0.1.0",
        workload_ids=workload_ids,
        generation=1,
    )
