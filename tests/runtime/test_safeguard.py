"""algorithm.safeguard: after aggregation a node keeps the mix of its own trained model and the
aggregate that scores best on its validation split (`true`), or deploys its Local model unless
validation shows the federated one is better (`"local"`)."""

from __future__ import annotations

import json

import pytest
import torch

from p2pfl.errors import ConfigError
from p2pfl.report.tables import deployed_at_level
from p2pfl.core.evidence import disagreements, evidence_z, prefer_federated
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
    for kind in ("true", '"local"'):
        with pytest.raises(ConfigError, match="algorithm.safeguard"):
            load_scenario(write_tiny(tmp_path, algorithm="di"), [f"algorithm.safeguard={kind}"])
        with pytest.raises(ConfigError, match="val_fraction"):
            load_scenario(write_tiny(tmp_path), [f"algorithm.safeguard={kind}", "data.val_fraction=0"])
    with pytest.raises(ConfigError, match="algorithm.safeguard.*'always'"):
        load_scenario(write_tiny(tmp_path), ['algorithm.safeguard="always"'])
    with pytest.raises(ConfigError, match="algorithm.safeguard"):
        load_scenario(write_tiny(tmp_path), ["algorithm.safeguard=1"])


def test_safeguard_kinds_round_trip_through_the_resolved_scenario(tmp_path) -> None:
    for written, kind, stored in (("false", None, False), ("true", "mix", True), ('"mix"', "mix", True),
                                  ('"local"', "local", "local")):
        sc = load_scenario(write_tiny(tmp_path), [f"algorithm.safeguard={written}"])
        assert sc.algorithm.safeguard == kind
        assert sc.to_dict()["algorithm"]["safeguard"] == stored  # `true` as before: old run folders still match
        assert load_scenario(write_tiny(tmp_path), [f"algorithm.safeguard={json.dumps(stored)}"]).algorithm.safeguard == kind


def test_safeguard_level_is_the_local_safeguards_and_a_level_in_0_1(tmp_path) -> None:
    sc = load_scenario(write_tiny(tmp_path), ['algorithm.safeguard="local"', "algorithm.safeguard_level=0.2"])
    assert sc.algorithm.safeguard_level == 0.2 and sc.to_dict()["algorithm"]["safeguard_level"] == 0.2
    unset = load_scenario(write_tiny(tmp_path), ['algorithm.safeguard="local"'])
    assert unset.algorithm.safeguard_level is None and unset.to_dict()["algorithm"]["safeguard_level"] is None
    for bad in ("0", "1", "1.5", "-0.1", "nan"):
        with pytest.raises(ConfigError, match="algorithm.safeguard_level.*in \\(0, 1\\)"):
            load_scenario(write_tiny(tmp_path), ['algorithm.safeguard="local"', f"algorithm.safeguard_level={bad}"])
    with pytest.raises(ConfigError, match="algorithm.safeguard_level.*expected float"):
        load_scenario(write_tiny(tmp_path), ['algorithm.safeguard="local"', 'algorithm.safeguard_level="5%"'])
    for kind in ("true", "false"):
        with pytest.raises(ConfigError, match="algorithm.safeguard_level.*\"local\""):
            load_scenario(write_tiny(tmp_path), [f"algorithm.safeguard={kind}", "algorithm.safeguard_level=0.1"])


def test_evidence_z_is_the_normal_quantile_of_the_level() -> None:
    assert evidence_z(0.5) == 0.0
    assert evidence_z(0.05) == pytest.approx(1.6449, abs=1e-4) and evidence_z(0.2) == pytest.approx(0.8416, abs=1e-4)
    for bad in (0.0, 1.0, float("nan")):
        with pytest.raises(ValueError, match="level"):
            evidence_z(bad)


def _correct(pattern: str) -> torch.Tensor:
    return torch.tensor([c == "1" for c in pattern])


def _prefer(federated: str, local: str, **kw) -> bool:
    return prefer_federated(*disagreements(_correct(federated), _correct(local)), **kw)


def test_prefer_federated_needs_evidence_on_the_samples_where_the_models_disagree() -> None:
    same = _correct("1101100111")
    assert disagreements(same, same) == (0, 0) and not prefer_federated(0, 0)  # a tie keeps Local
    assert disagreements(_correct("1100110000"), _correct("0100001100")) == (3, 2)
    # Agreement, right or wrong, is no evidence: only the disagreements count.
    assert not _prefer("1100000000", "0000000000")  # 2 - 0 <= 1.645 * sqrt(2)
    assert _prefer("1110000000", "0000000000")      # 3 - 0 >  1.645 * sqrt(3)
    assert _prefer("1111111110", "0000000001")      # 9 - 1 >  1.645 * sqrt(10)
    assert not _prefer("1111111000", "0000000111")  # 7 - 3 <= 1.645 * sqrt(10)
    assert not _prefer("0000000000", "1110000000")  # Local better: never federated
    assert _prefer("1100000000", "0000000000", z=1.0)  # a laxer level
    with pytest.raises(ValueError, match="different splits"):
        disagreements(_correct("11"), _correct("111"))


