"""Issue 30, finding 12: a poisoning peer's part is pulled back within `runtime.update_bound`
times the receiving node's own update, and named; robust aggregation for the baselines."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from p2pfl.errors import ConfigError
from p2pfl.models import part_state
from p2pfl.runtime.node.intake import RoundChecks
from p2pfl.runtime.peer_claims import (ClaimRefused, FlatCopy, bound_update, check_magnitude, flattened, own_norms,
                                      part_norm, update_norm)
from p2pfl.scenario.results import bounded_warning, far_bounded_peers, refused_peers
from p2pfl.scenario.schema import RuntimeSpec
from p2pfl.wire import NodeKey, Roster, open_message

from .helpers import build_in_process, model_frame, run_in_process, write_tiny
from .test_hardening import _serving


def test_a_part_outside_the_bound_lands_on_its_sphere_in_the_same_direction() -> None:
    g = torch.Generator().manual_seed(0)
    start = {"w": torch.randn(6, 4, generator=g), "b": torch.randn(4, generator=g), "steps": torch.tensor([3])}
    step = {"w": torch.randn(6, 4, generator=g), "b": torch.randn(4, generator=g)}
    far = {"w": start["w"] + 1000 * step["w"], "b": start["b"] + 1000 * step["b"], "steps": torch.tensor([9])}
    distance = update_norm(far, start)
    by_hand = math.sqrt(sum(float(((far[k].double() - start[k].double()) ** 2).sum()) for k in ("w", "b")))
    assert distance == pytest.approx(by_hand, rel=1e-12)

    out = bound_update(far, start, own_update=0.5, update_bound=3.0)
    assert out is not None
    clipped, was, bound = out
    assert was == pytest.approx(distance) and bound == pytest.approx(1.5)
    assert update_norm(clipped, start) == pytest.approx(1.5, rel=1e-5)
    moved = torch.cat([(clipped[k] - start[k]).flatten() for k in ("w", "b")])
    wanted = torch.cat([step[k].flatten() for k in ("w", "b")])
    assert float(torch.nn.functional.cosine_similarity(moved, wanted, dim=0)) == pytest.approx(1.0, abs=1e-5)
    assert torch.equal(clipped["steps"], far["steps"])  # integer tensors are not geometry

    near = {"w": start["w"] + 1e-3 * step["w"], "b": start["b"], "steps": start["steps"]}
    assert bound_update(near, start, own_update=0.5, update_bound=3.0) is None  # inside: untouched
    assert bound_update(far, start, own_update=0.5, update_bound=0.0) is None  # off
    assert bound_update(far, start, own_update=0.0, update_bound=3.0) is None  # no own step, no scale


def test_the_flattened_bound_equals_the_bound_tensor_by_tensor_on_mixed_dtypes() -> None:
    """The norms flatten a part into one float64 vector; against the per-tensor definition, with
    float16 and float32 tensors, an empty one, one the start lacks, and integers left alone."""
    g = torch.Generator().manual_seed(1)
    start = {"w": torch.randn(5, 3, generator=g), "h": torch.randn(7, generator=g).half(),
             "empty": torch.zeros(0), "n": torch.tensor([2])}
    far = {"w": start["w"] + 50 * torch.randn(5, 3, generator=g), "h": (start["h"].float() + 9).half(),
           "empty": torch.zeros(0), "n": torch.tensor([7]), "extra": torch.randn(2, generator=g)}
    keys = ("w", "h")
    by_hand = math.sqrt(sum(float(((far[k].double() - start[k].double()) ** 2).sum()) for k in keys))
    assert update_norm(far, start) == pytest.approx(by_hand, rel=1e-12)
    assert part_norm(far) == pytest.approx(math.sqrt(sum(float((far[k].double() ** 2).sum())
                                                         for k in ("w", "h", "extra"))), rel=1e-12)
    clipped, distance, bound = bound_update(far, start, own_update=1.0, update_bound=2.0)  # type: ignore[misc]
    assert distance == pytest.approx(by_hand, rel=1e-12) and bound == 2.0
    keep = bound / distance
    for k in keys:
        wanted = (start[k].double() + (far[k].double() - start[k].double()) * keep).to(far[k].dtype)
        assert clipped[k].dtype == far[k].dtype and clipped[k].shape == far[k].shape
        assert torch.equal(clipped[k], wanted)
    assert clipped["extra"] is far["extra"] and clipped["n"] is far["n"]  # not in the start, or not floating


def test_a_flat_round_start_and_a_flattened_part_give_the_bounds_bitwise_as_plain_dicts() -> None:
    """The node keeps its round start as a `FlatCopy` and flattens each peer part once for both
    bounds: every number (distances, pulled tensors, refusals) is the plain path's, bit for bit."""
    g = torch.Generator().manual_seed(2)
    state = {"conv": torch.randn(4, 2, 3, 3, generator=g), "bias": torch.randn(4, generator=g),
             "steps": torch.tensor([3]), "fc": torch.randn(10, 36, generator=g)}
    start = FlatCopy(state)
    assert start.flat is not None and start.flat_keys == ("conv", "bias", "fc")
    for k, v in state.items():
        assert torch.equal(start[k], v) and start[k].dtype == v.dtype and start[k] is not v
    assert start["fc"].data_ptr() == start.flat.data_ptr() + (72 + 4) * 4  # views into one buffer
    plain = {k: v.clone() for k, v in state.items()}
    own = {k: v + 0.01 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v for k, v in state.items()}
    assert update_norm(own, start) == update_norm(own, plain)
    for scale in (0.001, 1.0, 1000.0):  # inside the bound, just outside, far outside
        peer = {k: v + scale * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
                for k, v in state.items()}
        flat = flattened(peer)
        assert flat.keys == ("conv", "bias", "fc")
        for ratio in (1e-6, 1.0, 1e6):
            outcomes = []
            for piece in (None, flat):
                try:
                    check_magnitude("node-1", "full", peer, 1.0, ratio, piece)
                    outcomes.append("taken")
                except ClaimRefused:
                    outcomes.append("refused")
            assert outcomes[0] == outcomes[1], (scale, ratio)
        fast = bound_update(peer, start, own_update=0.05, update_bound=1.0, flat=flat)
        slow = bound_update(peer, plain, own_update=0.05, update_bound=1.0)
        assert (fast is None) == (slow is None), scale
        if fast is not None and slow is not None:
            assert fast[1:] == slow[1:]
            assert all(torch.equal(fast[0][k], slow[0][k]) for k in peer)
    for k, v in state.items():  # the round start is read, never changed
        assert torch.equal(start[k], v)


