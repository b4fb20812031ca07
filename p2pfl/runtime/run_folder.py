"""The run folder: where a run's files live, and both ends of the artefact format.

    RUN/scenario.json               the resolved scenario every process reads
    RUN/keys/<id>.key               each node's signing key
    RUN/nodes/<id>.toml             each node's (and the coordinator's) config
    RUN/nodes/<id>.result.json      what each node reports when it ends
    RUN/nodes/<id>.rounds.jsonl     each round's record as soon as the round ends
    RUN/checkpoints/<id>.p2pfl      signed checkpoints (--resume)
    RUN/checkpoints/.<id>.p2pfl.swap   the previous checkpoint; the next is written over it, then swapped in
    RUN/checkpoints/.<id>.round-start  runtime.round_start = "disk": the round's start model, during its gather
    RUN/artefacts/<id>.jsonl        strategies' larger per-round outputs (`ArtefactSink.save`)
    RUN/logs/<process>.log          one log per process
    RUN/results.json                the launcher's summary of all of it
    RUN/report/                     `p2pfl report`'s pictures and tables
    RUN/received/<id>/round-<r>/<peer>.<part>.safetensors
                                    with `runtime.audit = "<id>"`: the parts that node read (`p2pfl audit`)
    RUN/audit.json                  `p2pfl audit`'s findings

A compare folder holds one run folder per row and seed: COMPARE/<row slug>/seed<k>/, and
COMPARE/compare.json listing the rows.

A process may be killed at any byte: every file here is written with `p2pfl.runtime.files`.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from p2pfl.runtime.files import append_record, read_records, write_json_atomic
from p2pfl.runtime.peers import COORDINATOR_ID

ENTRIES = ("results.json", "scenario.json", "nodes", "logs", "artefacts", "checkpoints", "keys", "report", "pids.json",
           "received", "audit.json")


@dataclass(frozen=True)
class RunFolder:
    root: Path

    @property
    def scenario(self) -> Path:
        return self.root / "scenario.json"

    @property
    def results(self) -> Path:
        return self.root / "results.json"

    @property
    def artefacts(self) -> Path:
        return self.root / "artefacts"

    @property
    def report(self) -> Path:
        return self.root / "report"

    def key(self, node_id: str) -> Path:
        return self.root / "keys" / f"{node_id}.key"

    def node_config(self, node_id: str) -> Path:
        return self.root / "nodes" / f"{node_id}.toml"

    @property
    def roster(self) -> Path:
        """Every node's URL and public key (and the coordinator's), named by each node config."""
        return self.root / "nodes" / "roster.toml"

    def node_result(self, node_id: str) -> Path:
        return self.root / "nodes" / f"{node_id}.result.json"

    def traced_ids(self) -> list[str]:
        """The node ids whose result or round log this folder holds (a federation member's folder:
        its own id, which no scenario's `node-i` names); the coordinator's is not a node's."""
        found = {p.name.split(".")[0] for pattern in ("*.result.json", "*.rounds.jsonl")
                 for p in (self.root / "nodes").glob(pattern)}
        return sorted(found - {COORDINATOR_ID})

    def ids_here(self, named: list[str]) -> list[str]:
        """The nodes this folder is about: the scenario's `named` ones (node-i), or, where it holds
        others' files (a federation's members go by their own names), those."""
        traced = self.traced_ids()
        return traced if not set(traced) <= set(named) else named

    def node_rounds(self, node_id: str) -> Path:
        """One JSON line per finished round, appended as the node goes (what a live view reads)."""
        return self.root / "nodes" / f"{node_id}.rounds.jsonl"

    @property
    def pids(self) -> Path:
        """Node id -> the pid of the process running it, while it runs (`write_pids`)."""
        return self.root / "pids.json"

    def node_exit(self, node_id: str) -> Path:
        """How a node's process died without writing its result (the launcher's record; the
        node removes it when it starts again, `--resume`)."""
        return self.root / "nodes" / f"{node_id}.exit.json"

    def write_pids(self, pids: Mapping[str, int]) -> None:
        """The running nodes' pids, replacing the file (none left: removed)."""
        if pids:
            write_json_atomic(self.pids, dict(sorted(pids.items())))
        else:
            self.pids.unlink(missing_ok=True)

    def checkpoint(self, node_id: str) -> Path:
        return self.root / "checkpoints" / f"{node_id}.p2pfl"

    def round_start(self, node_id: str) -> Path:
        """Where a node's round start waits for its gather (runtime.round_start = "disk")."""
        return self.root / "checkpoints" / f".{node_id}.round-start"

    def received(self, node_id: str) -> Path:
        """The parts a node read from its peers, kept for an audit (`runtime.audit`)."""
        return self.root / "received" / node_id

    @property
    def audit(self) -> Path:
        return self.root / "audit.json"

    def log(self, process: str) -> Path:
        return self.root / "logs" / f"{process}.log"

    def create(self) -> None:
        for sub in ("keys", "nodes", "logs", "artefacts"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    def present(self) -> list[str]:
        """The run entries this folder already holds."""
        return [name for name in ENTRIES if (self.root / name).exists()]

    def append_round(self, node_id: str, record: Mapping[str, Any]) -> None:
        append_record(self.node_rounds(node_id), record)

    def write_result(self, node_id: str, result: Mapping[str, Any]) -> None:
        write_json_atomic(self.node_result(node_id), result)


def row_slug(label: str) -> str:
    """The folder name of a compare row."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_")


def compare_run(folder: Path, label: str, seed: int) -> Path:
    return folder / row_slug(label) / f"seed{seed}"


def compare_row_runs(folder: Path) -> dict[str, list[Path]]:
    """Row label -> its run folders, one per seed, in the order compare.json lists the rows; a
    sweep row's runs are those of the values validation chose (compare.json's `chosen`)."""
    doc = json.loads((folder / "compare.json").read_text())
    chosen = doc.get("chosen") or {}

    def runs(label: str) -> list[Path]:
        if "seeds" not in doc:  # a listing without its seeds: the seed folders the row has
            return sorted(p.parent for p in (folder / row_slug(label)).glob("seed*/results.json"))
        return [compare_run(folder, chosen.get(label, {}).get(str(seed), label), seed) for seed in doc["seeds"]]

    return {label: runs(label) for label in doc["rows"]}


# ---- artefacts: written by strategies through the node, read by `p2pfl report` ------------
class ArtefactSink:
    """Per-round outputs of a strategy.

    `record` puts a JSON-able value into this round's entry of results.json (keep it small:
    scalars, short vectors); `save` appends a larger value (influence matrices, relevance
    vectors) to `<out>/artefacts/<node>.jsonl`, which `load_artefacts` reads.
    """

    def __init__(self, node_id: str, directory: Path | None) -> None:
        self.node_id = node_id
        self.round = 0
        self.records: dict[str, Any] = {}
        self._path = None if directory is None else Path(directory) / f"{node_id}.jsonl"
        if self._path is not None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
        self.saved: list[dict[str, Any]] = []

    def begin_round(self, round_: int) -> None:
        self.round = round_
        self.records = {}

    def record(self, key: str, value: Any) -> None:
        self.records[key] = _jsonable(value)

    def save(self, name: str, value: Any) -> None:
        entry = {"node": self.node_id, "round": self.round, "name": name, "value": _jsonable(value)}
        self.saved.append(entry)
        if self._path is not None:
            append_record(self._path, entry)


def load_artefacts(run_dir: Path) -> dict[str, dict[str, dict[int, Any]]]:
    """name -> node -> round -> value, from `artefacts/*.jsonl`."""
    out: dict[str, dict[str, dict[int, Any]]] = defaultdict(lambda: defaultdict(dict))
    for path in sorted(RunFolder(run_dir).artefacts.glob("*.jsonl")):
        for e in read_records(path, ("name", "node", "round", "value")):
            if isinstance(e["name"], str) and isinstance(e["node"], str) and type(e["round"]) is int:
                out[e["name"]][e["node"]][e["round"]] = e["value"]
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().tolist()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value
