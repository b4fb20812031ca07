"""Decentralized FedAvg: every node averages the latest models of all peers, weighted by sample count.

`aggregation = "median"` or `"trimmed_mean"` (with `trim`) replaces the weighted mean with a
coordinate-wise robust aggregate of the own model and the peers' (`p2pfl.core.robust`), for runs
where a peer may be poisoning; `"krum"`, `"multi_krum"` (the `keep` best, 0: n − byzantine) and
`"bulyan"` pick models by their distances, tolerating `byzantine` bad ones among the own model
and the peers'. A topology that gives a node fewer models than the rule needs (Krum and Multi-Krum
2f + 3, Bulyan 4f + 3) is refused at launch unless `fallback = true` (ours): then, as when churn
leaves too few at run time, the node keeps its own model that round and records `fell_back`,
which the run's summary counts. FedProx inherits the options.

`staleness = a > 0` (ours, after FedAsync's polynomial weight, Xie et al. 2019) weighs a part
that is τ rounds old (a straggler's, taken under `runtime.accept_stale`) by (1 + τ)^-a on top of
its sample count; 0, the default, is FedAvg as printed.

`sum_dtype = "model"` (ours) keeps the running sum in the model's own dtype instead of float64:
half the memory a waiting node holds for a float32 model (docs/benchmarks.md, issue 66), and an
aggregate that can differ in its last bits with the order the models arrived in, as Flower's
NumPy sums do; "float64", the default, sums so that the order moves nothing the float32 answer keeps.
"""

from __future__ import annotations

import torch

from p2pfl.algorithms import register
from p2pfl.core.influence import RunningWeightedMean
from p2pfl.core.robust import ROBUST_RULES, SELECTION_RULES, models_needed, robust_aggregate, selection_aggregate, trimmed_count
from p2pfl.models import load_part, part_state
from p2pfl.runtime.strategy import Fetch, PeerModel, RoundContext, Strategy


# The running sum's dtype by its setting's value: "model" sums in each tensor's own dtype.
SUM_DTYPES: dict[str, torch.dtype | None] = {"float64": torch.float64, "model": None}


@register
class FedAvg(Strategy):
    """Sample-count-weighted mean of the own model and every neighbour's, summed as models
    arrive: a node holds one running sum, never all its peers' models at once."""

    name = "fedavg"
    shared_parts = ("full",)
    folds_arrivals = True

    def __init__(self, aggregation: str = "mean", trim: float = 0.1, staleness: float = 0.0, byzantine: int = 1,
                 keep: int = 0, fallback: bool = False, sum_dtype: str = "float64") -> None:
        if sum_dtype not in SUM_DTYPES:
            raise ValueError(f"sum_dtype must be one of {tuple(SUM_DTYPES)}, got {sum_dtype!r}")
        if aggregation not in ("mean", *ROBUST_RULES):
            raise ValueError(f"aggregation must be one of {('mean', *ROBUST_RULES)}, got {aggregation!r}")
        trimmed_count(1, trim)  # the range check, before the first round
        if int(byzantine) != byzantine or byzantine < 0 or int(keep) != keep or keep < 0:
            raise ValueError(f"byzantine and keep must be integers >= 0, got {byzantine}, {keep}")
        self.byzantine, self.keep = int(byzantine), int(keep)
        if not 0 <= staleness < float("inf"):
            raise ValueError(f"staleness must be a finite exponent >= 0 (0: off), got {staleness}")
        if staleness and aggregation != "mean":
            raise ValueError(f"staleness weighs the mean; aggregation {aggregation!r} takes no weights")
        if sum_dtype != "float64" and aggregation != "mean":
            raise ValueError(f"sum_dtype is the mean's running sum; aggregation {aggregation!r} keeps none")
        if not isinstance(fallback, bool):
            raise ValueError(f"fallback must be true or false, got {fallback!r}")
        if fallback and aggregation not in SELECTION_RULES:
            raise ValueError(f"fallback is for krum, multi_krum and bulyan, not aggregation {aggregation!r}")
        self.aggregation, self.trim, self.staleness, self.fallback = aggregation, trim, staleness, fallback
        self.sum_dtype = sum_dtype
        # A robust rule needs every model of the round at once; only the mean is summed as they arrive.
        self.folds_arrivals = aggregation == "mean"
        self._mean: RunningWeightedMean | None = None

    def topology_conflict(self, models_per_node: int) -> str | None:
        needed = models_needed(self.aggregation, self.byzantine)
        if self.aggregation not in SELECTION_RULES or self.fallback or models_per_node >= needed:
            return None
        return (f"{self.aggregation} with byzantine = {self.byzantine} needs {needed} models a round (a node's own "
                f"and {needed - 1} peers'), but the topology gives a node {models_per_node}")

    def configure_fetch(self, ctx: RoundContext) -> list[Fetch]:
        self._mean = None
        return [Fetch(peer, "full") for peer in ctx.peers]

    def fold(self, ctx: RoundContext, arrival: PeerModel) -> bool:
        if arrival.part != "full":
            return False
        if self._mean is None:  # the own model counts too; it does not change while models arrive
            self._mean = RunningWeightedMean(SUM_DTYPES[self.sum_dtype])
            self._mean.add(part_state(ctx.model, "full"), float(len(ctx.data.train)))
        self._mean.add(arrival.tensors, float(arrival.n_train) * staleness_weight(ctx.round - arrival.version,
                                                                                   self.staleness))
        return True

    def aggregate(self, ctx: RoundContext, arrived: list[PeerModel]) -> None:
        if self.aggregation != "mean":
            models = [m for m in arrived if m.part == "full"]
            states = [part_state(ctx.model, "full"), *(m.tensors for m in models)]
            if self.aggregation in SELECTION_RULES:
                self._select(ctx, states, [ctx.node_id, *(m.sender for m in models)])
            elif models:
                load_part(ctx.model, robust_aggregate(states, self.aggregation, self.trim))
            ctx.artefacts.record("aggregated_from", [m.sender for m in models])
            return
        for m in arrived:
            if m.tensors:  # handed over whole rather than folded as it arrived
                self.fold(ctx, m)
        if self._mean is not None:
            load_part(ctx.model, self._mean.mean(last=True))
        self._mean = None  # a copy of the model in the sums' dtype: not held between rounds
        ctx.artefacts.record("aggregated_from", [m.sender for m in arrived])


    def _select(self, ctx: RoundContext, states: list, senders: list[str]) -> None:
        """Krum, Multi-Krum or Bulyan over the own model and the peers'; the picked are recorded."""
        needed = models_needed(self.aggregation, self.byzantine)
        if len(states) < needed:
            ctx.artefacts.record("picked", {"too_few_models": len(states), "needed": needed})
            ctx.artefacts.record("fell_back", f"{self.aggregation} needs {needed} models, had {len(states)}: "
                                              "kept its own model")
            return  # fewer than the rule is defined on: the own model stays
        keep = min(self.keep, len(states) - self.byzantine) if self.keep else 0
        merged, picked = selection_aggregate(states, self.aggregation, self.byzantine, keep)
        load_part(ctx.model, merged)
        ctx.artefacts.record("picked", [senders[i] for i in picked])


def staleness_weight(tau: int, exponent: float) -> float:
    """FedAsync's polynomial staleness function (1 + τ)^-a; a part of this round (τ <= 0) weighs 1."""
    return 1.0 if exponent == 0 or tau <= 0 else float((1 + tau) ** -exponent)
