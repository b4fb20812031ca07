"""placement = "shared": nodes as asyncio tasks in a few worker processes, still talking over
the signed HTTP wire. Same scenario and seed, same results as one process per node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from p2pfl.runtime.checkpoint import load_checkpoint
from p2pfl.scenario.launcher import run_scenario
from p2pfl.wire import NodeKey

from .helpers import write_tiny

pytestmark = pytest.mark.slow


def _run(tmp_path: Path, algorithm: str, placement: str) -> tuple[Path, dict]:
    (tmp_path / placement).mkdir(parents=True, exist_ok=True)
    scenario = write_tiny(tmp_path / placement, nodes=4, rounds=2, samples=60, algorithm=algorithm, timeout=30.0)
    out = tmp_path / placement / "run"
    results, code = run_scenario(scenario, out, [f'runtime.placement="{placement}"', "runtime.workers=2"],
                                 progress=False, quiet=True)
    assert code == 0, [(n["id"], n.get("error")) for n in results["nodes"]]
    return out, results


@pytest.mark.parametrize("algorithm", ["local", "fedavg"])
def test_shared_placement_gives_the_same_run_as_one_process_per_node(tmp_path: Path, algorithm: str) -> None:
    (out_p, process), (out_s, shared) = _run(tmp_path, algorithm, "process"), _run(tmp_path, algorithm, "shared")
    assert sorted(p.name for p in (out_s / "logs").glob("*.log")) == ["worker-0.log", "worker-1.log"]
    for a, b in zip(process["nodes"], shared["nodes"]):
        assert a["id"] == b["id"] and a["status"] == b["status"] == "ok"
        for ra, rb in zip(a["rounds"], b["rounds"]):
            assert (ra["test_acc"], ra["test_loss"], ra["train_loss"]) == (rb["test_acc"], rb["test_loss"], rb["train_loss"])
            assert ra["arrived"] == rb["arrived"]
        key = NodeKey.load(out_p / "keys" / f"{a['id']}.key").public_hex
        key_s = NodeKey.load(out_s / "keys" / f"{b['id']}.key").public_hex
        state_p = load_checkpoint(out_p / "checkpoints" / f"{a['id']}.p2pfl", node_id=a["id"], public_hex=key)
        state_s = load_checkpoint(out_s / "checkpoints" / f"{b['id']}.p2pfl", node_id=b["id"], public_hex=key_s)
        for name, tensor in state_p.items():
            assert torch.equal(tensor, state_s[name]), (a["id"], name)
    assert json.loads((out_s / "scenario.json").read_text())["runtime"]["placement"] == "shared"
