"""A node that comes and goes: joining a running federation from its neighbours' newest model,
stopping dead (a crash), and coming back from its checkpoint in the round its neighbours are in.

The node learns where the federation is from its neighbours' public status (their round), and
takes a model only as a verified, signed part, checked like any other arrival.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from p2pfl.models import part_state
from p2pfl.runtime.churn import NodeScript
from p2pfl.runtime.node.exchange import Exchange
from p2pfl.runtime.node.intake import RoundChecks
from p2pfl.runtime.node.neighbours import Neighbours
from p2pfl.runtime.node.state import NodeState
from p2pfl.runtime.settings import NodeSettings
from p2pfl.runtime.strategy import COORDINATOR_ID
from p2pfl.runtime.transport import Transport
from p2pfl.wire import Message

GLOBAL = "global"  # the part a coordinator serves its global model as (p2pfl.algorithms.di)
RETRY_S = (0.1, 1.0)  # first and longest pause before asking again when no neighbour could be reached


class NoFederation(RuntimeError):
    """No neighbour answered, or none reached the round awaited, within the wait."""


class Membership:
    def __init__(self, transport: Transport, exchange: Exchange, neighbours: Neighbours, state: NodeState,
                 settings: NodeSettings, log: logging.Logger) -> None:
        self.transport, self.exchange, self.neighbours = transport, exchange, neighbours
        self.state, self.settings, self.log = state, settings, log
        self.events: list[dict[str, Any]] = []  # joined, crashed, restarted, left: with their rounds

    async def end(self, status: str, goodbye: str, next_round: int, coordinator: bool, not_up_yet: set[str]) -> None:
        """How the node's part ends: crashed, it says nothing and serves nothing; revoked, every
        member refuses it (nothing to serve, nobody to tell); failed or left early, it stops
        serving and says goodbye (signed, for `next_round`) to its neighbours, its readers and the
        coordinator, the others hearing it as news; having run every round, it lingers, serving
        its last rounds until its neighbours are done (`not_up_yet`: still starting, waited for)."""
        if status == "crashed":
            return
        if status not in ("ok", "isolated", "degraded"):
            await self.transport.withdraw()  # nobody waits for it now, not after fetch_timeout_s
            if status != "revoked":
                told = self.neighbours.goodbye_targets(self.transport.readers())
                await self.transport.say_goodbye(told + [COORDINATOR_ID] * coordinator, goodbye, before_round=next_round)
            return
        await self.transport.linger(set(self.neighbours.asked), self.settings.linger_s, not_up_yet)

    async def away_for(self, round_: int, last: int) -> int:
        """Away for round `round_` only (churn's flap): a goodbye signed for it to its neighbours and
        readers, then its own signed word that it is back from the next round, to them and as news
        (a neighbour that hears it still in `round_` does not wait for it there: `Neighbours.to_ask`).
        It keeps serving its last parts. Returns the next round."""
        told = self.neighbours.goodbye_targets(self.transport.readers())
        await self.transport.say_goodbye(told, f"away for round {round_} (churn schedule)", before_round=round_)
        self.events.append({"round": round_, "event": "stepped_out", "at": time.time()})
        if round_ < last:
            self.neighbours.announce(await self.transport.say_back(told, round_ + 1), round_ + 1)
            self.events.append({"round": round_ + 1, "event": "stepped_back", "at": time.time()})
        return round_ + 1

    async def federation_at(self, at_least: int, part: str, sources: list[str] | None = None) -> Message | None:
        """A neighbour's `part` at version `at_least` or later (or the coordinator's, as `sources`
        says): the first answer (a read waits on the server until it publishes that version, so a
        round that passes quickly is not missed). None at once for `at_least` <= 0."""
        if at_least <= 0:
            return None
        sources = list(self.neighbours.asked) if sources is None else sources
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.setup_wait_s
        pause = RETRY_S[0]
        while loop.time() < deadline:
            message = await self.exchange.first_served(sources, part, at_least, deadline - loop.time())
            if message is not None:
                return message
            await asyncio.sleep(min(pause, max(deadline - loop.time(), 0)))  # none up: crashed, or not yet
            pause = min(pause * 2, RETRY_S[1])
        raise NoFederation(f"none of {sorted(sources)} served round {at_least} within "
                           f"{self.settings.setup_wait_s:.0f} s (runtime.setup_wait_s)")

    async def furthest(self) -> int:
        """The furthest round a neighbour reports now (one look; 0 when none answers)."""
        statuses = await asyncio.gather(*(self.transport.status_of(p, timeout=2.0) for p in self.neighbours.asked))
        return max((int(s.get("round", 0)) for s in statuses if s and not s.get("done")), default=0)

    async def rejoin(self, restored: int) -> int:
        """A node resumed alone from its checkpoint after round `restored`: the round it goes on
        with. Its neighbours' round when they are two or more rounds past it (it was down while
        they went on), else the next one. (A whole run resumed together never asks: it replays.)"""
        now = await self.furthest()
        await self._tell_coordinator(max(now, restored + 1))
        if now < restored + 2:
            return restored + 1
        self.events.append({"round": now, "event": "restarted", "after_round": restored, "at": time.time()})
        self.neighbours.announce(self.transport.own_statement(now), now)
        self.log.info("resumed after round %d; its neighbours are in round %d: rejoins there", restored, now)
        return now

    async def join(self, join_round: int, shared_parts: tuple[str, ...], catch_up: bool = True) -> int:
        """Join a running federation: take a neighbour's model of the round before `join_round`
        (or newer; with `catch_up` False only its round number, and keep the initial model).
        Returns the first round this node runs: `join_round`, or the round the neighbours
        are in (the version taken: a neighbour that published version v is in round v) if later."""
        # Its own signed word first: a member that said goodbye earlier is read and heard again,
        # and a coordinator waits for it from `join_round` on (not only if it wins a race).
        await self.transport.say_back(self._told_back(), join_round)
        parts = ("full",) if "full" in shared_parts else tuple(p for p in ("body", "head") if p in shared_parts)
        if not parts and self.exchange.ctx.coordinator is not None:  # DI, GA: the newest global model
            return await self._join_coordinated(join_round, catch_up)
        if not parts:  # a strategy that shares nothing (Local): no model to take, only the round
            return self._joined(max(join_round, await self.furthest()), None, None)
        first_message = await self.federation_at(join_round - 1, parts[0])
        peer, version = None, None
        if first_message is not None:
            peer, version = first_message.header.sender, first_message.header.version
            if catch_up:
                await self._take_model(first_message, parts[1:])
        # A neighbour that published version v is in round v.
        return self._joined(max(join_round, version or 0), *((peer, version) if catch_up else (None, None)))

    async def _tell_coordinator(self, first: int) -> None:
        """A coordinator stops waiting for a member it did not hear from: its signed return says it
        is back from round `first` (the neighbours hear it as news with its parts)."""
        if self.exchange.ctx.coordinator is not None:
            await self.transport.say_back([COORDINATOR_ID], first)

    def _told_back(self) -> list[str]:
        """Whom a returning member tells: its neighbours, and its coordinator where it has one."""
        return [*self.neighbours.asked, *[COORDINATOR_ID] * (self.exchange.ctx.coordinator is not None)]

    async def _join_coordinated(self, join_round: int, catch_up: bool) -> int:
        """The coordinator's global model of the round before `join_round` or newer (it publishes
        version v when round v is aggregated: the federation is then in round v + 1)."""
        message = await self.federation_at(join_round - 1, GLOBAL, [COORDINATOR_ID])
        version = None if message is None else message.header.version
        if message is not None and catch_up:
            await self._take_model(message, ())
        taken = catch_up and message is not None
        first = max(join_round, (version or 0) + 1)
        if message is not None:  # said again now that it surely listens: it may have been starting at the first word
            await self._tell_coordinator(first)
        return self._joined(first, *((COORDINATOR_ID, version) if taken else (None, None)))

    def _joined(self, first: int, source: str | None, version: int | None) -> int:
        """Record the join (`source`: whose model it started from, None: its own) and return `first`."""
        self.events.append({"round": first, "event": "joined", "from": source, "version": version, "at": time.time()})
        self.neighbours.announce(self.transport.own_statement(first), first)  # passed on with its parts: news of a new member
        self.log.info("joined in round %d with %s's model (version %s)", first, source or "its own", version)
        return first

    async def _take_model(self, first: Message, more_parts: tuple[str, ...]) -> None:
        """Load the model parts of `first`'s sender at `first`'s version, each checked as any arrival
        (a sparse one read again whole where this node does not hold its public copy)."""
        checks, peer, version = RoundChecks(0), first.header.sender, first.header.version
        wait = self.settings.fetch_timeout_s
        taken = await self.exchange.taken(first, checks, wait)
        if taken is None:
            raise NoFederation(f"{peer} served {first.header.part} version {version} but not its public copy")
        loaded = dict(taken.tensors)
        for part in more_parts:
            message = await self.transport.fetch(peer, part, version, wait)
            taken = None if message is None else await self.exchange.taken(message, checks, wait)
            if taken is None:
                raise NoFederation(f"{peer} served {first.header.part} version {version} but not {part}")
            loaded.update(taken.tensors)
        model = self.exchange.ctx.model
        own = part_state(model, "full")
        model.load_state_dict({**own, **{k: v for k, v in loaded.items() if k in own}})
        self.state.trained = True
        if self.exchange.sparse is not None:  # its readers hold its initial model as its public copy, not this one
            self.exchange.sparse.restart({p: part_state(model, p) for p in self.exchange.sparse.feedback})

    async def crash(self, round_: int, restart: int | None, restart_after_s: float | None = None
                    ) -> tuple[int, int] | None:
        """Stop dead before `round_` (the port refuses, nothing is said). Come back from the
        checkpoint when the neighbours have published the round before `restart`, or
        `restart_after_s` seconds later, in the round they are in (at least `restart`, and after
        the checkpoint's); returns that round and the checkpoint's. None: it stays down."""
        await self.transport.stop_listening()
        self.events.append({"round": round_, "event": "crashed", "at": time.time()})
        self.log.warning("crashed before round %d (churn schedule)%s", round_,
                         "" if restart is None else f"; back in round {restart}")
        shared = self.exchange.strategy.shared_parts
        if restart is not None and shared:
            message = await self.federation_at(restart - 1, "full" if "full" in shared else shared[0])
            at_least = max(restart, 0 if message is None else message.header.version)
        elif restart is not None and self.exchange.ctx.coordinator is not None:
            message = await self.federation_at(restart - 1, GLOBAL, [COORDINATOR_ID])
            at_least = max(restart, 0 if message is None else message.header.version + 1)
        elif restart is not None:  # it shares nothing to wait on: back at its round, or where the others are
            at_least = max(restart, await self.furthest())
        elif restart_after_s is not None:
            await asyncio.sleep(restart_after_s)
            at_least = await self.furthest()
        else:
            return None
        last, _ = await asyncio.to_thread(self.state.restore)
        back = max(at_least, last + 1)
        await self.transport.listen()
        await self.exchange.republish(last)
        self.state.restarts.append({"after_round": last, "at": time.time()})
        self.events.append({"round": back, "event": "restarted", "after_round": last, "at": time.time()})
        await self._tell_coordinator(back)
        self.neighbours.announce(self.transport.own_statement(back), back)
        return back, last

    async def arrive(self, script: NodeScript, by_hand: bool, started: float) -> int:
        """A node not there at the start comes in: by its schedule's round, at its schedule's time
        (its port closed until then, as a process not started), or by hand (`p2pfl node --join`).
        Returns its first round."""
        shared = self.exchange.strategy.shared_parts
        if script.join_s is not None and not by_hand:
            await self.transport.stop_listening()
            await asyncio.sleep(max(0.0, script.join_s - (time.perf_counter() - started)))
            first = await self.join(max(2, await self.furthest()), shared, script.catch_up)
            await self.transport.listen()
            return first
        # Scheduled: its round. By hand: the round its neighbours are in (2 at the earliest).
        return await self.join(script.join if not by_hand else max(2, await self.furthest()), shared, script.catch_up)
