"""``neuron-dra-controller`` as a process: leader election, endpoints, clean SIGTERM."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from pathlib import Path

import aiohttp
from neuron_dra.sim.fakeapi.server import FakeAPIServer


async def test_console_script_leads_serves_and_stops(
    fake_apiserver: FakeAPIServer, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    fake_apiserver.write_kubeconfig(kubeconfig)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "neuron_dra.controller.main",
        "--kubeconfig",
        str(kubeconfig),
        "--leader-elect",
        "--http-port",
        "0",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        found = re.search(rb"http port (\d+)", line)
        assert found, line
        port = int(found[1])
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{port}/readyz") as r:
                assert r.status == 200, await r.text()
            async with s.get(f"http://127.0.0.1:{port}/metrics") as r:
                assert "neuron_dra_reflector_lists" in await r.text()
        # The Lease names this replica once it leads.
        async with asyncio.timeout(30):
            while True:
                lease = fake_apiserver.get(
                    "coordination.k8s.io/v1", "Lease", "neuron-dra-controller", "neuron-dra-driver"
                )
                if lease and lease["spec"].get("holderIdentity"):
                    break
                await asyncio.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    # Released on a clean stop, so a standby takes over without waiting for expiry.
    lease = fake_apiserver.get(
        "coordination.k8s.io/v1", "Lease", "neuron-dra-controller", "neuron-dra-driver"
    )
    assert lease is not None and not lease["spec"].get("holderIdentity")
