"""Logging for node, worker and coordinator processes, at the level `--log-level` chose.

The CLI puts the level in the environment, so that the processes a launcher starts (and Ray
actors started from it) log at the same level as the command that started them.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

LEVEL_ENV = "P2PFL_LOG_LEVEL"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def set_level(level: str) -> None:
    os.environ[LEVEL_ENV] = level.upper()


def configure(fmt: str = FORMAT, filename: Path | None = None, also_to: Path | None = None) -> None:
    """Log to stderr, or to `filename` instead; `also_to`: a file that gets the same lines as stderr."""
    level = os.environ.get(LEVEL_ENV, "INFO").upper()
    if level not in LEVELS:
        level = "INFO"
    if filename is None:
        logging.basicConfig(level=level, stream=sys.stderr, format=fmt, force=True)
    else:
        logging.basicConfig(level=level, filename=filename, format=fmt, force=True)
    if also_to is not None:
        also_to.parent.mkdir(parents=True, exist_ok=True)
        copy = logging.FileHandler(also_to)
        copy.setFormatter(logging.Formatter(fmt))
        logging.getLogger().addHandler(copy)
    limit_library_logs()


# Loggers of the libraries under a node that log a full traceback per bad request or per failed
# accept: a peer sending malformed HTTP, or a flood that exhausts file descriptors, would write
# megabytes of log a second. Their records keep one line each, at most LIBRARY_LINES_PER_WINDOW
# per logger in LIBRARY_WINDOW_S; the rest are counted and the count logged.
NOISY_LIBRARY_LOGGERS = ("aiohttp.server", "aiohttp.web", "asyncio")
LIBRARY_LINES_PER_WINDOW = 10
LIBRARY_WINDOW_S = 10.0


class OneLineRateLimited(logging.Filter):
    """A record's traceback becomes its exception's one-line summary; beyond `lines` records in
    `window_s` seconds, records are dropped and counted, and the count goes out with the next one."""

    def __init__(self, lines: int = LIBRARY_LINES_PER_WINDOW, window_s: float = LIBRARY_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.lines, self.window_s, self.clock = lines, window_s, clock
        self.window_start = clock()
        self.in_window = 0
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        now = self.clock()
        if now - self.window_start > self.window_s:
            self.window_start, self.in_window = now, 0
        self.in_window += 1
        if self.in_window > self.lines:
            self.suppressed += 1
            return False
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            record.msg = f"{record.getMessage()}: {type(exc).__name__}: {str(exc)[:300]}"
            record.args = None
            record.exc_info = record.exc_text = None
        if self.suppressed:
            record.msg = f"{record.getMessage()} ({self.suppressed} more like it were not logged)"
            record.args = None
            self.suppressed = 0
        return True


def limit_library_logs() -> None:
    """One line per library error, rate-limited (idempotent)."""
    for name in NOISY_LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, OneLineRateLimited) for f in logger.filters):
            logger.addFilter(OneLineRateLimited())
