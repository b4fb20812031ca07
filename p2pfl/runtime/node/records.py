"""What a node reports: one record per round (taken part in or sat out), its lifecycle stage, and
the run's end status rules. The round record's keys are declared here once; a sat-out round is
the same type with the training and exchange fields at their empty values."""

from __future__ import annotations

import enum
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


class Stage(enum.IntEnum):
    """Where a node is in its life (hivemind's `AveragingStage`, for a whole node); ordered."""

    BUILT = 0        # constructed, nothing written
    PREPARED = 1     # round 0's checkpoint written (a fresh node), or a resume pending
    SET_UP = 2       # Strategy.setup ran, or its outcome was restored from a checkpoint
    IN_ROUNDS = 3
    DONE = 4         # its end status is decided; it serves nothing new


def epsilon_for_json(epsilon: float | None) -> float | str | None:
    """JSON has no infinity; σ = 0 (clipping without noise) gives ε = ∞, written as "inf"."""
    if epsilon is not None and math.isinf(epsilon):
        return "inf"
    return epsilon


@dataclass(frozen=True)
class RoundEntry:
    """What every round record says, a node's and the coordinator's: which round, its bytes (the
    byte counter's summary, flat in the JSON), how long it took and when it started."""

    round: int
    traffic: Mapping[str, Any]  # the byte counter's summary of the round (bytes_sent, bytes_received, ...)
    wall_s: float
    started_at: float


@dataclass(frozen=True)
class RoundRecord(RoundEntry):
    """One round of one node, as results.json, the rounds file and the checkpoint keep it (`to_json`)."""

    participated: bool
    test_acc: float           # the model the node deploys, after its local training
    test_loss: float
    test_acc_aggregated: float
    # The federated model on the validation split, after training and after aggregation: what
    # `p2pfl compare` picks a swept hyperparameter on (never on the test split).
    val_acc: float | None
    val_acc_aggregated: float | None
    train_loss: float | None
    train_steps: int
    time: Mapping[str, float]   # seconds per phase (p2pfl.runtime.timing)
    epsilon: float | str | None
    asked: int = 0
    arrived: Sequence[str] = ()
    stale: Sequence[str] = ()
    # Asked for, not answered, and not gone with a goodbye: the count a run's summary checks for an
    # overloaded machine or a network that drops peers.
    unanswered: int = 0
    strategy: Mapping[str, Any] = field(default_factory=dict)
    # Rounds each aggregated peer part lay behind this round (0: current); empty when none was stale.
    staleness: Mapping[str, int] = field(default_factory=dict)
    # What changed in the neighbour table: departed, suspected, replaced (gone -> stand-in), returned, back (a
    # departed member's signed return), claimed_left (news of a departure without the member's signature: probed).
    neighbours: Mapping[str, Any] = field(default_factory=dict)
    peers_refused: Mapping[str, str] = field(default_factory=dict)   # claims over a bound (peer_claims)
    sat_out: Sequence[str] = ()                  # neighbours sitting this round out with nothing to take
    peers_bounded: Mapping[str, list[str]] = field(default_factory=dict)  # each count pulled back within runtime.update_bound
    peers_bounded_factor: Mapping[str, float] = field(default_factory=dict)
    aggregate_refused: str | None = None
    safeguard: Mapping[str, Any] = field(default_factory=dict)  # the safeguard's own keys, flat in the JSON
    fit_config: Mapping[str, Any] = field(default_factory=dict)   # the strategy's training settings this round
    metrics: Mapping[str, float] = field(default_factory=dict)    # the strategy's evaluation after aggregation
    peer_scores: Mapping[str, float] = field(default_factory=dict)  # the strategy's trust in each peer it judged
    silent: Sequence[str] = ()  # the `unanswered` peers, by name
    # data.extra_test_splits: reading -> test accuracy of the model after training, and after aggregation
    test_acc_by_split: Mapping[str, float] = field(default_factory=dict)
    test_acc_aggregated_by_split: Mapping[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "round": self.round, "participated": self.participated, "test_acc": self.test_acc,
            "test_loss": self.test_loss, "test_acc_aggregated": self.test_acc_aggregated, "val_acc": self.val_acc,
            "val_acc_aggregated": self.val_acc_aggregated, "train_loss": self.train_loss,
            "train_steps": self.train_steps, **self.traffic, "wall_s": self.wall_s, "started_at": self.started_at,
            "time": dict(self.time), "epsilon": self.epsilon, "asked": self.asked, "arrived": list(self.arrived),
            "stale": list(self.stale), "unanswered": self.unanswered, "strategy": dict(self.strategy),
        }
        optional = {"staleness": self.staleness, "neighbours": self.neighbours, "peers_refused": self.peers_refused,
                    "sat_out": self.sat_out, "silent": self.silent,
                    "peers_bounded": self.peers_bounded, "peers_bounded_factor": self.peers_bounded_factor,
                    "fit_config": self.fit_config, "metrics": self.metrics, "peer_scores": self.peer_scores,
                    "test_acc_by_split": self.test_acc_by_split,
                    "test_acc_aggregated_by_split": self.test_acc_aggregated_by_split}
        doc.update({k: (list(v) if k in ("sat_out", "silent") else dict(v)) for k, v in optional.items() if v})
        if self.aggregate_refused is not None:
            doc["aggregate_refused"] = self.aggregate_refused
        doc.update(self.safeguard)
        return doc


