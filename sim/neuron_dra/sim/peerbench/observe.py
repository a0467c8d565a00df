"""What the harness reads about a driver's process without asking it anything: RSS and CPU
time from /proc, its own Prepare histogram from its metrics, py-spy samples; and the
byte-compiling of our packages before it starts."""

from __future__ import annotations

import asyncio
import compileall
import os
import re
import shutil
import signal
import sys
from pathlib import Path

from .driver import Driver


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tmpfs_dir() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") else None


def compile_project() -> None:
    """Byte-compile our packages, as installing a wheel or building an image does (see
    hack/bench/prepare); quiet: the plugin's start would show any error."""
    import neuron_dra

    for directory in neuron_dra.__path__:
        compileall.compile_dir(directory, quiet=2)


OUR_PREPARE_METRIC = "neuron_dra_prepare_seconds"
PEER_PREPARE_METRIC = "dra_example_driver_prepare_claim_duration_seconds"


async def prepare_metric(d: Driver) -> tuple[float, int] | None:
    """(sum of seconds, count) of the driver's own per-claim Prepare histogram."""
    if d.metrics_port is None:
        return None
    import aiohttp

    url = f"http://127.0.0.1:{d.metrics_port}/metrics"
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        text = await resp.text()
    return parse_sum_count(text, d.prepare_metric)


def our_http_port(log: Path) -> int | None:
    """The port our plugin printed last (``neuron-dra-kubelet-plugin: http port N``; the log
    is appended to by every start)."""
    found = re.findall(rb"http port (\d+)", log.read_bytes())
    return int(found[-1]) if found else None


def parse_sum_count(text: str, metric: str) -> tuple[float, int] | None:
    """A histogram's ``_sum`` and ``_count`` from Prometheus text (all label sets added)."""
    total, count, seen = 0.0, 0, False
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name == f"{metric}_sum":
            total += float(line.rsplit(" ", 1)[1])
            seen = True
        elif name == f"{metric}_count":
            count += int(float(line.rsplit(" ", 1)[1]))
    return (total, count) if seen else None


async def start_profiler(path: Path | None, pid: int) -> asyncio.subprocess.Process | None:
    """``py-spy record`` attached to ``pid`` (without pausing it), or None."""
    if path is None:
        return None
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    proc = await asyncio.create_subprocess_exec(
        py_spy, "record", "--pid", str(pid), "--idle", "--nonblocking", "--rate", "200",
        "--format", "raw", "-o", str(path),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    await asyncio.sleep(1)  # attached
    return proc


async def stop_profiler(proc: asyncio.subprocess.Process | None) -> None:
    if proc is not None:
        proc.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
        await asyncio.wait_for(proc.wait(), 60)
