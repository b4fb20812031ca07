"""A churn schedule (`[churn]`): nodes that join late, leave, crash and come back, and nodes that
compute slower than the rest, listed or drawn from rates with the scenario's seed.

Every node reads the same schedule and plays its own part of it (`NodeScript`): a late joiner
starts from its neighbours' newest model at its round; a leaver says goodbye (signed) instead of
running its round; a crashed node stops dead (its port closes, no goodbye) and, if it restarts,
comes back from its own checkpoint in the round its neighbours are in. The schedule is
placement-blind: the node itself plays it, in a process of its own, a shared worker or a Ray
actor. Peers use only the joins (a member that has not joined yet is not waited for, as a
neighbour that sits a round out); crashes and departures they find out as a deployment would.

    [churn]
    join = [{node = 3, round = 4}]                # starts in round 4
    leave = [{node = 5, round = 6}]               # says goodbye instead of running round 6
    crash = [{node = 1, round = 3, restart = 5}]  # stops dead before round 3; back in round 5
    slow = [{node = 2, factor = 10.0}]            # its training takes 10 times as long
    flap = [{node = 4, round = 2}]                # leaves (signed goodbye) before round 2, 4, 6, ...
                                                  # and is back by its signed word in 3, 5, 7, ...
    # or at a time, in seconds from the node's start, where a round is not the point:
    #   join = [{node = 3, second = 20.0}], leave = [{node = 5, second = 60.0}],
    #   crash = [{node = 1, second = 30.0, restart_after_s = 15.0}]
    join_per_round = 0.05    # drawn: this share of the nodes joins in each round from round 2
    crash_per_round = 0.05   # drawn: this share of the live nodes crashes in each round from round 2
    restart_after = 0        # drawn crashes come back this many rounds later (0: never)
    slow_share = 0.2         # drawn: this share of the nodes is slow, by slow_factor
    slow_factor = 10.0
    catch_up = true          # a joiner starts from its neighbours' newest model; false: from the initial one
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from p2pfl.errors import ConfigError, check_table

CHURN_STREAM = 0xC4A2  # its own stream of the scenario's seed: a schedule never shifts any other draw
EVENT_KEYS = {"join": ("node", "round", "second"), "leave": ("node", "round", "second"),
              "crash": ("node", "round", "restart", "second", "restart_after_s"), "slow": ("node", "factor"),
              "flap": ("node", "round")}
RATE_KEYS = ("join_per_round", "crash_per_round", "restart_after", "slow_share", "slow_factor")
FLAG_KEYS = ("catch_up",)


@dataclass(frozen=True)
class NodeScript:
    """One node's part of the schedule. Rounds are the scenario's, 1-based."""

    join: int = 1                 # its first round
    leave: int | None = None      # it says goodbye instead of running this round
    crash: int | None = None      # it stops dead before this round
    restart: int | None = None    # after a crash: back, from its checkpoint, for this round
    slowdown: float = 1.0         # its training takes this many times as long
    catch_up: bool = True         # as a joiner: start from its neighbours' newest model (else its own initial one)
    flap: int | None = None       # from this round on it is away every other round: goodbye, then back by its word
    # The same events at a time, in seconds from the node's start (a node that joins at a time runs
    # the round its neighbours are in then; a crash at a time comes back `restart_after_s` later).
    join_s: float | None = None
    leave_s: float | None = None
    crash_s: float | None = None
    restart_after_s: float | None = None

    @property
    def active(self) -> bool:
        return self != NodeScript()

    @property
    def late(self) -> bool:
        """Not there at the start: nobody waits for it before round 1."""
        return self.join > 1 or self.join_s is not None

    @property
    def timed(self) -> bool:
        """Some event of it happens at a time, not a round: its rounds are not the schedule's to say."""
        return any(t is not None for t in (self.join_s, self.leave_s, self.crash_s))

    def away_in(self, r: int) -> bool:
        """A round a flapping node sits out (it said goodbye for it)."""
        return self.flap is not None and r >= self.flap and (r - self.flap) % 2 == 0

    def live_in(self, r: int) -> bool:
        """Whether the node runs round `r` by its script."""
        if self.away_in(r):
            return False
        if self.join_s is not None or r < self.join or (self.leave is not None and r >= self.leave):
            return False
        return self.crash is None or r < self.crash or (self.restart is not None and r >= self.restart)


