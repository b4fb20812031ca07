"""Cost of DI's data-influence calculator (DIC) per round, relative to one local epoch.

Setup (one CPU thread): 500 training samples of 3x28x28 synthetic images (class prototypes
plus noise), 10 classes; one local epoch = LocalTrainer with Adam 1e-3, batch 32 (16
steps); models `p2pfl.models.cnn(3, 28, 10)` and `p2pfl.models.lenet(3, 28, 10)`. The node
trains one epoch from a "global" model, then DIC computes ξ = −ḡᵀ(H + λI)⁻¹g_core with the
`di` defaults: core set of 64 samples at the global parameters, ḡ over the 500 training
samples at the trained parameters, CG with 20 iterations and λ = 0.01, for the head only
(`hessian="head"`, the default) and for all parameters. The parts are timed separately:
feature extraction (head only: the body's forward pass at both models), φ read off the
training surface (as `DI` does), g_core, ḡ, one HVP over the training set, and the CG solve
(≤ 20 HVPs; it stops early once converged or at negative curvature, so the HVP count is
printed, with an estimate of the cost had it run all 20). φ alone (the `dic=False`
ablation: one forward pass) is printed too. Every number is also given as a multiple of
one local epoch.

    /work/venv/bin/python benchmarks/dic.py
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from p2pfl.algorithms.di import DI
from p2pfl.core.influence_functions import conjugate_gradient, loss_sum
from p2pfl.data import NodeData, Split
from p2pfl.models import SplitModel, cnn, lenet, part_state
from p2pfl.runtime.strategy import ArtefactSink, RoundContext
from p2pfl.training import LocalTrainer, TrainConfig

TRAIN, CLASSES = 500, 10


def synthetic(n: int, seed: int) -> Split:
    g = torch.Generator().manual_seed(seed)
    protos = torch.randn(CLASSES, 3, 28, 28, generator=torch.Generator().manual_seed(0))
    y = torch.randint(CLASSES, (n,), generator=g)
    return Split(protos[y] + torch.randn(n, 3, 28, 28, generator=g), y)


def timed(fn: Callable[[], Any], repeat: int = 1) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def bench(name: str, build: Callable[[], SplitModel], data: NodeData, trainer: LocalTrainer) -> None:
    torch.manual_seed(0)
    global_model = build()
    trainer.fit(global_model, data.train)  # a "global" model that is not at its initialisation
    start = {k: v.clone() for k, v in part_state(global_model, "full").items()}
    epoch_s, _ = timed(lambda: trainer.fit(copy.deepcopy(global_model), data.train), repeat=3)
    local = copy.deepcopy(global_model)
    trainer.fit(local, data.train)
    n_params = sum(p.numel() for p in local.parameters())
    n_head = sum(p.numel() for p in local.head.parameters())
    print(f"{name}: {n_params:,} parameters ({n_head} in the head); one local epoch {epoch_s:.3f} s")
    phi_s, _ = timed(lambda: loss_sum(local, data.train.x, data.train.y))
    print(f"  phi alone (dic off)         {phi_s:7.3f} s  {phi_s / epoch_s:6.2f} x epoch")
    for hessian in ("head", "all"):
        strategy = DI(hessian=hessian)
        ctx = RoundContext(
            node_id="bench", round=1, rounds=1, peers=(), model=local, data=data, trainer=trainer,
            rng=np.random.default_rng(0), artefacts=ArtefactSink("bench", None), log=lambda _: None,
        )
        setup_s, problem = timed(lambda: strategy.problem(ctx, start))
        core_s, g_core = timed(problem.core.gradient)
        train_s, _ = timed(problem.trained.gradient)
        hvp_s, _ = timed(lambda: problem.trained.hvp(g_core))
        calls = 0

        def counted_hvp(v: torch.Tensor) -> torch.Tensor:
            nonlocal calls
            calls += 1
            return problem.trained.hvp(v)

        cg_s, solve = timed(lambda: conjugate_gradient(
            counted_hvp, g_core, damping=strategy.damping, max_iterations=strategy.cg_iterations, tol=1e-6))
        phi_from_surface_s, _ = timed(lambda: problem.trained.value("sum"))
        fixed = setup_s + phi_from_surface_s + core_s + train_s
        total = fixed + cg_s
        stop = ("converged" if solve.converged else "negative curvature" if solve.negative_curvature
                else f"max iterations, residual {solve.residual:.1e}")
        rows = [
            ("features / surfaces", setup_s), ("phi from the surface", phi_from_surface_s),
            ("g_core (64 samples)", core_s), ("g_train (500 samples)", train_s),
            ("one HVP (500 samples)", hvp_s), (f"CG: {calls} HVPs", cg_s), ("DIC + phi total", total),
            ("  same with 20 HVPs (est.)", fixed + 20 * hvp_s),
        ]
        print(f"  hessian={hessian} ({problem.trained.dim:,} parameters); CG stopped: {stop}")
        for label, seconds in rows:
            print(f"    {label:28s} {seconds:7.3f} s  {seconds / epoch_s:6.2f} x epoch")


def main() -> None:
    torch.set_num_threads(1)
    began = time.perf_counter()
    data = NodeData(0, synthetic(TRAIN, 1), synthetic(50, 2), synthetic(10, 3), None)
    trainer = LocalTrainer(TrainConfig(epochs=1, batch_size=32, optimizer="adam", lr=1e-3))
    print(f"DIC cost per round; train {TRAIN} samples 3x28x28, {CLASSES} classes; 1 thread; "
          "defaults core_size=64, damping=0.01, cg_iterations=20\n")
    bench("cnn(3,28,10)", lambda: cnn(3, 28, CLASSES), data, trainer)
    print()
    bench("lenet(3,28,10)", lambda: lenet(3, 28, CLASSES), data, trainer)
    print(f"\nwall {time.perf_counter() - began:.1f} s")


if __name__ == "__main__":
    main()
