"""klog-style logging set-up shared by every process.

Kubernetes components take ``-v N`` and ``--logging-format text|json``; we map
them onto stdlib logging so third-party logs (aiohttp, grpc, kubernetes_asyncio)
flow through the same handler. Levels follow sig-instrumentation guidance:
``-v 0..2`` is INFO, ``3..4`` DEBUG, ``5+`` TRACE (wire-level chatter).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any, Final

TRACE: Final = 5
logging.addLevelName(TRACE, "TRACE")

# Attributes every LogRecord has; anything else passed via ``extra=`` is a
# structured key/value and is rendered as such.
_RESERVED: Final = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys()) | {
    "message",
    "asctime",
}


def level_for_verbosity(v: int) -> int:
    if v < 0:
        return logging.WARNING
    if v <= 2:
        return logging.INFO
    if v <= 4:
        return logging.DEBUG
    return TRACE


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _RESERVED and not k.startswith("_")}


class TextFormatter(logging.Formatter):
    """``I1122 06:41:00.123456 name] message key="value"`` like klog's text output."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%m%d %H:%M:%S", time.gmtime(record.created))
        micros = int((record.created % 1) * 1_000_000)
        line = f"{record.levelname[0]}{ts}.{micros:06d} {record.name}] {record.getMessage()}"
        for key, value in _extras(record).items():
            line += f" {key}={json.dumps(value, default=str)}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JSONFormatter(logging.Formatter):
    """One JSON object per line with ``ts``, ``v``, ``msg``, ``err`` and the structured keys."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(_extras(record))
        if record.exc_info:
            out["err"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def add_logging_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-v",
        "--v",
        dest="verbosity",
        type=int,
        default=2,
        help="log verbosity like klog: 0-2 info, 3-4 debug, 5+ trace (default 2)",
    )
    parser.add_argument(
        "--logging-format",
        choices=("text", "json"),
        default="text",
        help="log line format (default text)",
    )


def setup_logging(verbosity: int = 2, fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level_for_verbosity(verbosity))
    if verbosity < 5:
        # aiohttp's access log is one line per request: wire-level, so trace only.
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
