"""One round of one node: train -> publish -> pushes -> fetch -> gather -> aggregate -> score.

A `Round` is made for each round and owns everything that lives for that round only (its clock,
what arrived, what was refused or pulled back); the node keeps nothing a round resets. It can be
driven without a node: give it a `RoundKit` built in code (`tests/runtime/node/test_round.py`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from p2pfl.errors import ConfigError
from p2pfl.models import part_state
from p2pfl.runtime.devices import host_snapshot, lend, take_back
from p2pfl.runtime.node.exchange import Exchange
from p2pfl.runtime.node.intake import RoundChecks
from p2pfl.runtime.node.kept import KeptParts
from p2pfl.runtime.node.neighbours import Neighbours
from p2pfl.runtime.node.parts import NodeParts
from p2pfl.runtime.node.records import RoundRecord, epsilon_for_json
from p2pfl.runtime.node.round_start import SharedStart, SpilledStart, shared_start
from p2pfl.runtime.node.scoring import Scored, Scorer, Scores
from p2pfl.runtime.peer_claims import FlatCopy
from p2pfl.runtime.precision import quantize
from p2pfl.runtime.run_folder import ArtefactSink
from p2pfl.runtime.safeguard import Safeguard
from p2pfl.runtime.settings import NodeSettings
from p2pfl.runtime.statements import sign_statement
from p2pfl.runtime.strategy import PeerModel, RoundContext, Strategy, overrides
from p2pfl.runtime.timing import PhaseClock, device_synchronizer
from p2pfl.runtime.worker_pool import run_training
from p2pfl.training.config import TrainConfig
from p2pfl.training.trainer import FitResult


@dataclass(frozen=True)
class RoundKit:
    """What every round of one node works with: the node's long-lived parts."""

    parts: NodeParts
    settings: NodeSettings
    ctx: RoundContext
    exchange: Exchange
    neighbours: Neighbours
    scorer: Scorer
    artefacts: ArtefactSink
    log: logging.Logger
    kept: KeptParts | None = None  # runtime.audit: this node keeps what it reads
    round_start_file: Path | None = None  # runtime.round_start = "disk": where the round start waits (round_start.py)


@dataclass(frozen=True)
class Aggregated:
    refused: str | None            # why the aggregate was refused (kept the model from before it), or None
    safeguard: dict[str, Any]      # the safeguard's record of its check
    scored: Scored


