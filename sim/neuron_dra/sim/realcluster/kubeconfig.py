"""The kubeconfig document for one client certificate of a control plane (TLS verified
against the run's CA)."""

from __future__ import annotations

from pathlib import Path


def kubeconfig_doc(url: str, ca_cert: Path, crt: Path, key: Path) -> dict[str, object]:
    """A kubeconfig naming the API server at ``url``, its CA and the client pair."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "real",
                "cluster": {"server": url, "certificate-authority": str(ca_cert)},
            }
        ],
        "users": [
            {
                "name": "user",
                "user": {"client-certificate": str(crt), "client-key": str(key)},
            }
        ],
        "contexts": [{"name": "real", "context": {"cluster": "real", "user": "user"}}],
        "current-context": "real",
    }
