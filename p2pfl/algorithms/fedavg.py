"""Decentralized FedAvg: every node averages the latest models of all peers, weighted by sample count."""

from __future__ import annotations

import torch

from p2pfl.algorithms import register
from p2pfl.core.influence import RunningWeightedMean, combine_states
from p2pfl.models import load_part, part_state
from p2pfl.runtime.strategy import Fetch, PeerModel, RoundContext, Strategy


def weighted_average(states: list[dict[str, torch.Tensor]], weights: list[float]) -> dict[str, torch.Tensor]:
    """Σ w_i state_i over the keys of the first state, with `weights` normalised to sum to 1."""
    total = float(sum(weights))
    if total <= 0:
        raise ValueError("weights must have a positive sum")
    return combine_states(states, [w / total for w in weights])


def average_part_by_count(ctx: RoundContext, part: str, members: list[PeerModel]) -> None:
    """Load into `ctx.model` the sample-count-weighted mean of its own `part` and `members`' (one per peer).

    Shared by FedRep and FedC2I's Λ/g variant; a no-op when no member arrived.
    """
    if not members:
        return
    states = [part_state(ctx.model, part)] + [m.tensors for m in members]
    counts = [float(len(ctx.data.train))] + [float(m.n_train) for m in members]
    load_part(ctx.model, weighted_average(states, counts))


@register
class FedAvg(Strategy):
    """Sample-count-weighted mean of the own model and every neighbour's, summed as models
    arrive: a node holds one running sum, never all its peers' models at once."""

    name = "fedavg"
    shared_parts = ("full",)
    folds_arrivals = True

    def __init__(self) -> None:
        self._mean: RunningWeightedMean | None = None

    def configure_fetch(self, ctx: RoundContext) -> list[Fetch]:
        self._mean = None
        return [Fetch(peer, "full") for peer in ctx.peers]

    def fold(self, ctx: RoundContext, arrival: PeerModel) -> None:
        if self._mean is None:  # the own model counts too; it does not change while models arrive
            self._mean = RunningWeightedMean()
            self._mean.add(part_state(ctx.model, "full"), float(len(ctx.data.train)))
        self._mean.add(arrival.tensors, float(arrival.n_train))

    def aggregate(self, ctx: RoundContext, arrived: list[PeerModel]) -> None:
        for m in arrived:
            if m.tensors:  # handed over whole rather than folded as it arrived
                self.fold(ctx, m)
        if self._mean is not None:
            load_part(ctx.model, self._mean.mean())
        self._mean = None
        ctx.artefacts.record("aggregated_from", [m.sender for m in arrived])
