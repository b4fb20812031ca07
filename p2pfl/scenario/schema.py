"""The scenario file: one TOML table per concern, validated with errors that name the field.

    name, nodes, seed, rounds, device       top-level keys
    [data]        p2pfl.data.DataSpec
    [model]       name = "cnn" | "lenet" | "package.module:factory"
    [algorithm]   name, [algorithm.params]
    [train]       epochs, batch_size, optimizer, lr, momentum, weight_decay
    [runtime]     timeouts, message size limit, threads, ...
    [privacy]     p2pfl.privacy.PrivacySpec
    [churn]       p2pfl.runtime.churn.ChurnSpec: joins, departures, crashes, slow nodes
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from p2pfl.errors import ConfigError, check_table
from p2pfl.plugins import admit, is_reference, resolve
from p2pfl.runtime.churn import ChurnSpec
from p2pfl.runtime.config import node_ids
from p2pfl.runtime.settings import (Sparsity, DEFAULT_MAX_NORM_RATIO, DEFAULT_MAX_WEIGHT_RATIO, DEFAULT_UPDATE_BOUND,
                                    DEFAULT_UPDATE_REFUSE, ROUND_STARTS, SAFEGUARD_KINDS, WIRE_PRECISIONS)
from p2pfl.runtime.topology import Topology
from p2pfl.runtime.transport import CARRIERS
from p2pfl.scenario.migrations import FORMAT, format_of, unrecorded, upgrade
from p2pfl.training.config import TrainConfig

TOP_LEVEL = {"format", "name", "nodes", "seed", "rounds", "device", "data", "model", "algorithm", "train", "runtime", "privacy",
             "attack", "churn", "plugins"}


def _typed(value: Any, kind: type | tuple[type, ...], where: str) -> Any:
    """Check a TOML value's type; ints are accepted where floats are expected."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool) and bool not in kinds:
        raise ConfigError(where, f"expected {'/'.join(k.__name__ for k in kinds)}, got a boolean")
    if not isinstance(value, kinds):
        raise ConfigError(where, f"expected {'/'.join(k.__name__ for k in kinds)}, got {type(value).__name__} {value!r}")
    return value


def _safeguard_kind(value: Any) -> str | None:
    """`algorithm.safeguard`: false (off), true or "mix", or "local" (see p2pfl.runtime.safeguard)."""
    value = _typed(value, (bool, str), "algorithm.safeguard")
    if isinstance(value, bool):
        return "mix" if value else None
    if value not in SAFEGUARD_KINDS:
        raise ConfigError("algorithm.safeguard", f"unknown safeguard {value!r}; use true, false, or one of {SAFEGUARD_KINDS}")
    return value


def _safeguard_level(value: Any, kind: str | None) -> float | None:
    """`algorithm.safeguard_level`: the level of the "local" safeguard's sign test, in (0, 1)."""
    if value is None:
        return None
    value = _typed(value, float, "algorithm.safeguard_level")
    if kind != "local":
        raise ConfigError("algorithm.safeguard_level", f"is the level of the \"local\" safeguard's test; "
                                                       f"set algorithm.safeguard = \"local\" (it is {kind!r})")
    if not 0.0 < value < 1.0:
        raise ConfigError("algorithm.safeguard_level", f"is a test level in (0, 1), got {value!r}")
    return value


