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
# The coordinator's "degraded" is a member kept out of rounds while it still answered: the sign of a
# member crowding others out (docs/security.md), so its process exits non-zero as for a failure.
COORDINATOR_ENDED_BADLY = (*ENDED_BADLY, "degraded")


def exit_status(results: Sequence[Mapping[str, Any]], ended_badly: Sequence[str] = ENDED_BADLY) -> int:
    """2: could not start (a port taken); 130: interrupted; 1: a node (or the coordinator) ended
    with a status of `ended_badly`."""
    if not all(results):
        return 2
    if any(r["status"] == "interrupted" for r in results):
        return 130
    return 1 if any(r["status"] in ended_badly for r in results) else 0