@dataclass(frozen=True)
class ChurnSpec:
    join: tuple[tuple[Any, ...], ...] = ()    # (node, round, second): one of the two is None
    leave: tuple[tuple[Any, ...], ...] = ()   # (node, round, second)
    crash: tuple[tuple[Any, ...], ...] = ()   # (node, round, restart round, second, restart_after_s)
    slow: tuple[tuple[int, float], ...] = ()              # (node, factor)
    flap: tuple[tuple[int, int], ...] = ()                # (node, first round away)
    join_per_round: float = 0.0
    crash_per_round: float = 0.0
    restart_after: int = 0
    slow_share: float = 0.0
    slow_factor: float = 10.0
    catch_up: bool = True

    @property
    def active(self) -> bool:
        return self != ChurnSpec()

    @classmethod
    def from_dict(cls, table: Any, *, nodes: int, rounds: int, prefix: str = "churn") -> ChurnSpec:
        check_table(table, [*EVENT_KEYS, *RATE_KEYS, *FLAG_KEYS], prefix)
        catch_up = table.get("catch_up", True)
        if not isinstance(catch_up, bool):
            raise ConfigError(f"{prefix}.catch_up", f"expected true or false, got {catch_up!r}")
        events: dict[str, list[tuple[Any, ...]]] = {}
        for kind, keys in EVENT_KEYS.items():
            listed = table.get(kind, [])
            if not isinstance(listed, list):
                raise ConfigError(f"{prefix}.{kind}", f"expected a list of tables like {{{', '.join(keys)}}}")
            events[kind] = [_event(e, kind, keys, nodes, rounds, f"{prefix}.{kind}[{i}]") for i, e in enumerate(listed)]
        spec = cls(**{k: tuple(v) for k, v in events.items()},
                   **{k: _rate(table, k, prefix) for k in RATE_KEYS if k in table}, catch_up=catch_up)
        spec.scripts(nodes, rounds, 0)  # every clash (a node that leaves before it joins, ...) named now
        return spec

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for kind, keys in EVENT_KEYS.items():
            if getattr(self, kind):
                out[kind] = [{k: v for k, v in zip(keys, e) if v is not None} for e in getattr(self, kind)]
        for key in (*RATE_KEYS, *FLAG_KEYS):
            if getattr(self, key) != getattr(ChurnSpec, key):
                out[key] = getattr(self, key)
        return out

    def scripts(self, nodes: int, rounds: int, seed: int) -> tuple[NodeScript, ...]:
        """Every node's script: the listed events, then the drawn ones among nodes listed for nothing."""
        fields: list[dict[str, Any]] = [{} for _ in range(nodes)]
        for node, r, second in self.join:
            fields[node].update({"join": r} if r is not None else {"join_s": second})
        for node, r, second in self.leave:
            fields[node].update({"leave": r} if r is not None else {"leave_s": second})
        for node, r, restart, second, after_s in self.crash:
            fields[node].update({"crash": r, "restart": restart} if r is not None
                                else {"crash_s": second, "restart_after_s": after_s})
        for node, factor in self.slow:
            fields[node]["slowdown"] = factor
        for node, r in self.flap:
            fields[node]["flap"] = r
        self._drawn(fields, rounds, np.random.default_rng([seed, CHURN_STREAM]))
        scripts = tuple(NodeScript(**f, catch_up=self.catch_up) if NodeScript(**f).late else NodeScript(**f)
                        for f in fields)
        for i, s in enumerate(scripts):
            _check_script(i, s, rounds)
        return scripts

    def _drawn(self, fields: list[dict[str, Any]], rounds: int, rng: np.random.Generator) -> None:
        nodes = len(fields)
        free = [i for i in range(nodes) if not fields[i]]
        if self.slow_share:
            for i in rng.choice(free, size=min(len(free), round(self.slow_share * nodes)), replace=False):
                fields[int(i)]["slowdown"] = self.slow_factor
        if self.join_per_round:
            order = [i for i in rng.permutation(free) if "join" not in fields[int(i)]]
            per_round = round(self.join_per_round * nodes)
            for r in range(2, rounds + 1):
                for i in order[(r - 2) * per_round:(r - 1) * per_round]:
                    fields[int(i)]["join"] = r
        if self.crash_per_round:
            for r in range(2, rounds + 1):
                live = [i for i in range(nodes) if NodeScript(**fields[i]).live_in(r) and fields[i].get("join", 1) < r
                        and "crash" not in fields[i] and fields[i].get("leave") is None and "flap" not in fields[i]]
                for i in rng.choice(live, size=min(len(live), round(self.crash_per_round * len(live))), replace=False):
                    restart = r + self.restart_after if self.restart_after and r + self.restart_after <= rounds else None
                    fields[int(i)].update(crash=r, restart=restart)


