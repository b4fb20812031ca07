"""Decentralized FedAvg: every node averages the latest models of all peers, weighted by sample count."""

from __future__ import annotations

from p2pfl.algorithms import register
from p2pfl.core.influence import RunningWeightedMean
from p2pfl.models import load_part, part_state
from p2pfl.runtime.strategy import Fetch, PeerModel, RoundContext, Strategy


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

    def fold(self, ctx: RoundContext, arrival: PeerModel) -> bool:
        if arrival.part != "full":
            return False
        if self._mean is None:  # the own model counts too; it does not change while models arrive
            self._mean = RunningWeightedMean()
            self._mean.add(part_state(ctx.model, "full"), float(len(ctx.data.train)))
        self._mean.add(arrival.tensors, float(arrival.n_train))
        return True

    def aggregate(self, ctx: RoundContext, arrived: list[PeerModel]) -> None:
        for m in arrived:
            if m.tensors:  # handed over whole rather than folded as it arrived
                self.fold(ctx, m)
        if self._mean is not None:
            load_part(ctx.model, self._mean.mean())
        self._mean = None
        ctx.artefacts.record("aggregated_from", [m.sender for m in arrived])
