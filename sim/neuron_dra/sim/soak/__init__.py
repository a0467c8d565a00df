"""The chaos soak (issue 13, ``hack/soak``): :class:`.harness.Soak`. See docs/reliability.md."""

from neuron_dra.sim.soak.harness import Options, Soak

__all__ = ["Options", "Soak"]
