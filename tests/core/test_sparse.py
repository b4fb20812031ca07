"""Sparse updates with error feedback (issue 50's math): round trips, a hand-worked two-round
example, and the receiver's checks of what arrives."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from p2pfl.core.sparse import ErrorFeedback, SparseTensor, check_sparse, entries_kept, rebuild, sparsify


def t(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float32)


def test_two_rounds_by_hand_with_and_without_error_feedback() -> None:
    start = {"w": t(0, 0, 0, 0)}
    ef, plain = ErrorFeedback(start, 0.25), ErrorFeedback(start, 0.25, error_feedback=False)
    # Round 1: update [4, -1, 2, 0.5]; k = 1; top-1 is index 0.
    for sender in (ef, plain):
        sent = sender.step({"w": t(4, -1, 2, 0.5)})
        assert sent["w"].indices.tolist() == [0] and sent["w"].values.tolist() == [4.0]
    assert ef.residual["w"].tolist() == [0, -1, 2, 0.5]
    assert ef.reference["w"].tolist() == [4, 0, 0, 0]
    # Round 2: update [0, 0, 1, 0]; with the residual u = [0, -1, 3, 0.5], top-1 is index 2 (3).
    sent = ef.step({"w": t(4, -1, 3, 0.5)})
    assert sent["w"].indices.tolist() == [2] and sent["w"].values.tolist() == [3.0]
    assert ef.residual["w"].tolist() == [0, -1, 0, 0.5]
    assert ef.reference["w"].tolist() == [4, 0, 3, 0]
    # Without it the residual is dropped: only this round's own update, 1 at index 2.
    sent = plain.step({"w": t(4, -1, 3, 0.5)})
    assert sent["w"].values.tolist() == [1.0] and plain.reference["w"].tolist() == [4, 0, 1, 0]
    assert plain.residual["w"].tolist() == [0, 0, 0, 0]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), fraction=st.sampled_from([0.001, 0.01, 0.1, 0.5, 1.0]),
       kind=st.sampled_from(["topk", "randomk"]), rounds=st.integers(1, 4))
def test_the_receiver_rebuilds_what_the_sender_holds_and_the_residual_is_what_was_not_sent(
        seed: int, fraction: float, kind: str, rounds: int) -> None:
    g = torch.Generator().manual_seed(seed)
    model = {"a": torch.randn(7, 5, generator=g), "b": torch.randn(3, generator=g), "n": torch.tensor(3)}
    sender = ErrorFeedback(model, fraction, kind, seed=seed)
    receiver = {k: v.clone() for k, v in model.items()}
    for _ in range(rounds):
        model = {k: (v + torch.randn(v.shape, generator=g) if v.is_floating_point() else v) for k, v in model.items()}
        sent = sender.step(model)
        for name, s in sent.items():  # what crosses the wire, checked as a receiver checks it
            check_sparse(name, s.shape, s.indices, s.values)
            assert s.nbytes == s.indices.numel() * 8 + s.values.numel() * 4
            assert s.values.numel() == entries_kept(model[name].numel(), fraction)
        receiver = rebuild(receiver, sent)
        for name in sent:
            assert torch.equal(receiver[name], sender.reference[name])  # both sides hold the same copy
            # Error feedback loses nothing: the copy plus the residual is the model (to rounding).
            torch.testing.assert_close(sender.reference[name] + sender.residual[name], model[name])
    assert torch.equal(receiver["n"], model["n"])  # integer buffers are not sparsified


def test_top_k_keeps_the_largest_magnitudes_and_a_full_fraction_is_the_dense_update() -> None:
    u = t(0.1, -5, 3, -0.2, 5)
    s = sparsify(u, 0.4, "topk")  # k = 2; |-5| ties with |5|: both kept
    assert s.indices.tolist() == [1, 4] and s.values.tolist() == [-5, 5]
    assert torch.equal(sparsify(u, 1.0, "topk").dense(), u)
    assert entries_kept(10_000, 0.001) == 10 and entries_kept(3, 0.001) == 1 and entries_kept(0, 0.5) == 0
    with pytest.raises(ValueError, match="fraction"):
        entries_kept(3, 0.0)


def test_random_k_draws_distinct_entries_from_its_seed() -> None:
    u = torch.arange(100, dtype=torch.float32)
    a = sparsify(u, 0.1, "randomk", torch.Generator().manual_seed(1))
    b = sparsify(u, 0.1, "randomk", torch.Generator().manual_seed(1))
    assert torch.equal(a.indices, b.indices) and len(set(a.indices.tolist())) == 10
    assert torch.equal(a.values, u[a.indices])


@pytest.mark.parametrize(("indices", "values", "reason"), [
    ([0, 7], [1.0, 2.0], "out of range"),
    ([-1, 2], [1.0, 2.0], "out of range"),
    ([2, 2], [1.0, 2.0], "repeated index 2"),
    ([3, 1], [1.0, 2.0], "not sorted"),
    ([1, 2, 3], [1.0, 2.0], "3 indices but 2 values"),
    ([1, 2], [1.0, float("nan")], "non-finite"),
])
def test_a_malformed_sparse_tensor_is_refused_with_its_reason(indices: list[int], values: list[float],
                                                              reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        check_sparse("w", (2, 3), torch.tensor(indices, dtype=torch.int64), torch.tensor(values))
    with pytest.raises(ValueError, match="int32 or int64"):
        check_sparse("w", (2, 3), torch.tensor([0.0, 1.0]), torch.tensor([1.0, 2.0]))


def test_a_sparse_tensor_rebuilds_densely() -> None:
    s = SparseTensor((2, 2), torch.tensor([0, 3]), t(1, 2))
    assert s.dense().tolist() == [[1, 0], [0, 2]]
    assert rebuild({"w": torch.ones(2, 2)}, {"w": s})["w"].tolist() == [[2, 1], [1, 3]]
