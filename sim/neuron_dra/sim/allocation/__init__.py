"""Structured device allocation shared by the simulated scheduler and ``neuron-dra check-claim``.

Pure functions over API dicts: ``allocate(claim_spec, classes=..., slices=..., allocated=...)``
returns an ``AllocationResult`` (``status.allocation`` content and the node) or an
``AllocationFailure`` (a short message plus one explanation per node).
"""

from neuron_dra.sim.allocation.allocator import (
    DEFAULT_MAX_STEPS,
    AllocatedDevice,
    AllocationFailure,
    AllocationResult,
    NodeExplanation,
    allocate,
)
from neuron_dra.sim.allocation.cel import CelError, compile_selector, device_view
from neuron_dra.sim.allocation.model import DeviceKey

__all__ = [
    "DEFAULT_MAX_STEPS",
    "AllocatedDevice",
    "AllocationFailure",
    "AllocationResult",
    "CelError",
    "DeviceKey",
    "NodeExplanation",
    "allocate",
    "compile_selector",
    "device_view",
]
