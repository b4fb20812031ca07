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


def mnist_to_all_domains(model_seed: int) -> dict[str, float]:
    """Accuracy on every digits domain of a small CNN trained on 600 `mnist` samples only.

    The recipe behind the domain-shift test and `benchmarks/data_stats.py`: 8 epochs of Adam
    2e-3, batch 32, one thread; `model_seed` seeds the initialisation and the shuffling.
    """
    import torch

    from p2pfl.data import DataSpec, build_partition
    from p2pfl.models import cnn

    spec = DataSpec(dataset="digits", partition="domain", samples_per_node=800, val_fraction=0.0, test_fraction=0.25)
    part = build_partition(spec, 5, seed=0)
    train = part.node(0).train
    assert part.node(0).domain == "mnist" and len(train) == 600
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(model_seed)
        model = cnn(in_channels=3, image_size=28, num_classes=10)
        opt = torch.optim.Adam(model.parameters(), lr=2e-3)
        gen = torch.Generator().manual_seed(model_seed)
        model.train()
        for _ in range(8):
            perm = torch.randperm(len(train), generator=gen)
            for i in range(0, len(train), 32):
                b = perm[i : i + 32]
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(train.x[b]), train.y[b]).backward()
                opt.step()
        model.eval()
        with torch.no_grad():
            return {n.domain: float((model(n.test.x).argmax(1) == n.test.y).float().mean()) for n in part.nodes}
    finally:
        torch.set_num_threads(threads)
