"""A node process that dies during `p2pfl run`, named at once: which node, how it died, after which
round, and the command that resumes it. Its record (RUN/nodes/<id>.exit.json) is what the
results and the dashboard read for a node that left no result; the node removes it when it runs
again (`--resume`)."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from p2pfl.runtime.files import read_records, write_json_atomic
from p2pfl.runtime.run_folder import RunFolder

STOPPED_CODES = (-int(signal.SIGTERM), 130)  # stopped by the launcher or the terminal: a stop, not a death


def cause(code: int) -> str:
    """How a process with exit status `code` ended, in words (< 0: the signal that killed it)."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def last_round(path: Path) -> int:
    """The last round a node recorded (0: none)."""
    rounds = [int(r["round"]) for r in read_records(path, ("round",))]
    return max(rounds, default=0)


class Deaths:
    """The launcher's `on_exit`: a node's process ended without writing its result."""

    def __init__(self, out: Path, rounds: int, say: Callable[[str], None]) -> None:
        self.folder, self.rounds, self.say = RunFolder(out), rounds, say
        self.named: set[str] = set()

    def heard(self, node: str, code: int) -> None:
        if code == 0 or code in STOPPED_CODES or node in self.named or self.folder.node_result(node).is_file():
            return  # it ended on its own and wrote its result, or the run was stopped
        after = last_round(self.folder.node_rounds(node))
        resume = f"p2pfl node {self.folder.node_config(node)} --resume"
        record = {"id": node, "exit_code": code, "cause": cause(code), "after_round": after, "at": time.time(),
                  "resume": resume}
        write_json_atomic(self.folder.node_exit(node), record)
        self.named.add(node)
        self.say(f"{node} died ({record['cause']}) after round {after} of {self.rounds}; the other nodes go on. "
                 f"Resume it: {resume}")


def read_death(out: Path, node: str) -> dict[str, Any] | None:
    """The launcher's record of how `node` died, where it left no result since."""
    path = RunFolder(out).node_exit(node)
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except ValueError:
        return None
