"""The optional coordinator: runs the coordinator half of an algorithm with a global step.

It speaks the nodes' signed wire format and knows no algorithm's math: the strategy's
`CoordinatorHalf` declares what nodes push (a setup kind, answered once before round 1, and a
round kind, answered every round) and turns what arrived into a `Reply`, which nodes pull by
long-poll (addressed parts only their own). A global model is scored on the held-out domain's
test split, where the scenario has one. What nodes push is whatever their algorithm sends (model
states, statistics, or Client2Vec's data-derived embeddings); byte counts say how much. It waits
`first_submission_wait_s` for a round's first node, then `straggler_wait_s` for the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from p2pfl.models import SplitModel, load_part, part_spec, part_state
from p2pfl.runtime.accounting import ByteCounter
from p2pfl.runtime.checkpoint import (CheckpointError, read_resumable, restore_run_state, run_state, save_checkpoint,
                                     scenario_digest)
from p2pfl.runtime.config import NodeConfig
from p2pfl.runtime.deadline import wait_at_most
from p2pfl.runtime.peer_claims import DeclaredSizes
from p2pfl.runtime.node.records import CoordinatorRoundRecord, Stage
from p2pfl.runtime.run_folder import RunFolder
from p2pfl.runtime.devices import host_snapshot, to_device
from p2pfl.runtime.coordinator_half import CoordinatorHalf, Reply, Submission, weighed_as_capped
from p2pfl.runtime.settings import CoordinatorSettings
from p2pfl.runtime.statements import Statement
from p2pfl.runtime.transport import SETUP_PREFIX, Transport
from p2pfl.training.trainer import LocalTrainer
from p2pfl.wire import Message, NodeKey


@dataclasses.dataclass
class CoordinatorParts:
    """What a coordinator runs with, built by `p2pfl.assembly.build_coordinator`: the coordinator
    reads no scenario and builds no model, as a node does not."""

    settings: CoordinatorSettings
    model: SplitModel                     # the nodes' initial model, on `device`
    device: torch.device
    build_half: Callable[[], CoordinatorHalf]  # a fresh half (restore loads a checkpoint into one)
    evaluator: LocalTrainer               # scores a global model on the held-out domain
    held_out: Any                         # that domain's test split on `device`, or None
    held_out_domain: str | None
    expected: set[str]                    # the nodes waited for from the start (not the late joiners)
    key: NodeKey
    endpoint: Transport
    counter: ByteCounter


class Coordinator:
    def __init__(self, config: NodeConfig, parts: CoordinatorParts, *, resume: bool = False) -> None:
        self.config = config
        self.resume = resume
        self.folder = RunFolder(config.out)
        self.checkpoint_path = self.folder.checkpoint(config.id)
        self.settings = parts.settings
        self.log = logging.getLogger("p2pfl.coordinator")
        self.device, self.model, self.held_out, self.evaluator = parts.device, parts.model, parts.held_out, parts.evaluator
        self.held_out_domain = parts.held_out_domain
        self.spec = part_spec(self.model, "full")
        self.build_half = parts.build_half
        self.half = self.build_half()
        self.expected: set[str] = set(parts.expected)
        self.returning: dict[str, int] = {}  # member -> the round its signed return says it is live from
        self.counter = parts.counter
        self.submissions: dict[int, dict[str, Submission]] = {}
        self.declared_sizes = DeclaredSizes()
        self.arrived = asyncio.Event()
        self.round = 0
        self.stage = Stage.BUILT if self.half.setup_kind is not None else Stage.SET_UP  # the node's stages
        self.rounds: list[dict[str, Any]] = []
        self.setup_record: dict[str, Any] | None = None
        self.key = parts.key
        self.endpoint: Transport = parts.endpoint
        self.endpoint.attach(
            expected_for=lambda kind, part: self._declared(kind, "spec"),
            meta_schema_for=lambda kind, part: self._declared(kind, "meta"),
            on_message=self._on_submission, on_departed=self._on_departed, on_statement=self._on_statement,
            status=lambda: {"id": config.id, "round": self.round, "done": self.stage is Stage.DONE},
        )

    def _declared(self, kind: str, what: str) -> Any:
        decl = self.half.expected(kind)
        return None if decl is None else getattr(decl, what)

    def _on_submission(self, message: Message) -> None:
        h = message.header
        if h.round == 0 and h.kind == self.half.setup_kind:
            if self.stage >= Stage.SET_UP:
                raise ValueError("the setup exchange is over")
        elif h.kind != self.half.round_kind or h.round < 1:
            raise ValueError(f"kind {h.kind!r} in round {h.round} is not what {self.settings.algorithm} exchanges")
        elif h.round <= self.round:
            raise ValueError(f"round {h.round} is already aggregated (coordinator is at round {self.round})")
        elif h.round > self.settings.rounds:
            raise ValueError(f"round {h.round} is beyond the scenario's {self.settings.rounds} rounds")
        elif h.round != self.round + 1:  # a node learns round r's model only after the coordinator moved to r
            raise ValueError(f"round {h.round} has not started (the coordinator collects round {self.round + 1})")
        per_round = self.submissions.setdefault(h.round, {})
        if h.sender in per_round:
            raise ValueError(f"{h.sender} already submitted round {h.round}")
        if "n_train" in h.meta:
            self.declared_sizes.check(h.sender, int(h.meta["n_train"]))
        per_round[h.sender] = Submission(h.sender, to_device(message.torch_tensors(), self.device), dict(h.meta))
        self.arrived.set()

    def _on_departed(self, node: str, reason: str) -> None:
        """A node that failed is not waited for again; with none left the coordinator stops."""
        self.expected.discard(node)
        self.returning.pop(node, None)
        self.arrived.set()

    def _on_statement(self, statement: Statement) -> None:
        """A member's verified return (a joiner, a restarted node): waited for from the round it names."""
        if statement.event > 0 and statement.member in self.config.peers:
            self.returning[statement.member] = statement.round
            self.arrived.set()

    def _take_returning(self, r: int) -> None:
        self.expected |= {m for m, first in self.returning.items() if first <= r}
        self.returning = {m: first for m, first in self.returning.items() if first > r}

    async def collect(self, r: int) -> dict[str, Submission]:
        """Wait for every expected node: `first_submission_wait_s` for the first (nodes may still
        be training), then `straggler_wait_s` for the rest."""
        loop = asyncio.get_running_loop()
        timeout = self.settings.straggler_wait_s
        first_deadline = loop.time() + self.settings.first_submission_wait_s
        deadline = None
        while True:
            self._take_returning(r)
            got = self.submissions.get(r, {})
            if self.expected <= set(got):
                return got
            if got and deadline is None:
                deadline = loop.time() + timeout
            limit = deadline if deadline is not None else first_deadline
            remaining = limit - loop.time()
            if remaining <= 0:
                return got
            self.arrived.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await wait_at_most(self.arrived.wait(), timeout=remaining)

    async def run(self) -> dict[str, Any]:
        cfg = self.config
        # What it opens is closed on every path, as a node's is: cancelled (SIGTERM, Ctrl-C), it first
        # stops listening, so that its nodes' waiting reads end and its port is freed at once.
        async with contextlib.AsyncExitStack() as opened:
            await self.endpoint.start(cfg.host, cfg.port)
            opened.push_async_callback(self.endpoint.close)
            self.log.info("coordinator on %s:%d for %d nodes, %s", cfg.host, cfg.port, len(cfg.peers),
                          self.settings.algorithm)
            started = time.perf_counter()
            status, error = "ok", None
            try:
                await self._rounds()
            except asyncio.CancelledError:
                await self.endpoint.stop_listening()
                raise
            except Exception as exc:
                status, error = "failed", "".join(traceback.format_exception(exc))
                self.log.error("coordinator failed:\n%s", error)
            short = [x["round"] for x in self.rounds if x.get("missing_live")]
            if status == "ok" and short:
                status = "degraded"  # aggregated without live members: see each round's `missing_live`
                error = f"rounds {short} were aggregated without members that were still live"
            self.stage = Stage.DONE
            await self.endpoint.linger(set(cfg.peers), self.settings.linger_s)
            result = {
                "id": cfg.id, "status": status, "error": error, "rounds": self.rounds, "setup": self.setup_record,
                "held_out_domain": self.held_out_domain, "totals": self.counter.totals(),
                "rejected": self.endpoint.rejections.summary(), "wall_s": time.perf_counter() - started,
            }
            self.folder.write_result(cfg.id, result)
        return result

    async def _rounds(self) -> None:
        sc = self.settings
        first = 1
        if self.resume and self.half.round_kind is None:
            # Nothing to restore: the nodes resume with what setup gave them and never ask again.
            self.stage = Stage.SET_UP
        elif self.resume:
            first = self.restore() + 1
            if self.rounds:  # serve the restored global model at once
                await self.endpoint.publish(self.round, self.round, {"global": host_snapshot(part_state(self.model, "full"))},
                                            {"weights": dict(self.rounds[-1]["weights"])})
        if self.stage < Stage.SET_UP:
            await self.run_setup()
        self.stage = Stage.IN_ROUNDS
        for r in range(first, sc.rounds + 1 if self.half.round_kind is not None else first):
            self.counter.begin_round(r)
            t0, started_at = time.perf_counter(), time.time()
            got = await self.collect(r)
            if not got:
                self.log.warning("no node submitted round %d; stopping", r)
                return
            missing = sorted(self.expected - set(got))
            live: list[str] = []
            if missing:
                # A member that still answers was kept out (its pushes refused or lost), not gone:
                # it is waited for again, and the round says so. A silent one is not waited for again.
                statuses = await asyncio.gather(*(self.endpoint.status_of(p, timeout=2.0) for p in missing))
                live = [p for p, s in zip(missing, statuses) if s is not None and not s.get("done")]
                self.log.warning("round %d: no statistics from %s (%s still live); aggregating without them",
                                 r, missing, live or "none")
            self.expected = (set(got) | set(live)) - set(self.endpoint.departed)
            subs = weighed_as_capped([got[k] for k in sorted(got)], sc.max_weight_ratio)
            reply = await asyncio.to_thread(self.half.aggregate, r, subs)
            held_acc = None
            if reply.model is not None:
                load_part(self.model, reply.model)
                if self.held_out is not None:
                    held_acc, _ = self.evaluator.evaluate(self.model, self.held_out)
            self.round = r
            await self.publish(r, r, reply)
            self.rounds.append(CoordinatorRoundRecord(
                round=r, traffic=self.counter.round_summary(r), wall_s=time.perf_counter() - t0, started_at=started_at,
                weights=dict(reply.meta.get("weights", {})), info=reply.info, held_out_acc=held_acc,
                submitted=sorted(got), missing=missing, missing_live=live).to_json())
            self.log.info("round %d aggregated from %d nodes, held-out acc %s", r, len(got), held_acc)
            self.submissions.pop(r, None)
            await asyncio.to_thread(self.write_checkpoint)

    async def publish(self, version: int, round_: int, reply: Reply) -> None:
        await self.endpoint.publish(
            version, round_, {name: host_snapshot(t) for name, t in reply.parts.items()}, dict(reply.meta),
            addressed={name: {node: host_snapshot(t) for node, t in per_node.items()}
                       for name, per_node in reply.addressed.items()},
        )

    async def run_setup(self) -> None:
        """The setup exchange: every node's setup push, the half's `setup`, its reply as step 1."""
        t0 = time.perf_counter()
        self.counter.begin_round(0)
        got = await self.collect(0)
        self.stage = Stage.SET_UP
        if not got:
            raise RuntimeError("no node took part in the setup exchange")
        missing = self.expected - set(got)
        if missing:
            self.log.warning("setup: nothing from %s; going on without them", sorted(missing))
        self.expected = set(got) - set(self.endpoint.departed)
        reply = await asyncio.to_thread(self.half.setup, [got[k] for k in sorted(got)])
        names = list(reply.parts) + list(reply.addressed)
        if not all(n.startswith(SETUP_PREFIX) for n in names):
            raise ValueError(f"setup reply parts must be named {SETUP_PREFIX}*, got {names}")
        await self.publish(1, 0, reply)
        self.submissions.pop(0, None)
        self.setup_record = {"submitted": sorted(got), "info": reply.info, **self.counter.round_summary(0),
                             "wall_s": time.perf_counter() - t0}
        self.log.info("setup answered for %d nodes in %.1f s", len(got), self.setup_record["wall_s"])

    # ---- checkpoints ----------------------------------------------------------------------
    def write_checkpoint(self) -> None:
        state = {
            **run_state(self.config.id, scenario_digest(self.settings.resolved), self.rounds, self.endpoint.replay,
                        self.counter.totals()),
            "aggregator": self.half.state_dict(), "expected": sorted(self.expected),
        }
        save_checkpoint(self.checkpoint_path, self.model.state_dict(), key=self.key, node_id=self.config.id,
                        round_=len(self.rounds), extra=state)

    def restore(self) -> int:
        """Load the last checkpoint, checked in full first; returns the last aggregated round."""
        if self.half.setup_kind is not None:
            raise CheckpointError(f"{self.settings.algorithm} cannot be resumed: its coordinator half has both a "
                                  "setup exchange and rounds, and only the rounds are checkpointed; start the run again")
        tensors, doc = read_resumable(self.checkpoint_path, node_id=self.config.id,
                                      public_hex=self.key.public_hex, scenario=self.settings.resolved,
                                      rounds=self.settings.rounds, spec=self.spec, written_as=self.settings.written_as)
        fresh = self.build_half()
        try:
            fresh.load_state_dict(doc["aggregator"])
            expected = {str(n) for n in doc["expected"]}
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"checkpoint {self.checkpoint_path}: state does not fit "
                                  f"{self.settings.algorithm}: {exc!r}") from None
        self.half = fresh
        self.expected = expected & set(self.config.peers)
        load_part(self.model, {k: v.to(self.device) for k, v in tensors.items()})
        restore_run_state(doc, self.endpoint.replay, self.counter)
        self.rounds = doc["rounds"]
        self.round = doc["round"]
        self.log.info("resumed from %s after round %d", self.checkpoint_path, self.round)
        return self.round