def _event(entry: Any, kind: str, keys: tuple[str, ...], nodes: int, rounds: int, where: str) -> tuple[Any, ...]:
    check_table(entry, keys, where)
    if "node" not in entry:
        raise ConfigError(f"{where}.node", "missing")
    node = entry["node"]
    if type(node) is not int or not 0 <= node < nodes:
        raise ConfigError(f"{where}.node", f"must be a node index in 0..{nodes - 1}, got {node!r}")
    if kind == "slow":
        if "factor" not in entry:
            raise ConfigError(f"{where}.factor", "missing")
        factor = entry["factor"]
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor >= 1:
            raise ConfigError(f"{where}.factor", f"must be a number >= 1 (times slower), got {factor!r}")
        return node, float(factor)
    if ("round" in entry) == ("second" in entry):
        raise ConfigError(f"{where}.round", "give the event a round or a second (from the node's start), one of them")
    values: dict[str, Any] = {}
    for key in ("round", "restart"):
        r = entry.get(key)
        if r is not None and (type(r) is not int or not 1 <= r <= rounds):
            raise ConfigError(f"{where}.{key}", f"must be a round in 1..{rounds}, got {r!r}")
        values[key] = r
    for key in ("second", "restart_after_s"):
        t = entry.get(key)
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < float("inf")):
            raise ConfigError(f"{where}.{key}", f"must be a number of seconds >= 0, got {t!r}")
        values[key] = None if t is None else float(t)
    if values["restart"] is not None and values["round"] is None:
        raise ConfigError(f"{where}.restart", "is a round: with a crash at a second, give restart_after_s")
    if values["restart_after_s"] is not None and values["second"] is None:
        raise ConfigError(f"{where}.restart_after_s", "is seconds: with a crash at a round, give restart (a round)")
    return tuple(values[k] if k in values else node for k in keys)


def _rate(table: Mapping[str, Any], key: str, prefix: str) -> float | int:
    value = table[key]
    if key == "restart_after":
        if type(value) is not int or value < 0:
            raise ConfigError(f"{prefix}.{key}", f"must be a number of rounds >= 0 (0: never), got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{prefix}.{key}", f"expected a number, got {value!r}")
    if key == "slow_factor" and not value >= 1:
        raise ConfigError(f"{prefix}.{key}", f"must be >= 1 (times slower), got {value!r}")
    if key != "slow_factor" and not 0 <= value < 1:
        raise ConfigError(f"{prefix}.{key}", f"must be a share in [0, 1), got {value!r}")
    return float(value)


def _check_script(index: int, s: NodeScript, rounds: int) -> None:
    where = f"churn: node {index}"
    if s.join < 1:
        raise ConfigError("churn.join", f"{where} joins in round {s.join}; rounds start at 1")
    for name in ("leave", "crash"):
        r = getattr(s, name)
        if r is not None and r <= s.join:
            raise ConfigError(f"churn.{name}", f"{where} would {name} in round {r}, not after it joins (round {s.join})")
    if s.restart is not None and (s.crash is None or s.restart <= s.crash):
        raise ConfigError("churn.crash", f"{where} restarts in round {s.restart}, which must come after its crash")
    if s.leave is not None and s.crash is not None:
        raise ConfigError("churn.leave", f"{where} both leaves and crashes; give it one of them")
    if (s.leave_s is not None or s.leave is not None) and (s.crash_s is not None or s.crash is not None):
        raise ConfigError("churn.leave", f"{where} both leaves and crashes; give it one of them")
    if s.flap is not None and (s.flap <= s.join or s.timed or s.leave is not None or s.crash is not None):
        raise ConfigError("churn.flap", f"{where} flaps from round {s.flap}: after it joins (round {s.join}), "
                                        "by rounds, and neither leaving nor crashing")
    if not s.timed and not any(s.live_in(r) for r in range(1, rounds + 1)):
        raise ConfigError("churn", f"{where} runs no round at all")


@functools.lru_cache(maxsize=8)  # a worker's nodes share one schedule: drawn once, not once per node
def scripts_of(spec: ChurnSpec | None, nodes: int, rounds: int, seed: int) -> tuple[NodeScript, ...]:
    return (NodeScript(),) * nodes if spec is None or not spec.active else spec.scripts(nodes, rounds, seed)


@functools.lru_cache(maxsize=8)  # scanned once a worker: each of thousands of nodes asks for them
def late_and_joining(spec: ChurnSpec | None, nodes: int, rounds: int, seed: int) -> tuple[frozenset[int], frozenset[int]]:
    """The indices of `scripts_of`'s nodes that start late, and of those that join after round 1."""
    scripts = scripts_of(spec, nodes, rounds, seed)
    return (frozenset(j for j, s in enumerate(scripts) if s.late),
            frozenset(j for j, s in enumerate(scripts) if s.join > 1))
