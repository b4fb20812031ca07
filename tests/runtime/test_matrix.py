"""Every algorithm and privacy mode, 2 rounds, on the CPU and (marked `gpu`) on CUDA.

The same cases run on both devices, so the GPU matrix is the CPU one CI keeps green, moved
to `device = "cuda"`. Run it on a GPU machine with `python -m pytest -m gpu`.
Nodes run in this process over real HTTP on 127.0.0.1 (see `helpers.run_in_process`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from p2pfl.runtime.timing import PHASES

from .helpers import build_in_process, run_in_process, write_tiny

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=[gpu, needs_cuda])]

DP_SGD = '\n[privacy]\nmode = "dp-sgd"\nnoise_multiplier = 1.0\nmax_grad_norm = 1.0\n'
OUTPUT_NOISE = '\n[privacy]\nmode = "output-noise"\nnoise_multiplier = 0.5\nclip_norm = 1.0\n'
CASES = {
    "local": ("local", ""),
    "fedavg": ("fedavg", ""),
    "fedprox": ("fedprox", ""),
    "fedrep": ("fedrep", ""),
    "fedc2i": ("fedc2i", ""),
    "pfedsv": ("pfedsv", '\n[algorithm.params]\nk = 2\n'),
    "pfedsv-D+C": ("pfedsv", '\n[algorithm.params]\nk = 2\nvariant = "D+C"\n'),
    "fedfomo": ("fedfomo", '\n[algorithm.params]\nm = 2\n'),
    "di": ("di", ""),
    "ga": ("ga", ""),
    "fedavg_global": ("fedavg_global", ""),
    "fedavg+dp-sgd": ("fedavg", DP_SGD),
    "pfedsv+dp-sgd": ("pfedsv", DP_SGD),
    "fedavg+output-noise": ("fedavg", OUTPUT_NOISE),
    "pfedsv+output-noise": ("pfedsv", OUTPUT_NOISE),
}
FETCHES_NOTHING = {"local"}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(CASES))
def test_every_algorithm_and_privacy_mode_runs(tmp_path: Path, case: str, device: str) -> None:
    algorithm, extra = CASES[case]
    path = write_tiny(tmp_path, nodes=3, rounds=2, samples=60, algorithm=algorithm, timeout=20.0, extra=extra)
    nodes, coordinator = build_in_process(path, tmp_path / "run", overrides=(f"device={device}",))
    results, coordinator_result, _ = run_in_process(nodes, coordinator)
    for r in results:
        assert r["status"] == "ok", r["error"]
        assert torch.device(r["device"]).type == device
        assert [x["round"] for x in r["rounds"]] == [1, 2]
        for record in r["rounds"]:
            phases = record["time"]
            assert set(phases) == {f"{p}_s" for p in PHASES}
            assert sum(phases.values()) == pytest.approx(record["wall_s"], rel=0.05)
        # From round 2 on pFedSV and FedFomo may rightly download nobody (all peers scored <= 0).
        if algorithm not in FETCHES_NOTHING:
            assert r["rounds"][0]["arrived"], f"{r['id']}: nothing arrived in round 1"
            if "privacy" in extra:
                assert record["epsilon"] is not None
    if coordinator is not None:
        assert coordinator_result is not None and coordinator_result["status"] == "ok"
        assert [x["round"] for x in coordinator_result["rounds"]] == [1, 2]
