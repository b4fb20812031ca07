"""A node's fit with the optimizer's step as one call over all parameters (`foreach`, what
`LocalTrainer` uses) against torch's default on the CPU, a Python loop over the parameters.

    python benchmarks/optimizer_step.py [--models 300] [--repeat 5] [--model cnn] [--samples 3]

Two cases, each way alternating, CPU time of this process per fit (one batch of `--samples`
samples, Adam, a fresh optimizer as every round's fit has):

* one model, fitted again and again: everything stays in the caches;
* `--models` models fitted in turn, as a worker of many nodes trains them in a round: each fit
  reads its model in from memory.

Both ways give bitwise the same parameters (tests/training/test_fit.py).
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch

from p2pfl.models import build_model
from p2pfl.training.config import TrainConfig
from p2pfl.training.trainer import LocalTrainer


def per_fit_ms(trainer: LocalTrainer, models: list[torch.nn.Module], split: SimpleNamespace, foreach: bool,
               fits: int) -> float:
    def make(params: object) -> torch.optim.Optimizer:
        return torch.optim.Adam([p for p in params if p.requires_grad], lr=1e-3, foreach=foreach)  # type: ignore[attr-defined]

    trainer.make_optimizer = make  # type: ignore[method-assign]
    start = time.process_time()
    for i in range(fits):
        trainer.fit(models[i % len(models)], split)
    return (time.process_time() - start) / fits * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=5, help="alternating blocks per case (median reported)")
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--samples", type=int, default=3, help="training samples a node holds (1000 nodes of the 5000 MNIST: 3)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    models = [build_model(args.model, 1, 28, 10) for _ in range(args.models)]
    split = SimpleNamespace(x=torch.rand(args.samples, 1, 28, 28), y=torch.arange(args.samples) % 10)
    trainer = LocalTrainer(TrainConfig(epochs=1, batch_size=32))
    print(f"{args.model}, {args.samples} samples a fit, Adam, 1 torch thread; ms of CPU a fit, median of {args.repeat}")
    print(f"{'case':<28}{'loop':>8}{'foreach':>9}{'ratio':>8}")
    for case, pool in (("one model, warm", models[:1]), (f"{args.models} models in turn", models)):
        fits = len(pool) if len(pool) > 1 else 300
        per_fit_ms(trainer, pool, split, True, fits)  # warm-up: first optimizer, allocator
        loop, one_call = [], []
        for _ in range(args.repeat):
            loop.append(per_fit_ms(trainer, pool, split, False, fits))
            one_call.append(per_fit_ms(trainer, pool, split, True, fits))
        a, b = statistics.median(loop), statistics.median(one_call)
        print(f"{case:<28}{a:>8.2f}{b:>9.2f}{b / a:>7.2f}x")


if __name__ == "__main__":
    main()
