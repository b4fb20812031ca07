"""The running weighted mean FedAvg folds arrivals into, against the all-at-once reference."""

from __future__ import annotations

import itertools

import pytest
import torch

from p2pfl.core.influence import RunningWeightedMean, combine_states


def _states(n: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [{"w": torch.randn(7, 5, generator=g), "b": torch.randn(5, generator=g) * 1e3,
             "steps": torch.tensor(10 * i)} for i in range(n)]


def test_running_mean_equals_combine_states_in_any_order() -> None:
    states, weights = _states(4), [30.0, 1.0, 7.0, 12.0]
    total = sum(weights)
    reference = combine_states(states, [w / total for w in weights])
    for order in itertools.permutations(range(1, 4)):  # the own state first, peers in any order
        mean = RunningWeightedMean()
        for i in (0, *order):
            mean.add(states[i], weights[i])
        got = mean.mean()
        assert mean.count == 4 and mean.total == total
        for k, ref in reference.items():
            assert got[k].dtype == ref.dtype
            torch.testing.assert_close(got[k], ref, rtol=0, atol=0) if not ref.is_floating_point() else \
                torch.testing.assert_close(got[k], ref, rtol=1e-7, atol=1e-6)
        assert got["steps"].item() == 0  # integers are the first state's, not averaged


def test_running_mean_refuses_what_it_cannot_average() -> None:
    mean = RunningWeightedMean()
    with pytest.raises(ValueError, match="no state"):
        mean.mean()
    with pytest.raises(ValueError, match="weight must be > 0"):
        mean.add(_states(1)[0], 0.0)
    mean.add(_states(1)[0], 1.0)
    with pytest.raises(ValueError, match="keys differ"):
        mean.add({"w": torch.zeros(7, 5)}, 1.0)


def test_the_last_mean_divides_in_place_and_equals_the_mean_to_the_bit() -> None:
    states, weights = _states(3, seed=4), [3.0, 1.0, 2.0]
    for dtype in (torch.float32, torch.float64):
        typed = [{k: v.to(dtype) if v.is_floating_point() else v for k, v in s.items()} for s in states]
        kept = {k: v.clone() for k, v in typed[0].items()}
        first, last = RunningWeightedMean(), RunningWeightedMean()
        for state, weight in zip(typed, weights):
            first.add(state, weight)
            last.add(state, weight)
        reference, got = first.mean(), last.mean(last=True)
        assert all(torch.equal(got[k], reference[k]) and got[k].dtype == reference[k].dtype for k in reference)
        assert all(torch.equal(typed[0][k], kept[k]) for k in kept)  # the first state is never written into
        with pytest.raises(ValueError, match="no state"):
            last.mean()


def test_a_sum_in_the_states_own_dtype_holds_half_and_differs_by_rounding_only() -> None:
    states, weights = _states(4, seed=2), [30.0, 1.0, 7.0, 12.0]
    reference = combine_states(states, [w / sum(weights) for w in weights])
    for order in itertools.permutations(range(1, 4)):
        own, wide = RunningWeightedMean(dtype=None), RunningWeightedMean()
        for i in (0, *order):
            own.add(states[i], weights[i])
            wide.add(states[i], weights[i])
        assert {v.dtype for v in own._sum.values()} == {torch.float32}
        assert sum(v.nbytes for v in own._sum.values()) * 2 == sum(v.nbytes for v in wide._sum.values())
        got = own.mean(last=True)
        for k, ref in reference.items():
            assert got[k].dtype == ref.dtype
            if ref.is_floating_point():  # float32 summation's bound: n·eps·Σ w|x| / Σ w, and the answer's rounding
                eps = torch.finfo(torch.float32).eps
                magnitude = sum(w * s[k].double().abs() for w, s in zip(weights, states)) / sum(weights)
                error = (got[k].double() - ref.double()).abs()
                assert bool((error <= 5 * eps * magnitude + eps * ref.double().abs()).all())
            else:
                assert torch.equal(got[k], ref)
