"""Shared pytest configuration: the fake API server fixtures are available everywhere."""

pytest_plugins = ["neuron_dra.common.testing.fakeapi.pytest_plugin"]
