"""The node's traffic with its peers over its `Transport`: publishing a round's parts, pushes,
gathering what the strategy asked for (a fetch answered by the peer's server or by its push,
whichever comes first); an outbound-only node's pushes; sparse parts (`p2pfl.runtime.sparse_wire`)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from p2pfl.models import PARTS, part_state
from p2pfl.runtime.deadline import wait_at_most
from p2pfl.runtime.devices import host_snapshot
from p2pfl.runtime.node.intake import Intake, RoundChecks
from p2pfl.runtime.node.kept import KeptParts
from p2pfl.runtime.node.neighbours import Neighbours
from p2pfl.runtime.peer_claims import ClaimRefused
from p2pfl.runtime.precision import quantize
from p2pfl.runtime.settings import NodeSettings, Sparsity
from p2pfl.runtime.sparse_wire import BASE_META, REF_SUFFIX, NeedReference, SparseSender
from p2pfl.runtime.strategy import COORDINATOR_ID, Fetch, PeerModel, Push, RoundContext, Strategy
from p2pfl.runtime.transport import Transport
from p2pfl.wire import Message


class Exchange:
    def __init__(self, transport: Transport, intake: Intake, neighbours: Neighbours, strategy: Strategy,
                 ctx: RoundContext, settings: NodeSettings, log: logging.Logger, seed: int = 0) -> None:
        self.transport, self.intake, self.neighbours = transport, intake, neighbours
        self.strategy, self.ctx, self.settings, self.log = strategy, ctx, settings, log
        # Nobody can reach this node (behind NAT; hivemind's client_mode): it pushes its round's
        # parts to its neighbours instead of waiting to be read.
        self.outbound_only = False
        self.kept: KeptParts | None = None  # runtime.audit: every part read is kept, before a strategy folds it
        self._pushing: set[asyncio.Future[None]] = set()
        # Parts sent sparse against a public copy (p2pfl.runtime.sparse_wire): from the initial model.
        sparsity = Sparsity.parse(settings.wire_sparsity)
        self.sparse = None if sparsity is None else SparseSender(
            {p: host_snapshot(part_state(ctx.model, p)) for p in strategy.shared_parts if p in PARTS}, sparsity,
            error_feedback=settings.error_feedback, seed=seed)

    async def publish(self, round_: int, parts: Mapping[str, Mapping[str, torch.Tensor]]) -> None:
        """Serve `parts` (host snapshots) as this node's version `round_`, with the strategy's
        metadata: a restored model, which its readers' public copies of it do not match."""
        if self.sparse is not None:
            self.sparse.restart(parts)
        await self.publish_round(round_, parts, self.round_meta(round_))

    async def publish_round(self, round_: int, parts: Mapping[str, Mapping[str, torch.Tensor]],
                            meta: Mapping[str, Any]) -> None:
        """Serve this round's parts (sparse, with their public copies, under runtime.wire_sparsity);
        an outbound-only node (nobody can reach it: `outbound_only`) also pushes them to each
        neighbour, who takes them in place of a read."""
        if self.sparse is not None and set(parts) <= set(self.sparse.feedback):
            parts, base = await asyncio.to_thread(self.sparse.encode, round_, parts)
            meta = {**meta, BASE_META: base}
        await self.transport.publish(round_, round_, parts, meta)
        if self.outbound_only:
            for peer in self.neighbours.asked:
                if peer == COORDINATOR_ID:
                    continue
                for name, tensors in parts.items():
                    # Sparse, its public copy goes whole: no neighbour can read it again if it missed one.
                    if self.sparse is not None and not name.endswith(REF_SUFFIX) and name + REF_SUFFIX in parts:
                        continue
                    task = asyncio.ensure_future(self._push_part(peer, name, round_, tensors, meta))
                    self._pushing.add(task)
                    task.add_done_callback(self._pushing.discard)

    async def _push_part(self, peer: str, part: str, round_: int, tensors: Mapping[str, torch.Tensor],
                         meta: Mapping[str, Any]) -> None:
        try:
            await self.transport.push(peer, kind="model", part=part, round_=round_, version=round_, tensors=tensors,
                                      meta=meta, timeout=self.settings.fetch_timeout_s)
        except Exception as exc:  # noqa: BLE001 - a push that fails is a part the neighbour does not get
            self.log.warning("round %d: push of %s to %s failed: %r", round_, part, peer, exc)

    async def first_served(self, peers: Sequence[str], part: str, at_least: int, wait: float) -> Message | None:
        """The first answer among `peers` for `part` at version `at_least` or later, each read
        waiting up to `wait` on its server; None when none answered (one try each)."""
        pending = {asyncio.ensure_future(self.transport.fetch(p, part, at_least, wait)) for p in peers}
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                answers = [m for m in (t.result() for t in done) if m is not None]
                if answers:
                    return max(answers, key=lambda m: m.header.version)
            return None
        finally:
            for task in pending:
                task.cancel()

    def round_meta(self, round_: int) -> dict[str, Any]:
        """What a round's parts carry besides tensors: `n_train`, the strategy's metadata, and the
        membership news this node passes on (absent without news: a run without churn sends the
        bytes it always did)."""
        meta = {"n_train": self.intake.n_train, **self.strategy.shared_meta(self.ctx)}
        news = self.neighbours.news_for(round_)
        if news:
            meta["members"] = news
        return meta

    async def republish(self, round_: int) -> None:
        """Serve the model as it is now (a restored one), so peers that accept stale parts need not wait a round."""
        if round_ and self.strategy.shared_parts:
            precision = self.settings.wire_precision
            await self.publish(round_, {p: quantize(host_snapshot(part_state(self.ctx.model, p)), precision)
                                        for p in self.strategy.shared_parts})

    async def probe_watched(self, round_: int) -> None:
        """Ask each watched neighbour (replaced for its silence) whether it is back: a closed port
        answers at once, a silent host within a second."""
        watched = sorted(self.neighbours.watched)
        statuses = await asyncio.gather(*(self.transport.status_of(p, timeout=1.0) for p in watched))
        for peer, status in zip(watched, statuses):
            if status is not None and not status.get("done"):
                self.neighbours.returned(peer, round_)

    async def send_pushes(self, pushes: list[Push], round_: int) -> None:
        timeout = self.settings.fetch_timeout_s
        await asyncio.gather(*(
            self.transport.push(p.target, kind=p.kind, part=p.part, round_=round_, version=round_,
                                tensors=p.tensors, meta=p.meta, timeout=timeout)
            for p in pushes
        ))

    async def gather(self, fetches: list[Fetch], round_: int, checks: RoundChecks, wait: float | None = None,
                     versions: Mapping[str, int] | None = None) -> list[PeerModel]:
        """The version `round_` (or later) of each fetch, checked into `checks`. `wait`: the longest
        wait for each fetch (default: fetch_timeout_s for a peer, coordinator_wait_s for the
        coordinator). `versions`: the version asked of a peer where it is not `round_` (a neighbour
        that sits out this round: the last round it took part in)."""
        versions = versions or {}
        settings, transport = self.settings, self.transport
        loop = asyncio.get_running_loop()
        self.intake.current = checks
        push_only = self.neighbours.push_only
        checks.awaiting = {(f.peer, f.part): loop.create_future() for f in fetches
                           if f.peer in transport.peers or f.peer in push_only}
        self._take_early(checks, round_, versions)
        if self.intake.gave_up:
            self.intake.give_up_waits()

        async def one(fetch: Fetch) -> PeerModel | None:
            if fetch.peer in push_only and fetch.peer not in transport.peers:
                return await self._pushed(fetch, checks, wait)
            if fetch.peer not in transport.peers:
                self.log.warning("strategy asked for unknown peer %r", fetch.peer)
                return None
            if (fetch.peer in self.neighbours.unreachable or fetch.peer in self.neighbours.probe_first) and \
                    await transport.status_of(fetch.peer, timeout=1.0) is None:
                # Gone last round and not answering now (killed, or its machine is down): one
                # quick probe instead of fetch_timeout_s in every later round.
                return None
            longest = wait if wait is not None else (
                settings.coordinator_wait_s if fetch.peer == COORDINATOR_ID else settings.fetch_timeout_s)
            fetched = asyncio.ensure_future(transport.fetch(fetch.peer, fetch.part, versions.get(fetch.peer, round_),
                                                            longest))
            pushed = checks.awaiting[(fetch.peer, fetch.part)]
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
            if message.header.version < round_ and not settings.accept_stale:
                return None
            try:
                if fetch.part in self.intake.specs and message.header.version > settings.rounds:
                    # No honest peer publishes a round's model past the last round (setup parts count steps).
                    raise ClaimRefused(f"{fetch.peer} served version {message.header.version} of "
                                       f"{fetch.part}; the run has {settings.rounds} rounds")
                return await self.taken(message, checks, longest)
            except ClaimRefused as exc:
                checks.refused[fetch.peer] = str(exc)
                transport.rejections.add(fetch.peer, exc.status, exc.reason, str(exc))
                return None

        async def folded(fetch: Fetch) -> PeerModel | None:
            arrival = await one(fetch)
            if arrival is not None and self.kept is not None:
                await asyncio.to_thread(self.kept.arrived, round_, [arrival])
            if arrival is None or not self.strategy.folds_arrivals or not self.strategy.fold(self.ctx, arrival):
                return arrival
            return dataclasses.replace(arrival, tensors={})  # folded: its tensors can go

        try:
            results = await asyncio.gather(*(folded(f) for f in fetches))
        finally:
            for waiting in checks.awaiting.values():
                waiting.cancel()
            checks.awaiting = {}
        # A member taken out while its part was on its way (revoked, expired) is not aggregated.
        results = [r if r is None or r.sender in transport.peers or r.sender in push_only else self._dropped(r)
                   for r in results]
        # A refused part is an answer, judged by the conduct rule (`Neighbours.judge`), not silence.
        silent = {f.peer for f, r in zip(fetches, results) if r is None} - set(checks.refused)
        self.neighbours.answered({f.peer for f in fetches}, silent, round_)
        return [r for r in results if r is not None]

    async def taken(self, message: Message, checks: RoundChecks, wait: float) -> PeerModel | None:
        """`message` as a strategy sees it; a sparse part against a public copy this node does not
        hold is read again whole (`<part>#ref`, same version). None if that read fails."""
        try:
            return self.intake.peer_model(message, checks)
        except NeedReference as reason:
            h = message.header
            self.log.info("round %d: %s; reading its public copy whole", self.ctx.round, reason)
            whole = await self.transport.fetch(h.sender, h.part + REF_SUFFIX, h.version, wait)
            return None if whole is None else self.intake.peer_model(whole, checks)

    def _take_early(self, checks: RoundChecks, round_: int, versions: Mapping[str, int]) -> None:
        """Parts outbound-only neighbours pushed before this gather began answer its fetches now."""
        for (peer, part), waiting in checks.awaiting.items():
            early = self.intake.early.pop((peer, part), None)
            if early is None or early.header.version < versions.get(peer, round_):
                continue
            try:
                waiting.set_result(self.intake.peer_model(early, checks))
            except NeedReference:  # an outbound-only peer cannot be read: its next push, or nothing
                waiting.set_result(None)
            except ClaimRefused as exc:
                checks.refused[peer] = str(exc)
                self.transport.rejections.add(peer, exc.status, exc.reason, str(exc))
                waiting.set_result(None)

    async def _pushed(self, fetch: Fetch, checks: RoundChecks, wait: float | None) -> PeerModel | None:
        """An outbound-only neighbour's part: what it pushes within the fetch timeout (only what it
        pushed already, if it was silent last round: it cannot be probed)."""
        pushed = checks.awaiting[(fetch.peer, fetch.part)]
        if pushed.done() or fetch.peer in self.neighbours.unreachable:
            return pushed.result() if pushed.done() else None
        try:
            return await wait_at_most(asyncio.shield(pushed), wait if wait is not None else self.settings.fetch_timeout_s)
        except asyncio.TimeoutError:
            return None

    def _dropped(self, arrival: PeerModel) -> None:
        self.log.warning("round %d: %s's %s dropped: it is no longer a member", self.ctx.round, arrival.sender, arrival.part)
        return None
