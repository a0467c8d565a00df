"""The chaos soak (issue 13, ``hack/soak``): :class:`.harness.Soak`. See docs/reliability.md."""

from neuron_dra.sim.soak.harness import Soak
from neuron_dra.sim.soak.options import Options

__all__ = ["Options", "Soak"]