def _dataclass_from_table(cls: type, table: Mapping[str, Any], prefix: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    check_table(table, fields, prefix)
    values = {}
    for key, value in table.items():
        declared = fields[key].type
        kind: tuple[type, ...] = {"int": (int,), "float": (float,), "str": (str,), "bool": (bool,)}.get(
            str(declared).split(" |")[0], (object,)
        )
        if value is not None and kind != (object,):
            value = _typed(value, kind, f"{prefix}.{key}")
        values[key] = value
    return cls(**values)


@dataclass(frozen=True)
class ModelSpec:
    name: str = "cnn"


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str = "fedavg"
    params: Mapping[str, Any] = field(default_factory=dict)
    # None, "mix" (`true` in a file: keep the best mix of own and aggregate) or "local" (deploy the
    # federated model only where validation shows it beats the node's Local one); see runtime.safeguard.
    safeguard: str | None = None
    # With safeguard "local": the sign test's one-sided level (None: runtime.safeguard.DEFAULT_LEVEL).
    safeguard_level: float | None = None


_UNKNOWN: Any = object()  # `absent` not declared: a stored scenario without the field cannot say


def setting(default: Any, *, feeds: tuple[str, ...], absent: Any = _UNKNOWN) -> Any:
    """A runtime field, declared once: its default; what it `feeds` ("node": `NodeSettings`, built
    by `settings_for`; "carrier", "coordinator", "hosting": read where those are built); and what
    a stored scenario that lacks it meant (`absent`: a field added after runs were published;
    `p2pfl.scenario.migrations`)."""
    metadata = {"feeds": feeds} if absent is _UNKNOWN else {"feeds": feeds, "absent": absent}
    return field(default=default, metadata=metadata)


PLACEMENTS = ("process", "shared", "ray")
START_METHODS = ("auto", "fork", "spawn")


@dataclass(frozen=True)
class RuntimeSpec:
    fetch_timeout_s: float = setting(60.0, feeds=("node",))     # longest wait for a peer's version of this round
    # a node's longest wait for the coordinator's reply to a round
    coordinator_wait_s: float = setting(120.0, feeds=("node",))
    # the coordinator's longest wait for a round's first node (nodes train)
    first_submission_wait_s: float = setting(240.0, feeds=("coordinator",))
    # then the coordinator's longest wait for the round's other nodes
    straggler_wait_s: float = setting(60.0, feeds=("coordinator",))
    # a node's longest wait for a peer's or the coordinator's step before round 1
    setup_wait_s: float = setting(1800.0, feeds=("node",))
    connect_retry_s: float = setting(0.25, feeds=("carrier",))     # first backoff step when a peer is not up yet
    # largest accepted message (aiohttp's default is 1 MiB)
    message_limit_mb: float = setting(64.0, feeds=("carrier",))
    # use a peer's older version when the wanted one is late
    accept_stale: bool = setting(True, feeds=("node",))
    torch_threads: int = setting(1, feeds=("hosting",))            # 2 cores are shared by all node processes
    # keep serving after the last round until peers are done
    linger_s: float = setting(60.0, feeds=("node", "coordinator"))
    # before round 1, wait this long at most for every peer to be up
    start_wait_s: float = setting(30.0, feeds=("node",))
    # HTTPS between nodes, certificates pinned by fingerprint (no CA)
    tls: bool = setting(False, feeds=("carrier",))
    # "process": one OS process per node; "shared": nodes share worker processes; "ray": the workers
    # are actors on a Ray cluster
    placement: str = setting("process", feeds=("hosting",))
    # worker processes ("shared") or actors ("ray"); 0: one per core / cluster CPU
    workers: int = setting(0, feeds=("hosting",))
    # How "process" placement starts its node processes, and "shared" its workers (multiprocessing's
    # names): "fork" from one process that imported torch and the node's code once (a quarter of
    # the quickstart's start-up on 2 cores; benchmarks/startup.py), "spawn" each as a fresh
    # interpreter; "auto": fork where the platform forks safely (Linux), else spawn.
    start_method: str = setting("auto", feeds=("hosting",), absent="auto")
    # the Ray cluster for placement = "ray" (`ray start --head` prints it)
    ray_address: str = setting("auto", feeds=("hosting",))
    # who fetches from whom: full | ring | regular:d | small_world:d
    topology: str = setting("full", feeds=("hosting",))
    # chance that a node takes part in a round (its own seeded draw)
    participation: float = setting(1.0, feeds=("node",))
    host: str = setting("127.0.0.1", feeds=("hosting",))
    max_skew_s: float = setting(300.0, feeds=("carrier",))         # accepted clock difference for message timestamps
    # shared parameters on the wire: float32 | float16 | int8 (per-tensor scale)
    wire_precision: str = setting("float32", feeds=("node",))
    # model parts sent sparse: "none" | "topk:<fraction>" | "randomk:<fraction>"
    wire_sparsity: str = setting("none", feeds=("node",), absent="none")
    # with wire_sparsity: what a round leaves out is sent in later rounds
    error_feedback: bool = setting(True, feeds=("node",), absent=True)
    # a node serves its published versions that fit here (the latest always), so a peer that ran ahead
    # still serves the round asked for: runs reproducible
    held_mb: float = setting(32.0, feeds=("carrier",))
    # A peer's claims (p2pfl.runtime.peer_claims): its n_train counts at most this many times the
    # node's own (the coordinator: the round's median), and a part over this many times the norm
    # of the node's own part is refused.
    max_weight_ratio: float = setting(DEFAULT_MAX_WEIGHT_RATIO, feeds=("node", "coordinator"))
    max_norm_ratio: float = setting(DEFAULT_MAX_NORM_RATIO, feeds=("node",), absent=DEFAULT_MAX_NORM_RATIO)
    # A peer's model part is pulled back to at most this many times the distance the node's own
    # training moved its model this round (norm clipping against poisoning); 0 turns it off. The
    # papers' scenarios set 0: a paper's method runs as printed.
    update_bound: float = setting(DEFAULT_UPDATE_BOUND, feeds=("node",), absent=0.0)
    # A part this many times over that bound is refused, not pulled back (0: never refused): a
    # sign-flip x1000 otherwise still adds a reversed update as long as the node's own to every
    # average. Meaningless without the bound, so not stored when update_bound = 0.
    update_refuse: float = setting(DEFAULT_UPDATE_REFUSE, feeds=("node",), absent=0.0)
    # bodies of pushes read at once, all senders together; beyond it: 429
    buffered_mb: float = setting(256.0, feeds=("carrier",), absent=256.0)
    # The carrier between nodes (p2pfl.runtime.transport): "http" between processes and machines;
    # "loopback" hands the same signed frames over in memory, for nodes that share one process;
    # "colocated" does so between nodes of one worker and uses HTTP for everyone else.
    transport: str = setting("http", feeds=("carrier",), absent="http")
    # A node checkpoints after a round it takes part in whose number is a multiple of this (and
    # before its first round and at its end): a resume goes on from the last one, running the
    # rounds after it again. At 1000 nodes a checkpoint a round is a share of the round's CPU.
    checkpoint_every: int = setting(1, feeds=("node",), absent=1)
    # Where a node keeps the model at its round's start while it waits for its peers' parts: "disk"
    # writes it beside the node's checkpoint after training and reads it back for each part and for
    # the aggregation (a model on the host only; the same results). Thousands of nodes sharing a
    # process each held a model's size more while they waited (p2pfl.runtime.node.round_start).
    round_start: str = setting("memory", feeds=("node",), absent="memory")
    # A node that keeps every part it reads (`RunFolder.received`), and that `p2pfl audit` attacks
    # them from after the run, as an honest-but-curious peer would ("": none; `p2pfl run --audit`).
    audit: str = setting("", feeds=("node",), absent="")

    def __post_init__(self) -> None:
        for name in ("fetch_timeout_s", "connect_retry_s", "message_limit_mb", "linger_s", "max_skew_s",
                     "coordinator_wait_s", "first_submission_wait_s", "straggler_wait_s", "setup_wait_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"runtime.{name}", f"must be > 0, got {getattr(self, name)}")
        if self.placement not in PLACEMENTS:
            raise ConfigError("runtime.placement", f"unknown placement {self.placement!r}; choose one of {PLACEMENTS}")
        if self.start_method not in START_METHODS:
            raise ConfigError("runtime.start_method", f"unknown start method {self.start_method!r}; choose one of "
                                                      f"{START_METHODS}")
        if not 0 < self.participation <= 1:
            raise ConfigError("runtime.participation", f"must be in (0, 1], got {self.participation}")
        Topology.parse(self.topology)
        if self.workers < 0:
            raise ConfigError("runtime.workers", f"must be >= 0 (0: one per core), got {self.workers}")
        if not self.held_mb >= 0:
            raise ConfigError("runtime.held_mb", f"must be >= 0 (0: serve the latest version only), got {self.held_mb}")
        if not self.start_wait_s >= 0:
            raise ConfigError("runtime.start_wait_s", f"must be >= 0, got {self.start_wait_s}")
        if self.torch_threads < 1:
            raise ConfigError("runtime.torch_threads", f"must be >= 1, got {self.torch_threads}")
        if not self.buffered_mb >= self.message_limit_mb:
            raise ConfigError("runtime.buffered_mb", f"must be >= runtime.message_limit_mb ({self.message_limit_mb}), "
                                                     f"or no message of the largest size could be read; got {self.buffered_mb}")
        if not (self.max_weight_ratio == 0 or 1 <= self.max_weight_ratio < float("inf")):
            raise ConfigError("runtime.max_weight_ratio", "must be 0 (no cap: averages by sample count as printed) or a "
                                                          "finite number >= 1 (a bound on a peer's n_train relative to "
                                                          f"this node's own), got {self.max_weight_ratio}")
        for name in ("max_norm_ratio",):
            if not getattr(self, name) >= 1:
                raise ConfigError(f"runtime.{name}", f"must be >= 1 (a bound on a peer's claim relative to this "
                                                     f"node's own), got {getattr(self, name)}")
        if not (self.update_bound == 0 or 1 <= self.update_bound < float("inf")):
            raise ConfigError("runtime.update_bound", "must be 0 (off) or a finite number >= 1 (times this node's own "
                                                      f"update), got {self.update_bound}")
        if not (self.update_refuse == 0 or 1 <= self.update_refuse < float("inf")):
            raise ConfigError("runtime.update_refuse", "must be 0 (never refuse) or a finite number >= 1 (times over "
                                                       f"runtime.update_bound), got {self.update_refuse}")
        if self.transport not in CARRIERS and ":" not in self.transport:
            raise ConfigError("runtime.transport", f"unknown transport {self.transport!r}; choose one of "
                                                   f"{', '.join(sorted(CARRIERS))}, or name one as 'pkg.module:factory'")
        if self.transport == "loopback" and not (self.placement == "shared" and self.workers == 1):
            raise ConfigError("runtime.transport", "loopback carries frames between nodes of one process only: set "
                                                   "runtime.placement = \"shared\" and runtime.workers = 1")
        if self.transport == "loopback" and self.tls:
            raise ConfigError("runtime.transport", "loopback has no sockets to encrypt: runtime.tls = true needs \"http\"")
        if self.checkpoint_every < 1:
            raise ConfigError("runtime.checkpoint_every", f"must be >= 1 (1: a checkpoint every round), "
                                                          f"got {self.checkpoint_every}")
        if self.round_start not in ROUND_STARTS:
            raise ConfigError("runtime.round_start", f"unknown place {self.round_start!r}; choose one of "
                                                     f"{', '.join(ROUND_STARTS)}")
        if self.wire_precision not in WIRE_PRECISIONS:
            raise ConfigError("runtime.wire_precision",
                              f"unknown precision {self.wire_precision!r}; choose one of {', '.join(WIRE_PRECISIONS)}")
        try:
            sparse = Sparsity.parse(self.wire_sparsity)
        except ValueError as exc:
            raise ConfigError("runtime.wire_sparsity", str(exc)) from None
        if sparse is not None and self.wire_precision != "float32":
            raise ConfigError("runtime.wire_sparsity", f"sparse parts send float32 values; runtime.wire_precision is "
                                                       f"{self.wire_precision!r} (set one of them)")


def runtime_fields() -> list[str]:
    return [f.name for f in dataclasses.fields(RuntimeSpec)]


def runtime_absent() -> dict[str, Any]:
    """What each runtime field's absence from a stored scenario meant, where declared."""
    return {f.name: f.metadata["absent"] for f in dataclasses.fields(RuntimeSpec) if "absent" in f.metadata}


def as_today(stored: Mapping[str, Any]) -> dict[str, Any]:
    """A stored resolved scenario of any format, in today's (`p2pfl.scenario.migrations`)."""
    return upgrade(stored, runtime_absent())


def settings_for(runtime: RuntimeSpec, reader: str) -> dict[str, Any]:
    """The runtime fields declared to feed `reader`, by name, as its settings object takes them."""
    return {f.name: getattr(runtime, f.name) for f in dataclasses.fields(RuntimeSpec) if reader in f.metadata["feeds"]}


@dataclass(frozen=True)
class Scenario:
    name: str
    nodes: int
    seed: int
    rounds: int
    device: str
    data: Any  # p2pfl.data.DataSpec
    model: ModelSpec
    algorithm: AlgorithmSpec
    train: TrainConfig
    runtime: RuntimeSpec
    privacy: Any  # p2pfl.privacy.PrivacySpec
    attack: Any = None  # p2pfl.attacks.AttackSpec
    churn: ChurnSpec = field(default_factory=ChurnSpec)
    # The packages whose code the scenario runs (`p2pfl.plugins.admit`): those it lists, and the
    # modules found next to it; stored resolved, so a node loading the run's copy admits the same.
    plugins: tuple[str, ...] = ()
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False)
    # Loaded from a run folder of an older format: its scenario.json as written (checkpoints are
    # bound to that form); None otherwise.
    written_as: Mapping[str, Any] | None = field(default=None, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The resolved scenario (defaults filled in), JSON-able, loadable again by `scenario_from_dict`."""
        out: dict[str, Any] = {
            "format": FORMAT, "name": self.name, "nodes": self.nodes, "seed": self.seed, "rounds": self.rounds,
            "device": self.device,
        }
        for key in ("data", "model", "train", "runtime", "privacy"):
            out[key] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(getattr(self, key)).items()}
        if self.runtime.update_bound == 0:  # no bound, nothing to be over: one form whatever the factor
            out["runtime"]["update_refuse"] = 0.0
        out["algorithm"] = {"name": self.algorithm.name, "params": dict(self.algorithm.params),
                            "safeguard": True if self.algorithm.safeguard == "mix" else (self.algorithm.safeguard or False),
                            "safeguard_level": self.algorithm.safeguard_level}
        from p2pfl.attacks import AttackSpec

        attack = self.attack if self.attack is not None else AttackSpec()
        out["attack"] = {**dataclasses.asdict(attack), "nodes": list(attack.nodes)}
        out["churn"] = self.churn.to_dict()
        out["plugins"] = list(self.plugins)
        return out


def scenario_differences(stored: Mapping[str, Any], scenario: Scenario) -> list[str]:
    """Dotted fields in which a stored resolved scenario (a run's `scenario.json` or results'
    `scenario`), read in today's format, differs from `scenario`; empty when the run was made from
    this scenario. A field the stored run never recorded is named as such first."""
    stored = as_today(stored)
    unknown = unrecorded(stored, runtime_fields())

    def walk(a: Any, b: Any, prefix: str) -> list[str]:
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            return [f for key in sorted(set(a) | set(b)) for f in walk(a.get(key), b.get(key), f"{prefix}{key}.")]
        return [] if a == b or prefix.rstrip(".") in unknown else [prefix.rstrip(".")]

    here = json.loads(json.dumps(scenario.to_dict()))
    return [f"{name} (not recorded: made before it was stored)" for name in unknown] + walk(stored, here, "")


def scenario_from_dict(raw: Mapping[str, Any], *, source: str = "scenario") -> Scenario:
    """The scenario, every field checked: first each table's fields and values, torch-free (a
    typo is named in well under a second); then the model and the algorithm's parameters, which
    need torch."""
    from p2pfl.attacks import AttackSpec
    from p2pfl.data.spec import DataSpec
    from p2pfl.privacy.spec import PrivacySpec

    check_table(raw, sorted(TOP_LEVEL), "")
    format_of(raw)
    name = _typed(raw.get("name", Path(source).stem), str, "name")
    nodes = _typed(raw.get("nodes", 3), int, "nodes")
    if nodes < 1:
        raise ConfigError("nodes", f"must be >= 1, got {nodes}")
    seed = _typed(raw.get("seed", 0), int, "seed")
    rounds = _typed(raw.get("rounds", 3), int, "rounds")
    if rounds < 1:
        raise ConfigError("rounds", f"must be >= 1, got {rounds}")
    device = _typed(raw.get("device", "cpu"), str, "device")
    if device != "cpu" and not device.startswith("cuda"):
        raise ConfigError("device", f"expected 'cpu' or 'cuda[:N]', got {device!r}")

    data = DataSpec.from_dict(raw.get("data", {}), prefix="data")
    model = _dataclass_from_table(ModelSpec, raw.get("model", {}), "model")
    listed = raw.get("plugins", [])
    if not isinstance(listed, list) or not all(isinstance(p, str) for p in listed):
        raise ConfigError("plugins", f"expected a list of package names, got {listed!r}")
    algo_table = raw.get("algorithm", {})
    if not isinstance(algo_table, Mapping):
        raise ConfigError("algorithm", "expected a table with `name` and optional `params`")
    check_table(algo_table, ["name", "params", "safeguard", "safeguard_level"], "algorithm")
    algo_name = _typed(algo_table.get("name", "fedavg"), str, "algorithm.name")
    params = algo_table.get("params", {})
    if not isinstance(params, Mapping):
        raise ConfigError("algorithm.params", "expected a table")
    safeguard = _safeguard_kind(algo_table.get("safeguard", False))
    safeguard_level = _safeguard_level(algo_table.get("safeguard_level"), safeguard)
    algorithm = AlgorithmSpec(algo_name, dict(params), safeguard, safeguard_level)
    train = _dataclass_from_table(TrainConfig, raw.get("train", {}), "train")
    runtime = _dataclass_from_table(RuntimeSpec, raw.get("runtime", {}), "runtime")
    privacy = PrivacySpec.from_dict(raw.get("privacy", {}), prefix="privacy")
    attack = AttackSpec.from_dict(raw.get("attack", {}), nodes=nodes)
    churn = ChurnSpec.from_dict(raw.get("churn", {}), nodes=nodes, rounds=rounds)
    Topology.parse(runtime.topology).check(nodes)
    if runtime.audit and runtime.audit not in node_ids(nodes):
        raise ConfigError("runtime.audit", f"names the node that keeps what it reads; {runtime.audit!r} is none of "
                                           f"this scenario's {nodes} (e.g. {node_ids(nodes)[0]!r})")
    here = [Path(source).resolve().parent] if Path(source).is_file() else []
    plugins = set(listed)
    for field_name, value in (("model.name", model.name), ("data.dataset", data.dataset),
                              ("runtime.transport", runtime.transport)):
        if is_reference(value):
            plugins.add(admit(value, field_name, listed, [*here, Path.cwd()]))

    # From here torch loads: the model's name, and the algorithm's parameters against its class.
    from p2pfl.algorithms import build_strategy, strategy_class
    from p2pfl.models import MODELS

    if is_reference(model.name):
        resolve(model.name, "model.name")  # imports now; the launcher builds it once before nodes start
    elif model.name not in MODELS:
        raise ConfigError("model.name", f"unknown model {model.name!r}; choose one of {sorted(MODELS)} "
                                        "or 'package.module:factory'")
    strategy_class(algo_name)
    strategy = build_strategy(algo_name, params)  # validates the parameters now, before any process starts
    # A coordinator that answers every round holds one global model and waits for every node.
    global_step = strategy.needs_coordinator and getattr(strategy.coordinator, "round_kind", None) is not None
    conflict = strategy.privacy_conflict(privacy.mode)
    if conflict:
        raise ConfigError("privacy.mode", f"{algo_name}: {conflict}")
    check_topology_needs(strategy, algo_name, Topology.parse(runtime.topology), nodes, seed)
    if safeguard and global_step:
        raise ConfigError("algorithm.safeguard", f"{algo_name} trains one global model with its coordinator; the "
                                                 "safeguard is for personalized (serverless) algorithms")
    if safeguard and data.val_fraction <= 0:
        raise ConfigError("algorithm.safeguard", "scores the models on each node's validation split: "
                                                 "set data.val_fraction > 0")
    if runtime.participation < 1 and global_step:
        raise ConfigError("runtime.participation", f"{algo_name} has a coordinator, which waits for every node; "
                                                   "partial participation needs a serverless algorithm")
    if (churn.active and getattr(strategy.coordinator, "setup_kind", None) is not None
            and not getattr(strategy, "setup_for_joiners", False)):
        raise ConfigError("churn", f"{algo_name}'s coordinator holds a setup exchange before round 1 that a node "
                                   "coming later cannot take part in, and the strategy cannot set a joiner up from "
                                   "its peers (Strategy.setup_for_joiners)")
    return Scenario(name, nodes, seed, rounds, device, data, model, algorithm, train, runtime, privacy, attack,
                    churn, tuple(sorted(plugins)), raw=dict(raw))


def check_topology_needs(strategy: Any, algo_name: str, topology: Topology, nodes: int, seed: int) -> None:
    """A ConfigError, naming the smallest topology that works, where `topology` gives some node
    fewer models a round than the strategy needs (`Strategy.topology_conflict`)."""
    from p2pfl.runtime.strategy import Strategy, overrides

    if not overrides(strategy, Strategy, "topology_conflict"):
        return
    fewest = 1 + (nodes - 1 if topology.kind == "full" else min(map(len, topology.neighbours(nodes, seed))))
    conflict = strategy.topology_conflict(fewest)
    if conflict is None:
        return
    degree = next((d for d in range(fewest, 10 * nodes + 2) if strategy.topology_conflict(d + 1) is None), None)
    if degree is None:
        works = "no topology gives enough"
    elif degree >= nodes:
        works = f"the smallest federation that works is {degree + 1} nodes with runtime.topology = \"full\""
    elif degree == nodes - 1:
        works = "the smallest topology that works is runtime.topology = \"full\""
    else:
        even = degree if nodes * degree % 2 == 0 else degree + 1
        works = (f"the smallest topology that works is runtime.topology = \"regular:{even}\""
                 if even < nodes - 1 else "the smallest topology that works is runtime.topology = \"full\"")
    raise ConfigError("algorithm.params.aggregation",
                      f"{algo_name}: {conflict} ({topology} on {nodes} nodes); {works}, or set "
                      "algorithm.params.fallback = true to keep a node's own model in rounds with too few")


def parse_override(text: str) -> tuple[list[str], Any]:
    """`key.path=value`; the value is read as a TOML literal, else taken as a bare string."""
    if "=" not in text:
        raise ConfigError("--set", f"expected key.path=value, got {text!r}")
    key, value_text = text.split("=", 1)
    path = [part for part in key.strip().split(".") if part]
    if not path:
        raise ConfigError("--set", f"empty key in {text!r}")
    try:
        value = tomllib.loads(f"v = {value_text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = value_text.strip()
    return path, value


def apply_overrides(raw: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    return apply_values(raw, [parse_override(text) for text in overrides])


def apply_values(raw: dict[str, Any], values: Sequence[tuple[list[str], Any]]) -> dict[str, Any]:
    """A copy of `raw` with each (key path, value) set; a table value replaces the whole table."""
    raw = json.loads(json.dumps(raw))  # deep copy; TOML values are all JSON-able except dates
    for path, value in values:
        table = raw
        for part in path[:-1]:
            table = table.setdefault(part, {})
            if not isinstance(table, dict):
                raise ConfigError(".".join(path), f"{part!r} is not a table")
        table[path[-1]] = value
    return raw


def read_raw(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError("scenario", f"file not found: {path}")
    text = path.read_text()
    if path.suffix == ".json":
        return json.loads(text)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("scenario", f"{path} is not valid TOML: {exc}") from exc


def load_scenario(path: str | Path, overrides: Sequence[str] = ()) -> Scenario:
    raw = read_raw(path)
    written_as = None
    if str(path).endswith(".json") and format_of(raw) < FORMAT:  # a run folder of an older format
        raw, written_as = as_today(raw), raw
    scenario = scenario_from_dict(apply_overrides(raw, overrides), source=str(path))
    return dataclasses.replace(scenario, written_as=written_as) if written_as is not None and not overrides else scenario
