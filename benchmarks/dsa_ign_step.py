"""Cost of one DSA-IGN training step by feed-forward width: the paper's 2048 against the default 256.

One Adam step (forward, the four losses, backward) on a batch of 128 random unit (D, L)
pairs of 512 dimensions, the paper's network otherwise (3 layers, 8 heads, d_model 32,
dropout 0.1), one CPU thread; median of 10 steps after 3 warm-up steps, and the ratio
against ff_dim = 256 measured in the same process.

    python benchmarks/dsa_ign_step.py
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from p2pfl.core.client2vec import DSAIGN, DSAIGNConfig, dsa_ign_losses


def step_seconds(ff_dim: int, steps: int = 10) -> float:
    torch.manual_seed(0)
    model = DSAIGN(DSAIGNConfig(ff_dim=ff_dim))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    d, lab = F.normalize(torch.randn(128, 512), dim=1), F.normalize(torch.randn(128, 512), dim=1)
    times = []
    for i in range(steps + 3):
        t0 = time.perf_counter()
        loss = torch.stack(list(dsa_ign_losses(model, d, lab).values())).sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if i >= 3:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    torch.set_num_threads(1)
    base = step_seconds(256)
    print("ff_dim | s per step | x ff_dim 256")
    for ff in (256, 2048):
        s = base if ff == 256 else step_seconds(ff)
        print(f"{ff} | {s:.3f} | {s / base:.2f}")


if __name__ == "__main__":
    main()
