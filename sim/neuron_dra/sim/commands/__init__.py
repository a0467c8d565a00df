"""Implementations of the ``neuron-dra`` sub-commands."""