def test_own_norms_from_one_copy_are_part_norm_and_update_norm_exactly() -> None:
    g = torch.Generator().manual_seed(3)
    state = {"w": torch.randn(8, 5, generator=g), "b": torch.randn(5, generator=g), "n": torch.tensor([4])}
    own = {k: v + 0.1 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v for k, v in state.items()}
    for start in (FlatCopy(state), {k: v.clone() for k, v in state.items()}, {"w": state["w"]}):
        assert own_norms(own, start) == (part_norm(own), update_norm(own, start))
    assert own_norms(own, None) == (part_norm(own), None)
    assert own_norms({"n": torch.tensor([1])}, FlatCopy(state)) == (0.0, 0.0)


def test_a_flat_copy_of_mixed_dtypes_copies_each_tensor_and_the_bound_gathers_its_start() -> None:
    state = {"w": torch.randn(3, 2), "h": torch.randn(5).half(), "n": torch.tensor([1])}
    start = FlatCopy(state)
    assert start.flat is None and start.origin(["w", "h"]) is None
    assert all(torch.equal(start[k], v) and start[k].dtype == v.dtype for k, v in state.items())
    far = {"w": state["w"] + 100, "h": (state["h"].float() - 50).half(), "n": torch.tensor([1])}
    fast = bound_update(far, start, own_update=1.0, update_bound=1.0, flat=flattened(far))
    slow = bound_update(far, dict(state), own_update=1.0, update_bound=1.0)
    assert fast is not None and slow is not None and fast[1:] == slow[1:]
    assert all(torch.equal(fast[0][k], slow[0][k]) for k in far)
    # A part of a few of the start's tensors (a body, a head) pairs them with the start's views.
    head = {"w": far["w"]}
    fast = bound_update(head, FlatCopy({"w": state["w"], "b": torch.zeros(2)}), own_update=1.0, update_bound=1.0,
                        flat=flattened(head))
    slow = bound_update(head, {"w": state["w"]}, own_update=1.0, update_bound=1.0)
    assert fast is not None and slow is not None and torch.equal(fast[0]["w"], slow[0]["w"])