@dataclass(frozen=True)
class CoordinatorRoundRecord(RoundEntry):
    """One round the coordinator aggregated: the weights its half gave each node, what the half
    reports (`info`), the global model's accuracy on the held-out domain, who submitted, and who
    did not (`missing`; `missing_live`: those still answering, which make the coordinator's run
    "degraded")."""

    weights: Mapping[str, float]
    info: Mapping[str, Any]
    held_out_acc: float | None
    submitted: Sequence[str]
    missing: Sequence[str] = ()
    missing_live: Sequence[str] = ()

    def to_json(self) -> dict[str, Any]:
        return {"round": self.round, "weights": dict(self.weights), "info": self.info, "held_out_acc": self.held_out_acc,
                "submitted": list(self.submitted), **self.traffic, "wall_s": self.wall_s, "started_at": self.started_at,
                **({"missing": list(self.missing), "missing_live": list(self.missing_live)} if self.missing else {})}


# Readers of round records kept as JSON (results.json, rounds files, checkpoints) name keys by these.
ROUND = "round"
PARTICIPATED = "participated"
TEST_ACC = "test_acc"
TEST_ACC_AGGREGATED = "test_acc_aggregated"


def participated(record: Mapping[str, Any]) -> bool:
    """Records written before sitting out existed carry no flag: those rounds were taken part in."""
    return bool(record.get(PARTICIPATED, True))


def after_training(rounds: Sequence[Mapping[str, Any]]) -> list[float | None]:
    """Each round's test accuracy after the node's latest local training. A round the node sits
    out trains nothing and measures the model it holds (its last aggregate, `test_acc` of that
    record); after training, it is still at the last round it trained in. Before its first
    training, the model as built."""
    latest: float | None = None
    trained_yet = False
    out: list[float | None] = []
    for x in rounds:
        if participated(x) or not trained_yet:
            latest, trained_yet = x.get(TEST_ACC), trained_yet or participated(x)
        out.append(latest)
    return out


def accuracies(rounds: Sequence[Mapping[str, Any]], key: str) -> list[float | None]:
    """Each round's `test_acc` (read as `after_training`) or `test_acc_aggregated`, for tables and curves."""
    return after_training(rounds) if key == TEST_ACC else [x.get(key) for x in rounds]


def final_accuracies(rounds: Sequence[Mapping[str, Any]]) -> tuple[float | None, float | None]:
    """A node's test accuracy at the end of a run: after its latest local training (under partial
    participation, that of the last round it trained in), and of the model it ends with (right
    after its last aggregation). Under full participation both come from the last round."""
    if not rounds:
        return None, None
    return last_trained(rounds).get(TEST_ACC), rounds[-1].get(TEST_ACC_AGGREGATED)


def last_trained(rounds: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The record of the last round the node trained in; the last record if it never trained
    (every such round measured the model as built)."""
    return next((x for x in reversed(rounds) if participated(x)), rounds[-1])


def rounds_alone(rounds: Sequence[Mapping[str, Any]]) -> list[int]:
    """Rounds in which the node asked for peers that had not said goodbye and received nothing:
    it learned from no one there, which a run's status must not call ok."""
    return [x[ROUND] for x in rounds
            if participated(x) and x.get("asked") and not x.get("arrived") and x.get("unanswered")]


def isolated(rounds: Sequence[Mapping[str, Any]]) -> bool:
    """The strategy asked for peers and, over the whole run, no peer's part arrived (none answered,
    or every part that came was refused)."""
    return any(x.get("asked") for x in rounds) and not any(x.get("arrived") for x in rounds)


def end_status(status: str, rounds: Sequence[Mapping[str, Any]], log: logging.Logger) -> str:
    """A run that ended "ok" but learned from no peer at all is "isolated", one with rounds in
    which nothing arrived "degraded"; either says so once in the node's log."""
    if status == "ok" and isolated(rounds):
        log.warning("ended isolated: asked for peers in %d rounds and took in no peer's part (none answered, or "
                    "each part that came was refused: see the result's `rejected`)", sum(1 for x in rounds if x.get("asked")))
        return "isolated"
    if status == "ok" and rounds_alone(rounds):
        log.warning("rounds %s: asked for peers and received nothing (peers refused or unreachable: a flood of "
                    "connections, a network down); the run went on with its own model", rounds_alone(rounds))
        return "degraded"
    return status


def node_result(node_id: str, index: int, status: str, error: str | None, wall_s: float, *, data: Any, device: str,
                rounds: list[dict[str, Any]], setup: dict[str, Any] | None, restarts: list[dict[str, Any]],
                membership: list[dict[str, Any]], totals: Mapping[str, int], rejected: Any,
                companions: Mapping[str, Any]) -> dict[str, Any]:
    """What a node reports when it ends (`RunFolder.node_result`, results.json's `nodes`)."""
    after_training, aggregated = final_accuracies(rounds)
    return {
        "id": node_id, "index": index, "status": status, "error": error,
        "domain": data.domain, "device": device, "pid": os.getpid(),
        "n_train": len(data.train), "n_val": len(data.val), "n_test": len(data.test),
        "rounds": rounds, "setup": setup,
        "final_test_acc": after_training, "final_test_acc_aggregated": aggregated,
        "final_epsilon": rounds[-1].get("epsilon") if rounds else None, "rounds_alone": rounds_alone(rounds),
        "restarts": restarts, "membership": membership, "totals": dict(totals), "rejected": rejected,
        "wall_s": wall_s, **companions,
    }
