"""Shared pytest configuration: the fake API server fixtures are available everywhere."""

pytest_plugins = ["neuron_dra.sim.fakeapi.pytest_plugin"]
