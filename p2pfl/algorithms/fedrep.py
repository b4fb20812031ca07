"""FedRep (Collins et al., ICML 2021), decentralized: a shared body, a personal head.

Each round a node first trains its head alone with the body frozen (`head_epochs`), then
its body alone with the head frozen (`body_epochs`, default `train.epochs`), as FedRep
does (PFLlib's order and defaults: head first, 1 head epoch). Only the body is published
and fetched; it is averaged over the node and its peers by training-sample count, the
decentralized stand-in for FedRep's server average. The head never leaves the node.

Under DP-SGD each phase is a fit of its own, so the accountant counts both passes.
"""

from __future__ import annotations

from p2pfl.algorithms import register
from p2pfl.algorithms.common import average_part_by_count, latest_parts
from p2pfl.runtime.strategy import Fetch, PeerModel, RoundContext, Strategy
from p2pfl.training.trainer import FitResult


@register
class FedRep(Strategy):
    name = "fedrep"
    shared_parts = ("body",)

    def __init__(self, head_epochs: int = 1, body_epochs: int | None = None) -> None:
        if head_epochs < 0:
            raise ValueError(f"head_epochs must be >= 0, got {head_epochs}")
        if body_epochs is not None and body_epochs < 0:
            raise ValueError(f"body_epochs must be >= 0, got {body_epochs}")
        self.head_epochs = head_epochs
        self.body_epochs = body_epochs

    def fit(self, ctx: RoundContext) -> FitResult:
        model, train = ctx.model, ctx.data.train
        head = ctx.trainer.fit(model, train, epochs=self.head_epochs, params=model.head.parameters())
        body = ctx.trainer.fit(model, train, epochs=self.body_epochs, params=model.body.parameters())
        # The reported loss is the body phase's (the last), over the model the node publishes.
        last = body if body.steps else head
        return FitResult(loss=last.loss, steps=head.steps + body.steps, samples=head.samples + body.samples)

    def configure_fetch(self, ctx: RoundContext) -> list[Fetch]:
        return [Fetch(peer, "body") for peer in ctx.peers]

    def aggregate(self, ctx: RoundContext, arrived: list[PeerModel]) -> None:
        bodies = latest_parts(arrived, "body")
        average_part_by_count(ctx, "body", bodies)
        ctx.artefacts.record("aggregated_from", [m.sender for m in bodies])
