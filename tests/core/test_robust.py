"""Coordinate-wise median and trimmed mean against numpy and an explicit per-coordinate loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from p2pfl.core.robust import robust_aggregate, trimmed_count


def _by_hand_trimmed(values: list[float], cut: int) -> float:
    ordered = sorted(values)
    kept = ordered[cut: len(ordered) - cut]
    return sum(kept) / len(kept)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 9), trim=st.floats(0.0, 0.49), seed=st.integers(0, 2**16))
def test_both_rules_match_a_per_coordinate_reference(n: int, trim: float, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    states = [{"w": torch.randn(3, 2, generator=g), "n": torch.tensor([i])} for i in range(n)]
    median = robust_aggregate(states, "median")
    stacked = np.stack([s["w"].numpy().astype(np.float64) for s in states])
    np.testing.assert_allclose(median["w"].numpy(), np.median(stacked, axis=0), rtol=1e-6, atol=1e-7)
    cut = trimmed_count(n, trim)
    trimmed = robust_aggregate(states, "trimmed_mean", trim)
    for i in range(3):
        for j in range(2):
            expected = _by_hand_trimmed([float(s["w"][i, j]) for s in states], cut)
            assert float(trimmed["w"][i, j]) == pytest.approx(expected, rel=1e-6, abs=1e-7)
    assert torch.equal(median["n"], states[0]["n"]) and median["w"].dtype == torch.float32


def test_one_peer_x1000_cannot_move_a_coordinate_out_of_the_honest_range() -> None:
    g = torch.Generator().manual_seed(1)
    honest = [{"w": torch.randn(50, generator=g)} for _ in range(4)]
    attacker = {"w": -1000 * honest[0]["w"]}
    low = torch.stack([s["w"] for s in honest]).min(0).values
    high = torch.stack([s["w"] for s in honest]).max(0).values
    for rule in ("median", "trimmed_mean"):
        out = robust_aggregate([*honest, attacker], rule, trim=0.2)["w"]
        assert bool(((out >= low - 1e-6) & (out <= high + 1e-6)).all()), rule


def test_trimming_keeps_one_member_and_bad_arguments_are_named() -> None:
    assert trimmed_count(10, 0.1) == 1 and trimmed_count(10, 0.49) == 4 and trimmed_count(2, 0.49) == 0
    with pytest.raises(ValueError, match="trim must be in"):
        trimmed_count(5, 0.5)
    with pytest.raises(ValueError, match="unknown coordinate-wise rule .mode."):
        robust_aggregate([{"w": torch.zeros(1)}], "mode")
    with pytest.raises(ValueError, match="keys differ"):
        robust_aggregate([{"w": torch.zeros(1)}, {"v": torch.zeros(1)}], "median")
