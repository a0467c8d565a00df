"""pytest fixtures for the fake API server.

Enable with ``pytest_plugins = ["neuron_dra.sim.fakeapi.pytest_plugin"]``.

- ``fake_apiserver``: a started ``FakeAPIServer`` (CRDs from the chart loaded), stopped after
  the test.
- ``kube_api_client``: a ``kubernetes_asyncio.client.ApiClient`` bound to it, closed after the
  test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from kubernetes_asyncio import client

from .server import FakeAPIServer


@pytest_asyncio.fixture
async def fake_apiserver() -> AsyncIterator[FakeAPIServer]:
    server = FakeAPIServer()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest_asyncio.fixture
async def kube_api_client(fake_apiserver: FakeAPIServer) -> AsyncIterator[client.ApiClient]:
    api = client.ApiClient(configuration=fake_apiserver.client_configuration())
    try:
        yield api
    finally:
        await api.close()