def test_bounding_a_float64_part_of_one_tensor_changes_neither_it_nor_the_start() -> None:
    start = {"w": torch.zeros(4, dtype=torch.float64)}
    far = {"w": torch.full((4,), 10.0, dtype=torch.float64)}
    near = {"w": torch.full((4,), 0.1, dtype=torch.float64)}
    assert bound_update(near, start, own_update=1.0, update_bound=1.0) is None
    clipped, _, _ = bound_update(far, start, own_update=1.0, update_bound=1.0)  # type: ignore[misc]
    assert float(clipped["w"].norm()) == pytest.approx(1.0)
    assert torch.equal(near["w"], torch.full((4,), 0.1, dtype=torch.float64))  # kept as sent
    assert torch.equal(far["w"], torch.full((4,), 10.0, dtype=torch.float64))
    assert torch.equal(start["w"], torch.zeros(4, dtype=torch.float64))


@pytest.mark.parametrize("value", [0.5, -1.0, float("inf"), float("nan")])
def test_a_wrong_update_bound_is_named(value: float) -> None:
    with pytest.raises(ConfigError) as err:
        RuntimeSpec(update_bound=value)
    assert err.value.field == "runtime.update_bound"


def test_a_node_pulls_a_sign_flipped_part_back_and_names_its_sender(tmp_path: Path) -> None:
    import dataclasses

    peer_key = NodeKey.generate()
    node = _serving(tmp_path, peer_key)
    intake = node.exchange.intake
    intake.settings = dataclasses.replace(intake.settings, update_bound=3.0, update_refuse=0.0)
    checks = RoundChecks(1, round_start={k: v.detach().clone() for k, v in node.model.state_dict().items()})
    with torch.no_grad():  # this node's own training this round: 0.01 on every body parameter
        for name, p in node.model.named_parameters():
            if name.startswith("body."):
                p.add_(0.01)
    start = part_state_of(checks.round_start, "body")
    own = update_norm(part_state(node.model, "body"), start)
    flipped = {k: v - 1000 * 0.02 if v.is_floating_point() else v for k, v in start.items()}  # sign-flipped x1000
    roster = Roster({"node-1": peer_key.public_hex})
    message = open_message(model_frame(peer_key, node, tensors=flipped), roster=roster, recipient="node-0", replay=None)
    taken = intake.peer_model(message, checks)
    assert update_norm(taken.tensors, start) == pytest.approx(3.0 * own, rel=1e-4)
    assert "node-1" in checks.bounded and "pulled back" in checks.bounded["node-1"][0]

    honest = {k: v + 0.015 if v.is_floating_point() else v for k, v in start.items()}  # 1.5x own: inside
    checks = RoundChecks(1, round_start=checks.round_start)
    message = open_message(model_frame(peer_key, node, seq=2, tensors=honest), roster=roster, recipient="node-0",
                           replay=None)
    assert all(torch.equal(intake.peer_model(message, checks).tensors[k], honest[k]) for k in honest)
    assert checks.bounded == {}


def test_a_part_far_over_the_bound_is_refused_and_named(tmp_path: Path) -> None:
    """A sign-flip x1000 pulled back still adds a reversed update as long as the node's own to every
    average; at `update_refuse` times over the bound the part is refused instead, and the sender named."""
    import dataclasses

    peer_key = NodeKey.generate()
    node = _serving(tmp_path, peer_key)
    intake = node.exchange.intake
    intake.settings = dataclasses.replace(intake.settings, update_bound=1.0, update_refuse=100.0)
    checks = RoundChecks(1, round_start={k: v.detach().clone() for k, v in node.model.state_dict().items()})
    with torch.no_grad():
        for name, p in node.model.named_parameters():
            if name.startswith("body."):
                p.add_(0.01)
    start = part_state_of(checks.round_start, "body")
    roster = Roster({"node-1": peer_key.public_hex})
    flipped = {k: v - 1000 * 0.01 if v.is_floating_point() else v for k, v in start.items()}  # 1000x over
    message = open_message(model_frame(peer_key, node, tensors=flipped), roster=roster, recipient="node-0", replay=None)
    with pytest.raises(ClaimRefused, match="1000 times over 1 x its own update"):
        intake.peer_model(message, checks)
    assert checks.bounded == {}
    farther = {k: v + 50 * 0.01 if v.is_floating_point() else v for k, v in start.items()}  # 50x over: pulled back
    message = open_message(model_frame(peer_key, node, seq=2, tensors=farther), roster=roster, recipient="node-0",
                           replay=None)
    intake.peer_model(message, checks)
    assert checks.bounded_factor["node-1"] == pytest.approx(50.0, rel=1e-3)


