"""How a node ends, in one leaf: the statuses that fail a run, the exit status of a process
hosting nodes, and the progress line a node process prints for the launcher."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

PROGRESS_PREFIX = "P2PFL-PROGRESS "  # a node process's stdout line per round, read by the launcher
PROGRESS_ENV = "P2PFL_PROGRESS_LINES"  # set by the launcher: its processes print those lines; a node started by hand does not
# A forking parent's stdout line when one of its nodes' processes ends: {"id", "code"} (code < 0: the signal)
EXIT_PREFIX = "P2PFL-EXIT "
ENDED_BADLY = ("failed", "isolated", "revoked")  # statuses that make the node's process exit non-zero


def exit_status(results: Sequence[Mapping[str, Any]]) -> int:
    """2: could not start (a port taken); 130: interrupted; 1: a node failed or ended isolated."""
    if not all(results):
        return 2
    if any(r["status"] == "interrupted" for r in results):
        return 130
    return 1 if any(r["status"] in ENDED_BADLY for r in results) else 0
