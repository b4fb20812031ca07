"""pFedSV's Fig. 11 on Fashion-MNIST: what a peer recovers of a node's training images from the model
it downloads, without and with pFedSV's output noise (issue 64).

    python benchmarks/fig11.py [--out docs/fig11_fashion_mnist.png] [--seed 0] [--iterations 600]

The paper's Fig. 11 recovers CIFAR-10 training images "from the model through the gradients only"
and shows its DP noise defeating that. Here one node of `scenarios/pfedsv_fmnist.toml` (the
calibrated regime: 390 training images, the paper's CNN, SGD 0.01) publishes its model after
(a) one SGD step on a batch of 4 images, what a gradient-inversion attack is made for;
(b) the same step, then pFedSV's output noise as `privacy.mode = "output-noise"` publishes it
    (update clipped to C = 1, N(0, σ²C²) per coordinate, σ = 1: `p2pfl.privacy.output_noise`);
(c) a whole round as the scenario runs it: 5 epochs over its 390 images, no noise.
A peer holding the model before and after inverts each update into 4 images
(`p2pfl.audit.inversion.update_inversion`, labels from the head's bias); each is shown beside the
nearest true training image with its PSNR. The figure and the printed PSNRs come from this script.
"""

from __future__ import annotations

import argparse
import copy
import statistics
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from p2pfl.audit.inversion import nearest, trained_labels, update_inversion
from p2pfl.data.partition import build_partition
from p2pfl.models import build_model
from p2pfl.privacy.output_noise import clip_and_noise
from p2pfl.report.style import plt, save_figure
from p2pfl.scenario.schema import load_scenario
from p2pfl.training.trainer import LocalTrainer

BATCH = 4
NODE = 1


def state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/fig11_fashion_mnist.png"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=600)
    args = parser.parse_args()
    scenario = load_scenario("scenarios/pfedsv_fmnist.toml", [f"seed={args.seed}"])
    partition = build_partition(scenario.data, scenario.nodes, scenario.seed, only=[NODE])
    data = partition.node(NODE)
    shape = (partition.in_channels, partition.image_size, partition.image_size)
    torch.manual_seed(scenario.seed)
    model = build_model(scenario.model.name, *shape[:2], partition.num_classes)
    start = state(model)
    batch = torch.randperm(len(data.train), generator=torch.Generator().manual_seed(args.seed))[:BATCH]
    x, y = data.train.x[batch], data.train.y[batch]

    stepped = copy.deepcopy(model)
    loss = F.cross_entropy(stepped(x), y)
    with torch.no_grad():
        for p, g in zip(stepped.parameters(), torch.autograd.grad(loss, list(stepped.parameters()))):
            p -= scenario.train.lr * g
    noisy = copy.deepcopy(stepped)
    clip_and_noise(noisy, start, clip_norm=1.0, noise_std=1.0, generator=torch.Generator().manual_seed(args.seed))
    rounded = copy.deepcopy(model)
    LocalTrainer(scenario.train, seed=args.seed).fit(rounded, data.train)

    bias = [k for k, v in start.items() if k.endswith("bias") and v.shape == (partition.num_classes,)][-1]
    train = data.train.x.numpy()
    cases = {"one step, 4 images": state(stepped), "one step + output noise σ = 1": state(noisy),
             "one round: 5 epochs, 390 images": state(rounded)}
    rows = []
    for title, end in cases.items():
        labels = trained_labels(start, end, bias, BATCH)
        recovered = update_inversion(copy.deepcopy(model), start, end, labels, shape, iterations=args.iterations,
                                     seed=args.seed)
        found = [nearest(r, train) for r in recovered]
        rows.append((title, recovered, found))
        print(f"{title}: PSNR to the nearest training image {statistics.fmean(p for _, p in found):.1f} dB "
              f"({', '.join(f'{p:.1f}' for _, p in found)}); labels {labels}, true {sorted(y.tolist())}")

    fig, axes = plt.subplots(1 + 2 * len(rows), BATCH, figsize=(1.5 * BATCH, 1.45 * (1 + 2 * len(rows))))
    for j in range(BATCH):
        axes[0, j].imshow(x[j, 0], cmap="gray", vmin=0, vmax=1)
        axes[0, j].set_title(f"trained on (label {int(y[j])})", fontsize=6)
    for i, (title, recovered, found) in enumerate(rows):
        for j in range(BATCH):
            axes[1 + 2 * i, j].imshow(recovered[j, 0], cmap="gray", vmin=0, vmax=1)
            axes[1 + 2 * i, j].set_title(f"{title}" if j == 0 else "", fontsize=6, loc="left")
            axes[2 + 2 * i, j].imshow(train[found[j][0], 0], cmap="gray", vmin=0, vmax=1)
            axes[2 + 2 * i, j].set_title(f"nearest, {found[j][1]:.1f} dB", fontsize=6)
    for ax in axes.flat:
        ax.axis("off")
    fig.suptitle("pFedSV Fig. 11 on Fashion-MNIST: update inversion by a peer", fontsize=8)
    print(save_figure(fig, args.out))


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
