"""Helpers shared by the data tests."""

from __future__ import annotations

import numpy as np


def assert_disjoint_cover(parts, expected) -> None:
    """``parts`` (index arrays) are pairwise disjoint and their union is exactly ``expected``."""
    allc = np.concatenate([np.asarray(p, np.int64) for p in parts])
    assert len(allc) == len(np.unique(allc)), "a sample is given to two nodes (or twice to one)"
    assert np.array_equal(np.sort(allc), np.sort(np.asarray(expected, np.int64))), "the parts do not cover the data"


def label_tv(labels, reference, k: int) -> float:
    """Total-variation distance between the label distribution of ``labels`` and of ``reference``."""
    p = np.bincount(np.asarray(labels), minlength=k) / max(len(labels), 1)
    q = np.bincount(np.asarray(reference), minlength=k) / max(len(reference), 1)
    return 0.5 * float(np.abs(p - q).sum())
