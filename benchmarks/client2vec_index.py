"""Client2Vec index quality and cost on the digits domains (issue 13's index-quality check).

Setup: the five digits domains x 4 nodes, Dirichlet(0.5) label skew inside each domain,
`samples_per_node` 400; default encoders (`random_cnn` images, `orthonormal` labels, 512-d).
The GLOBAL strategy in one process: every node gives one batch of 128 (D, L) pairs, DSA-IGN
is trained on their union (Adam 1e-3, batch 128, 60 epochs), every node computes beta from all its
training samples. Printed per seed:

* the mean same-domain cosine of beta^f minus the mean cross-domain cosine (the "gap"),
  and how many nodes have their nearest neighbour (by cosine of beta^f) in their own domain;
* the same for the class-balanced beta^f (`feature_mean = "balanced"`: the mean over the
  node's classes of each class's mean u^f), from the same DSA-IGN;
* the same for the mean-D index (the mean image embedding in place of beta^f), the baseline
  the paper's Table 2 compares against;
* seconds: encoding every node's data, training DSA-IGN, computing the indices, against one
  round of local training (one epoch of the scenario's LeNet on every node, one after another),
  all on one thread in this process; the ratio index / round is the cost the paper's Table 3
  calls negligible.

The FEDERATED strategy (`--strategy federated`) trains DSA-IGN by FedAvg instead: 100
rounds, 10 % of the nodes each round, 10 local epochs on all their samples
(`p2pfl.core.client2vec.federated_dsa_ign`).

    python benchmarks/client2vec_index.py [--strategy global|federated] [--seeds 0,1,2]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from p2pfl.core.client2vec import (
    DSAIGN,
    DSAIGNConfig,
    IndexTraining,
    client_index,
    federated_dsa_ign,
    group_separation,
    mean_embedding_index,
    train_dsa_ign,
)
from p2pfl.data import build_partition
from p2pfl.data.spec import DataSpec
from p2pfl.models import build_model
from p2pfl.models.encoders import build_image_encoder, build_label_encoder, encode_images
from p2pfl.training import LocalTrainer, TrainConfig

DOMAINS = ("mnist", "usps", "synth", "mnistm", "uci")


def domain_gap(vectors: list[torch.Tensor], domains: list[str]) -> tuple[float, float, float, int]:
    """(same - cross, same, cross, nodes whose nearest neighbour shares their domain)."""
    sep = group_separation(vectors, domains)
    return sep.gap, sep.same, sep.cross, sep.nearest_in_group


def run(seed: int, strategy: str, epochs: int, rounds: int, ff_dim: int, samples: int) -> dict[str, float]:
    spec = DataSpec(dataset="digits", partition="domain", domains=DOMAINS, nodes_per_domain=4,
                    domain_split="dirichlet", alpha=0.5, samples_per_node=samples)
    part = build_partition(spec, len(DOMAINS) * 4, seed)
    domains = [str(n.domain) for n in part.nodes]
    t0 = time.perf_counter()
    image = build_image_encoder("random_cnn", 512, seed)
    label = build_label_encoder("orthonormal", part.num_classes, 512, seed)
    d = [encode_images(image, n.train.x) for n in part.nodes]
    lab = [label(n.train.y) for n in part.nodes]
    t1 = time.perf_counter()
    g = torch.Generator().manual_seed(seed)
    batches = [torch.randperm(len(x), generator=g)[:128] for x in d]
    torch.manual_seed(seed)
    model = DSAIGN(DSAIGNConfig(ff_dim=ff_dim))
    if strategy == "global":
        train_dsa_ign(model, torch.cat([x[b] for x, b in zip(d, batches)]),
                      torch.cat([y[b] for y, b in zip(lab, batches)]), IndexTraining(epochs=epochs), generator=g)
    else:
        federated_dsa_ign(model, list(zip(d, lab)), rounds=rounds, fraction=0.1, training=IndexTraining(epochs=epochs),
                          rng=np.random.default_rng(seed), generator=g)
    t2 = time.perf_counter()
    beta = [client_index(model, x, y) for x, y in zip(d, lab)]
    t3 = time.perf_counter()
    balanced = [client_index(model, x, y, "balanced") for x, y in zip(d, lab)]
    baseline = [mean_embedding_index(x, y) for x, y in zip(d, lab)]
    trainer = LocalTrainer(TrainConfig(epochs=1, batch_size=32, optimizer="adam", lr=1e-3))
    t4 = time.perf_counter()
    for n in part.nodes:
        trainer.fit(build_model("lenet", part.in_channels, part.image_size, part.num_classes), n.train)
    t5 = time.perf_counter()
    gap, same, cross, hits = domain_gap([b.feature for b in beta], domains)
    base_gap, _, _, base_hits = domain_gap([b.feature for b in baseline], domains)
    bal_gap, _, _, bal_hits = domain_gap([b.feature for b in balanced], domains)
    return {"balanced_gap": bal_gap, "balanced_hits": bal_hits, "gap": gap, "same": same, "cross": cross, "hits": hits, "nodes": len(domains),
            "mean_d_gap": base_gap, "mean_d_hits": base_hits,
            "encode_s": t1 - t0, "train_s": t2 - t1, "index_s": t3 - t2, "round_s": t5 - t4}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--strategy", choices=("global", "federated"), default="global")
    parser.add_argument("--epochs", type=int, default=None,
                        help="DSA-IGN epochs (global, default 60) or local epochs per index round (federated, default 10)")
    parser.add_argument("--rounds", type=int, default=100, help="index rounds of the federated strategy")
    parser.add_argument("--ff-dim", type=int, default=256)
    parser.add_argument("--samples", type=int, default=400)
    args = parser.parse_args()
    torch.set_num_threads(1)
    epochs = args.epochs if args.epochs is not None else (60 if args.strategy == "global" else 10)
    training = (f"GLOBAL strategy, {epochs} epochs" if args.strategy == "global" else
                f"FEDERATED strategy, {args.rounds} rounds of 10 % of the nodes, {epochs} local epochs")
    print(f"digits, 5 domains x 4 nodes, Dirichlet 0.5 inside domains, {args.samples} samples/node; "
          f"{training}, ff_dim {args.ff_dim}")
    print("seed | gap beta^f (same, cross) | NN in domain | gap balanced beta^f | NN balanced | gap mean-D | NN mean-D | "
          "encode s | DSA-IGN s | index s | one round s | index/round")
    for seed in (int(s) for s in args.seeds.split(",")):
        r = run(seed, args.strategy, epochs, args.rounds, args.ff_dim, args.samples)
        index_s = r["encode_s"] + r["train_s"] + r["index_s"]
        print(f"{seed} | {r['gap']:.3f} ({r['same']:.3f}, {r['cross']:.3f}) | {r['hits']}/{r['nodes']} | "
              f"{r['balanced_gap']:.3f} | {r['balanced_hits']}/{r['nodes']} | {r['mean_d_gap']:.3f} | {r['mean_d_hits']}/{r['nodes']} | {r['encode_s']:.1f} | {r['train_s']:.1f} | "
              f"{r['index_s']:.1f} | {r['round_s']:.1f} | {index_s / r['round_s']:.2f}", flush=True)


if __name__ == "__main__":
    main()