def test_a_wrong_update_refuse_is_named() -> None:
    for value in (-1.0, 0.5, float("inf"), float("nan")):
        with pytest.raises(ConfigError) as err:
            RuntimeSpec(update_refuse=value)
        assert err.value.field == "runtime.update_refuse"


def part_state_of(state: dict[str, torch.Tensor], part: str) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if k.startswith(part + ".")}


def _attacked_run(tmp_path: Path, update_bound: float, update_refuse: float = 0.0) -> tuple[list[dict], list[float]]:
    tmp_path.mkdir()
    scenario = write_tiny(tmp_path, nodes=3, rounds=2, samples=40, extra=(
        '\n[attack]\nkind = "sign-flip"\nnodes = [0]\nscale = 1000.0\n'))
    nodes, coordinator = build_in_process(scenario, tmp_path / "run", (f"runtime.update_bound={update_bound}",
                                                                       f"runtime.update_refuse={update_refuse}"))
    results, _, _ = run_in_process(nodes, coordinator)
    return results, [part_norm(part_state(n.model, "full")) for n in nodes[1:]]


def test_a_sign_flipping_peer_x1000_is_bounded_and_named(tmp_path: Path) -> None:
    """Review finding 12: Before: honest FedAvg nodes averaged node-0's update reversed x1000 and nobody noticed."""
    bounded_results, bounded_norms = _attacked_run(tmp_path / "bound", 3.0)
    open_results, open_norms = _attacked_run(tmp_path / "off", 0.0)
    for r in bounded_results[1:]:
        assert r["status"] == "ok"
        assert all("node-0" in (rec.get("peers_bounded") or {}) for rec in r["rounds"])
    assert not any(rec.get("peers_bounded") for r in open_results for rec in r["rounds"])
    warning = bounded_warning(refused_peers(bounded_results, "peers_bounded"), 6, far_bounded_peers(bounded_results))
    assert warning is not None and warning.startswith("warning: parts at least 10 times over runtime.update_bound")
    assert "node-0 (4 of 6 node-rounds)" in warning.splitlines()[0]  # the attacker is named in the warning
    # Unbounded, the reversed update x1000 weighs a third of each honest average: the models grow
    # by orders of magnitude; bounded, they stay the size of a trained model.
    assert max(bounded_norms) * 10 < min(open_norms)


def test_a_sign_flipping_peer_x1000_is_refused_at_the_default_factor(tmp_path: Path) -> None:
    """Review finding 12: Pulled back, the reversed update still weighs in every average; at the default
    `update_refuse` it is refused in every round, named, and no honest model takes it in."""
    results, norms = _attacked_run(tmp_path / "refuse", 1.0, 100.0)
    _, bounded_norms = _attacked_run(tmp_path / "bound", 1.0, 0.0)
    for r in results[1:]:
        assert r["status"] == "ok"
        for rec in r["rounds"]:
            assert "times over 1 x its own update" in (rec.get("peers_refused") or {}).get("node-0", "")
            assert "node-0" not in (rec.get("peers_bounded") or {}) and "node-0" not in rec["arrived"]
    assert refused_peers(results) == {"node-0": 4}
    assert max(norms) < max(bounded_norms) * 2


