"""Issue 48, finding 4: buffers are parts. A peer serving BatchNorm running variances that are not
positive is refused; tiny positive ones are pulled back with the node's own buffers' move as the
bound; and an aggregate that scores a non-finite loss however it came about is rolled back to the
node's own model, naming the peers it took in. Real rounds: the node's own round loop, its wire
and its intake, three nodes in this process."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch
from torch import nn

from p2pfl.models import SplitModel
from p2pfl.runtime.peer_claims import ClaimRefused, check_variances

from .helpers import build_in_process, run_in_process, write_tiny

HERE = "tests.runtime.test_buffers"


def bn_net(in_channels: int, image_size: int, num_classes: int) -> SplitModel:
    """A body with BatchNorm: running means and variances that travel with the weights."""
    body = nn.Sequential(nn.Conv2d(in_channels, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * image_size ** 2, 16), nn.BatchNorm1d(16), nn.ReLU())
    return SplitModel(body, 16, num_classes)


class Gain(nn.Module):
    """Scales by the square root of a buffer: finite values of it can still make a NaN."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.register_buffer("gain", torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gain.sqrt()


def gain_net(in_channels: int, image_size: int, num_classes: int) -> SplitModel:
    return SplitModel(nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size ** 2, 16), Gain(16), nn.ReLU()),
                      16, num_classes)


class BufferAttack:
    """Node 0 publishes its honest model with one kind of buffer replaced."""

    def __init__(self, suffix: str, value: float) -> None:
        self.suffix, self.value = suffix, value

    def published(self, parts: Mapping[str, Mapping[str, torch.Tensor]], start: Mapping[str, torch.Tensor],
                  round_: int) -> dict[str, dict[str, torch.Tensor]]:
        return {p: {k: torch.full_like(v, self.value) if k.endswith(self.suffix) else v for k, v in t.items()}
                for p, t in parts.items()}


def test_a_variance_must_be_positive_and_finite() -> None:
    good = {"body.1.running_var": torch.tensor([0.5, 2.0]), "body.1.running_mean": torch.tensor([-3.0, 0.0])}
    check_variances("node-1", "body", good)
    for bad in (-1.0, 0.0, float("nan"), float("inf")):
        with pytest.raises(ClaimRefused, match="running_var"):
            check_variances("node-1", "body", {**good, "body.1.running_var": torch.tensor([1.0, bad])})


def test_a_part_over_both_bounds_names_each_count_with_its_distance_and_bound() -> None:
    """Buffers and weights both far from the round start: the round names both counts, neither
    overwriting the other, and keeps the larger factor."""
    import dataclasses

    from p2pfl.runtime.node.intake import Intake, RoundChecks
    from p2pfl.runtime.node.neighbours import Neighbours

    from .node.kit import SETTINGS

    torch.manual_seed(0)
    model = bn_net(1, 4, 3)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():  # this node's own round: weights and buffers each moved by a known amount
        for k, v in model.state_dict().items():
            if v.is_floating_point():
                v.add_(0.01)
    intake = Intake(model, 10, torch.device("cpu"), dataclasses.replace(SETTINGS, update_bound=1.0), {},
                    Neighbours(["node-1"]))
    checks = RoundChecks(1, round_start=start)
    peer = {k: v + (50.0 if "running" in k else 0.05) if v.is_floating_point() else v for k, v in start.items()}
    within = intake.bounded("node-1", "full", intake.bounded_buffers("node-1", "full", peer, checks), checks)
    reasons = checks.bounded["node-1"]
    assert len(reasons) == 2 and "buffers" in reasons[0] and "buffers" not in reasons[1], reasons
    assert all("moved" in r and "x its own" in r for r in reasons)
    buffer_keys = intake.buffer_keys["full"]
    own_buffers = float(torch.linalg.vector_norm(torch.cat([(model.state_dict()[k] - start[k]).flatten()
                                                            for k in buffer_keys])))
    buffers_far = float(torch.linalg.vector_norm(torch.cat([(peer[k] - start[k]).flatten() for k in buffer_keys])))
    assert checks.bounded_factor["node-1"] >= round(buffers_far / own_buffers, 3) - 1e-3
    moved = torch.cat([(within[k] - start[k]).flatten().double() for k in start if start[k].is_floating_point()])
    own = torch.cat([(model.state_dict()[k] - start[k]).flatten().double() for k in start if start[k].is_floating_point()])
    assert float(torch.linalg.vector_norm(moved)) <= float(torch.linalg.vector_norm(own)) * (1 + 1e-5)


def _run(tmp_path: Path, model: str, attack: BufferAttack, *overrides: str) -> list[dict]:
    scenario = write_tiny(tmp_path, nodes=3, rounds=3, samples=60)
    nodes, _ = build_in_process(scenario, tmp_path / "run", (f'model.name="{HERE}:{model}"', *overrides))
    nodes[0].parts.attack = attack
    results, _, _ = run_in_process(nodes, None)
    assert [r["status"] for r in results] == ["ok"] * 3, [r.get("error") for r in results]
    return results


def test_negative_running_variances_are_refused_and_never_reach_a_checkpoint(tmp_path: Path) -> None:
    """Review finding 4: Before: taken in, NaN loss from round 1, accuracy 0.108, status ok, negative variances checkpointed."""
    from p2pfl.runtime.checkpoint import load_checkpoint
    from p2pfl.wire import NodeKey

    results = _run(tmp_path, "bn_net", BufferAttack("running_var", -1.0), "runtime.update_bound=1")
    for node in results[1:]:
        for record in node["rounds"]:
            assert "running_var" in record["peers_refused"]["node-0"]
            assert math.isfinite(record["test_loss"])
        state = load_checkpoint(tmp_path / "run" / "checkpoints" / f"{node['id']}.p2pfl", node_id=node["id"],
                                public_hex=NodeKey.load(tmp_path / "run" / "keys" / f"{node['id']}.key").public_hex)
        assert all(bool((v > 0).all()) for k, v in state.items() if k.endswith("running_var"))


def test_tiny_running_variances_are_pulled_back_by_the_buffers_own_bound(tmp_path: Path) -> None:
    """Review finding 4: 1e-30 is a positive variance; lumped with the weights it lay within the part's bound. Bounded
    as buffers, it is pulled back, named, and the honest nodes' losses stay finite."""
    results = _run(tmp_path, "bn_net", BufferAttack("running_var", 1e-30), "runtime.update_bound=1")
    for node in results[1:]:
        # the buffers' own reason, whether or not the weights' move also lies over its bound (a tie)
        assert all(any("buffers" in reason for reason in r["peers_bounded"].get("node-0", []))
                   for r in node["rounds"]), node["rounds"]
        assert all(math.isfinite(r["test_loss"]) for r in node["rounds"])


def test_an_aggregate_that_scores_nan_is_rolled_back_naming_the_peers(tmp_path: Path) -> None:
    """Review finding 4: No bound (as the papers' scenarios run) and a buffer no rule knows: the mean of a gain of -30
    and two of 1 is negative, its root NaN. The node keeps its own model and says whom it took in."""
    results = _run(tmp_path, "gain_net", BufferAttack("gain", -30.0), "runtime.update_bound=0")
    for node in results[1:]:
        for record in node["rounds"]:
            assert "non-finite loss" in record["aggregate_refused"] and "node-0" in record["aggregate_refused"]
            assert math.isfinite(record["test_loss"]) and record["test_acc_aggregated"] == record["test_acc"]
