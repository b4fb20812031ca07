"""Logging for node, worker and coordinator processes, at the level `--log-level` chose.

The CLI puts the level in the environment, so that the processes a launcher starts (and Ray
actors started from it) log at the same level as the command that started them.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

LEVEL_ENV = "P2PFL_LOG_LEVEL"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def set_level(level: str) -> None:
    os.environ[LEVEL_ENV] = level.upper()


def configure(fmt: str = FORMAT, filename: Path | None = None) -> None:
    level = os.environ.get(LEVEL_ENV, "INFO").upper()
    if level not in LEVELS:
        level = "INFO"
    if filename is None:
        logging.basicConfig(level=level, stream=sys.stderr, format=fmt, force=True)
    else:
        logging.basicConfig(level=level, filename=filename, format=fmt, force=True)
