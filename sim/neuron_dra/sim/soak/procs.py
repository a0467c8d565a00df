"""The soak's child processes: the product's own entry points with their HTTP endpoints on
loopback (the console scripts bind ``0.0.0.0``; the soak stays on 127.0.0.1).

    python -m neuron_dra.sim.soak.procs plugin --node-name ... (plugin flags)
    python -m neuron_dra.sim.soak.procs controller --kubeconfig ... (controller flags)

Everything else is exactly what ``neuron-dra-kubelet-plugin`` / ``neuron-dra-controller`` run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from collections.abc import Sequence

LOOPBACK = "127.0.0.1"


def _plugin(argv: Sequence[str]) -> int:
    from neuron_dra.common.k8s.errors import PermanentError
    from neuron_dra.common.logsetup import setup_logging
    from neuron_dra.nodeplugin import main as plugin_main

    args = plugin_main.build_parser().parse_args(argv)
    setup_logging(args.verbosity, args.logging_format)
    config = dataclasses.replace(plugin_main.config_from_args(args), http_host=LOOPBACK)
    try:
        return asyncio.run(plugin_main.run(config, args.kubeconfig or None))
    except PermanentError as exc:
        print(f"neuron-dra-kubelet-plugin: {exc}", file=sys.stderr)
        return 1


def _controller(argv: Sequence[str]) -> int:
    from neuron_dra.controller import main as controller_main
    from neuron_dra.controller import manager

    # run() builds its ManagerConfig itself: default its host to loopback.
    original = manager.ManagerConfig

    @dataclasses.dataclass(frozen=True)
    class LoopbackConfig(original):  # type: ignore[valid-type,misc]
        http_host: str = LOOPBACK

    setattr(controller_main, "ManagerConfig", LoopbackConfig)  # noqa: B010
    return controller_main.main(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ("plugin", "controller"):
        print("usage: procs plugin|controller [flags]", file=sys.stderr)
        return 2
    return _plugin(args[1:]) if args[0] == "plugin" else _controller(args[1:])


if __name__ == "__main__":
    sys.exit(main())
