"""How the walkthrough prints what it sees: aligned tables and short forms of device lists,
core ranges and UltraServer modes (pure functions)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from neuron_dra.common.constants import device_index


def render_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Columns aligned the way ``kubectl get`` prints them."""
    text = [[str(h) for h in headers], *([("" if v is None else str(v)) for v in r] for r in rows)]
    widths = [max(len(r[i]) for r in text) for i in range(len(headers))]
    return "\n".join(
        "   ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in text
    )


def core_count(ranges: str) -> int:
    """How many cores ``NEURON_RT_VISIBLE_CORES`` (``0-15`` or ``3``) names."""
    total = 0
    for part in ranges.split(","):
        lo, _, hi = part.partition("-")
        total += int(hi or lo) - int(lo) + 1
    return total


def device_order(name: str) -> tuple[int, str]:
    index = device_index(name)
    return (index, "") if index is not None else (-1, name)


def compact_devices(names: Iterable[str]) -> str:
    """``neurondevice0..3`` for a run, names otherwise."""
    ordered = sorted(names, key=device_order)
    idx = [device_order(n)[0] for n in ordered]
    if len(idx) > 1 and all(i >= 0 for i in idx) and idx == list(range(idx[0], idx[0] + len(idx))):
        return f"neurondevice{idx[0]}..{idx[-1]}"
    return ",".join(ordered)


#: NEURON_RT_ULTRASERVER_MODE is the driver's enum, not a node count (docs/configuration.md).
MODE_NAMES = {"1": "X4", "2": "X2H", "3": "X2V", "4": "X1"}


def mode_label(value: str | None) -> str:
    """``1 (X4)`` for the table: the number alone reads like a node count."""
    if value is None:
        return "-"
    return f"{value} ({MODE_NAMES[value]})" if value in MODE_NAMES else value