def test_prefer_federated_errs_at_about_its_level_when_the_models_are_equally_good() -> None:
    """Under "equally good" (each disagreement a fair coin) the federated model is preferred in
    about 5 % of draws: the one-sided level of EVIDENCE_Z, checked by simulation."""
    g = torch.Generator().manual_seed(0)
    draws = 4000
    preferred = 0
    for _ in range(draws):
        both = torch.rand(200, generator=g) < 0.8  # where they agree: both right or both wrong
        disagree = torch.rand(200, generator=g) < 0.15
        coin = torch.rand(200, generator=g) < 0.5  # where they disagree: which one is right
        preferred += prefer_federated(*disagreements(torch.where(disagree, coin, both), torch.where(disagree, ~coin, both)))
    assert 0.02 < preferred / draws < 0.065, preferred / draws


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


@pytest.mark.slow
def test_the_local_safeguard_deploys_exactly_the_local_run_or_exactly_the_federated_run(tmp_path) -> None:
    """The Local reference follows the `local` run draw for draw, the federated model the run
    without the safeguard: both bit for bit. Each round the node deploys one of the two."""
    split = ('data.partition="pathological"', "data.classes_per_node=2", "data.val_fraction=0.3")
    runs = {}
    for name, extra in (("local", ('algorithm.name="local"',)), ("fedavg", ()),
                        ("guarded", ('algorithm.safeguard="local"',))):
        nodes, _ = build_in_process(write_tiny(tmp_path, nodes=5, rounds=3, samples=90), tmp_path / name,
                                    (*split, *extra))
        results, _, _ = run_in_process(nodes, None)
        assert all(r["status"] == "ok" for r in results), [r["error"] for r in results]
        runs[name] = {r["id"]: r["rounds"] for r in results}
    kept = []
    for node, rounds in runs["guarded"].items():
        for r, local, fedavg in zip(rounds, runs["local"][node], runs["fedavg"][node]):
            assert r["test_acc_local"] == local["test_acc"]
            assert r["test_acc_federated"] == fedavg["test_acc"]
            assert r["test_acc_federated_aggregated"] == fedavg["test_acc_aggregated"]
            assert r["test_acc"] == (local["test_acc"] if r["safeguard_kept_own_trained"] else fedavg["test_acc"])
            assert r["test_acc_aggregated"] == (local["test_acc"] if r["safeguard_kept_own"]
                                                else fedavg["test_acc_aggregated"])
            kept.append(r["safeguard_kept_own"])
            wins, losses = r["safeguard_evidence"]
            assert r["safeguard_kept_own"] == (wins - losses <= 1.645 * (wins + losses) ** 0.5)
    assert any(kept), "on two classes per node the FedAvg average should lose to Local somewhere"



@pytest.mark.slow
def test_a_laxer_level_deploys_on_thinner_evidence_and_the_records_decide_any_level_again(tmp_path) -> None:
    """At level 0.5 (z = 0) a node deploys the federated model whenever it wins more validation
    samples than it loses. Both tracks are the same at every level, so the records of the run at
    0.05, decided again at 0.5, are the run at 0.5 and back: what `p2pfl report` relies on. On
    IID data the federated and Local models are close, so the two levels disagree somewhere."""
    runs = {}
    for name, level in (("strict", ()), ("lax", ("algorithm.safeguard_level=0.5",))):
        nodes, _ = build_in_process(write_tiny(tmp_path, nodes=5, rounds=3, samples=90), tmp_path / name,
                                    ("data.val_fraction=0.3", 'algorithm.safeguard="local"', *level))
        results, _, _ = run_in_process(nodes, None)
        assert all(r["status"] == "ok" for r in results), [r["error"] for r in results]
        runs[name] = {r["id"]: r["rounds"] for r in results}
    laxer = 0
    for node, rounds in runs["lax"].items():
        for r, strict in zip(rounds, runs["strict"][node]):
            assert r["safeguard_evidence"] == strict["safeguard_evidence"]
            for aggregated, key, kept in ((False, "test_acc", "safeguard_kept_own_trained"),
                                          (True, "test_acc_aggregated", "safeguard_kept_own")):
                wins, losses = r["safeguard_evidence" if aggregated else "safeguard_evidence_trained"]
                assert r[kept] == (wins <= losses)
                assert deployed_at_level(strict, 0.5, aggregated)[0] == r[key]
                assert deployed_at_level(r, 0.05, aggregated)[0] == strict[key]
                laxer += strict[kept] and not r[kept]
    assert laxer, "some node should have been certified at 0.5 and not at 0.05"
