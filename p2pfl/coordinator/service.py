"""The optional coordinator: holds the global model for algorithms with a global step (DI, GA).

It speaks the same signed wire format as the nodes: nodes push their round statistics
(`kind="stats"`) to its inbox and pull the `global` part by long-poll. It never sees raw
data; it scores the global model on the held-out domain's test split, when the scenario
has one, for leave-one-domain-out evaluation.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from typing import Any

import torch

from p2pfl import logs
from p2pfl.coordinator.aggregators import Submission, build_aggregator
from p2pfl.data import build_partition
from p2pfl.models import build_model, load_part, part_spec, part_state
from p2pfl.runtime.accounting import ByteCounter
from p2pfl.runtime.checkpoint import CheckpointError, read_resumable, restore_run_state, run_state, save_checkpoint
from p2pfl.runtime.config import NodeConfig
from p2pfl.runtime.metadata import STATS_META
from p2pfl.runtime.run_folder import RunFolder
from p2pfl.runtime.tls import server_context
from p2pfl.runtime.placement import host_snapshot, node_device, split_to_device, to_device
from p2pfl.runtime.transport import Endpoint
from p2pfl.runtime.transport_api import Transport
from p2pfl.scenario.schema import Scenario, load_scenario
from p2pfl.training import LocalTrainer
from p2pfl.wire import Message, NodeKey, Roster, WireLimits


class Coordinator:
    def __init__(self, config: NodeConfig, scenario: Scenario | None = None, *, resume: bool = False) -> None:
        self.config = config
        self.resume = resume
        self.folder = RunFolder(config.out)
        self.checkpoint_path = self.folder.checkpoint(config.id)
        self.scenario = sc = scenario or load_scenario(config.scenario, config.overrides)
        self.log = logging.getLogger("p2pfl.coordinator")
        torch.set_num_threads(sc.runtime.torch_threads)
        self.partition = build_partition(sc.data, sc.nodes, sc.seed)
        self.device = node_device(sc.device, 0)
        self.held_out = None if self.partition.held_out is None else split_to_device(self.partition.held_out, self.device)
        torch.manual_seed(sc.seed)
        self.model = build_model(sc.model.name, self.partition.in_channels, self.partition.image_size, self.partition.num_classes)
        self.model.to(self.device)
        self.spec = part_spec(self.model, "full")
        self.aggregator = build_aggregator(sc.algorithm.name, sc.algorithm.params, rounds=sc.rounds)
        self.evaluator = LocalTrainer(sc.train, device=self.device)
        self.expected: set[str] = set(config.peers)
        self.counter = ByteCounter()
        self.submissions: dict[int, dict[str, Submission]] = {}
        self.arrived = asyncio.Event()
        self.round = 0
        self.done = False
        self.rounds: list[dict[str, Any]] = []
        self.key = key = NodeKey.load(config.key_file)
        self.endpoint: Transport = Endpoint(
            node_id=config.id, key=key,
            roster=Roster({pid: p.public_key for pid, p in config.peers.items()}),
            urls={pid: p.url for pid, p in config.peers.items()}, counter=self.counter,
            limits=WireLimits(max_message_bytes=int(sc.runtime.message_limit_mb * 2**20)),
            expected_for=lambda kind, part: self.spec if kind == "stats" else None,
            meta_schema_for=lambda kind, part: STATS_META if kind == "stats" else None,
            on_message=self._on_stats, status=lambda: {"id": config.id, "round": self.round, "done": self.done},
            on_departed=self._on_departed,
            max_skew_s=sc.runtime.max_skew_s, retry_s=sc.runtime.connect_retry_s, log=self.log,
            tls=server_context(key, config.id) if sc.runtime.tls else None,
            pins={pid: p.tls_fingerprint for pid, p in config.peers.items() if p.tls_fingerprint},
        )

    def _on_stats(self, message: Message) -> None:
        h = message.header
        if h.round <= self.round:
            raise ValueError(f"round {h.round} is already aggregated (coordinator is at round {self.round})")
        if h.round > self.scenario.rounds:
            raise ValueError(f"round {h.round} is beyond the scenario's {self.scenario.rounds} rounds")
        per_round = self.submissions.setdefault(h.round, {})
        if h.sender in per_round:
            raise ValueError(f"{h.sender} already submitted round {h.round}")
        per_round[h.sender] = Submission(h.sender, to_device(message.torch_tensors(), self.device), dict(h.meta))
        self.arrived.set()

    def _on_departed(self, node: str, reason: str) -> None:
        """A node that failed is not waited for again; with none left the coordinator stops."""
        self.expected.discard(node)
        self.arrived.set()

    async def collect(self, r: int) -> dict[str, Submission]:
        """Wait for every expected node, or `fetch_timeout_s` after the first one arrived."""
        loop = asyncio.get_running_loop()
        timeout = self.scenario.runtime.fetch_timeout_s
        first_deadline = loop.time() + 4 * timeout  # nodes may still be training
        deadline = None
        while True:
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
            try:
                await asyncio.wait_for(self.arrived.wait(), timeout=remaining)
            except asyncio.TimeoutError:
                pass

    async def run(self) -> dict[str, Any]:
        cfg, sc = self.config, self.scenario
        await self.endpoint.start(cfg.host, cfg.port)
        self.log.info("coordinator on %s:%d for %d nodes, %s", cfg.host, cfg.port, len(cfg.peers), sc.algorithm.name)
        started = time.perf_counter()
        status, error = "ok", None
        try:
            first = 1
            if self.resume:
                first = self.restore() + 1
                if self.rounds:  # serve the restored global model at once
                    await self.endpoint.publish(self.round, self.round, {"global": host_snapshot(part_state(self.model, "full"))},
                                                {"weights": dict(self.rounds[-1]["weights"])})
            for r in range(first, sc.rounds + 1):
                self.counter.begin_round(r)
                t0 = time.perf_counter()
                got = await self.collect(r)
                if not got:
                    self.log.warning("no node submitted round %d; stopping", r)
                    break
                missing = self.expected - set(got)
                if missing:
                    self.log.warning("round %d: no statistics from %s; aggregating without them", r, sorted(missing))
                # A node that missed a round, or said goodbye meanwhile, is not waited for again.
                self.expected = set(got) - set(self.endpoint.departed)
                subs = [got[k] for k in sorted(got)]
                update = await asyncio.to_thread(self.aggregator.aggregate, r, subs)
                load_part(self.model, update.state)
                held_acc = None
                if self.held_out is not None:
                    held_acc, _ = self.evaluator.evaluate(self.model, self.held_out)
                self.round = r
                await self.endpoint.publish(r, r, {"global": host_snapshot(update.state)}, {"weights": dict(update.weights)})
                self.rounds.append({
                    "round": r, "weights": dict(update.weights), "info": update.info, "held_out_acc": held_acc,
                    "submitted": sorted(got), **self.counter.round_summary(r), "wall_s": time.perf_counter() - t0,
                })
                self.log.info("round %d aggregated from %d nodes, held-out acc %s", r, len(got), held_acc)
                self.submissions.pop(r, None)
                await asyncio.to_thread(self.write_checkpoint)
        except Exception as exc:
            status, error = "failed", "".join(traceback.format_exception(exc))
            self.log.error("coordinator failed:\n%s", error)
        self.done = True
        await self.endpoint.linger(set(self.config.peers), self.scenario.runtime.linger_s)
        result = {
            "id": cfg.id, "status": status, "error": error, "rounds": self.rounds,
            "held_out_domain": self.partition.held_out_domain, "totals": self.counter.totals(),
            "rejected": self.endpoint.rejections.summary(),
            "wall_s": time.perf_counter() - started,
        }
        self.folder.write_result(cfg.id, result)
        await self.endpoint.close()
        return result


    # ---- checkpoints ----------------------------------------------------------------------
    def write_checkpoint(self) -> None:
        state = {
            **run_state(self.config.id, self.scenario.to_dict(), self.rounds, self.endpoint.replay, self.counter.totals()),
            "aggregator": self.aggregator.state_dict(), "expected": sorted(self.expected),
        }
        save_checkpoint(self.checkpoint_path, self.model.state_dict(), key=self.key, node_id=self.config.id,
                        round_=len(self.rounds), extra=state)

    def restore(self) -> int:
        """Load the last checkpoint, checked in full first; returns the last aggregated round."""
        tensors, doc = read_resumable(self.checkpoint_path, node_id=self.config.id,
                                      public_hex=self.key.public_hex, scenario=self.scenario.to_dict(),
                                      rounds=self.scenario.rounds, spec=self.spec)
        fresh = build_aggregator(self.scenario.algorithm.name, self.scenario.algorithm.params, rounds=self.scenario.rounds)
        try:
            fresh.load_state_dict(doc["aggregator"])
            expected = {str(n) for n in doc["expected"]}
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"checkpoint {self.checkpoint_path}: state does not fit "
                                  f"{self.scenario.algorithm.name}: {exc!r}") from None
        self.aggregator = fresh
        self.expected = expected & set(self.config.peers)
        load_part(self.model, {k: v.to(self.device) for k, v in tensors.items()})
        restore_run_state(doc, self.endpoint.replay, self.counter)
        self.rounds = doc["rounds"]
        self.round = doc["round"]
        self.log.info("resumed from %s after round %d", self.checkpoint_path, self.round)
        return self.round


def run_coordinator(config: NodeConfig, resume: bool = False) -> int:
    logs.configure(f"%(asctime)s {config.id} %(levelname)s %(message)s")
    result = asyncio.run(Coordinator(config, resume=resume).run())
    return 1 if result["status"] == "failed" else 0
