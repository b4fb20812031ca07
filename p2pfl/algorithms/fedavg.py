"""Decentralized FedAvg: every node averages the latest models of all peers, weighted by sample count."""

from __future__ import annotations

import torch

from p2pfl.algorithms import register
from p2pfl.models import load_part, part_state
from p2pfl.runtime.strategy import Fetch, PeerModel, RoundContext, Strategy


def weighted_average(states: list[dict[str, torch.Tensor]], weights: list[float]) -> dict[str, torch.Tensor]:
    """Σ w_i state_i over the keys of the first state, with `weights` normalised to sum to 1."""
    total = float(sum(weights))
    if total <= 0:
        raise ValueError("weights must have a positive sum")
    keys = states[0].keys()
    return {
        k: sum((w / total) * s[k].to(torch.float64) for s, w in zip(states, weights)).to(states[0][k].dtype)
        for k in keys
    }


@register
class FedAvg(Strategy):
    name = "fedavg"
    shared_parts = ("full",)

    def configure_fetch(self, ctx: RoundContext) -> list[Fetch]:
        return [Fetch(peer, "full") for peer in ctx.peers]

    def aggregate(self, ctx: RoundContext, arrived: list[PeerModel]) -> None:
        states = [part_state(ctx.model, "full")] + [m.tensors for m in arrived]
        weights = [float(len(ctx.data.train))] + [float(m.n_train) for m in arrived]
        load_part(ctx.model, weighted_average(states, weights))
        ctx.artefacts.record("aggregated_from", [m.sender for m in arrived])
