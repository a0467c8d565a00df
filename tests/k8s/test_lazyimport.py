"""kubernetes_asyncio is imported lazily once neuron_dra.common.k8s is imported.

Each check runs in a fresh interpreter: the test process itself has long imported
kubernetes_asyncio eagerly (other tests use its typed APIs).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out.stdout.strip()


def test_raw_client_loads_no_generated_models() -> None:
    out = run("""
        import sys
        import neuron_dra.common.k8s.client
        models = [m for m in sys.modules if m.startswith("kubernetes_asyncio.client.models.")]
        apis = [m for m in sys.modules if m.startswith("kubernetes_asyncio.client.api.")]
        print(len(models), len(apis))
    """)
    assert out == "0 0"


def test_lazy_names_resolve_to_the_real_classes() -> None:
    out = run("""
        import neuron_dra.common.k8s
        from kubernetes_asyncio import client, config
        from kubernetes_asyncio.client.models.v1_pod import V1Pod
        from kubernetes_asyncio.client.api.custom_objects_api import CustomObjectsApi
        assert client.V1Pod is V1Pod and client.models.V1Pod is V1Pod
        assert client.CustomObjectsApi is CustomObjectsApi
        assert client.ApiClient.__module__ == "kubernetes_asyncio.client.api_client"
        assert callable(config.load_kube_config)
        assert client.__version__.startswith("36.")
        # The API client deserializes a named model through the lazy models package.
        import asyncio

        async def main():
            async with client.ApiClient() as api:
                pod = api._ApiClient__deserialize({"metadata": {"name": "p"}}, "V1Pod")
                print(type(pod).__name__, pod.metadata.name)

        asyncio.run(main())
    """)
    assert out == "V1Pod p"


def test_not_installed_over_an_eager_import() -> None:
    out = run("""
        import kubernetes_asyncio.client as eager
        from neuron_dra.common.k8s import lazyimport
        print(lazyimport.install(), type(eager).__name__)
    """)
    assert out == "False module"
