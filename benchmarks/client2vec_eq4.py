"""Client2Vec's eq. 4 in local training: the two readings of L_orth against plain training.

Setup: `scenarios/client2vec_digits.toml`'s partition (seed 0 by default): the five digits
domains x 4 nodes, Dirichlet(0.5) inside domains, 440 samples per node. B^f holds the 20
nodes' mean-D indices (the mean random-CNN image embedding; cheap, and eq. 4's failure below
does not depend on which index fills B^f). One node's LeNet is trained alone, `--epochs`
epochs of Adam 1e-3, batch 32, with eq. 4 at each (L_orth reading, weight mu), trainable P.
Printed: test accuracy on that node after each configuration, and its ratio to plain
training (mu = 0) run in the same process.

* "raw": the printed ||z_P B^f||_1 (mean |z_P beta^f|, unit beta^f). z = 0 minimises it too.
* "cosine" (the default, `local_orth`): mean |cos(z_P, beta^f)|, unchanged by rescaling z.

    python benchmarks/client2vec_eq4.py [--node 0] [--epochs 10] [--seed 0]
"""

from __future__ import annotations

import argparse

import torch

from p2pfl.algorithms.client2vec import Eq4
from p2pfl.core.client2vec import mean_embedding_index
from p2pfl.data import build_partition
from p2pfl.models import build_model
from p2pfl.models.encoders import build_image_encoder, build_label_encoder, encode_images
from p2pfl.scenario.schema import load_scenario
from p2pfl.training import LocalTrainer, TrainConfig

CONFIGS = (("plain", 0.0), ("cosine", 1.0), ("cosine", 5.0), ("raw", 1.0), ("raw", 5.0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--node", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    scenario = load_scenario("scenarios/client2vec_digits.toml")
    part = build_partition(scenario.data, scenario.nodes, args.seed)
    image = build_image_encoder("random_cnn", 512, args.seed)
    label = build_label_encoder("orthonormal", part.num_classes, 512, args.seed)
    indices = torch.stack([mean_embedding_index(encode_images(image, n.train.x), label(n.train.y)).feature
                           for n in part.nodes], dim=1)
    data = part.nodes[args.node]
    print(f"node {args.node} ({data.domain}), {len(data.train)} train / {len(data.test)} test samples, "
          f"{args.epochs} epochs")
    print("L_orth | mu | test accuracy | x plain")
    plain = None
    for mode, mu in CONFIGS:
        torch.manual_seed(args.seed)
        model = build_model("lenet", part.in_channels, part.image_size, part.num_classes)
        trainer = LocalTrainer(TrainConfig(epochs=args.epochs, batch_size=32), seed=args.seed)
        if mu == 0:
            trainer.fit(model, data.train)
        else:
            eq4 = Eq4(model, indices, mu, trainable=True, seed=args.seed, orth=mode)
            with eq4.capturing(model):
                trainer.fit(model, data.train, params=[*model.parameters(), *eq4.parameters()], regularizer=eq4.loss)
        model.eval()
        with torch.no_grad():
            acc = float((model(data.test.x).argmax(1) == data.test.y).float().mean())
        plain = acc if plain is None else plain
        print(f"{mode} | {mu:g} | {100 * acc:.1f} | {acc / plain:.2f}")


if __name__ == "__main__":
    main()
