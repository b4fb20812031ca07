"""A node's life: prepare, listen, wait for its peers, set up, one `Round` per round (taken part in
or sat out), decide its end status, linger or withdraw, and report its result.

No global barrier: each round the node trains, publishes a new version, gathers what its
strategy asked for (waiting at most `fetch_timeout_s` per peer), aggregates, and moves on.
Training runs in a worker thread so that the server keeps answering peers meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from p2pfl.runtime.checkpoint import CheckpointError
from p2pfl.runtime.config import NodeConfig
from p2pfl.runtime.node.exchange import Exchange
from p2pfl.runtime.node.setup_exchange import run_setup
from p2pfl.runtime.node.intake import Intake
from p2pfl.runtime.node.kept import KeptParts
from p2pfl.runtime.node.membership import Membership
from p2pfl.runtime.node.neighbours import Neighbours
from p2pfl.runtime.node.parts import NodeParts
from p2pfl.runtime.node.peer_directory import PeerDirectory
from p2pfl.runtime.node.records import Stage, end_status, node_result
from p2pfl.runtime.node.round import Round, RoundKit
from p2pfl.runtime.node.scoring import Scorer
from p2pfl.runtime.node.state import NodeState
from p2pfl.runtime.participation import participation_rng, takes_part
from p2pfl.runtime.run_folder import ArtefactSink, RunFolder
from p2pfl.runtime.settings import NodeSettings
from p2pfl.runtime.shared_tables import without
from p2pfl.runtime.statements import read_news
from p2pfl.runtime.strategy import COORDINATOR_ID, RoundContext
from p2pfl.runtime.transport import Transport

RoundCallback = Callable[[dict[str, Any]], None]


class Node:
    """Runs rounds: train, publish, gather what the strategy asks for, aggregate, checkpoint. `on_round`
    hears each round's record (with the node's `id`) as the round ends; `run` returns the node's
    result. Whoever hosts the node decides where they go (`p2pfl.assembly`)."""

    def __init__(self, config: NodeConfig, settings: NodeSettings, parts: NodeParts, *, resume: bool = False,
                 together: bool = False, join: bool = False, on_round: RoundCallback | None = None) -> None:
        """`resume`: go on from this node's checkpoint, in the round its neighbours are in if they went
        on without it; with `together` the whole federation resumes at once (`p2pfl run --resume`) and
        it replays from its checkpoint's round, whatever round its neighbours' checkpoints hold.
        `join`: from a neighbour's newest model, in the round the neighbours are in (a node started
        while the federation runs; `p2pfl node --join`)."""
        if resume and join:
            raise ValueError("a node either resumes from its checkpoint or joins from a neighbour's model, not both")
        self.config, self.settings, self.parts = config, settings, parts
        self.arrival = "resume" if resume else "join" if join else "fresh"
        self.rejoins = resume and not together
        self.on_round = on_round or (lambda _: None)
        self.log = logging.getLogger(f"p2pfl.{config.id}")
        self.stage = Stage.BUILT
        self.stop_with: tuple[str, str] | None = None
        folder = RunFolder(config.out)
        self.neighbours = Neighbours(parts.neighbours, parts.peer_rounds, self.log, seed=parts.seed,
                                     members=without(parts.transport.peers, COORDINATOR_ID))  # a view of the roster
        self.ctx = RoundContext(
            node_id=config.id, round=0, rounds=settings.rounds, peers=self.neighbours.asked, model=parts.model,
            data=parts.data, trainer=parts.trainer, rng=np.random.default_rng(parts.seed), log=self.log.info,
            artefacts=ArtefactSink(config.id, folder.artefacts), seed=settings.seed, departed=self.neighbours.departed,
            coordinator=COORDINATOR_ID if config.coordinator is not None else None, unreachable=self.neighbours.unreachable)
        intake = Intake(parts.model, len(parts.data.train), parts.device, settings,
                        parts.strategy.extra_parts(parts.model), self.neighbours)
        self.exchange = Exchange(parts.transport, intake, self.neighbours, parts.strategy, self.ctx, settings, self.log,
                                 seed=parts.seed)
        parts.transport.attach(expected_for=intake.expected, meta_schema_for=intake.meta_schema,
                               on_message=intake.on_push, status=self._status,
                               on_statement=lambda said: self.neighbours.told(said, self.ctx.round))
        intake.read_news = lambda news: read_news(news, parts.transport.roster, parts.transport.run,
                                                  self.neighbours.statements)
        self.neighbours.on_back = lambda member: parts.transport.take_back(self.neighbours.statements[member][0])
        parts.transport.expect_readers(self.neighbours.asked)  # the graph is undirected; the coordinator is pushed to
        self.participation_rng = participation_rng(parts.seed)
        self.state = NodeState(config.id, folder.checkpoint(config.id), parts, settings, self.ctx,
                               self.participation_rng, self.neighbours, self.log)
        self.scorer = Scorer(parts.model, parts.data, parts.trainer, parts.safeguard)
        self.membership = Membership(parts.transport, self.exchange, self.neighbours, self.state, settings, self.log)
        self.exchange.kept = kept = KeptParts(folder.received(config.id)) if settings.audit == config.id else None
        self.kit = RoundKit(parts, settings, self.ctx, self.exchange, self.neighbours, self.scorer, self.ctx.artefacts, self.log,
                            kept, folder.round_start(config.id) if settings.round_start == "disk" else None)
        self.peers = PeerDirectory(parts.transport, self.neighbours, self.exchange, lambda: self.ctx.round, settings.rounds)

    # The parts a host, a test or a benchmark reaches for by name.
    @property
    def transport(self) -> Transport:
        return self.parts.transport

    @property
    def model(self) -> Any:
        return self.parts.model

    @property
    def strategy(self) -> Any:
        return self.parts.strategy

    @property
    def rounds(self) -> list[dict[str, Any]]:
        return self.state.rounds

    @property
    def round(self) -> int:
        return self.ctx.round

    def stop_soon(self, status: str, reason: str) -> None:
        """End before the next round with `status` (error: `reason`), and stop waiting for this round's
        parts; what a companion calls when this node may not go on (its federation revoked it)."""
        if self.stop_with is None:
            self.stop_with = (status, reason)
            self.exchange.intake.give_up_waits()

    def _status(self) -> dict[str, Any]:
        # Public (unauthenticated): liveness and round only.
        return {"id": self.config.id, "round": self.ctx.round, "done": self.stage is Stage.DONE}

    def write_checkpoint(self, durable: bool = True) -> None:
        self.state.write(self.stage >= Stage.SET_UP, durable)

    def restore(self) -> int:
        """Load the last checkpoint; returns the last complete round (CheckpointError: nothing applied)."""
        last, set_up = self.state.restore()
        if set_up:
            self.stage = Stage.SET_UP
        self.ctx.round = last
        return last

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
        if self.arrival == "resume" or self.stage >= Stage.PREPARED:
            return
        self.stage = Stage.PREPARED
        self.write_checkpoint(False)
        if self.settings.participation < 1:  # else it never sits a round out
            self.scorer.last = self.scorer.model_scores()

    async def _set_up(self, late: bool) -> None:
        ran, self.state.setup_record = await run_setup(
            self.exchange, self.parts.counter, self.kit.artefacts, late=late, joiners=bool(self.parts.joins_late) or late)
        if ran:
            self.scorer.last = None  # setup may have changed the model
        self.stage = Stage.SET_UP

    async def _rounds(self, first: int, started: float) -> str:
        """Rounds `first`..last, as the node's churn script has it; the status they end with: "ok",
        "budget_exhausted", "left" (it said goodbye) or "crashed" (it stopped dead for good)."""
        sc, privacy, script = self.settings, self.parts.privacy, self.parts.script
        self.stage = Stage.IN_ROUNDS
        r = first
        while r <= sc.rounds:
            if self.stop_with is not None:  # a companion's verdict (a federation that revoked this node)
                self.log.error("stopping before round %d: %s", r, self.stop_with[1])
                self.membership.events.append({"round": r, "event": self.stop_with[0], "at": time.time()})
                return self.stop_with[0]
            if privacy is not None and privacy.exhausted():
                self.log.warning("stopping before round %d: another round would exceed the epsilon budget "
                                 "(epsilon so far %.3f)", r, privacy.epsilon() or 0.0)
                return "budget_exhausted"
            since_start = time.perf_counter() - started
            if r == script.leave or (script.leave_s is not None and since_start >= script.leave_s):
                self.membership.events.append({"round": r, "event": "left", "at": time.time()})
                return "left"
            if script.away_in(r):  # a flapping member: away this round by its goodbye, back by its word
                self._skip_draws(r, r + 1)
                r = await self.membership.away_for(r, sc.rounds)
                continue
            if r == script.crash or (script.crash_s is not None and since_start >= script.crash_s
                                     and not any(e["event"] == "crashed" for e in self.membership.events)):
                came_back = await self.membership.crash(r, script.restart, script.restart_after_s)
                if came_back is None:
                    return "crashed"
                r, last = came_back
                self._skip_draws(last + 1, r)
                continue
            participates = takes_part(self.participation_rng, sc.participation)
            one = Round(self.kit, r)
            if participates:
                self.state.trained = True
            record = (await (one.run() if participates else one.sit_out())).to_json()
            self.state.rounds.append(record)
            if self.state.checkpoints_after(r, participates):
                await asyncio.to_thread(self.write_checkpoint, False)
            self.on_round({"id": self.config.id, **record})
            r += 1
        return "ok"

    def _skip_draws(self, start: int, stop: int) -> None:
        """The participation draws of rounds `start`..`stop - 1`, which this node was not there for:
        its neighbours computed its schedule from round 1 on."""
        for _ in range(start, stop):
            takes_part(self.participation_rng, self.settings.participation)

    async def run(self) -> dict[str, Any]:
        cfg, sc, transport, script = self.config, self.settings, self.parts.transport, self.parts.script
        self.prepare()
        # A late joiner serves from the start: nobody asks it before its round (the schedule's joins
        # are known), and a neighbour's read in its round waits for its version instead of being refused.
        late = (script.late and self.arrival == "fresh") or self.arrival == "join"
        # What the node opens is closed on every path, cancellation (SIGTERM, a node beside it
        # that could not listen) included: the companions (a federation's gossip session), then
        # the carrier, before the result is taken, so that every message the node answered (and
        # every rejection) is in it.
        async with contextlib.AsyncExitStack() as opened:
            await transport.start(cfg.host, cfg.port)
            opened.push_async_callback(transport.close)
            if self.kit.round_start_file is not None:  # runtime.round_start = "disk" (round_start.py)
                opened.callback(self.kit.round_start_file.unlink, missing_ok=True)
            started = time.perf_counter()
            status, error, goodbye, resume_failed = "ok", None, "", False
            first, silent = 1, set[str]()  # the first round to run; the awaited peers not up when it started
            try:
                for companion in self.parts.companions:
                    await companion.start(self)
                    opened.push_async_callback(companion.stop)
                self.log.info("listening on %s:%d with %d peers, algorithm %s", cfg.host, cfg.port,
                              len(transport.peers) - (cfg.coordinator is not None), sc.algorithm)
                if self.arrival == "resume":  # before the start wait: a missing or foreign checkpoint is an error now
                    first = await asyncio.to_thread(self.restore) + 1
                    self.state.restarts.append({"after_round": first - 1, "at": time.time()})
                if late:
                    first = await self.membership.arrive(script, self.arrival == "join", started)
                    self.ctx.round = first - 1
                    self._skip_draws(1, first)
                else:
                    # Not a barrier: peers still importing torch do not slow round 1. After its last round
                    # it asks a coordinator nothing (one resumed with nothing left to do has ended).
                    awaited = set(self.neighbours.asked) - self.parts.joins_late
                    if cfg.coordinator is not None and first <= sc.rounds:
                        awaited.add(COORDINATOR_ID)
                    silent = await transport.wait_until_up(awaited, sc.start_wait_s)
                    if silent:
                        self.log.warning("starting without %s: not up after %.0f s", sorted(silent), sc.start_wait_s)
                if self.arrival == "resume":
                    await self.exchange.republish(self.ctx.round)
                if self.rejoins:
                    first = await self.membership.rejoin(first - 1)
                    self._skip_draws(self.ctx.round + 1, first)
                if self.stage < Stage.SET_UP:  # else restored from a checkpoint taken after it
                    await self._set_up(late)
                status = await self._rounds(first, started)
                if status == "budget_exhausted":
                    goodbye = f"privacy budget exhausted before round {self.ctx.round + 1}"
                elif status == "left":
                    goodbye = f"left before round {self.membership.events[-1]['round']}"
                elif self.stop_with is not None and status == self.stop_with[0]:
                    error = goodbye = self.stop_with[1]
                status = end_status(status, self.state.rounds, self.log)
            except CheckpointError as exc:  # --resume with no usable checkpoint: the reason, no traceback
                status, error, resume_failed = "failed", str(exc), True
                goodbye = f"cannot resume: {exc}"
                self.log.error("cannot resume: %s", exc)
            except Exception as exc:  # a failing node reports why and exits non-zero; peers carry on
                status = "failed"
                error = "".join(traceback.format_exception(exc))
                goodbye = f"failed in round {self.ctx.round}: {exc!r}"
                self.log.error("node failed:\n%s", error)
            self.stage = Stage.DONE
            # Resumed after its last round, it asked nobody: a silent neighbour is one still starting,
            # which will replay rounds this node serves.
            not_up_yet = silent - self.neighbours.departed if first > sc.rounds else set()
            await self.membership.end(status, goodbye, self.ctx.round + 1, cfg.coordinator is not None, not_up_yet)
        result = self.result(status, error, time.perf_counter() - started)
        result["checkpoint"] = str(self.state.path)
        if status != "crashed" and not resume_failed and (status != "failed" or not self.state.path.exists()):
            # Again at exit, with the final byte totals (linger included); a failed round's
            # half-trained model never replaces the last good checkpoint, and a resume that
            # found none writes no round-0 one (the next --resume would silently start over).
            # Off the event loop: this write waits for the disk (synced), and nodes sharing the
            # process may still be in their last round.
            await asyncio.to_thread(self.write_checkpoint)
        return result

    def result(self, status: str, error: str | None, wall_s: float) -> dict[str, Any]:
        parts = self.parts
        return node_result(self.config.id, self.config.index, status, error, wall_s, data=parts.data,
                           device=str(parts.device), rounds=self.state.rounds, setup=self.state.setup_record,
                           restarts=self.state.restarts, membership=self.membership.events,
                           totals=parts.counter.totals(), rejected=parts.transport.rejections.summary(),
                           companions={companion.name: companion.summary() for companion in parts.companions})
