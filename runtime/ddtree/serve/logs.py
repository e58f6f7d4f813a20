"""Logging to stderr with timestamps, SGLang's format; journald captures it under systemd."""

from __future__ import annotations

import logging
import sys

FORMAT = "[%(asctime)s] %(message)s"
DATEFMT = "%Y-%m-%d %H:%M:%S"


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT, DATEFMT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The DDTREE and Decode batch lines are the contract opsctl parses: keep them even at --log-level warning.
    numeric = logging.getLevelName(level.upper())
    if isinstance(numeric, int) and numeric > logging.INFO:
        logging.getLogger("ddtree").setLevel(logging.INFO)
