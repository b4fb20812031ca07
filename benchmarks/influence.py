"""Cost of FedC2I's influence computation per round: batched against naive, and against one epoch.

Setup (one CPU thread): the FedC2I paper's LeNet (`p2pfl.models.lenet(3, 28, 10)`, ~0.5M
parameters), an influence batch of 64 synthetic 3x28x28 images (class prototypes plus
noise), C = 10 classes, the node holding M = 5 or 10 models (its own and M - 1 peers: the
own model plus small perturbations, so that leave-one-out models differ).

* λ batched: `client_influence`, the M leave-one-out bodies stacked and evaluated with
  `torch.vmap` over `torch.func.functional_call` (one batched forward pass);
* λ chunk 2: the same vmap in chunks of 2 models (`chunk_size=2`, FedC2I's
  `influence_chunk`), which bounds the M-fold activations;
* λ loop: the same leave-one-out parameters, one `functional_call` per model (the path
  `leave_one_out_losses` falls back to when vmap cannot batch a module);
* λ naive: for each i, build the leave-one-out state dict, `load_state_dict` it into a
  model and run a forward pass (M forward passes);
* Λ batched: `eval_features` once with the own body, then `class_influence` (one tensor
  expression for all M·C losses);
* Λ naive: for each (i, c), load node m's model with head row c replaced by the
  leave-one-out row and run a full forward pass (M·C forward passes).

The time of one local epoch is `LocalTrainer.fit` on 320 samples, batch 32, Adam 1e-3 (10
steps), in the same process. Times are medians of repeated runs; the machine is shared, so
compare ratios rather than absolute seconds.

    python benchmarks/influence.py
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch.func import functional_call

from timing import median_seconds
from p2pfl.core.influence import (
    class_influence, client_influence, eval_features, leave_one_out_means, stack_states,
)
from p2pfl.data import Split
from p2pfl.models import SplitModel, lenet, part_state
from p2pfl.training import LocalTrainer, TrainConfig

CLASSES, BATCH, EPOCH_SAMPLES, GAMMA = 10, 64, 320, 5.0


def synthetic(n: int, seed: int) -> Split:
    g = torch.Generator().manual_seed(seed)
    protos = torch.randn(CLASSES, 3, 28, 28, generator=torch.Generator().manual_seed(0))
    y = torch.randint(CLASSES, (n,), generator=g)
    return Split(protos[y] + torch.randn(n, 3, 28, 28, generator=g), y)


@torch.no_grad()
def lambda_loop(model: SplitModel, bodies: list[dict], head: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    loo = {k: leave_one_out_means(v) for k, v in stack_states(bodies).items()}
    model.eval()
    return torch.stack([F.cross_entropy(functional_call(model, {**head, **{k: v[i] for k, v in loo.items()}}, (x,)), y)
                        for i in range(len(bodies))])


@torch.no_grad()
def lambda_naive(model: SplitModel, models: list[SplitModel], x: torch.Tensor, y: torch.Tensor) -> list[float]:
    work = copy.deepcopy(model).eval()
    own = model.state_dict()
    states = [m.state_dict() for m in models]
    losses = []
    for i in range(len(models)):
        others = [s for j, s in enumerate(states) if j != i]
        work.load_state_dict({k: torch.stack([o[k] for o in others]).mean(0) if k.startswith("body.") else v
                              for k, v in own.items()})
        losses.append(float(F.cross_entropy(work(x), y)))
    return losses


@torch.no_grad()
def Lambda_naive(model: SplitModel, models: list[SplitModel], x: torch.Tensor, y: torch.Tensor) -> list[list[float]]:
    work = copy.deepcopy(model).eval()
    own = model.state_dict()
    heads = [part_state(m, "head") for m in models]
    losses = []
    for i in range(len(models)):
        others = [h for j, h in enumerate(heads) if j != i]
        row_w = torch.stack([o["head.weight"] for o in others]).mean(0)
        row_b = torch.stack([o["head.bias"] for o in others]).mean(0)
        per_class = []
        for c in range(CLASSES):
            w, b = own["head.weight"].clone(), own["head.bias"].clone()
            w[c], b[c] = row_w[c], row_b[c]
            work.load_state_dict({**own, "head.weight": w, "head.bias": b})
            per_class.append(float(F.cross_entropy(work(x), y)))
        losses.append(per_class)
    return losses


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    train = synthetic(EPOCH_SAMPLES, 1)
    batch = synthetic(BATCH, 2)
    x, y = batch.x, batch.y
    base = lenet(3, 28, CLASSES)
    trainer = LocalTrainer(TrainConfig(epochs=1, batch_size=32, optimizer="adam", lr=1e-3))
    trainer.fit(base, train)  # warm-up, and a model that is not at its initialisation
    epoch_s = median_seconds(lambda: trainer.fit(copy.deepcopy(base), train), repeat=3, warmup=1)
    n_params = sum(p.numel() for p in base.parameters())
    print(f"LeNet(3,28,10): {n_params:,} parameters; influence batch {BATCH}; C = {CLASSES}; gamma {GAMMA}; 1 thread")
    print(f"one local epoch ({EPOCH_SAMPLES} samples, Adam 1e-3, batch 32, {EPOCH_SAMPLES // 32} steps): {epoch_s:.3f} s\n")

    header = (f"{'M':>3} {'what':>7} {'batched s':>10} {'chunk2 s':>9} {'loop s':>8} {'naive s':>8} {'naive/batched':>14} "
              f"{'batched/epoch':>14} {'naive/epoch':>12}")
    print(header)
    print("-" * len(header))
    for m in (5, 10):
        models = [base] + [copy.deepcopy(base) for _ in range(m - 1)]
        with torch.no_grad():
            for j, peer in enumerate(models[1:]):
                for p in peer.parameters():
                    p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(100 + j)))
        bodies = [part_state(mm, "body") for mm in models]
        heads = [part_state(mm, "head") for mm in models]
        own_head = heads[0]

        lam_batched = client_influence(base, bodies, own_head, x, y, GAMMA)
        lam_ref = lambda_naive(base, models, x, y)
        assert torch.allclose(lam_batched.losses, torch.tensor(lam_ref, dtype=torch.float64), rtol=1e-4)
        Lam_batched = class_influence(eval_features(base.body, x), heads, y, GAMMA)
        Lam_ref = Lambda_naive(base, models, x, y)
        assert torch.allclose(Lam_batched.losses, torch.tensor(Lam_ref, dtype=torch.float64), rtol=1e-4)

        t_lam = median_seconds(lambda: client_influence(base, bodies, own_head, x, y, GAMMA), repeat=5, warmup=1)
        t_lam_chunk = median_seconds(lambda: client_influence(base, bodies, own_head, x, y, GAMMA, chunk_size=2), repeat=5, warmup=1)
        t_lam_loop = median_seconds(lambda: lambda_loop(base, bodies, own_head, x, y), repeat=5, warmup=1)
        t_lam_naive = median_seconds(lambda: lambda_naive(base, models, x, y), repeat=5, warmup=1)
        t_Lam = median_seconds(lambda: class_influence(eval_features(base.body, x), heads, y, GAMMA), repeat=5, warmup=1)
        t_Lam_naive = median_seconds(lambda: Lambda_naive(base, models, x, y), repeat=2, warmup=1)
        rows = [
            ("lambda", t_lam, f"{t_lam_chunk:>9.3f} {t_lam_loop:>8.3f}", t_lam_naive),
            ("Lambda", t_Lam, f"{'-':>9} {'-':>8}", t_Lam_naive),
            ("both", t_lam + t_Lam, f"{'-':>9} {'-':>8}", t_lam_naive + t_Lam_naive),
        ]
        for what, batched, others, naive in rows:
            print(f"{m:>3} {what:>7} {batched:>10.3f} {others} {naive:>8.3f} {naive / batched:>14.1f} "
                  f"{batched / epoch_s:>14.3f} {naive / epoch_s:>12.2f}")
    print("\nlambda: batched (one vmap call), chunk2, loop and naive all run M forward passes' worth of work;\n"
          "Lambda: batched runs 1 body pass plus one tensor expression, naive M*C full forward passes.")


if __name__ == "__main__":
    main()
