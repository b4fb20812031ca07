#!/usr/bin/env bash
# Issue 62's calibration: the cheap rows (Local = the paper's Separate; FedAvg, whose aggregated
# column is the paper's FedAvg and whose after-training column is FedAvg+FT) of pFedSV's
# Fashion-MNIST setting at the paper's training (scenarios/pfedsv_fmnist.toml: 10 nodes, SGD 0.01,
# 5 local epochs, 20 rounds, the paper's CNN), both partitions, scored under every test-split
# reading: the runs' own test split is own_distribution, and data.extra_test_splits scores the
# same models on the other readings (no extra training; tests/runtime/test_extra_test_splits.py).
# Usage: bash benchmarks/calibration.sh OUT SEEDS [PARTITION ...] [-- --set FIELD=VALUE ...]
#   bash benchmarks/calibration.sh ~/p2pfl-runs/calibration 0,1
#   bash benchmarks/calibration.sh ~/p2pfl-runs/calibration 0,1,2,3,4 dirichlet   # more seeds: --reuse keeps the rest
#   bash benchmarks/calibration.sh ~/p2pfl-runs/calibration-600 0,1 dirichlet -- --set data.samples_per_node=600
#     (a training budget: the paper's clients may hold a share of the 70,000 images, not all of them)
# then: python benchmarks/calibration_table.py ~/p2pfl-runs/calibration
set -euo pipefail
out=${1:?OUT folder}; seeds=${2:?seeds, e.g. 0,1}; shift 2
partitions=(); extra=()
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then shift; extra=("$@"); break; fi
  partitions+=("$1"); shift
done
[ ${#partitions[@]} -gt 0 ] || partitions=(dirichlet pathological)
# benchmarks/calibrated_comparison.sh runs its rows through this loop (ROWS, REFERENCE, and no
# extra readings: EVERY_READING=0)
rows=${ROWS:-local,fedavg}; reference=${REFERENCE:-local}
for partition in "${partitions[@]}"; do
  sets=(${extra[@]+"${extra[@]}"})
  [ "${EVERY_READING:-1}" = 1 ] && sets+=(--set 'data.extra_test_splits=["own_classes_balanced", "global"]')
  [ "$partition" = dirichlet ] && sets+=(--set 'data.partition="dirichlet"' --set data.alpha=0.1)
  p2pfl compare scenarios/pfedsv_fmnist.toml --seeds "$seeds" --out "$out/$partition" \
    --algorithms "$rows" --reference "$reference" --reuse --no-progress ${sets[@]+"${sets[@]}"}
done