def test_update_bound_0_survives_the_run_folder_and_old_runs_count_as_unbounded(tmp_path: Path) -> None:
    """A run asked for without the bound must run without it: the resolved scenario the nodes
    read keeps 0 (it was once left out, and the nodes read the default 3). A run folder made
    before the field existed is compared and resumed as 0, how it was made."""
    import json

    from p2pfl.scenario.schema import load_scenario, scenario_differences

    scenario = load_scenario(write_tiny(tmp_path, nodes=2, rounds=1), ["runtime.update_bound=0"])
    stored = json.loads(json.dumps(scenario.to_dict()))
    assert stored["runtime"]["update_bound"] == 0
    (tmp_path / "scenario.json").write_text(json.dumps(stored))
    assert load_scenario(tmp_path / "scenario.json").runtime.update_bound == 0
    older = json.loads(json.dumps(stored))
    del older["runtime"]["update_bound"]
    (tmp_path / "older.json").write_text(json.dumps(older))
    assert load_scenario(tmp_path / "older.json").runtime.update_bound == 0
    assert scenario_differences(older, scenario) == []
    assert scenario_differences(older, load_scenario(write_tiny(tmp_path, nodes=2, rounds=1),
                                                     ["runtime.update_bound=1"])) == [
        "runtime.update_bound", "runtime.update_refuse"]
    # A bounded run made before refusals existed pulled every part back: it matches update_refuse = 0 only.
    bounded = load_scenario(write_tiny(tmp_path, nodes=2, rounds=1),
                            ["runtime.update_bound=1", "runtime.update_refuse=0"]).to_dict()
    assert bounded["runtime"]["update_refuse"] == 0
    del bounded["runtime"]["update_refuse"]
    assert scenario_differences(bounded, load_scenario(write_tiny(tmp_path, nodes=2, rounds=1),
                                                       ["runtime.update_bound=1", "runtime.update_refuse=0"])) == []
    assert scenario_differences(bounded, load_scenario(write_tiny(tmp_path, nodes=2, rounds=1),
                                                       ["runtime.update_bound=1"])) == ["runtime.update_refuse"]


def test_honest_peers_pulled_back_a_little_get_a_note_not_a_warning() -> None:
    """The quickstart (honest FedAvg, Dirichlet 1.0) once ended on "warning: ... a poisoning peer":
    honest parts lie up to a few times over the bound; only a part far over it is warned about."""
    rounds = [{"peers_bounded": {"node-1": "...", "node-2": "..."}, "peers_bounded_factor": {"node-1": 1.3, "node-2": 1500.0}},
              {"peers_bounded": {"node-1": "..."}, "peers_bounded_factor": {"node-1": 9.99}},
              {"peers_bounded": {"node-3": "..."}}]  # a record from before the factor was kept
    nodes = [{"rounds": rounds}]
    assert far_bounded_peers(nodes) == {"node-2": 1}
    lines = bounded_warning(refused_peers(nodes, "peers_bounded"), 3, far_bounded_peers(nodes)).splitlines()
    assert lines[0].startswith("warning: ") and "node-2 (1 of 3 node-rounds)" in lines[0] and "node-1" not in lines[0]
    assert lines[1].startswith("note: ") and "node-1 (2 of 3 node-rounds), node-3 (1 of 3 node-rounds)" in lines[1]
    honest = bounded_warning({"node-1": 2}, 3, {})
    assert honest is not None and honest.startswith("note: ") and "warning" not in honest


def test_a_thousand_nodes_pulled_back_are_named_ten_at_a_time() -> None:
    near = {f"node-{i:03d}": 1 + i % 7 for i in range(1000)}
    note = bounded_warning(near, 2000, {})
    assert note is not None and note.count("node-rounds)") == 10 and "and 990 more peers" in note
    assert "over: node-006 (7 of 2000 node-rounds), node-013 (7 of" in note  # the most frequent first
    assert "more peers" not in bounded_warning({"node-1": 2}, 3, {})


@pytest.mark.slow
def test_a_sign_flip_just_under_the_refusal_is_dropped_after_three_rounds(tmp_path: Path) -> None:
    """Review finding 7 of issue 48: A real run: node 0 publishes its update sign-flipped x90 (over the bound, under the 100x
    refusal). Each honest node pulls it back three rounds, then asks it no more."""
    from p2pfl.scenario.launcher import run_scenario

    from .helpers import write_tiny

    scenario = write_tiny(tmp_path, nodes=4, rounds=5, samples=60,
                          extra='\n[attack]\nkind = "sign-flip"\nnodes = [0]\nscale = 90.0\n')
    results, code = run_scenario(scenario, tmp_path / "run", ["runtime.update_bound=1"], progress=False, quiet=True)
    assert code == 0
    for node in results["nodes"][1:]:
        rounds = node["rounds"]
        # 77 to 113 times over: pulled back, or refused where over 100
        assert all(r.get("peers_bounded_factor", {}).get("node-0", 0) >= 10 or "node-0" in r.get("peers_refused", {})
                   for r in rounds[:3])
        assert rounds[2]["neighbours"]["distrusted"] == ["node-0"]
        assert all("node-0" not in r["arrived"] and "node-0" not in r.get("peers_refused", {}) for r in rounds[3:])
