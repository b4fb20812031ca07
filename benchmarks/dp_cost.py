"""Cost of DP-SGD: seconds per local epoch, plain training vs Opacus DP-SGD.

    python benchmarks/dp_cost.py [--samples 500] [--batch 32] [--repeat 2] [--threads 1]

Same model, data and batch size through `LocalTrainer` (SGD, lr 0.05). "dp-sgd" is the
project's mechanism as nodes run it: Poisson sampling (expected batch 32), per-sample
gradients, flat clipping to 1.0, noise multiplier 1.0, accountant step per batch.
"dp-sgd, no poisson" keeps the plain shuffled batches, isolating the per-sample gradient
cost. Each time is the median of `repeat` epochs after one warm-up epoch; the wrap and
release of each fit are included (they are part of every round).
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch

from p2pfl.models import cnn, lenet
from p2pfl.privacy import PrivacySpec, build_privacy, prepare_model
from p2pfl.training import LocalTrainer, TrainConfig


def epoch_seconds(builder, split, batch: int, privacy: dict | None, repeat: int) -> float:
    torch.manual_seed(0)
    cfg = TrainConfig(epochs=1, batch_size=batch, optimizer="sgd", lr=0.05)
    mech = None
    if privacy is not None:
        spec = PrivacySpec.from_dict(privacy)
        mech = build_privacy(spec, n_train=len(split.y), batch_size=batch, epochs=1, rounds=repeat + 1, seed=0)
    model = builder(3, 28, 10)
    if mech is not None:
        model = prepare_model(model, mech)
    trainer = LocalTrainer(cfg, seed=0, privacy=mech)
    times = []
    for i in range(repeat + 1):
        start = time.perf_counter()
        trainer.fit(model, split)
        if i > 0:  # the first epoch warms caches and allocators
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    split = SimpleNamespace(x=torch.randn(args.samples, 3, 28, 28, generator=g),
                            y=torch.randint(0, 10, (args.samples,), generator=g))
    dp = {"mode": "dp-sgd", "noise_multiplier": 1.0, "max_grad_norm": 1.0}
    variants = [("plain", None), ("dp-sgd", dp), ("dp-sgd, no poisson", {**dp, "poisson_sampling": False})]
    print(f"{args.samples} random 3x28x28 samples, batch {args.batch}, SGD, torch threads {args.threads}, "
          f"median of {args.repeat} epochs")
    print(f"{'model':<7} {'variant':<20} {'s/epoch':>8} {'x plain':>8}")
    for name, builder in (("cnn", cnn), ("lenet", lenet)):
        plain = None
        for label, privacy in variants:
            seconds = epoch_seconds(builder, split, args.batch, privacy, args.repeat)
            plain = plain or seconds
            print(f"{name:<7} {label:<20} {seconds:8.3f} {seconds / plain:8.2f}", flush=True)


if __name__ == "__main__":
    main()
