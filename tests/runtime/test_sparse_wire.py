"""runtime.wire_sparsity: sparse model parts against a public copy, with error feedback, through
the real wire codec, refused when malformed, and in runs of node objects over HTTP."""

from __future__ import annotations

import pytest
import torch

from p2pfl.core.sparse import SPARSE_KINDS as CORE_KINDS
from p2pfl.core.sparse import entries_kept
from p2pfl.errors import ConfigError
from p2pfl.models import build_model, part_spec, part_state
from p2pfl.runtime.settings import SPARSE_KINDS, Sparsity
from p2pfl.runtime.sparse_wire import (INDEX_SUFFIX, RESTARTED, REF_SUFFIX, VALUE_SUFFIX, NeedReference, SparseReceiver,
                                       SparseRefused, SparseSender, reference_spec, sparse_spec)
from p2pfl.scenario.schema import load_scenario
from p2pfl.wire.errors import ShapeMismatch

from .helpers import build_in_process, run_in_process, through_wire, write_tiny


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("cnn", 1, 28, 10)


def _train_a_little(model: torch.nn.Module, step: int) -> None:
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(100 * step + i)) * 0.01)


def test_the_kinds_are_declared_alike_in_the_math_core_and_the_settings() -> None:
    assert SPARSE_KINDS == CORE_KINDS  # the schema reads the torch-free one


@pytest.mark.parametrize("kind", ["topk", "randomk"])
@pytest.mark.parametrize("error_feedback", [True, False])
def test_the_receiver_rebuilds_the_senders_public_copy_bit_for_bit_through_the_wire(kind: str,
                                                                                  error_feedback: bool) -> None:
    model = _model()
    spec = part_spec(model, "full")
    sender = SparseSender({"full": part_state(model, "full")}, Sparsity(kind, 0.05), error_feedback=error_feedback,
                          seed=3)
    receiver = SparseReceiver({"full": part_state(model, "full")})
    for version in (1, 2, 3):
        _train_a_little(model, version)
        wire, base = sender.encode(version, {"full": part_state(model, "full")})
        assert base == version - 1 and set(wire) == {"full", "full" + REF_SUFFIX}
        arrived = through_wire(wire["full"], sparse_spec(spec, 0.05))  # names, shapes and dtypes checked
        rebuilt = receiver.rebuild("a", "full", version, base, arrived, spec)
        public = sender.feedback["full"].reference
        assert all(torch.equal(rebuilt[name], public[name]) for name in public)
        assert torch.equal(through_wire(wire["full" + REF_SUFFIX], reference_spec(spec))[next(iter(public))],
                           public[next(iter(public))])
    # With error feedback the public copy plus the residual is the model itself: nothing is lost.
    if error_feedback:
        residual = sender.feedback["full"].residual
        assert all(torch.allclose(public[n] + residual[n], part_state(model, "full")[n], atol=1e-6) for n in public)


def test_a_sparse_part_costs_its_indices_and_values_not_the_dense_size() -> None:
    model = _model()
    state = part_state(model, "full")
    sender = SparseSender({"full": state}, Sparsity("topk", 0.01), error_feedback=True, seed=0)
    _train_a_little(model, 1)
    wire, _ = sender.encode(1, {"full": part_state(model, "full")})
    sent = sum(t.numel() * t.element_size() for t in wire["full"].values())
    expected = sum(8 * entries_kept(t.numel(), 0.01) if t.is_floating_point() else t.numel() * t.element_size()
                   for t in state.values())
    assert sent == expected
    dense = sum(t.numel() * t.element_size() for t in state.values())
    assert sent < 0.03 * dense


def test_a_part_against_a_copy_the_receiver_does_not_hold_is_read_whole_then_followed() -> None:
    model = _model()
    spec = part_spec(model, "full")
    sender = SparseSender({"full": part_state(model, "full")}, Sparsity("topk", 0.1), error_feedback=True, seed=0)
    receiver = SparseReceiver({"full": part_state(model, "full")})
    _train_a_little(model, 1)
    sender.encode(1, {"full": part_state(model, "full")})  # version 1: this receiver missed it
    _train_a_little(model, 2)
    wire, base = sender.encode(2, {"full": part_state(model, "full")})
    with pytest.raises(NeedReference, match="against version 1; this node holds 0"):
        receiver.rebuild("a", "full", 2, base, wire["full"], spec)
    receiver.take_reference("a", "full", 2, wire["full" + REF_SUFFIX], spec)
    _train_a_little(model, 3)
    wire, base = sender.encode(3, {"full": part_state(model, "full")})
    rebuilt = receiver.rebuild("a", "full", 3, base, wire["full"], spec)
    assert all(torch.equal(rebuilt[n], t) for n, t in sender.feedback["full"].reference.items())
    # A restarted sender (restored from its checkpoint) names no copy anyone holds.
    sender.restart({"full": part_state(model, "full")})
    _train_a_little(model, 4)
    wire, base = sender.encode(4, {"full": part_state(model, "full")})
    assert base == RESTARTED
    with pytest.raises(NeedReference):
        receiver.rebuild("a", "full", 4, base, wire["full"], spec)


