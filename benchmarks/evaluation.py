"""Scoring a split on the CPU: the stored layout at batch 1024 (how p2pfl scored before) against
the channels-last copy at `CPU_EVAL_BATCH` (how `LocalTrainer.evaluate` scores now), one thread,
in the same process. Prints the median seconds per 1000 samples and the ratio; logits must agree.
The second table does the same for a coalition game's utility (`ModelPool.evaluate`: the average
of 3 of 6 states, through `functional_call`), which was most of a pFedSV round.

    python benchmarks/evaluation.py [--samples 1000] [--repeats 7]
"""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import torch
from torch import nn
from torch.func import functional_call

from p2pfl.algorithms.common import ModelPool
from p2pfl.models import build_model
from p2pfl.training.config import TrainConfig
from p2pfl.training.trainer import CPU_EVAL_BATCH, LocalTrainer, _eval_batches
from timing import median_seconds


def stored_layout(model: nn.Module, x: torch.Tensor, batch: int = 1024) -> torch.Tensor:
    with torch.no_grad():
        model.eval()
        return torch.cat([model(x[i : i + batch]) for i in range(0, len(x), batch)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    trainer = LocalTrainer(TrainConfig())
    print(f"{'model':<12} {'before s':>9} {'now s':>9} {'ratio':>7}  logits max |diff|")
    for name, channels, size in (("lenet", 3, 28), ("cnn", 1, 28), ("cnn", 3, 32)):
        model = build_model(name, channels, size, 10)
        x = torch.randn(args.samples, channels, size, size)
        y = torch.randint(0, 10, (args.samples,))
        split = SimpleNamespace(x=x, y=y)
        before = median_seconds(lambda: stored_layout(model, x), args.repeats, warmup=1)
        now = median_seconds(lambda: trainer.evaluate(model, split), args.repeats, warmup=1)
        with torch.no_grad():
            fast = torch.cat([logits for logits, _ in _eval_batches(model, model, split, CPU_EVAL_BATCH)])
        diff = float((fast - stored_layout(model, x)).abs().max())
        print(f"{name + f' {channels}x{size}':<12} {before:9.3f} {now:9.3f} {before / now:6.1f}x  {diff:.1e}")
    print(f"\n{'game utility':<12} {'before s':>9} {'now s':>9} {'ratio':>7}  logits max |diff|")
    for name, channels, size in (("lenet", 3, 28), ("cnn", 1, 28), ("cnn", 3, 32)):
        states = [build_model(name, channels, size, 10).state_dict() for _ in range(6)]
        model = build_model(name, channels, size, 10)
        pool = ModelPool(model, states)
        x = torch.randn(args.samples, channels, size, size)
        split = SimpleNamespace(x=x, y=torch.randint(0, 10, (args.samples,)))
        members = [0, 2, 5]
        average = pool.average(members)

        def stored_pool() -> torch.Tensor:
            with torch.no_grad():
                return torch.cat([functional_call(model, average, (x[i : i + 1024],)) for i in range(0, len(x), 1024)])

        before = median_seconds(stored_pool, args.repeats, warmup=1)
        now = median_seconds(lambda: pool.evaluate(members, split), args.repeats, warmup=1)
        forward, batch = pool.scorer(members)
        with torch.no_grad():
            fast = torch.cat([forward(x[i : i + batch]) for i in range(0, len(x), batch)])
        diff = float((fast - stored_pool()).abs().max())
        print(f"{name + f' {channels}x{size}':<12} {before:9.3f} {now:9.3f} {before / now:6.1f}x  {diff:.1e}")


if __name__ == "__main__":
    main()
