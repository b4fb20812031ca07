"""A run's records as TensorBoard scalars, so a run can be looked at beside other TensorBoard runs:
live while it goes (`p2pfl run --tensorboard DIR`) or after (`p2pfl export --tensorboard RUN`, a
run folder or a compare folder). One TensorBoard run per node (`LOGDIR/node-3`) and one for the
mean over nodes (`LOGDIR/mean`, written live as each round ends at every node); the step is the
round. Besides the runtime's scalars, a strategy's `evaluate` metrics (`metrics/<name>`) and its
`fit_config` numbers (`fit/<name>`: a learning-rate schedule). Writing again replaces the event files
it wrote before, so every scalar appears once. Needs the `tensorboard` extra
(`pip install 'p2pfl-influence[tensorboard]'`)."""

from __future__ import annotations

import asyncio
import json
import math
import statistics
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
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


def hook_scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The strategy hooks' numbers of a round record, as tags: `evaluate`'s metrics under
    `metrics/<name>`, `fit_config`'s numeric settings (a learning rate) under `fit/<name>`."""
    out: dict[str, float] = {}
    for prefix, key in (("metrics", "metrics"), ("fit", "fit_config")):
        table = record.get(key)
        for name, value in (table.items() if isinstance(table, Mapping) else ()):
            number = _number(value)
            if number is not None:
                out[f"{prefix}/{name}"] = number
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None  # None, "inf" as text, a missing record
    return float(value) if math.isfinite(value) else None


EVENT_FILES = "events.out.tfevents.*"
LIVE_EVERY_S = 1.0  # how often a live writer reads the nodes' round files


def _writer_class() -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError("--tensorboard", "needs TensorBoard: pip install 'p2pfl-influence[tensorboard]' "
                                           "(in a checkout: pip install -e '.[tensorboard]')") from None
    return SummaryWriter


def clear_events(logdir: Path) -> None:
    """The event files an earlier export or live run wrote under `logdir`; nothing else is touched."""
    for path in logdir.glob(f"*/{EVENT_FILES}"):
        path.unlink()


class ScalarWriter:
    """Round records in, scalars out: one writer per node, and the mean over nodes of a round as
    soon as `nodes` of them have it (live), the rest at `close` (a node that ended early)."""

    def __init__(self, logdir: Path, nodes: int | None = None) -> None:
        self.logdir, self.writer_class, self.nodes = logdir, _writer_class(), nodes
        clear_events(logdir)
        self.writers: dict[str, Any] = {}
        self.by_round: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        self.mean: Any = None
        self.written: set[tuple[str, int]] = set()  # the means written already

    def add(self, node: str, record: Mapping[str, Any]) -> None:
        writer = self.writers.get(node)
        if writer is None:
            writer = self.writers[node] = self.writer_class(log_dir=str(self.logdir / node))
        if not isinstance(record.get("round"), int):
            return
        round_ = record["round"]
        values = {tag: _number(record.get(key)) for tag, key in SCALARS.items()} | hook_scalars(record)
        for tag, value in values.items():
            if value is None:
                continue
            writer.add_scalar(tag, value, round_)
            self.by_round[tag][round_].append(value)
            if self.nodes is not None and len(self.by_round[tag][round_]) >= self.nodes:
                self._write_mean(tag, round_)

    def _write_mean(self, tag: str, round_: int) -> None:
        if (tag, round_) in self.written:
            return
        if self.mean is None:
            self.mean = self.writer_class(log_dir=str(self.logdir / "mean"))
        self.mean.add_scalar(tag, statistics.fmean(self.by_round[tag][round_]), round_)
        self.written.add((tag, round_))

    def flush(self) -> None:
        for writer in [*self.writers.values(), *([self.mean] if self.mean is not None else [])]:
            writer.flush()

    def close(self, title: str) -> None:
        for tag, rounds in self.by_round.items():
            for round_ in sorted(rounds):
                self._write_mean(tag, round_)
        if self.mean is None:
            self.mean = self.writer_class(log_dir=str(self.logdir / "mean"))
        self.mean.add_text("run", title)
        self.mean.close()
        for writer in self.writers.values():
            writer.close()


def export_tensorboard(run_dir: Path, logdir: Path | None = None) -> Path:
    """Write the scalars of `run_dir/results.json` under `logdir` (default `run_dir/tensorboard`);
    a compare folder's runs each under `logdir/<row>/seed<N>`."""
    from p2pfl.runtime.run_folder import compare_row_runs, row_slug

    logdir = logdir or run_dir / "tensorboard"
    if (run_dir / "compare.json").is_file():
        for label, runs in compare_row_runs(run_dir).items():
            for run in runs:
                if (run / "results.json").is_file():
                    export_tensorboard(run, logdir / row_slug(label) / run.name)
        return logdir
    path = run_dir / "results.json"
    if not path.is_file():
        raise ConfigError("run", f"{run_dir} holds no results.json (not a finished run folder, nor a compare folder)")
    results: Mapping[str, Any] = json.loads(path.read_text())
    scalars = ScalarWriter(logdir)
    for node in results["nodes"]:
        for record in node.get("rounds", []):
            scalars.add(node["id"], record)
    scalars.close(_title(results["scenario"], results["algorithm"], len(results["nodes"])))
    return logdir


def _title(scenario: Mapping[str, Any], algorithm: str, nodes: int) -> str:
    return f"{scenario.get('name')}: {algorithm}, {nodes} nodes, {scenario.get('rounds')} rounds"


class RoundTail:
    """The nodes' round files of a running run (`nodes/<id>.rounds.jsonl`), read as they grow:
    each call returns the records written since the last, whole lines only."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir, self.offsets = run_dir, dict[Path, int]()

    def new_records(self) -> list[tuple[str, dict[str, Any]]]:
        found = []
        for path in sorted((self.run_dir / "nodes").glob("*.rounds.jsonl")):
            with path.open("rb") as fh:
                fh.seek(self.offsets.get(path, 0))
                data = fh.read()
            whole = data[: data.rfind(b"\n") + 1]
            self.offsets[path] = self.offsets.get(path, 0) + len(whole)
            for line in whole.splitlines():
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict):
                    found.append((path.name.removesuffix(".rounds.jsonl"), record))
        return found


def live_tensorboard(logdir: Path | None = None) -> Callable[[Path], AbstractAsyncContextManager[None]]:
    """A run's live view (`run_scenario(..., live_view=live_tensorboard(DIR))`): each node's scalars
    written as its rounds end (read every LIVE_EVERY_S), the mean over nodes when the run ends."""
    _writer_class()  # a missing extra is said before the run starts

    @asynccontextmanager
    async def writing(run_dir: Path) -> AsyncIterator[None]:
        scenario = run_dir / "scenario.json"
        nodes = json.loads(scenario.read_text()).get("nodes") if scenario.is_file() else None
        scalars = ScalarWriter(logdir or run_dir / "tensorboard", nodes if isinstance(nodes, int) else None)
        tail = RoundTail(run_dir)

        def take() -> None:
            for node, record in tail.new_records():
                scalars.add(node, record)
            scalars.flush()

        async def follow() -> None:
            while True:
                await asyncio.to_thread(take)
                await asyncio.sleep(LIVE_EVERY_S)

        task = asyncio.create_task(follow())
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            take()
            scenario = run_dir / "scenario.json"
            title = json.loads(scenario.read_text()) if scenario.is_file() else {}
            scalars.close(_title(title, (title.get("algorithm") or {}).get("name", "?"), len(scalars.writers)))

    return writing