@pytest.mark.parametrize("change,reason", [
    (lambda i: i.flip(0), "indices not sorted"),
    (lambda i: torch.cat([i[:1], i[:-1]]), "repeated index"),
    (lambda i: torch.cat([i[:-1], torch.tensor([10**8], dtype=i.dtype)]), "out of range"),
    (lambda i: torch.cat([torch.tensor([-1], dtype=i.dtype), i[1:]]), "out of range"),
])
def test_a_malformed_sparse_part_is_refused_with_its_reason(change, reason: str) -> None:
    model = _model()
    spec = part_spec(model, "full")
    sender = SparseSender({"full": part_state(model, "full")}, Sparsity("topk", 0.1), error_feedback=True, seed=0)
    receiver = SparseReceiver({"full": part_state(model, "full")})
    _train_a_little(model, 1)
    wire, base = sender.encode(1, {"full": part_state(model, "full")})
    name = next(n for n in wire["full"] if n.endswith(INDEX_SUFFIX))
    bad = {**wire["full"], name: change(wire["full"][name])}
    with pytest.raises(SparseRefused, match=reason) as info:
        receiver.rebuild("a", "full", 1, base, through_wire(bad, sparse_spec(spec, 0.1)), spec)
    assert info.value.reason == "sparse_malformed"
    with pytest.raises(SparseRefused, match="cannot precede"):
        receiver.rebuild("a", "full", 1, 1, wire["full"], spec)  # against its own version


def test_indices_of_another_length_than_their_values_are_refused_by_the_wire() -> None:
    model = _model()
    spec = part_spec(model, "full")
    sender = SparseSender({"full": part_state(model, "full")}, Sparsity("topk", 0.1), error_feedback=True, seed=0)
    _train_a_little(model, 1)
    wire, _ = sender.encode(1, {"full": part_state(model, "full")})
    name = next(n for n in wire["full"] if n.endswith(VALUE_SUFFIX))
    with pytest.raises(ShapeMismatch):
        through_wire({**wire["full"], name: wire["full"][name][:-1]}, sparse_spec(spec, 0.1))


def test_a_bad_sparsity_is_a_config_error(tmp_path) -> None:
    for value in ('"topk"', '"topk:0"', '"topk:2"', '"lowrank:0.1"'):
        with pytest.raises(ConfigError, match="runtime.wire_sparsity"):
            load_scenario(write_tiny(tmp_path), [f"runtime.wire_sparsity={value}"])
    with pytest.raises(ConfigError, match="float32 values"):
        load_scenario(write_tiny(tmp_path), ['runtime.wire_sparsity="topk:0.1"', 'runtime.wire_precision="int8"'])


def _run(tmp_path, name: str, algorithm: str, overrides: tuple[str, ...], extra: str = "") -> list[dict]:
    nodes, coordinator = build_in_process(write_tiny(tmp_path, nodes=3, rounds=3, algorithm=algorithm, extra=extra),
                                          tmp_path / name, overrides)
    results, _, _ = run_in_process(nodes, coordinator)
    assert all(r["status"] == "ok" for r in results), [r.get("error") for r in results]
    return results


@pytest.mark.slow
def test_a_sparse_fedavg_run_moves_what_its_fraction_says_and_learns(tmp_path) -> None:
    """Three FedAvg nodes over HTTP: dense, and top-k 10 % with error feedback. Every part arrives;
    from round 2 on each moves its k entries (8 bytes each) instead of 4 bytes a parameter."""
    dense = _run(tmp_path, "dense", "fedavg", ())
    sparse = _run(tmp_path, "sparse", "fedavg", ('runtime.wire_sparsity="topk:0.1"',))
    model = _model()
    state = part_state(model, "full")
    part = sum(8 * entries_kept(t.numel(), 0.1) if t.is_floating_point() else t.numel() * t.element_size()
               for t in state.values())
    for d, s in zip(dense, sparse):
        assert all(len(r["arrived"]) == 2 for r in s["rounds"])
        assert [r["param_bytes_received"] for r in s["rounds"]] == [2 * part] * 3
        assert s["rounds"][0]["param_bytes_received"] < 0.25 * d["rounds"][0]["param_bytes_received"]
        assert s["final_test_acc"] > 0.1


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["pfedsv", "fedc2i", "fedrep"])
def test_strategies_that_exchange_parts_run_sparse(tmp_path, algorithm: str) -> None:
    """Each node takes both peers' parts in round 1 (pFedSV's dynamic k may then fetch fewer: a
    part fetched after a round it skipped is against a copy the node does not hold, read whole)."""
    results = _run(tmp_path, algorithm, algorithm, ('runtime.wire_sparsity="topk:0.1"',))
    assert all(len(set(r["rounds"][0]["arrived"])) == 2 for r in results)
    assert all(r["rejected"]["total"] == 0 for r in results)


@pytest.mark.slow
@pytest.mark.parametrize("privacy", [
    '\n[privacy]\nmode = "dp-sgd"\nnoise_multiplier = 1.0\nmax_grad_norm = 1.0\n',
    '\n[privacy]\nmode = "output-noise"\nnoise_multiplier = 0.5\nclip_norm = 1.0\n',
], ids=["dp-sgd", "output-noise"])
def test_sparse_parts_under_privacy_spend_the_same_epsilon(tmp_path, privacy: str) -> None:
    """Noise is added in training, or to the model before it is published; sparsifying the
    private model is post-processing, so epsilon is what the dense run spends."""
    dense = _run(tmp_path, "dp_dense", "fedavg", (), privacy)
    sparse = _run(tmp_path, "dp_sparse", "fedavg", ('runtime.wire_sparsity="topk:0.1"',), privacy)
    assert [r["final_epsilon"] for r in sparse] == [r["final_epsilon"] for r in dense]
    assert all(e is not None and e > 0 for e in (r["final_epsilon"] for r in sparse))