class Round:
    def __init__(self, kit: RoundKit, r: int) -> None:
        self.kit, self.r = kit, r
        self.checks = RoundChecks(r)
        self.clock: PhaseClock | None = None
        self.fit_config: dict[str, Any] = {}  # the strategy's training settings for this round
        self.metrics: dict[str, float] = {}   # the strategy's evaluation after aggregation
        self.peer_scores: dict[str, float] = {}  # the strategy's trust in each peer, after aggregation

    def _begin(self, phase: str) -> float:
        kit = self.kit
        kit.ctx.round = self.r
        kit.ctx.peers = kit.neighbours.asked
        kit.exchange.intake.current = self.checks
        kit.parts.counter.begin_round(self.r)
        kit.artefacts.begin_round(self.r)
        self.clock = PhaseClock(phase, sync=device_synchronizer(kit.parts.device))
        return time.time()

    def _forged(self, member: str, event: int) -> str:
        """A statement about `member` signed with this node's key (valid only about itself): what a
        `membership-lie` attacker can put in its news."""
        return sign_statement(self.kit.parts.key, self.kit.parts.transport.run, member, event).text

    def _epsilon(self) -> float | str | None:
        privacy = self.kit.parts.privacy
        return epsilon_for_json(None if privacy is None else privacy.epsilon())

    async def run(self) -> RoundRecord:
        kit, r, checks = self.kit, self.r, self.checks
        ctx, strategy, parts, exchange = kit.ctx, kit.parts.strategy, kit.parts, kit.exchange
        started_at = self._begin("train")
        clock = self.clock
        assert clock is not None
        # Watched neighbours are probed while this node trains (most rounds have none to probe).
        probes = asyncio.ensure_future(exchange.probe_watched(r)) if kit.neighbours.watched else None
        fit, trained = await run_training(self.train_and_score)
        if parts.script.slowdown > 1:  # a slower machine, on this one: the training's time, stretched
            clock.switch("train")
            await asyncio.sleep((parts.script.slowdown - 1) * clock.seconds["train"])
            clock.switch("evaluate")
        epsilon = self._epsilon()
        clock.switch("publish")
        meta = exchange.round_meta(r)
        lie = getattr(parts.attack, "news", None)  # an attack may poison parts only (tests bring their own)
        if lie is not None:
            meta = lie(meta, sorted(kit.neighbours.members), ctx.node_id, self._forged, r)
        # A host model's own tensors are published (no copy) until it takes fresh storage back after the gather.
        lent = self.lends()
        try:
            if strategy.shared_parts:
                shared = {p: (lend if lent else host_snapshot)(part_state(parts.model, p)) for p in strategy.shared_parts}
                if parts.attack is not None:
                    shared = parts.attack.published(shared, host_snapshot(ctx.round_start), r)
                shared = {p: quantize(t, kit.settings.wire_precision) for p, t in shared.items()}
                await exchange.publish_round(r, shared, meta)
            clock.switch("aggregate")  # the statistics a strategy pushes are its own computation
            pushes = await asyncio.to_thread(strategy.pushes, ctx) if overrides(strategy, Strategy, "pushes") else []
            clock.switch("exchange")
            await exchange.send_pushes(pushes, r)
            if probes is not None:
                await probes
            ctx.peers = kit.neighbours.asked  # after the probes, and any goodbye that came while it trained
            fetches, versions, sat_out = kit.neighbours.to_ask(strategy.configure_fetch(ctx), r, kit.settings.accept_stale)
            arrived = await exchange.gather(fetches, r, checks, versions=versions)
        finally:
            if lent:
                take_back(parts.model)
        unanswered = kit.neighbours.warn_silent(r, {f.peer for f in fetches} - {m.sender for m in arrived}
                                                - set(checks.refused))
        kit.neighbours.judge({m.sender for m in arrived}, checks.refused, checks.bounded_factor, r)
        clock.switch("aggregate")
        aggregated = await asyncio.to_thread(self.aggregate_and_score, arrived, trained.scores)
        kit.scorer.last = aggregated.scored.scores
        ctx.round_start = checks.round_start = {}  # a model's copy, for this round only (nodes share a process)
        time_record = clock.stop()
        safeguard = {**aggregated.safeguard, **parts.safeguard.round_record(
            trained.scores.test_acc, aggregated.scored.scores.test_acc, trained.deployed, aggregated.scored.deployed)}
        record = RoundRecord(
            round=r, participated=True, test_acc=trained.deployed.acc, test_loss=trained.deployed.loss,
            test_acc_aggregated=aggregated.scored.deployed.acc, val_acc=trained.scores.val_acc,
            val_acc_aggregated=aggregated.scored.scores.val_acc, train_loss=fit.loss, train_steps=fit.steps,
            traffic=parts.counter.round_summary(r), wall_s=sum(time_record.values()), started_at=started_at,
            time=time_record, epsilon=epsilon, asked=len({f.peer for f in fetches}),
            arrived=sorted(m.sender for m in arrived), stale=sorted(m.sender for m in arrived if m.version < r),
            unanswered=len(unanswered), strategy=dict(kit.artefacts.records),
            staleness={m.sender: r - m.version for m in arrived if m.version < r},
            neighbours=kit.neighbours.changes(), peers_refused=dict(checks.refused), sat_out=sat_out,
            peers_bounded={peer: list(reasons) for peer, reasons in checks.bounded.items()}, peers_bounded_factor=dict(checks.bounded_factor),
            aggregate_refused=aggregated.refused, safeguard=safeguard, fit_config=self.fit_config,
            metrics=self.metrics, peer_scores=self.peer_scores, silent=sorted(unanswered),
            test_acc_by_split=trained.scores.test_acc_by_split,
            test_acc_aggregated_by_split=aggregated.scored.scores.test_acc_by_split,
        )
        kit.log.info("round %d/%d: acc %.3f, %.3f after aggregation; %d of %d peers answered; %.1f MiB in; %.1f s",
                     r, kit.settings.rounds, trained.scores.test_acc, aggregated.scored.scores.test_acc,
                     len(set(record.arrived)), record.asked, record.traffic.get("bytes_received", 0) / 2**20,
                     record.wall_s)
        return record

    def lends(self) -> bool:
        """Whether the node publishes its model's own tensors (`p2pfl.runtime.devices.lend`)."""
        parts = self.kit.parts
        return bool(parts.strategy.shared_parts) and parts.attack is None and parts.device.type == "cpu"

    # A round's steps between two exchanges run in one worker thread each: nodes sharing a worker
    # keep serving meanwhile, and each hand-over to the pool (a thread woken, a future, a callback
    # on the loop) is paid once, not for every step.
    def train_and_score(self) -> tuple[FitResult, Scored]:
        """The round's training, the privacy step on what it publishes, and that model's scores."""
        parts, clock, ctx = self.kit.parts, self.clock, self.kit.ctx
        assert clock is not None
        # Taken here, in the pool's thread: a node queued for a thread holds no copy meanwhile.
        ctx.round_start = self.checks.round_start = start = FlatCopy(parts.model.state_dict())
        base = parts.trainer.config
        if overrides(parts.strategy, Strategy, "fit_config"):
            self.fit_config = dict(parts.strategy.fit_config(ctx))
            parts.trainer.config = round_config(base, self.fit_config, private=parts.privacy is not None)
        try:
            fit = parts.strategy.fit(ctx)
        finally:
            parts.trainer.config = base
        clock.switch("privacy")
        if parts.privacy is not None:
            parts.privacy.before_publish(parts.model, ctx.round_start)
        if parts.safeguard.trains:
            clock.switch("train")
            parts.safeguard.after_train(parts.data.train)
        clock.switch("evaluate")
        scored = self.kit.scorer.scored()
        if self.r == 1 and (first := shared_start(start)) is not None:  # the model as built: one copy a process
            ctx.round_start = self.checks.round_start = first
        elif self.kit.round_start_file is not None and self.lends() and start.flat is not None:
            ctx.round_start = self.checks.round_start = SpilledStart(start, self.kit.round_start_file)
        return fit, scored

    def aggregate_and_score(self, arrived: list[PeerModel], trained: Scores) -> Aggregated:
        """Aggregation, its checks (non-finite values, the safeguard) and the aggregate's scores."""
        parts, clock = self.kit.parts, self.clock
        assert clock is not None
        model = parts.model
        start = self.checks.round_start
        if isinstance(start, (SpilledStart, SharedStart)):  # back in memory, the strategy's own, to aggregate
            self.kit.ctx.round_start = self.checks.round_start = start.own_copy()
        before = FlatCopy(model.state_dict())  # one buffer, not a tensor each
        parts.strategy.aggregate(self.kit.ctx, arrived)
        if self.kit.kept is not None:
            self.kit.kept.own_aggregate(self.r, model.state_dict())
        if overrides(parts.strategy, Strategy, "peer_scores"):
            self.peer_scores = {str(p): float(v) for p, v in parts.strategy.peer_scores(self.kit.ctx).items()}
        refused = self.refuse_non_finite(before)
        safeguard_record: dict[str, Any] = {}
        if refused is None and overrides(parts.safeguard, Safeguard, "after_aggregate"):
            safeguard_record = parts.safeguard.after_aggregate(
                model, before, lambda m: parts.trainer.evaluate(m, parts.data.val))
        clock.switch("evaluate")
        if overrides(parts.strategy, Strategy, "evaluate"):
            self.metrics = {k: float(v) for k, v in parts.strategy.evaluate(self.kit.ctx).items()}
        if all(torch.equal(v, before[k]) for k, v in model.state_dict().items()):
            # Aggregation kept the trained model (Local, or nothing arrived): the same scores, and
            # no second pass over a test split that may hold a thousand samples.
            return Aggregated(refused, safeguard_record, Scored(trained, self.kit.scorer.deploy(trained)))
        scored = self.kit.scorer.scored()
        if not math.isfinite(scored.scores.test_loss) and math.isfinite(trained.test_loss):
            # Finite values can still score NaN (a buffer a layer takes the root or the log of):
            # the node's own model is kept, and the round names whom it took in.
            model.load_state_dict(before)
            senders = sorted({m.sender for m in arrived})
            refused = (f"aggregate scored a non-finite loss ({scored.scores.test_loss}); kept the model from before it "
                       f"(took in {', '.join(senders) or 'no peer'})")
            self.kit.log.warning("round %d: %s", self.r, refused)
            return Aggregated(refused, safeguard_record, Scored(trained, self.kit.scorer.deploy(trained)))
        return Aggregated(refused, safeguard_record, scored)

    def refuse_non_finite(self, before: dict[str, torch.Tensor]) -> str | None:
        """Keep the pre-aggregation model when the aggregate holds NaN or Inf (peers' values can
        be finite and still overflow a weighted sum); returns why, or None when it was fine."""
        model = self.kit.parts.model
        floats = {k: v for k, v in model.state_dict().items() if v.is_floating_point() and v.numel()}
        # A finite sum of every tensor means no NaN or Inf anywhere: one check a round, not one per
        # element. Summed in the tensors' own precision (a third of float64's time): a sum that
        # overflows with every value finite only sends the check to the test per element below.
        if not floats or bool(torch.stack([v.sum() for v in floats.values()]).isfinite().all()):
            return None
        bad = [k for k, v in floats.items() if not bool(torch.isfinite(v).all())]
        if not bad:  # a sum overflowed, every value finite
            return None
        model.load_state_dict(before)
        reason = f"aggregate has non-finite values in {len(bad)} tensors ({', '.join(bad[:3])}); kept the model from before it"
        self.kit.log.warning("round %d: %s", self.r, reason)
        return reason

    async def sit_out(self) -> RoundRecord:
        """A round this node does not take part in: no training, no downloads; it keeps serving its
        last version, and a GET for this round answers at once, so no peer waits for it."""
        kit = self.kit
        started_at = self._begin("exchange")
        clock = self.clock
        assert clock is not None
        await kit.exchange.transport.sit_out(self.r)
        clock.switch("evaluate")
        if kit.scorer.last is None:  # the model has not been scored since it last changed (a resume)
            scored = await asyncio.to_thread(kit.scorer.scored)
            kit.scorer.last = scored.scores
        else:
            scored = Scored(kit.scorer.last, kit.scorer.deploy(kit.scorer.last))
        safeguard = kit.parts.safeguard.round_record(scored.scores.test_acc, scored.scores.test_acc, scored.deployed,
                                                     scored.deployed)
        time_record = clock.stop()
        return RoundRecord(
            round=self.r, participated=False, test_acc=scored.deployed.acc, test_loss=scored.deployed.loss,
            test_acc_aggregated=scored.deployed.acc, val_acc=scored.scores.val_acc,
            val_acc_aggregated=scored.scores.val_acc, train_loss=None, train_steps=0,
            traffic=kit.parts.counter.round_summary(self.r), wall_s=sum(time_record.values()), started_at=started_at,
            time=time_record, epsilon=self._epsilon(), neighbours=kit.neighbours.changes(), safeguard=safeguard,
            test_acc_by_split=scored.scores.test_acc_by_split, test_acc_aggregated_by_split=scored.scores.test_acc_by_split,
        )


def round_config(base: TrainConfig, settings: Mapping[str, Any], *, private: bool) -> TrainConfig:
    """`base` with a strategy's settings for one round (`Strategy.fit_config`); a key that is not a
    training setting, or a value `[train]` would refuse, is a ValueError naming it."""
    allowed = {f.name for f in dataclasses.fields(TrainConfig)} - {"seed_offset"}
    unknown = sorted(set(settings) - allowed)
    if unknown:
        raise ValueError(f"fit_config returned {unknown}: a round's training settings are {sorted(allowed)}")
    if private and {"epochs", "batch_size"} & set(settings):
        raise ValueError("fit_config cannot change epochs or batch_size under privacy: the accountant counts the "
                         "steps the scenario's [train] gives")
    try:
        return dataclasses.replace(base, **settings)
    except ConfigError as exc:
        raise ValueError(f"fit_config: {exc}") from None
