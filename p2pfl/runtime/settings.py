"""What a node's loop reads of the scenario, as one frozen object.

`p2pfl.assembly` builds it from the resolved scenario; the runtime never sees a `Scenario`, so
nothing below the scenario layer depends on the schema's shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Defences that change what an honest run computes are off in a simulation, where every node is
# the user's own: a name computes what it names ("fedavg" is FedAvg). A LAN deployment's configs
# (`p2pfl lan`) turn them on unless its scenario sets them: DEPLOYED_DEFENCES.
DEFAULT_MAX_WEIGHT_RATIO = 0.0  # runtime.max_weight_ratio (p2pfl.runtime.peer_claims); 0: no cap
DEFAULT_MAX_NORM_RATIO = 1000.0  # runtime.max_norm_ratio (refuses only what no honest run sends: on everywhere)
DEFAULT_UPDATE_BOUND = 0.0  # runtime.update_bound; 0: off
# On a LAN, a peer is another operator's machine: a part pulled back to the node's own update
# (the bound, chosen on validation: docs/security.md) and a peer's n_train counted at most 4x.
DEPLOYED_DEFENCES = {"update_bound": 1.0, "max_weight_ratio": 4.0}
# runtime.update_refuse: a part this many times over the bound is refused, not pulled back; 0 never.
# Honest parts lay at most 10.8 times over in the poisoning table's bounded runs (pFedSV beside a
# label-flipper; 7.9 beside the sign-flipper), a sign-flip x1000 482 to 1744 times (docs/security.md):
# 100 sits between, with most of an order of magnitude to spare on either side.
DEFAULT_UPDATE_REFUSE = 100.0
WIRE_PRECISIONS = ("float32", "float16", "int8")  # runtime.wire_precision (p2pfl.runtime.precision)
SPARSE_KINDS = ("topk", "randomk")  # runtime.wire_sparsity (p2pfl.runtime.sparse_wire); p2pfl.core.sparse's
ROUND_STARTS = ("memory", "disk")  # runtime.round_start (p2pfl.runtime.node.round_start)
SAFEGUARD_KINDS = ("mix", "local")  # algorithm.safeguard (p2pfl.runtime.safeguard); torch-free, for the schema


@dataclass(frozen=True)
class NodeSettings:
    algorithm: str                  # its name, for logs and errors
    rounds: int
    seed: int
    fetch_timeout_s: float          # longest wait for a peer's version of a round
    coordinator_wait_s: float       # longest wait for the coordinator's reply to a round
    setup_wait_s: float             # longest wait for a step of the exchange before round 1
    start_wait_s: float             # before round 1, the longest wait for every peer to be up
    linger_s: float                 # keep serving after the last round until peers are done
    participation: float            # chance of taking part in a round
    accept_stale: bool              # use a peer's older version when the wanted one is late
    wire_precision: str
    max_weight_ratio: float         # p2pfl.runtime.peer_claims
    max_norm_ratio: float
    update_bound: float             # a peer part's distance from the round start, in own updates (0: off)
    update_refuse: float = DEFAULT_UPDATE_REFUSE  # times over update_bound at which a part is refused (0: never)
    wire_sparsity: str = "none"     # p2pfl.runtime.sparse_wire: "none" | "topk:<fraction>" | "randomk:<fraction>"
    error_feedback: bool = True     # what a sparse part leaves out is sent in later rounds
    audit: str = ""                 # the node that keeps the parts it reads (runtime.audit; p2pfl.runtime.node.kept)
    checkpoint_every: int = 1       # rounds taken part in between checkpoints (round 0 and the end always; the end holds the last round)
    round_start: str = "memory"     # where the round start waits for the gather: "memory" | "disk"
    # The resolved scenario (`Scenario.to_dict()`): a checkpoint is bound to its digest.
    resolved: Mapping[str, Any] = field(default_factory=dict, compare=False)
    # The same scenario as an older format wrote it (its run folder's scenario.json), whose
    # checkpoints are bound to that form; None when the folder is of today's format.
    written_as: Mapping[str, Any] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class CoordinatorSettings:
    """What the coordinator reads of the scenario (`p2pfl.assembly.build_coordinator`)."""

    algorithm: str
    rounds: int
    first_submission_wait_s: float  # the longest wait for a round's first node (nodes train)
    straggler_wait_s: float         # then the longest wait for the round's other nodes
    max_weight_ratio: float         # a node's n_train counts at most this many times the round's median
    linger_s: float                 # keep serving after the last round until the nodes are done
    resolved: Mapping[str, Any] = field(default_factory=dict, compare=False)  # checkpoints are bound to it
    written_as: Mapping[str, Any] | None = field(default=None, compare=False)  # as NodeSettings.written_as


@dataclass(frozen=True)
class Sparsity:
    kind: str          # "topk" | "randomk"
    fraction: float    # of each floating tensor's entries sent

    @classmethod
    def parse(cls, text: str) -> Sparsity | None:
        """`"none"` -> None; `"topk:0.01"` / `"randomk:0.1"` -> a Sparsity (ValueError naming what is wrong)."""
        if text == "none":
            return None
        kind, _, fraction = text.partition(":")
        try:
            value = float(fraction)
        except ValueError:
            value = float("nan")
        if kind not in SPARSE_KINDS or not 0 < value <= 1:
            raise ValueError(f"expected \"none\" or <{'|'.join(SPARSE_KINDS)}>:<fraction in (0, 1]>, e.g. "
                             f"\"topk:0.01\", got {text!r}")
        return cls(kind, value)
