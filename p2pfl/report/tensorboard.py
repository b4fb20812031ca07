"""A run folder's records as TensorBoard scalars (`p2pfl export --tensorboard RUN`), so a run can
be looked at beside other TensorBoard runs. One TensorBoard run per node (`LOGDIR/node-3`) and
one for the mean over nodes (`LOGDIR/mean`); the step is the round. Needs the `tensorboard`
extra (`pip install -e ".[tensorboard]"`)."""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from p2pfl.errors import ConfigError
from p2pfl.runtime.node.records import TEST_ACC_AGGREGATED

# tag -> the round record's key
SCALARS = {
    "accuracy/after_training": "test_acc",
    "accuracy/after_aggregation": TEST_ACC_AGGREGATED,
    "accuracy/validation": "val_acc",
    "loss/training": "train_loss",
    "loss/test": "test_loss",
    "bytes/received": "bytes_received",
    "bytes/sent": "bytes_sent",
    "time/round_s": "wall_s",
    "privacy/epsilon": "epsilon",
}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None  # None, "inf" as text, a missing record
    return float(value) if math.isfinite(value) else None


def export_tensorboard(run_dir: Path, logdir: Path | None = None) -> Path:
    """Write the scalars of `run_dir/results.json` under `logdir` (default `run_dir/tensorboard`)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError("--tensorboard", "needs TensorBoard: pip install 'p2pfl-influence[tensorboard]' (in a checkout: pip install -e '.[tensorboard]')") from None
    path = run_dir / "results.json"
    if not path.is_file():
        raise ConfigError("run", f"{run_dir} holds no results.json (not a finished run folder)")
    results: Mapping[str, Any] = json.loads(path.read_text())
    logdir = logdir or run_dir / "tensorboard"
    by_round: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for node in results["nodes"]:
        with SummaryWriter(log_dir=str(logdir / node["id"])) as writer:
            for record in node.get("rounds", []):
                for tag, key in SCALARS.items():
                    value = _number(record.get(key))
                    if value is not None:
                        writer.add_scalar(tag, value, record["round"])
                        by_round[tag][record["round"]].append(value)
    with SummaryWriter(log_dir=str(logdir / "mean")) as writer:
        for tag, rounds in by_round.items():
            for round_, values in sorted(rounds.items()):
                writer.add_scalar(tag, statistics.fmean(values), round_)
        writer.add_text("run", f"{results['scenario']['name']}: {results['algorithm']}, "
                               f"{len(results['nodes'])} nodes, {results['scenario']['rounds']} rounds")
    return logdir
