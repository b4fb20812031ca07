"""One node: an asyncio process that serves its model parts and runs its own round loop.

No global barrier: each round the node trains, publishes a new version, gathers what its
strategy asked for (waiting at most `fetch_timeout_s` per peer), aggregates, and moves on.
Training runs in a worker thread so that the server keeps answering peers meanwhile.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import math
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from p2pfl.attacks import Attack
from p2pfl.data import NodeData
from p2pfl.models import SplitModel, part_spec, part_state
from p2pfl.runtime.accounting import ByteCounter
from p2pfl.runtime.checkpoint import (
    AS_BUILT,
    CheckpointError,
    read_checkpoint,
    read_resumable,
    restore_run_state,
    run_state,
    save_checkpoint,
    scenario_digest,
    tensors_digest,
)
from p2pfl.runtime.config import NodeConfig
from p2pfl.runtime.metadata import MODEL_META, Schema
from p2pfl.runtime.participation import participation_rng, takes_part, version_to_ask
from p2pfl.runtime.peer_claims import (ClaimRefused, DeclaredSizes, FlatCopy, Flattened, bound_update, capped_size,
                                      check_magnitude, flattened, own_norms, update_norm)
from p2pfl.runtime.devices import host_snapshot, to_device
from p2pfl.runtime.precision import dequantize, quantize, wire_spec
from p2pfl.runtime.safeguard import Deployment, Safeguard
from p2pfl.runtime.run_folder import ArtefactSink, RunFolder
from p2pfl.runtime.settings import NodeSettings
from p2pfl.runtime.strategy import COORDINATOR_ID, Fetch, PartDecl, PeerModel, Push, RoundContext, Strategy, setup_part
from p2pfl.runtime.timing import PhaseClock
from p2pfl.runtime.transport import Transport
from p2pfl.training.trainer import FitResult, LocalTrainer, PrivacyMechanism, rng_state_from_hex, rng_state_hex
from p2pfl.wire import Message, NodeKey

PEER_PARTS = ("body", "head", "full")
WARN_EVERY = 5  # rounds between two warnings about the same silent peer


class PushRefused(ValueError):
    status = 409
    reason = "unsolicited_push"


# (test accuracy, test loss, validation accuracy, what the safeguard deploys) of the model as it is.
Scored = tuple[float, float, float | None, Deployment]
RoundCallback = Callable[[dict[str, Any]], None]


@dataclass
class NodeParts:
    """What a node runs with, built by `p2pfl.assembly` (the node builds nothing itself)."""

    data: NodeData
    device: torch.device
    model: SplitModel
    trainer: LocalTrainer
    strategy: Strategy
    fresh_strategy: Callable[[], Strategy]  # a new one with the same parameters: restore tries a checkpoint on it first
    privacy: PrivacyMechanism | None        # p2pfl.privacy's DP-SGD or output noise, or None
    attack: Attack | None
    key: NodeKey
    transport: Transport
    counter: ByteCounter
    neighbours: tuple[str, ...]             # whom this node fetches from and waits for (runtime.topology)
    seed: int
    safeguard: Safeguard = field(default_factory=Safeguard)  # algorithm.safeguard: none, MixSafeguard, LocalSafeguard
    # Under partial participation: the rounds each neighbour takes part in (`p2pfl.runtime.participation`).
    peer_rounds: Mapping[str, frozenset[int]] = field(default_factory=dict)


class Node:
    """Runs rounds: train, publish, gather what the strategy asks for, aggregate, checkpoint.

    `on_round` hears each round's record (with the node's `id`) as the round ends; `run` returns the node's
    result. Whoever hosts the node decides where they go (`p2pfl.assembly`).
    """

    def __init__(self, config: NodeConfig, settings: NodeSettings, parts: NodeParts, *, resume: bool = False,
                 on_round: RoundCallback | None = None) -> None:
        self.config = config
        self.settings = settings
        self.resume = resume
        self.on_round = on_round or (lambda _: None)
        self.log = logging.getLogger(f"p2pfl.{config.id}")
        self.data, self.device, self.model = parts.data, parts.device, parts.model
        self.trainer, self.strategy, self.privacy = parts.trainer, parts.strategy, parts.privacy
        self.fresh_strategy, self.attack, self.key = parts.fresh_strategy, parts.attack, parts.key
        self.counter, self.neighbours = parts.counter, parts.neighbours
        self.safeguard = parts.safeguard
        self.specs = {part: part_spec(self.model, part) for part in PEER_PARTS}
        # Parts besides the model's own (the coordinator's replies, setup parts), as the strategy declares them.
        self.extra: dict[str, PartDecl] = self.strategy.extra_parts(self.model)
        self.precision = settings.wire_precision
        self.round = 0
        self.done = False
        # (peer, part) -> the push that may answer this round's fetch of it, while gather waits.
        self.awaiting: dict[tuple[str, str], asyncio.Future[PeerModel]] = {}
        self.endpoint = parts.transport
        self.endpoint.attach(expected_for=self._expected, meta_schema_for=self._meta_schema, on_message=self._on_push,
                             status=self._status, on_departed=self._on_departed)
        self.endpoint.expect_readers(self.neighbours)  # the graph is undirected; the coordinator is pushed to
        self.folder = RunFolder(config.out)
        self.artefacts = ArtefactSink(config.id, self.folder.artefacts)
        self.ctx = RoundContext(
            node_id=config.id, round=0, rounds=settings.rounds, peers=self.neighbours, model=self.model,
            data=self.data, trainer=self.trainer, rng=np.random.default_rng(parts.seed), artefacts=self.artefacts,
            log=self.log.info, coordinator=COORDINATOR_ID if config.coordinator is not None else None,
            seed=settings.seed,
        )
        self.setup_record: dict[str, Any] | None = None
        self.set_up = False  # Strategy.setup has run, or its outcome was restored: checkpoints carry it
        self._prepared = False
        self.rounds: list[dict[str, Any]] = []
        self.participation_rng = participation_rng(parts.seed)
        self.peer_rounds = parts.peer_rounds
        # (test acc, test loss, val acc) of the model as it is: a round sat out changes nothing to score again.
        self._scores: tuple[float, float, float | None] | None = None
        self._warned: dict[str, int] = {}  # peer -> the round it was last reported silent
        self.declared_sizes = DeclaredSizes()
        self.refused: dict[str, str] = {}  # peer -> why its part was refused this round
        self._own_norms: dict[str, float] = {}  # part -> its norm this round, what a peer's is bounded by
        self.bounded: dict[str, str] = {}  # peer -> how its part was pulled back this round (update_bound)
        self.bounded_factor: dict[str, float] = {}  # peer -> how many times over the bound its part lay
        self._own_updates: dict[str, float] = {}  # part -> how far this round's training moved it
        self.restarts: list[dict[str, Any]] = []  # each --resume of this node: after which round, when
        self.checkpoint_path = self.folder.checkpoint(config.id)
        self._scenario_digest = scenario_digest(settings.resolved)  # what binds each checkpoint to the scenario
        # What a checkpoint stores instead of a model that never changed (checkpoint.AS_BUILT).
        built = self.checkpoint_tensors()
        self._built_digest = tensors_digest(built)
        self._built_versions = _write_marks(built)
        self._trained = False  # set by the first round taken part in, or a restored model

    # ---- endpoint callbacks ---------------------------------------------------------------
    def _expected(self, kind: str, part: str) -> dict[str, tuple[tuple[int, ...], str]] | None:
        if kind != "model":
            return None
        if part in self.extra:  # declared by the strategy; they travel at full precision
            return self.extra[part].spec
        spec = self.specs.get(part)
        return None if spec is None else wire_spec(spec, self.precision)

    def _meta_schema(self, kind: str, part: str) -> Schema | None:
        if kind != "model":
            return None
        return self.extra[part].meta if part in self.extra else MODEL_META

    def _on_push(self, message: Message) -> None:
        """A peer pushed a part. Taken only while this node's gather waits for exactly that
        (sender, part), at a version within one round of its own; it then answers the fetch."""
        h = message.header
        waiting = self.awaiting.get((h.sender, h.part))
        if waiting is None or waiting.done():
            raise PushRefused(f"{h.sender}/{h.part} was not asked for (this node is in round {self.round})")
        if not self.round - 1 <= h.version <= self.round + 1:
            raise PushRefused(f"version {h.version} of {h.sender}/{h.part} is not within one round of {self.round}")
        try:
            waiting.set_result(self._peer_model(message))
        except ClaimRefused as exc:
            self.refused[h.sender] = str(exc)
            raise

    def _peer_model(self, message: Message) -> PeerModel:
        """A verified message as a strategy sees it: every tensor already on this node's device,
        its claims bounded (`p2pfl.runtime.peer_claims`; ClaimRefused when over a bound)."""
        h = message.header
        tensors = message.torch_tensors()
        meta = dict(h.meta)
        settings = self.settings
        if h.part not in self.extra:  # a model part; the strategy's extra parts (setup steps, statistics) are its own
            tensors = dequantize(tensors, self.specs[h.part], self.precision)  # extra parts travel at full precision
            bounded = h.sender != COORDINATOR_ID and bool(self.ctx.round_start) and settings.update_bound > 0
            if h.part not in self._own_norms:  # once per part and round: the own model is still while parts arrive
                self._own_norms[h.part], update = own_norms(part_state(self.model, h.part),
                                                            self.ctx.round_start if bounded else None)
                if update is not None:
                    self._own_updates[h.part] = update
            flat = flattened(tensors) if bounded else None  # one float64 copy of the part for both bounds
            check_magnitude(h.sender, h.part, tensors, self._own_norms[h.part], settings.max_norm_ratio, flat)
            if bounded:
                tensors = self._bounded(h.sender, h.part, tensors, flat)
            if h.sender != COORDINATOR_ID and "n_train" in meta:
                self.declared_sizes.check(h.sender, int(meta["n_train"]))
                meta["n_train"] = capped_size(meta["n_train"], len(self.data.train), settings.max_weight_ratio)
        return PeerModel(h.sender, h.part, h.round, h.version, to_device(tensors, self.device), meta)

    def _bounded(self, sender: str, part: str, tensors: dict[str, torch.Tensor],
                 flat: Flattened | None = None) -> dict[str, torch.Tensor]:
        """`tensors` within `update_bound` times this node's own update of `part` this round
        (`p2pfl.runtime.peer_claims.bound_update`, which uses up `flat`); a part pulled back names
        its sender in the round."""
        if not self.settings.update_bound > 0:
            return tensors
        start = self.ctx.round_start  # the bound pairs each tensor of the part with its start
        if part not in self._own_updates:
            self._own_updates[part] = update_norm(part_state(self.model, part), start)
        clipped = bound_update(tensors, start, self._own_updates[part], self.settings.update_bound, flat)
        if clipped is None:
            return tensors
        tensors, distance, bound = clipped
        refuse = self.settings.update_refuse
        if refuse > 0 and distance >= refuse * bound:
            raise ClaimRefused(f"{sender}/{part} moved {distance:.3g} from this node's round start, {distance / bound:.0f} "
                               f"times over {self.settings.update_bound:g} x its own update ({bound:.3g}; refused from "
                               f"{refuse:g} times over, runtime.update_refuse)")
        self.bounded[sender] = (f"{part} moved {distance:.3g} from this node's round start, over "
                                f"{self.settings.update_bound:g} x its own update ({bound:.3g}); pulled back to it")
        self.bounded_factor[sender] = max(self.bounded_factor.get(sender, 0.0), round(distance / bound, 3))
        return tensors

    def _refuse(self, sender: str, exc: ClaimRefused) -> None:
        self.refused[sender] = str(exc)
        self.endpoint.rejections.add(sender, exc.status, exc.reason, str(exc))

    def _on_departed(self, peer: str, reason: str) -> None:
        self.ctx.unreachable.add(peer)
        self.ctx.departed.add(peer)

    def _status(self) -> dict[str, Any]:
        # Public (unauthenticated): liveness and round only.
        return {"id": self.config.id, "round": self.round, "done": self.done}

    # ---- the round loop -------------------------------------------------------------------
    async def gather(self, fetches: list[Fetch], round_: int, wait: float | None = None,
                     versions: Mapping[str, int] | None = None) -> list[PeerModel]:
        """`wait`: the longest wait for each fetch (default: fetch_timeout_s for a peer,
        coordinator_wait_s for the coordinator). `versions`: the version asked of a peer where it
        is not `round_` (a neighbour that sits out this round: the last round it took part in)."""
        versions = versions or {}
        timeout = self.settings.fetch_timeout_s
        loop = asyncio.get_running_loop()
        self.awaiting = {(f.peer, f.part): loop.create_future() for f in fetches if f.peer in self.endpoint.peers}

        async def one(fetch: Fetch) -> PeerModel | None:
            if fetch.peer not in self.endpoint.peers:
                self.log.warning("strategy asked for unknown peer %r", fetch.peer)
                return None
            if fetch.peer in self.ctx.unreachable and await self.endpoint.status_of(fetch.peer, timeout=1.0) is None:
                # Gone last round and not answering now (killed, or its machine is down): one
                # quick probe instead of fetch_timeout_s in every later round.
                return None
            longest = wait if wait is not None else (
                self.settings.coordinator_wait_s if fetch.peer == COORDINATOR_ID else timeout)
            fetched = asyncio.ensure_future(self.endpoint.fetch(fetch.peer, fetch.part, versions.get(fetch.peer, round_),
                                                                longest))
            pushed = self.awaiting[(fetch.peer, fetch.part)]
            try:
                await asyncio.wait({fetched, pushed}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not fetched.done():
                    fetched.cancel()
            if pushed.done():
                return pushed.result()
            message = fetched.result()
            if message is None:
                return None
            if message.header.version < round_ and not self.settings.accept_stale:
                return None
            try:
                if fetch.part in self.specs and message.header.version > self.settings.rounds:
                    # No honest peer publishes a round's model past the last round (setup parts count steps).
                    raise ClaimRefused(f"{fetch.peer} served version {message.header.version} of "
                                       f"{fetch.part}; the run has {self.settings.rounds} rounds")
                return self._peer_model(message)
            except ClaimRefused as exc:
                self._refuse(fetch.peer, exc)
                return None

        async def folded(fetch: Fetch) -> PeerModel | None:
            arrival = await one(fetch)
            if arrival is None or not self.strategy.folds_arrivals or not self.strategy.fold(self.ctx, arrival):
                return arrival
            return dataclasses.replace(arrival, tensors={})  # folded: its tensors can go

        try:
            results = await asyncio.gather(*(folded(f) for f in fetches))
        finally:
            for waiting in self.awaiting.values():
                waiting.cancel()
            self.awaiting = {}
        arrived = [r for r in results if r is not None]
        self.ctx.unreachable = {f.peer for f, r in zip(fetches, results) if r is None} | self.ctx.departed
        return arrived

    async def send_pushes(self, pushes: list[Push], round_: int) -> None:
        timeout = self.settings.fetch_timeout_s
        await asyncio.gather(*(
            self.endpoint.push(
                p.target, kind=p.kind, part=p.part, round_=round_, version=round_,
                tensors=p.tensors, meta=p.meta, timeout=timeout,
            )
            for p in pushes
        ))

    async def run_setup(self) -> None:
        """`Strategy.setup` with the setup exchange open; its bytes and records are round 0's."""
        t0 = time.perf_counter()
        self.counter.begin_round(0)
        self.artefacts.begin_round(0)
        if not _overrides(self.strategy, Strategy, "setup"):  # no thread for nothing (a worker starts hundreds of nodes)
            self.set_up = True
            return
        loop = asyncio.get_running_loop()
        self.ctx.exchange = NodeSetupExchange(self, loop)
        # A thread of its own: setup blocks on exchanges that need the loop's default executor
        # (encoding), which nodes sharing a process would otherwise fill with waiting setups.
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"{self.config.id}-setup") as pool:
            try:
                await loop.run_in_executor(pool, self.strategy.setup, self.ctx)
            finally:
                self.ctx.exchange = None
                self._scores = None  # setup may have changed the model
        summary = self.counter.round_summary(0)
        if summary.get("bytes_sent") or summary.get("bytes_received") or self.artefacts.records:
            self.setup_record = {**summary, "wall_s": time.perf_counter() - t0, "strategy": dict(self.artefacts.records)}
        self.set_up = True

    async def run_round(self, r: int) -> dict[str, Any]:
        started_at = time.time()
        clock = PhaseClock("train", sync=_synchronizer(self.device))
        ctx, strategy = self.ctx, self.strategy
        self.round = ctx.round = r
        self.counter.begin_round(r)
        self.artefacts.begin_round(r)
        ctx.round_start = FlatCopy(self.model.state_dict())
        self._trained = True
        fit, (test_acc, test_loss, val_acc, deployed_trained) = await asyncio.to_thread(self._train_and_score, ctx, clock)
        epsilon = epsilon_for_json(None if self.privacy is None else self.privacy.epsilon())
        clock.switch("publish")
        meta = {"n_train": len(self.data.train), **strategy.shared_meta(ctx)}
        if strategy.shared_parts:
            parts = {p: host_snapshot(part_state(self.model, p)) for p in strategy.shared_parts}
            if self.attack is not None:
                parts = self.attack.published(parts, host_snapshot(ctx.round_start), r)
            parts = {p: quantize(t, self.precision) for p, t in parts.items()}
            await self.endpoint.publish(r, r, parts, meta)
        clock.switch("aggregate")  # the statistics a strategy pushes are its own computation
        pushes = await asyncio.to_thread(strategy.pushes, ctx) if _overrides(strategy, Strategy, "pushes") else []
        clock.switch("exchange")
        await self.send_pushes(pushes, r)
        fetches, versions, sat_out = self._asked_of_neighbours(strategy.configure_fetch(ctx), r)
        self.refused, self.bounded, self.bounded_factor, self._own_norms, self._own_updates = {}, {}, {}, {}, {}
        arrived = await self.gather(fetches, r, versions=versions)
        unanswered = self._warn_silent(r, {f.peer for f in fetches} - {m.sender for m in arrived} - set(self.refused))
        clock.switch("aggregate")
        refused, safeguard_record, (acc_agg, loss_agg, val_acc_agg, deployed_aggregated) = await asyncio.to_thread(
            self._aggregate_and_score, ctx, arrived, clock, (test_acc, test_loss, val_acc))
        self._scores = (acc_agg, loss_agg, val_acc_agg)
        ctx.round_start = {}  # a copy of the model, needed within the round only (many nodes share a process)
        time_record = clock.stop()
        record: dict[str, Any] = {
            "round": r,
            "participated": True,
            "test_acc": deployed_trained.acc,
            "test_loss": deployed_trained.loss,
            "test_acc_aggregated": deployed_aggregated.acc,
            # The federated model on the validation split, after training and after aggregation:
            # what `p2pfl compare` picks a swept hyperparameter on (never on the test split).
            "val_acc": val_acc,
            "val_acc_aggregated": val_acc_agg,
            "train_loss": fit.loss,
            "train_steps": fit.steps,
            **self.counter.round_summary(r),
            "wall_s": sum(time_record.values()),
            "started_at": started_at,
            "time": time_record,
            "epsilon": epsilon,
            "asked": len({f.peer for f in fetches}),
            "arrived": sorted(m.sender for m in arrived),
            "stale": sorted(m.sender for m in arrived if m.version < r),
            # Asked for, not answered, and not gone with a goodbye: the count a run's summary
            # checks for an overloaded machine or a network that drops peers.
            "unanswered": len(unanswered),
            "strategy": dict(self.artefacts.records),
        }
        if self.refused:  # parts whose claims were over a bound (p2pfl.runtime.peer_claims)
            record["peers_refused"] = dict(self.refused)
        if sat_out:  # neighbours that sit this round out and have published nothing to take
            record["sat_out"] = sat_out
        if self.bounded:  # parts pulled back within runtime.update_bound of this node's own update
            record["peers_bounded"] = dict(self.bounded)
            record["peers_bounded_factor"] = dict(self.bounded_factor)
        if refused is not None:
            record["aggregate_refused"] = refused
        record.update(safeguard_record)
        record.update(self.safeguard.round_record(test_acc, acc_agg, deployed_trained, deployed_aggregated))
        self.log.info("round %d/%d: acc %.3f, %.3f after aggregation; %d of %d peers answered; %.1f MiB in; %.1f s",
                      r, self.settings.rounds, test_acc, acc_agg, len(set(record["arrived"])), record["asked"],
                      record.get("bytes_received", 0) / 2**20, record["wall_s"])
        return record

    # A round's steps between two exchanges run in one worker thread each: nodes sharing a worker
    # keep serving meanwhile, and each hand-over to the pool (a thread woken, a future, a callback
    # on the loop) is paid once, not for every step.
    def _train_and_score(self, ctx: RoundContext, clock: PhaseClock) -> tuple[FitResult, Scored]:
        """The round's training, the privacy step on what it publishes, and that model's scores."""
        fit = self.strategy.fit(ctx)
        clock.switch("privacy")
        if self.privacy is not None:
            self.privacy.before_publish(self.model, ctx.round_start)
        if self.safeguard.trains:
            clock.switch("train")
            self.safeguard.after_train(self.data.train)
        clock.switch("evaluate")
        return fit, self._scored()

    def _aggregate_and_score(self, ctx: RoundContext, arrived: list[PeerModel], clock: PhaseClock,
                             trained: tuple[float, float, float | None]) -> tuple[str | None, dict[str, Any], Scored]:
        """Aggregation, its checks (non-finite values, the safeguard) and the aggregate's scores:
        (why the aggregate was refused or None, the safeguard's record, the scores)."""
        before = FlatCopy(self.model.state_dict())  # one buffer, not a tensor each
        self.strategy.aggregate(ctx, arrived)
        refused = self._refuse_non_finite(before)
        safeguard_record: dict[str, Any] = {}
        if refused is None and _overrides(self.safeguard, Safeguard, "after_aggregate"):
            safeguard_record = self.safeguard.after_aggregate(self.model, before,
                                                              lambda model: self.trainer.evaluate(model, self.data.val))
        clock.switch("evaluate")
        if all(torch.equal(v, before[k]) for k, v in self.model.state_dict().items()):
            # Aggregation kept the trained model (Local, or nothing arrived): the same scores, and
            # no second pass over a test split that may hold a thousand samples.
            acc, loss, val_acc = trained
            return refused, safeguard_record, (acc, loss, val_acc, self._deploy(acc, loss))
        return refused, safeguard_record, self._scored()

    def _asked_of_neighbours(self, fetches: list[Fetch], r: int) -> tuple[list[Fetch], dict[str, int], list[str]]:
        """The fetches worth making in round `r`, the version asked of each neighbour that sits `r`
        out (the last round it took part in: served at once), and the neighbours left out (nothing
        published yet, or stale versions not taken)."""
        kept, versions, sat_out = [], {}, set()
        for fetch in fetches:
            version = version_to_ask(self.peer_rounds.get(fetch.peer), r, self.settings.accept_stale)
            if version is None:
                sat_out.add(fetch.peer)
                continue
            if version != r:
                versions[fetch.peer] = version
            kept.append(fetch)
        return kept, versions, sorted(sat_out)

    def _scored(self) -> Scored:
        """The model's test accuracy and loss, validation accuracy, and what the safeguard deploys."""
        test_acc, test_loss, val_acc = self._model_scores()
        return test_acc, test_loss, val_acc, self._deploy(test_acc, test_loss)

    def _model_scores(self) -> tuple[float, float, float | None]:
        if len(self.data.val) == 0:
            (test_acc, test_loss), val_acc = self.trainer.evaluate(self.model, self.data.test), None
        else:
            (test_acc, test_loss), (val_acc, _) = self.trainer.evaluate_together(self.model, [self.data.test, self.data.val])
        return test_acc, test_loss, val_acc

    def _deploy(self, federated_acc: float, federated_loss: float) -> Deployment:
        """Which model the node deploys now, and its test score (`p2pfl.runtime.safeguard`)."""
        return self.safeguard.deploy(self.model, self.data.test, self.data.val, federated_acc, federated_loss)

    def _warn_silent(self, r: int, silent: set[str]) -> set[str]:
        """A warning per peer that was asked for and did not answer, at most once in WARN_EVERY
        rounds; returns those peers, less the ones that said goodbye."""
        unanswered = silent - set(self.endpoint.departed)
        for peer in sorted(unanswered):
            if r - self._warned.get(peer, -WARN_EVERY) >= WARN_EVERY:
                self._warned[peer] = r
                self.log.warning("round %d: %s did not answer (no warning about it again for %d rounds)",
                                 r, peer, WARN_EVERY - 1)
        return unanswered

    async def sit_out(self, r: int) -> dict[str, Any]:
        """A round this node does not take part in: no training, no downloads; it keeps serving its
        last version, and a GET for this round answers at once, so no peer waits for it."""
        started_at = time.time()
        clock = PhaseClock("exchange", sync=_synchronizer(self.device))
        self.round = self.ctx.round = r
        self.counter.begin_round(r)
        self.artefacts.begin_round(r)
        await self.endpoint.sit_out(r)
        clock.switch("evaluate")
        if self._scores is None:  # the model has not been scored since it last changed (a resume)
            test_acc, test_loss, val_acc, deployed = await asyncio.to_thread(self._scored)
            self._scores = (test_acc, test_loss, val_acc)
        else:
            test_acc, test_loss, val_acc = self._scores
            deployed = self._deploy(test_acc, test_loss)
        scores = self.safeguard.round_record(test_acc, test_acc, deployed, deployed)
        time_record = clock.stop()
        return {
            "round": r, "participated": False, "test_acc": deployed.acc, "test_loss": deployed.loss,
            "test_acc_aggregated": deployed.acc, "val_acc": val_acc, "val_acc_aggregated": val_acc,
            "train_loss": None, "train_steps": 0,
            **self.counter.round_summary(r), "wall_s": sum(time_record.values()), "started_at": started_at,
            "time": time_record, "epsilon": epsilon_for_json(None if self.privacy is None else self.privacy.epsilon()),
            "asked": 0, "arrived": [], "stale": [], "unanswered": 0, "strategy": {}, **scores,
        }

    def _refuse_non_finite(self, before: dict[str, torch.Tensor]) -> str | None:
        """Keep the pre-aggregation model when the aggregate holds NaN or Inf (peers' values can
        be finite and still overflow a weighted sum); returns why, or None when it was fine."""
        floats = {k: v for k, v in self.model.state_dict().items() if v.is_floating_point() and v.numel()}
        # A finite sum of every tensor means no NaN or Inf anywhere (either makes its sum
        # non-finite): one check a round instead of a test per element and tensor. Summed in the
        # tensors' own precision (a third of the float64 sums' time): a sum that overflows with
        # every value finite only sends the check to the test per element below.
        if not floats or bool(torch.stack([v.sum() for v in floats.values()]).isfinite().all()):
            return None
        bad = [k for k, v in floats.items() if not bool(torch.isfinite(v).all())]
        if not bad:  # a sum overflowed, every value finite
            return None
        self.model.load_state_dict(before)
        reason = f"aggregate has non-finite values in {len(bad)} tensors ({', '.join(bad[:3])}); kept the model from before it"
        self.log.warning("round %d: %s", self.round, reason)
        return reason

    def prepare(self) -> None:
        """What a fresh node does before it listens (once; nothing for a resumed node):

        * round 0's checkpoint: a node killed in round 1 resumes from it, and its checkpoint files
          are made now, not in round 1 (under `perf record -a`, 1000 files made there were 9 % of
          its CPU: ext4 without a journal looks past every inode freed in the last minute for each);
        * under partial participation, its model as built, scored: what it reports for the rounds
          it sits out before it first trains, so that sitting a round out is no work beyond
          serving (at 10 % participation, 900 of 1000 nodes scored their models in round 1).

        `run` calls it; a worker of many nodes calls it for each node as it builds them, so that no
        node's preparation falls into another's first round."""
        if self.resume or self._prepared:
            return
        self._prepared = True
        self.write_checkpoint(False)
        if self.settings.participation < 1:  # else it never sits a round out
            self._scores = self._model_scores()

    async def run(self) -> dict[str, Any]:
        cfg, sc = self.config, self.settings
        self.prepare()
        await self.endpoint.start(cfg.host, cfg.port)
        self.log.info("listening on %s:%d with %d peers, algorithm %s", cfg.host, cfg.port, len(cfg.peers), sc.algorithm)
        started = time.perf_counter()
        status = "ok"
        error = None
        goodbye = ""
        resume_failed = False
        try:
            first = 1
            if self.resume:  # before the start wait: a missing or foreign checkpoint is an error now
                first = await asyncio.to_thread(self.restore) + 1
                self.restarts.append({"after_round": first - 1, "at": time.time()})
            # Not a barrier: a node starts once its peers are up or start_wait_s has passed, so
            # that peers still starting (importing torch) do not slow its first round.
            awaited = set(self.neighbours) | ({COORDINATOR_ID} if cfg.coordinator is not None else set())
            silent = await self.endpoint.wait_until_up(awaited, sc.start_wait_s)
            if silent:
                self.log.warning("starting without %s: not up after %.0f s", sorted(silent), sc.start_wait_s)
            if self.resume:
                await self._republish()
            if not self.set_up:  # restored from a checkpoint taken after it
                await self.run_setup()
            for r in range(first, sc.rounds + 1):
                if self.privacy is not None and self.privacy.exhausted():
                    status = "budget_exhausted"
                    self.log.warning(
                        "stopping before round %d: another round would exceed the epsilon budget (epsilon so far %.3f)",
                        r, self.privacy.epsilon() or 0.0,
                    )
                    goodbye = f"privacy budget exhausted before round {r}"
                    break
                participates = takes_part(self.participation_rng, sc.participation)
                record = await (self.run_round(r) if participates else self.sit_out(r))
                self.rounds.append(record)
                if self._checkpoints_after(r, participates):
                    await asyncio.to_thread(self.write_checkpoint, False)
                self.on_round({"id": cfg.id, **record})
            if status == "ok" and self._isolated():
                status = "isolated"
                self.log.warning("ended isolated: asked for peers in %d rounds and none ever answered",
                                 sum(1 for x in self.rounds if x.get("asked")))
            elif status == "ok" and self._rounds_alone():
                status = "degraded"
                self.log.warning("rounds %s: asked for peers and received nothing (peers refused or unreachable: "
                                 "a flood of connections, a network down); the run went on with its own model",
                                 self._rounds_alone())
        except CheckpointError as exc:  # --resume with no usable checkpoint: the reason, no traceback
            status, error, resume_failed = "failed", str(exc), True
            goodbye = f"cannot resume: {exc}"
            self.log.error("cannot resume: %s", exc)
        except Exception as exc:  # a failing node reports why and exits non-zero; peers carry on
            status = "failed"
            error = "".join(traceback.format_exception(exc))
            goodbye = f"failed in round {self.round}: {exc!r}"
            self.log.error("node failed:\n%s", error)
        self.done = True
        if status not in ("ok", "isolated"):
            # Peers and the coordinator stop waiting for this node now, not after fetch_timeout_s.
            await self.endpoint.withdraw()
            await self.endpoint.say_goodbye(sorted(self.endpoint.peers), goodbye)
        else:
            await self.endpoint.linger(set(self.neighbours), self.settings.linger_s)
        # Closed before the result is taken, so that every message the node answered (and
        # every rejection) is in it.
        await self.endpoint.close()
        result = self.result(status, error, time.perf_counter() - started)
        result["checkpoint"] = str(self.checkpoint_path)
        if not resume_failed and (status != "failed" or not self.checkpoint_path.exists()):
            # Again at exit, with the final byte totals (linger included); a failed round's
            # half-trained model never replaces the last good checkpoint, and a resume that
            # found none writes no round-0 one (the next --resume would silently start over).
            # Off the event loop: this write waits for the disk (synced), and nodes sharing the
            # process may still be in their last round.
            await asyncio.to_thread(self.write_checkpoint)
        return result

    def _checkpoints_after(self, r: int, participated: bool) -> bool:
        """Whether round `r` ends with a checkpoint: a round taken part in whose number is a
        multiple of `checkpoint_every` (a resume always has round 0's to go on from), other than
        the last. A round sat out changes no model: a resume replays it from the participation
        stream the last checkpoint holds (at 10 % participation, checkpointing the 900 of 1000
        nodes that sat a round out had cost more than the round's training). The last round's
        state is what the node's end checkpoint holds, written after it lingers: a second write
        of it was a quarter of a 1000-node run's checkpoint CPU, in the round every node is still
        finishing (`python benchmarks/round_cpu.py`); a node killed while it lingers runs its
        last round again on --resume."""
        return participated and r % self.settings.checkpoint_every == 0 and r < self.settings.rounds

    def _rounds_alone(self) -> list[int]:
        """Rounds in which the node asked for peers that had not said goodbye and received nothing:
        it learned from no one there, which a run's status must not call ok."""
        return [x["round"] for x in self.rounds
                if x.get("participated", True) and x.get("asked") and not x.get("arrived") and x.get("unanswered")]

    def _isolated(self) -> bool:
        """The strategy asked for peers and, over the whole run, none ever answered."""
        return any(x.get("asked") for x in self.rounds) and not any(x.get("arrived") for x in self.rounds)

    # ---- checkpoints ----------------------------------------------------------------------
    def checkpoint_state(self) -> dict[str, Any]:
        """Everything besides the model that the next round depends on."""
        rng = {
            "trainer": rng_state_hex(self.trainer.generator.get_state()),
            "ctx": self.ctx.rng.bit_generator.state,
            "participation": self.participation_rng.bit_generator.state,
            "torch": rng_state_hex(torch.get_rng_state()),
            "cuda": rng_state_hex(torch.cuda.get_rng_state(self.device)) if self.device.type == "cuda" else None,
        }
        rng.update(self.safeguard.rng_state())
        return {
            **run_state(self.config.id, self._scenario_digest, self.rounds, self.endpoint.replay, self.counter.totals()),
            "strategy": self.strategy.state_dict(),
            # What setup produced lives in the strategy's state; a node resumed from a checkpoint
            # that has it does not set up again, one resumed from the checkpoint before setup does.
            **({"setup": self.setup_record} if self.set_up else {}),
            "privacy": None if self.privacy is None else self.privacy.state_dict(),
            "rng": rng,
            "declared_sizes": dict(self.declared_sizes.pinned),
            "restarts": list(self.restarts),
        }

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        """The model's tensors, and the safeguard's (its Local model's, under their own prefix)."""
        return {**self.model.state_dict(), **self.safeguard.checkpoint_tensors()}

    def checkpoint_spec(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Names, shapes and dtypes of `checkpoint_tensors`, to check a checkpoint before loading it."""
        return {**part_spec(self.model, "full"), **self.safeguard.checkpoint_spec()}

    def write_checkpoint(self, durable: bool = True) -> None:
        """`durable`: synced to disk (at the end); a round's checkpoint survives the process, not the machine.
        A model as built (no round taken part in) is stored as its digest (checkpoint.AS_BUILT)."""
        tensors, state = self.checkpoint_tensors(), self.checkpoint_state()
        if not self._trained and (_write_marks(tensors) == self._built_versions
                                  or tensors_digest(tensors) == self._built_digest):
            tensors, state = {}, {**state, AS_BUILT: self._built_digest}
        save_checkpoint(self.checkpoint_path, tensors, key=self.key, node_id=self.config.id,
                        round_=len(self.rounds), extra=state, durable=durable)

    def checkpoint_state_from_disk(self) -> dict[str, Any]:
        """The state document of this node's checkpoint, verified, without loading it."""
        _, doc = read_checkpoint(self.checkpoint_path, node_id=self.config.id, public_hex=self.key.public_hex)
        if doc is None:
            raise CheckpointError(f"checkpoint {self.checkpoint_path} holds a model but no node state")
        return doc

    def restore(self) -> int:
        """Load the last checkpoint; returns the last complete round. Everything is checked before
        anything is applied: a corrupt, foreign or other-scenario checkpoint raises CheckpointError."""
        path, cfg = self.checkpoint_path, self.config
        tensors, doc = read_resumable(path, node_id=cfg.id, public_hex=self.key.public_hex,
                                      scenario=self.settings.resolved, rounds=self.settings.rounds,
                                      spec=self.checkpoint_spec())
        rounds = doc["rounds"]
        as_built = doc.get(AS_BUILT) if not tensors else None
        if as_built is not None and as_built != self._built_digest:
            raise CheckpointError(f"checkpoint {path} holds the model as built, and this node builds another one "
                                  "(a model factory that is not deterministic under torch.manual_seed?)")
        strategy = self.fresh_strategy()
        try:  # on a fresh strategy first: a state that does not fit leaves the node untouched
            strategy.load_state_dict(doc["strategy"])
            rng = np.random.default_rng()
            rng.bit_generator.state = doc["rng"]["ctx"]
            rng.bit_generator.state = doc["rng"]["participation"]
            self.safeguard.check_restorable(doc["rng"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"checkpoint {path}: state does not fit {self.settings.algorithm}: {exc!r}") from None
        self.strategy.load_state_dict(doc["strategy"])
        own = self.model.state_dict()
        if as_built is None:  # else the model and the safeguard's are as this node built them
            self.model.load_state_dict({k: v.to(self.device) for k, v in tensors.items() if k in own})
            self._trained = True
        self.safeguard.restore({k: v for k, v in tensors.items() if k not in own}, doc["rng"], self.device)
        if self.privacy is not None:
            self.privacy.load_state_dict(doc["privacy"])
        self.trainer.generator.set_state(rng_state_from_hex(doc["rng"]["trainer"]))
        self.ctx.rng.bit_generator.state = doc["rng"]["ctx"]
        self.participation_rng.bit_generator.state = doc["rng"]["participation"]
        self.declared_sizes = DeclaredSizes(doc.get("declared_sizes"))  # checkpoints made before it carry none
        self.restarts = list(doc.get("restarts") or [])
        torch.set_rng_state(rng_state_from_hex(doc["rng"]["torch"]))
        if doc["rng"]["cuda"] is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(rng_state_from_hex(doc["rng"]["cuda"]), self.device)
        restore_run_state(doc, self.endpoint.replay, self.counter)
        if "setup" in doc:  # absent from round 0's checkpoint (before setup) and older ones: set up again
            self.setup_record, self.set_up = doc["setup"], True
        self.rounds = rounds
        self.round = self.ctx.round = doc["round"]
        self.log.info("resumed from %s after round %d", path, self.round)
        return self.round

    async def _republish(self) -> None:
        """Serve the restored model at once, so peers that accept stale parts need not wait a round."""
        if self.round and self.strategy.shared_parts:
            parts = {p: quantize(host_snapshot(part_state(self.model, p)), self.precision)
                     for p in self.strategy.shared_parts}
            meta = {"n_train": len(self.data.train), **self.strategy.shared_meta(self.ctx)}
            await self.endpoint.publish(self.round, self.round, parts, meta)

    def result(self, status: str, error: str | None, wall_s: float) -> dict[str, Any]:
        last = self.rounds[-1] if self.rounds else {}
        return {
            "id": self.config.id,
            "index": self.config.index,
            "status": status,
            "error": error,
            "domain": self.data.domain,
            "device": str(self.device),
            "n_train": len(self.data.train),
            "n_val": len(self.data.val),
            "n_test": len(self.data.test),
            "rounds": self.rounds,
            "setup": self.setup_record,
            "final_test_acc": last.get("test_acc"),
            "final_test_acc_aggregated": last.get("test_acc_aggregated"),
            "final_epsilon": last.get("epsilon"),
            "rounds_alone": self._rounds_alone(),
            "restarts": self.restarts,
            "totals": self.counter.totals(),
            "rejected": self.endpoint.rejections.summary(),
            "wall_s": wall_s,
        }


class NodeSetupExchange:
    """`SetupExchange` over the node's transport: blocking calls from the strategy's worker thread,
    run on the node's event loop."""

    def __init__(self, node: Node, loop: asyncio.AbstractEventLoop) -> None:
        self.node, self.loop = node, loop

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def publish(self, step: int, parts: Mapping[str, Mapping[str, torch.Tensor]], meta: Mapping[str, Any]) -> None:
        snapshot = {setup_part(name): host_snapshot(dict(t)) for name, t in parts.items()}
        meta = {"n_train": len(self.node.data.train), **meta}
        self._run(self.node.endpoint.publish(step, 0, snapshot, meta))

    def push(self, step: int, pushes: Any) -> None:
        timeout = self.node.settings.fetch_timeout_s

        async def send() -> list[bool]:
            return await asyncio.gather(*(
                self.node.endpoint.push(p.target, kind=p.kind, part=p.part, round_=0, version=step,
                                        tensors=host_snapshot(dict(p.tensors)), meta=p.meta, timeout=timeout)
                for p in pushes
            ))

        refused = [p.target for p, ok in zip(pushes, self._run(send())) if not ok]
        if refused:
            raise RuntimeError(f"setup step {step}: {refused} did not take this node's push (see their rejections)")

    def fetch(self, step: int, fetches: Any) -> list[PeerModel]:
        """Waits up to setup_wait_s: a step may need many earlier ones (other nodes' training) first."""
        named = [Fetch(f.peer, setup_part(f.part)) for f in fetches]
        return self._run(self.node.gather(named, step, wait=self.node.settings.setup_wait_s))


def epsilon_for_json(epsilon: float | None) -> float | str | None:
    """JSON has no infinity; σ = 0 (clipping without noise) gives ε = ∞, written as "inf"."""
    if epsilon is not None and math.isinf(epsilon):
        return "inf"
    return epsilon


def _write_marks(tensors: Mapping[str, torch.Tensor]) -> dict[str, tuple[int, int]]:
    """Each tensor's storage and in-place write count (`Tensor._version`, shared by its views and
    `detach()`): equal marks mean no tensor was replaced or written to since they were taken, so
    a model's digest need not be taken again (900 of 1000 nodes sit round 1 out, and their first
    checkpoint holds the model as built). Unequal marks say nothing: the values are compared then."""
    return {k: (t.data_ptr(), t._version) for k, t in tensors.items()}


def _overrides(obj: object, base: type, hook: str) -> bool:
    """Whether `obj` does something in `hook`: the base class's is a no-op, not worth a thread hop
    (each is tens of microseconds, and a worker runs thousands of rounds)."""
    return getattr(type(obj), hook) is not getattr(base, hook)


def _synchronizer(device: torch.device) -> Callable[[], None] | None:
    """Waits for the GPU's queued work, so that a phase's time includes the kernels it launched."""
    if device.type != "cuda":
        return None
    return lambda: torch.cuda.synchronize(device)
