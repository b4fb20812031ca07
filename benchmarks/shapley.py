"""Cost of pFedSV's coalition game per round, relative to one local epoch.

Setup (one CPU thread): the FedC2I/pFedSV LeNet (`p2pfl.models.lenet(3, 28, 10)`, ~0.5M
parameters), 500 training samples and 200 validation samples of 3x28x28 synthetic images
(class prototypes plus noise), one local epoch = LocalTrainer with Adam 1e-3, batch 32
(16 steps). The node holds k downloaded models (k = 5 and 9) plus its own, so |S| = 6 or 10:
|S| = 6 is solved exactly (63 utility evaluations), |S| = 10 by Monte Carlo with R = 3|S| = 30
permutations (the defaults of `pfedsv`). The timed unit is `PFedSV.aggregate`, i.e. the whole
round's aggregation: game, relevance, weights and the new model; for D+C it also averages
the k bodies and computes the validation features once.

    /work/venv/bin/python benchmarks/shapley.py
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from timing import median_seconds
from p2pfl.algorithms.pfedsv import PFedSV
from p2pfl.data import NodeData, Split
from p2pfl.models import lenet, part_state
from p2pfl.runtime.strategy import ArtefactSink, PeerModel, RoundContext
from p2pfl.training import LocalTrainer, TrainConfig

TRAIN, VAL, CLASSES = 500, 200, 10


def synthetic(n: int, seed: int) -> Split:
    g = torch.Generator().manual_seed(seed)
    protos = torch.randn(CLASSES, 3, 28, 28, generator=torch.Generator().manual_seed(0))
    y = torch.randint(CLASSES, (n,), generator=g)
    return Split(protos[y] + torch.randn(n, 3, 28, 28, generator=g), y)


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = NodeData(0, synthetic(TRAIN, 1), synthetic(VAL, 2), synthetic(10, 3), None)
    base = lenet(3, 28, CLASSES)
    trainer = LocalTrainer(TrainConfig(epochs=1, batch_size=32, optimizer="adam", lr=1e-3))
    trainer.fit(base, data.train)  # warm-up, and a model that is not at its initialisation

    epoch_s = median_seconds(lambda: trainer.fit(copy.deepcopy(base), data.train), repeat=3)
    n_params = sum(p.numel() for p in base.parameters())
    print(f"LeNet(3,28,10): {n_params:,} parameters; train {TRAIN}, val {VAL} samples; 1 thread")
    print(f"one local epoch (Adam 1e-3, batch 32, {TRAIN // 32 + 1} steps): {epoch_s:.3f} s\n")

    # Peers: the node's model after different amounts of extra training, so coalitions differ.
    peers = []
    for j in range(9):
        peer = copy.deepcopy(base)
        with torch.no_grad():
            for p in peer.parameters():
                p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(100 + j)))
        peers.append(peer)

    header = f"{'k':>2} {'|S|':>3} {'variant':>7} {'method':>11} {'evals':>5} {'seconds':>8} {'x epoch':>8} {'ms/eval':>8}"
    print(header)
    print("-" * len(header))
    per_eval: dict[str, float] = {}
    for k in (5, 9):
        for variant in ("full", "D+C"):
            parts = ["full"] if variant == "full" else ["head", "body"]
            arrived = [
                PeerModel(f"p{j}", part, 1, 1, part_state(peers[j], part), {"n_train": TRAIN})
                for part in parts for j in range(k)
            ]
            stats: dict[str, object] = {}

            def run() -> None:
                strategy = PFedSV(k=k, variant=variant)
                ctx = RoundContext(
                    node_id="me", round=1, rounds=1, peers=tuple(f"p{j}" for j in range(9)),
                    model=copy.deepcopy(base), data=data, trainer=trainer, rng=np.random.default_rng(0),
                    artefacts=ArtefactSink("me", None), log=lambda _: None,
                )
                strategy.aggregate(ctx, arrived)
                stats["evals"] = ctx.artefacts.records["utility_evaluations"]
                stats["method"] = [e["value"]["method"] for e in ctx.artefacts.saved if e["name"] == "shapley"][0]

            seconds = median_seconds(run, repeat=1 if variant == "full" else 5)
            evals = int(stats["evals"])  # type: ignore[call-overload]
            per_eval[variant] = seconds / evals
            print(f"{k:>2} {k + 1:>3} {variant:>7} {stats['method']:>11} {evals:>5} {seconds:>8.3f} "
                  f"{seconds / epoch_s:>8.2f} {1000 * seconds / evals:>8.2f}")
    exact10 = 2**10 - 1
    print(f"\nexact at |S| = 10 would need {exact10} evaluations: ~{exact10 * per_eval['full']:.0f} s full "
          f"({exact10 * per_eval['full'] / epoch_s:.0f} epochs), ~{exact10 * per_eval['D+C']:.2f} s D+C")


if __name__ == "__main__":
    main()
