"""A node killed mid-run does not stop the others: they skip it and finish their rounds."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from p2pfl.assembly import PROGRESS_PREFIX
from p2pfl.scenario.launcher import write_run_folder
from p2pfl.scenario.schema import load_scenario

from .helpers import write_tiny

pytestmark = pytest.mark.slow


def test_survivors_finish_when_a_peer_dies(tmp_path):
    scenario = load_scenario(write_tiny(tmp_path, rounds=4, timeout=3.0))
    out = tmp_path / "run"
    node_paths, _ = write_run_folder(scenario, out)
    procs = {
        p.stem: subprocess.Popen([sys.executable, "-m", "p2pfl", "node", str(p)], stdout=subprocess.PIPE,
                                 stderr=open(out / "logs" / f"{p.stem}.log", "wb"), text=True)
        for p in node_paths
    }
    victim = procs["node-2"]
    try:
        assert victim.stdout is not None
        for line in victim.stdout:  # kill it right after its first round
            if line.startswith(PROGRESS_PREFIX):
                victim.kill()
                break
        victim.wait(timeout=30)
        for name in ("node-0", "node-1"):
            assert procs[name].wait(timeout=240) == 0, (out / "logs" / f"{name}.log").read_text()[-3000:]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    for name in ("node-0", "node-1"):
        result = json.loads((out / "nodes" / f"{name}.result.json").read_text())
        assert result["status"] == "ok"
        assert [r["round"] for r in result["rounds"]] == [1, 2, 3, 4]
        # After the kill the dead peer is skipped; the live one keeps answering.
        assert "node-2" not in result["rounds"][-1]["arrived"]
        assert [p for p in result["rounds"][-1]["arrived"]] == [n for n in ("node-0", "node-1") if n != name]
        # Once found gone, the dead peer costs one quick status probe per round, not fetch_timeout_s (3 s).
        assert result["rounds"][-1]["time"]["exchange_s"] < 1.5, result["rounds"][-1]["time"]
