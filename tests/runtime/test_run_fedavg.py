"""Real node processes on 127.0.0.1: FedAvg end to end, byte accounting against the model size."""

from __future__ import annotations

import json

import pytest
import torch

from p2pfl.data import DataSpec, build_partition
from p2pfl.models import build_model, part_state
from p2pfl.report import make_report
from p2pfl.runtime.checkpoint import load_checkpoint
from p2pfl.runtime.timing import PHASES, compute_fraction
from p2pfl.scenario.launcher import run_scenario
from p2pfl.wire import NodeKey, encode_body

from .helpers import write_tiny

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fedavg_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fedavg")
    # FedAvg as printed: every node averages the same models, so all end with the same body. The
    # norm bound (runtime.update_bound, on by default) measures peers against each node's own
    # update, so bounded nodes would differ by their clipping (test_update_bound.py covers it).
    results, code = run_scenario(write_tiny(tmp), tmp / "run", ["runtime.update_bound=0"], progress=False, quiet=True)
    return tmp / "run", results, code


def test_every_node_finishes(fedavg_run):
    run, results, code = fedavg_run
    assert code == 0
    assert [n["status"] for n in results["nodes"]] == ["ok"] * 3
    assert all(len(n["rounds"]) == 2 for n in results["nodes"])
    on_disk = json.loads((run / "results.json").read_text())
    assert on_disk["summary"]["nodes_ok"] == 3
    for n in on_disk["nodes"]:
        for r in n["rounds"]:
            assert {"round", "test_acc", "train_loss", "bytes_sent", "bytes_received", "param_bytes_sent",
                    "param_bytes_received", "wall_s"} <= set(r)
    assert len(on_disk["ground_truth"]["nodes"]) == 3


def test_fedavg_nodes_end_with_identical_bodies(fedavg_run):
    run, results, _ = fedavg_run
    assert all(sorted(r["arrived"]) == sorted(set(x["id"] for x in results["nodes"]) - {n["id"]})
               for n in results["nodes"] for r in n["rounds"]), "every peer answered every round"
    states = []
    for n in results["nodes"]:
        public = NodeKey.load(run / "keys" / f"{n['id']}.key").public_hex
        states.append(load_checkpoint(run / "checkpoints" / f"{n['id']}.p2pfl", node_id=n["id"], public_hex=public))
    for other in states[1:]:
        for name, tensor in states[0].items():
            if name.startswith("body."):
                torch.testing.assert_close(other[name], tensor, rtol=0, atol=1e-6)


def test_bytes_match_model_size_times_messages(fedavg_run):
    _, results, _ = fedavg_run
    sc = results["scenario"]
    part = build_partition(DataSpec.from_dict(sc["data"]), 3, 0)
    model = build_model("cnn", part.in_channels, part.image_size, part.num_classes)
    model_bytes = encode_body(part_state(model, "full")).param_bytes
    assert model_bytes == sum(t.numel() * t.element_size() for t in model.state_dict().values())
    peers = len(results["nodes"]) - 1
    for n in results["nodes"]:
        for r in n["rounds"]:
            assert r["param_bytes_received"] == peers * model_bytes
            overhead = r["bytes_received"] - r["param_bytes_received"]
            assert 0 < overhead < peers * 2048, "metadata is a small header per message"
    total_param_sent = sum(n["totals"]["param_bytes_sent"] for n in results["nodes"])
    total_param_received = sum(n["totals"]["param_bytes_received"] for n in results["nodes"])
    assert total_param_sent == total_param_received == 2 * 3 * peers * model_bytes


def test_round_time_is_split_into_phases_that_sum_to_the_wall(fedavg_run):
    run, results, _ = fedavg_run
    for n in results["nodes"]:
        for r in n["rounds"]:
            phases = r["time"]
            assert set(phases) == {f"{p}_s" for p in PHASES}
            assert all(v >= 0 for v in phases.values())
            assert sum(phases.values()) == pytest.approx(r["wall_s"], rel=0.05)
            assert phases["train_s"] > 0 and phases["evaluate_s"] > 0 and phases["exchange_s"] > 0
    expected = compute_fraction(r for n in results["nodes"] for r in n["rounds"])
    assert results["summary"]["compute_fraction"] == pytest.approx(expected)
    assert 0 < expected <= 1
    picture = run / "report" / "round_time.png"
    assert picture in make_report(run) and picture.stat().st_size > 10_000


def test_fedavg_by_default_is_the_sample_weighted_mean_of_the_trained_models(tmp_path):
    """A name computes what it names: with the scenario's defaults, a node's FedAvg aggregate is
    Σ n_i θ_i / Σ n_i over its own and its peers' trained models (of unequal sizes), computed here
    by hand: no defence pulls a peer back or changes a weight unless the scenario turns it on."""
    from p2pfl.algorithms.fedavg import FedAvg

    from .helpers import build_in_process, run_in_process

    path = write_tiny(tmp_path, nodes=3, rounds=1, samples=5000)
    nodes, _ = build_in_process(path, tmp_path / "run", ('data.partition="dirichlet"', "data.alpha=0.1",
                                                         "data.min_size=8"))
    sizes = {n.config.id: len(n.parts.data.train) for n in nodes}
    assert len(set(sizes.values())) == 3, sizes
    assert all(n.settings.update_bound == 0 and n.settings.max_weight_ratio == 0 for n in nodes)
    trained, aggregated = {}, {}
    fetch, aggregate = FedAvg.configure_fetch, FedAvg.aggregate

    def recording_fetch(self, ctx):  # type: ignore[no-untyped-def]
        trained[ctx.node_id] = {k: v.detach().clone() for k, v in part_state(ctx.model, "full").items()}
        return fetch(self, ctx)

    def recording_aggregate(self, ctx, arrived):  # type: ignore[no-untyped-def]
        aggregate(self, ctx, arrived)
        aggregated[ctx.node_id] = {k: v.detach().clone() for k, v in part_state(ctx.model, "full").items()}

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(FedAvg, "configure_fetch", recording_fetch)
        patch.setattr(FedAvg, "aggregate", recording_aggregate)
        results, _, _ = run_in_process(nodes, None)
    assert [r["status"] for r in results] == ["ok"] * 3
    total = sum(sizes.values())
    for node, state in aggregated.items():
        for k, v in state.items():
            if v.is_floating_point():
                by_hand = sum(sizes[i] * trained[i][k].double() for i in sizes) / total
                torch.testing.assert_close(v.double(), by_hand, rtol=1e-5, atol=1e-6)


def test_the_summary_gives_the_start_up(fedavg_run):
    """Start-up, from the launcher's start to the first node's first round, is its own number."""
    from p2pfl.scenario.results import format_summary

    _, results, _ = fedavg_run
    startup = results["summary"]["startup_s"]
    assert 0.0 <= startup < results["summary"]["wall_s"]
    assert f"(start-up {startup:.1f} s)" in format_summary(results)
