"""The memory benchmarks' sampler (benchmarks/scale.py): PSS, which costs the run it measures,
is read only near the highest RSS so far and at most every so often."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
scale = pytest.importorskip("scale")


def test_pss_is_read_near_a_new_rss_high_at_most_every_so_often() -> None:
    reads = scale.PssReads(near=0.98, every_s=2.0)
    assert reads.due(100, 0.0)            # the first sample
    assert not reads.due(200, 1.0)        # higher, but 1 s after the last read
    assert reads.due(199, 2.0)            # within 2 % of the highest (200), 2 s on
    assert not reads.due(150, 10.0)       # long after, but far below the highest
    assert reads.due(197, 10.2)           # back near it
    assert reads.peak_rss == 200
    assert reads.read(500, 199) and not reads.read(400, 197)  # only a higher PSS is kept, with its RSS
    assert (reads.peak_pss, reads.rss_at) == (500, 199)


def test_the_samplers_read_pss_only_when_told() -> None:
    """A run that rises, peaks and falls, sampled every 0.2 s for a minute: PSS is read a few
    times, one of them at the peak's plateau."""
    reads = scale.PssReads()
    profile = [min(t, 30) if t < 45 else 30 - (t - 45) for t in range(300)]  # rises 30 samples, a plateau of 15, falls
    taken = [t for t in range(300) if reads.due(1000 + profile[t], t * 0.2)]
    assert len(taken) <= 300 * 0.2 / 2.0 + 1
    assert any(30 <= t < 45 for t in taken)
