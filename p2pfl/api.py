"""The Python API: run a scenario or a comparison from a script or a notebook, and read the
results as objects instead of parsing results.json.

    import p2pfl
    results = p2pfl.run("scenarios/quickstart.toml", out="runs/qs", overrides=["rounds=2"], force=True)
    results.summary["mean_acc"], results.node("node-0").rounds[-1].test_acc
    again = p2pfl.Results.load("runs/qs")                # the same object from the folder
    table = p2pfl.compare("scenarios/quickstart.toml", "local,fedavg", seeds=[0, 1], out="runs/cmp")

Both calls block until the run ends and work inside a running event loop (a notebook's): the
run then goes on in a thread of its own. `run_async` / `compare_async` await it instead.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from p2pfl.runtime.run_folder import RunFolder, compare_row_runs, load_artefacts
from p2pfl.runtime.node.records import TEST_ACC_AGGREGATED

T = TypeVar("T")


@dataclass(frozen=True)
class Round:
    round: int
    participated: bool
    test_acc: float | None
    test_acc_aggregated: float | None
    train_loss: float | None
    wall_s: float
    epsilon: float | str | None
    asked: int
    arrived: tuple[str, ...]
    bytes_sent: int
    bytes_received: int
    raw: Mapping[str, Any] = field(repr=False)
    metrics: Mapping[str, float] = field(default_factory=dict)     # the strategy's `evaluate` this round
    fit_config: Mapping[str, Any] = field(default_factory=dict)    # its `fit_config` (a learning rate)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Round:
        return cls(round=d["round"], participated=d.get("participated", True), test_acc=d.get("test_acc"),
                   test_acc_aggregated=d.get(TEST_ACC_AGGREGATED), train_loss=d.get("train_loss"),
                   wall_s=d.get("wall_s", 0.0), epsilon=d.get("epsilon"), asked=d.get("asked", 0),
                   arrived=tuple(d.get("arrived", ())), bytes_sent=d.get("bytes_sent", 0),
                   bytes_received=d.get("bytes_received", 0), raw=d, metrics=dict(d.get("metrics") or {}),
                   fit_config=dict(d.get("fit_config") or {}))


@dataclass(frozen=True)
class NodeResult:
    id: str
    status: str
    rounds: tuple[Round, ...]
    final_test_acc: float | None
    final_test_acc_aggregated: float | None
    final_epsilon: float | str | None
    error: str | None
    raw: Mapping[str, Any] = field(repr=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> NodeResult:
        return cls(id=d["id"], status=d.get("status", "?"), rounds=tuple(Round.from_dict(r) for r in d.get("rounds", [])),
                   final_test_acc=d.get("final_test_acc"), final_test_acc_aggregated=d.get("final_test_acc_aggregated"),
                   final_epsilon=d.get("final_epsilon"), error=d.get("error"), raw=d)


@dataclass(frozen=True)
class Results:
    """One run: its folder, resolved scenario, nodes with their rounds, summary and topology."""

    folder: Path
    scenario: Mapping[str, Any]
    algorithm: str
    nodes: tuple[NodeResult, ...]
    summary: Mapping[str, Any]
    raw: Mapping[str, Any] = field(repr=False)

    @classmethod
    def load(cls, folder: str | Path) -> Results:
        folder = Path(folder)
        path = RunFolder(folder).results
        if not path.is_file():
            raise FileNotFoundError(f"{folder} holds no results.json (not a finished run folder)")
        d = json.loads(path.read_text())
        return cls(folder=folder, scenario=d["scenario"], algorithm=d["algorithm"],
                   nodes=tuple(NodeResult.from_dict(n) for n in d["nodes"]), summary=d["summary"], raw=d)

    def node(self, node_id: str) -> NodeResult:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(f"no node {node_id!r} in this run (nodes: {[n.id for n in self.nodes]})")

    @property
    def ok(self) -> bool:
        return not self.summary.get("nodes_failed")

    def accuracy_by_round(self, aggregated: bool = False) -> dict[str, list[float | None]]:
        """node id -> its test accuracy after each round (after aggregation with `aggregated`)."""
        return {n.id: [r.test_acc_aggregated if aggregated else r.test_acc for r in n.rounds] for n in self.nodes}

    def artefacts(self) -> dict[str, dict[str, dict[int, Any]]]:
        """Strategies' saved outputs: name -> node -> round -> value."""
        return load_artefacts(self.folder)


@dataclass(frozen=True)
class Comparison:
    """Several algorithms (rows) over several seeds: row label -> one `Results` per seed."""

    folder: Path
    rows: Mapping[str, tuple[Results, ...]]

    @classmethod
    def load(cls, folder: str | Path) -> Comparison:
        folder = Path(folder)
        return cls(folder, {label: tuple(Results.load(run) for run in runs)
                            for label, runs in compare_row_runs(folder).items()})

    def mean_acc(self) -> dict[str, float]:
        """row -> mean over seeds of the run's mean test accuracy."""
        return {label: sum(r.summary["mean_acc"] for r in runs) / len(runs) for label, runs in self.rows.items()}


def _blocking(work: Callable[[], T]) -> T:
    """Run `work` here, or in a thread when this thread already runs an event loop (a notebook)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return work()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(work).result()


def _scenario(scenario: str | Path | Mapping[str, Any], overrides: Sequence[str]) -> Any:
    from p2pfl.scenario.schema import apply_overrides, load_scenario, scenario_from_dict

    if isinstance(scenario, Mapping):
        return scenario_from_dict(apply_overrides(dict(scenario), overrides), source="<dict>")
    return load_scenario(scenario, overrides)


def run(scenario: str | Path | Mapping[str, Any], out: str | Path, overrides: Sequence[str] = (), *,
        force: bool = False, resume: bool = False, progress: bool = False, timeout_s: float | None = None) -> Results:
    """Run a scenario (a TOML/JSON file or the same as a dict) to completion; its `Results`.
    Failed nodes do not raise: see `Results.ok` and each node's `status`."""
    from p2pfl.scenario.launcher import run_loaded

    loaded = _scenario(scenario, overrides)

    def work() -> Results:
        run_loaded(loaded, out, progress=progress, timeout_s=timeout_s, quiet=True, force=force, resume=resume)
        return Results.load(out)

    return _blocking(work)


def compare(scenario: str | Path, algorithms: str | Sequence[str], seeds: Sequence[int], out: str | Path,
            overrides: Sequence[str] = (), *, reuse: bool = False, force: bool = False, progress: bool = False,
            reference: str | None = None) -> Comparison:
    """`p2pfl compare` as a call: `algorithms` as on the command line (`"fedavg,pfedsv[k=3]"`,
    `"fedc2i[gamma=1|5]"` to choose on validation) or a list; `reference` as `--reference`;
    a folder holding runs needs `reuse` (take them) or `force` (run them again)."""
    from p2pfl.scenario.compare import parse_algorithms, run_compare

    rows = parse_algorithms(algorithms if isinstance(algorithms, str) else ",".join(algorithms))

    def work() -> Comparison:
        run_compare(Path(scenario), rows, list(seeds), Path(out), overrides, reuse=reuse, force=force,
                    progress=progress, reference=reference)
        return Comparison.load(out)

    return _blocking(work)


async def run_async(*args: Any, **kwargs: Any) -> Results:
    return await asyncio.to_thread(run, *args, **kwargs)


async def compare_async(*args: Any, **kwargs: Any) -> Comparison:
    return await asyncio.to_thread(compare, *args, **kwargs)
