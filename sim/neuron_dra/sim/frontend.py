"""What the argparse front ends of the soak and the benchmarks (``python -m
neuron_dra.sim.soak``, ``.peerbench``, ``.gangbench``) share: their flags turned into the
run's options, and the machine line a report starts with."""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
from typing import Any, TypeVar

T = TypeVar("T")


def options_from(cls: type[T], args: argparse.Namespace, **overrides: Any) -> T:
    """The dataclass ``cls`` with every field that has a flag of the same name set from it
    (the others keep their defaults), then ``overrides``."""
    assert dataclasses.is_dataclass(cls)
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if f.name in args}
    return cls(**{**given, **overrides})


def machine_line() -> str:
    """CPUs, architecture, the load average now (at the end of a run) and Python's version."""
    return (
        f"machine: {os.cpu_count()} CPUs, {platform.machine()}, load average at the end "
        f"{os.getloadavg()[0]:.2f}; python {platform.python_version()}"
    )
