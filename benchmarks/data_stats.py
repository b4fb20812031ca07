"""The two data tables of docs/data.md: Dirichlet label skew and digits domain shift.

    python benchmarks/data_stats.py [--skip-skew] [--skip-shift] [--seeds 0 1 2] [--model-seeds 0 1 2 3]

(a) Label skew: for ``dataset = "mnist"``, 10 nodes, partition seeds 0, 1, 2, the mean over
    nodes of the total-variation distance between a node's *train* label distribution and
    the label distribution of the whole pool (all 5000 samples), for ``iid`` and for
    ``dirichlet`` with alpha in {0.05, 0.1, 0.3, 1, 10, 100, 1000} (``min_size`` 10, the
    default). The partitions come from ``build_partition``; the distance is
    ``label_tv`` of ``tests/data/helpers.py``, the one the partition tests use. The
    tests measure each node's whole share (train + val + test) instead; that column is
    printed too (the splits are stratified, so the two agree closely).

(b) Domain shift: the recipe of ``tests/data/test_digits.py``: ``digits`` partition
    ``domain`` over the five domains, 5 nodes, partition seed 0, ``samples_per_node``
    800, ``val_fraction`` 0, ``test_fraction`` 0.25 (600 train / 200 test per domain); a
    ``p2pfl.models.cnn`` trained on the 600 ``mnist`` samples for 8 epochs (Adam 2e-3,
    batch 32, one torch thread), evaluated on the 200 test samples of every domain. Model
    seed s sets ``torch.manual_seed(s)`` before the model is built and seeds the batch
    shuffling generator with s; seed 0 is exactly the test.

Uses the normal data cache (``$P2PFL_DATA_CACHE`` or ``~/.cache/p2pfl/data``); missing
domains are built on first use (about 15 s for all five).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.data.helpers

from p2pfl.data import DataSpec, build_partition  # noqa: E402
from p2pfl.data.partition import assign, load_pool  # noqa: E402
from tests.data.helpers import label_tv, mnist_to_all_domains  # noqa: E402

ALPHAS = (0.05, 0.1, 0.3, 1.0, 10.0, 100.0, 1000.0)
NODES = 10


def skew(seeds: list[int]) -> None:
    pool = load_pool(DataSpec(dataset="mnist"))
    k = pool.num_classes
    specs = [("iid", DataSpec(dataset="mnist", partition="iid"))]
    specs += [(f"{a:g}", DataSpec(dataset="mnist", partition="dirichlet", alpha=a)) for a in ALPHAS]
    print(f"(a) label skew: mnist ({len(pool.y)} samples), {NODES} nodes, partition seeds {seeds}")
    print("    mean over nodes of TV(node label distribution, pool label distribution)")
    head = f"{'alpha':>6}  {'train split, per seed':<24} {'mean':>5} {'range':>11}   {'whole share (tests)'}"
    print(head)
    print("-" * len(head))
    for label, spec in specs:
        train_tv, share_tv = [], []
        for s in seeds:
            part = build_partition(spec, NODES, seed=s)
            train_tv.append(float(np.mean([label_tv(n.train.y.numpy(), pool.y, k) for n in part.nodes])))
            raw = assign(spec, pool, NODES, s)["raw"]
            share_tv.append(float(np.mean([label_tv(pool.y[r], pool.y, k) for r in raw])))
        per_seed = " ".join(f"{v:.3f}" for v in train_tv)
        rng = f"{min(train_tv):.3f}-{max(train_tv):.3f}"
        shares = " ".join(f"{v:.3f}" for v in share_tv)
        print(f"{label:>6}  {per_seed:<24} {np.mean(train_tv):5.3f} {rng:>11}   {shares}", flush=True)
    print()


def shift(model_seeds: list[int]) -> None:
    domains = list(DataSpec(dataset="digits", partition="domain").resolved_domains())
    print("(b) domain shift: cnn trained on 600 mnist samples (8 epochs, Adam 2e-3, batch 32, 1 thread), "
          "tested on 200 test samples per domain; chance 0.10")
    head = f"{'model seed':>10} " + " ".join(f"{d:>11}" for d in domains) + f" {'train s':>8}"
    print(head)
    print("-" * len(head))
    rows = []
    for seed in model_seeds:
        start = time.perf_counter()
        acc = mnist_to_all_domains(seed)
        rows.append(acc)
        print(f"{seed:>10} " + " ".join(f"{acc[d]:11.3f}" for d in domains)
              + f" {time.perf_counter() - start:8.1f}", flush=True)
    if len(rows) > 1:
        print(f"{'min-max':>10} " + " ".join(f"{min(r[d] for r in rows):.3f}-{max(r[d] for r in rows):.3f}".rjust(11)
                                             for d in domains))
        print(f"{'mean':>10} " + " ".join(f"{np.mean([r[d] for r in rows]):11.3f}" for d in domains))
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="partition seeds for the skew table")
    ap.add_argument("--model-seeds", type=int, nargs="+", default=[0, 1, 2, 3], help="model seeds for the shift table")
    ap.add_argument("--skip-skew", action="store_true", help="skip table (a)")
    ap.add_argument("--skip-shift", action="store_true", help="skip table (b) (the slow one: 4 trainings)")
    args = ap.parse_args()
    if not args.skip_skew:
        skew(args.seeds)
    if not args.skip_shift:
        shift(args.model_seeds)


if __name__ == "__main__":
    main()
