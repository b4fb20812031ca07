"""algorithm.safeguard: after aggregation a node keeps the mix of its own trained model and the
aggregate that scores best on its validation split."""

from __future__ import annotations

import pytest
import torch

from p2pfl.errors import ConfigError
from p2pfl.runtime.safeguard import GRID, choose, mix
from p2pfl.scenario.schema import load_scenario

from .helpers import build_in_process, run_in_process, write_tiny


def _states() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    own = {"w": torch.randn(4, 3), "b": torch.randn(3), "count": torch.tensor(5)}
    agg = {"w": torch.randn(4, 3), "b": torch.randn(3), "count": torch.tensor(9)}
    return own, agg


def test_mix_is_the_convex_combination_and_the_ends_are_the_two_models() -> None:
    own, agg = _states()
    for w in GRID:
        mixed = mix(own, agg, w)
        for name in ("w", "b"):
            torch.testing.assert_close(mixed[name], w * agg[name] + (1 - w) * own[name])
        assert int(mixed["count"]) == (9 if w >= 0.5 else 5)
    assert all(torch.equal(mix(own, agg, 0.0)[k], own[k]) for k in own)
    assert all(torch.equal(mix(own, agg, 1.0)[k], agg[k]) for k in agg)


def test_choose_takes_the_best_accuracy_then_the_lowest_loss_then_the_most_aggregate() -> None:
    own, agg = _states()
    target = mix(own, agg, 0.25)["w"]

    def score(state):  # closest to the 0.25 mix is the most accurate
        return -float((state["w"] - target).abs().sum()), 0.0

    assert choose(own, agg, score).weight == 0.25
    assert choose(own, agg, lambda s: (0.5, 1.0)).weight == 1.0  # all tied: keep learning from peers
    losses = {w: (0.5, abs(w - 0.5)) for w in GRID}
    assert choose(own, agg, lambda s: losses[_weight_of(s, own, agg)]).weight == 0.5
    choice = choose(own, agg, lambda s: (1.0 - _weight_of(s, own, agg), 0.0))
    assert choice.weight == 0.0 and choice.kept_own


def _weight_of(state, own, agg) -> float:
    return min(GRID, key=lambda w: float((mix(own, agg, w)["w"] - state["w"]).abs().sum()))


def test_safeguard_is_refused_where_it_cannot_apply(tmp_path) -> None:
    with pytest.raises(ConfigError, match="algorithm.safeguard"):
        load_scenario(write_tiny(tmp_path, algorithm="di"), ["algorithm.safeguard=true"])
    with pytest.raises(ConfigError, match="val_fraction"):
        load_scenario(write_tiny(tmp_path), ["algorithm.safeguard=true", "data.val_fraction=0"])


@pytest.mark.slow
def test_with_two_classes_per_node_the_safeguard_keeps_what_fedavg_loses(tmp_path) -> None:
    """Each node sees two classes: its own model is good on its own data, the FedAvg
    average of five two-class models is not. With the safeguard the kept model is never
    much worse than the node's own on its test split; without it, it is."""
    split = ('data.partition="pathological"', "data.classes_per_node=2", "data.val_fraction=0.2")
    gaps = {}
    for safeguard in (False, True):
        nodes, _ = build_in_process(write_tiny(tmp_path, nodes=5, rounds=2, samples=90), tmp_path / str(safeguard),
                                    (*split, f"algorithm.safeguard={str(safeguard).lower()}"))
        results, _, _ = run_in_process(nodes, None)
        assert all(r["status"] == "ok" for r in results)
        rounds = [r for n in results for r in n["rounds"]]
        assert all(("safeguard_kept_own" in r) == safeguard for r in rounds)
        gaps[safeguard] = min(r["test_acc_aggregated"] - r["test_acc"] for r in rounds)
        if safeguard:
            assert all(r["safeguard_kept_own"] == (r["safeguard_weight"] == 0.0) for r in rounds)
    assert gaps[True] >= -0.05, gaps
    assert gaps[False] < -0.3, gaps  # what the safeguard prevents
