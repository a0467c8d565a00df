"""This node's UltraServer labels (listed in the README), as pure functions of the inventory,
and the merge patch that makes the Node carry them. No I/O: :mod:`.nodelabels` applies it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from neuron_dra.common.constants import (
    LABEL_ULTRASERVER_MODE,
    LABEL_ULTRASERVER_NODE_ID_2,
    LABEL_ULTRASERVER_NODE_ID_4,
    LABEL_ULTRASERVER_SERVER_ID_2,
    LABEL_ULTRASERVER_SERVER_ID_4,
    ULTRASERVER_NODE_LABELS,
    format_ultraserver_modes,
)
from neuron_dra.common.names import LABEL_VALUE_RE
from neuron_dra.nodeplugin.discovery.facts import (
    InventoryError,
    inventory_profile,
    ultraserver_node_counts,
)
from neuron_dra.nodeplugin.discovery.model import NodeInventory


def ultraserver_node_labels(inventory: NodeInventory) -> dict[str, str]:
    """The UltraServer labels this node should carry; {} on other nodes.

    Values that are not valid label values (a driver reporting something unexpected) are left
    out rather than failing the whole label update; the caller removes every owned label it
    does not get back here.
    """
    us = inventory.ultraserver
    if not inventory.devices or not inventory.instance_type:
        return {}
    try:
        profile = inventory_profile(inventory)
    except (InventoryError, LookupError):
        return {}
    counts = ultraserver_node_counts(inventory, profile)
    if not counts:
        return {}
    candidates: dict[str, str | None] = {LABEL_ULTRASERVER_MODE: format_ultraserver_modes(counts)}
    if us is not None:
        candidates[LABEL_ULTRASERVER_SERVER_ID_2] = us.server_id_2
        candidates[LABEL_ULTRASERVER_SERVER_ID_4] = us.server_id_4
        for label, node_id in (
            (LABEL_ULTRASERVER_NODE_ID_2, us.node_id_2),
            (LABEL_ULTRASERVER_NODE_ID_4, us.node_id_4),
        ):
            candidates[label] = None if node_id is None else str(node_id)
    return {
        k: v for k, v in candidates.items() if v and len(v) <= 63 and LABEL_VALUE_RE.fullmatch(v)
    }


def node_label_patch(
    current: Mapping[str, str],
    desired: Mapping[str, str],
    owned: Iterable[str] = ULTRASERVER_NODE_LABELS,
) -> dict[str, str | None]:
    """The ``metadata.labels`` merge patch making our labels on the Node equal ``desired``.

    Only ``owned`` labels are ever set or removed (``None`` = remove); anything else on the
    Node belongs to someone else and is left alone, even if ``desired`` named it.
    """
    owned = frozenset(owned)
    patch: dict[str, str | None] = {
        k: v for k, v in desired.items() if k in owned and current.get(k) != v
    }
    for k in sorted(owned):
        if k in current and k not in desired:
            patch[k] = None
    return patch
