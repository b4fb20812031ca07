"""Goodbyes and returns, as every carrier takes and sends them: a member's own signed statement
(`p2pfl.runtime.statements`) that it left before a round, or is live again from one, bound to the
run and checked against the round this node is in. A departed member's reads and pushes are
refused (410) until its return of a later round."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from p2pfl.runtime.statements import ROUND_SLACK, BadStatement, Statement, read_statement, sign_statement
from p2pfl.wire import NodeKey, Roster, WireError
from p2pfl.wire.header import Header

if TYPE_CHECKING:
    from p2pfl.runtime.transport.stores import PartStore

GOODBYE = "goodbye"  # kind of the signed message a failing node sends so that nobody waits for it
BACK = "back"  # kind of the signed message a member that said goodbye sends when it joins again


class StatementOffRound(WireError):
    """A signed goodbye or return for a round this node is not near (another round of the run)."""

    status = 409
    reason = "statement_off_round"


class Departures:
    """Mixed into `Carrier`, which sets these in its `__init__`."""

    node_id: str
    key: NodeKey
    roster: Roster
    run: str
    log: logging.Logger
    store: PartStore
    departed: dict[str, str]            # peer -> why it said goodbye
    goodbyes: dict[str, Statement]      # peer -> its signed goodbye
    _inflight: dict[str, set[asyncio.Future[Any]]]
    status: Callable[[], dict[str, Any]]
    on_departed: Callable[[str, str], None] | None
    on_statement: Callable[[Statement], None] | None

    if TYPE_CHECKING:  # the carrier's own
        @property
        def peers(self) -> Mapping[str, str]: ...

        async def push(self, target: str, *, kind: str, part: str, round_: int, version: int,
                       tensors: Mapping[str, Any], meta: Mapping[str, Any], timeout: float) -> bool: ...

    def own_statement(self, event: int) -> Statement:
        """This node's signed word about itself in this run: +r live from round r, -r left before r."""
        return sign_statement(self.key, self.run, self.node_id, event)

    def statement_in(self, header: Header) -> Statement:
        """The signed statement a goodbye (left before its round) or a return (live from it)
        carries: the sender's own, of this run, of the head's round, near this node's round."""
        statement = read_statement(header.sender, header.meta["statement"], self.roster, self.run)
        said = -header.round if header.kind == GOODBYE else header.round
        if header.round < 1 or statement.event != said:
            raise BadStatement(f"{header.kind} for round {header.round} carries the statement {statement.event}")
        now = self.status().get("round")
        if type(now) is int and abs(header.round - (now + 1)) > ROUND_SLACK:
            raise StatementOffRound(f"{header.kind} of {header.sender} for round {header.round}; this node is in round "
                                    f"{now} (within {ROUND_SLACK} rounds of the next are taken)")
        return statement

    def take_back(self, statement: Statement) -> None:
        """`statement` (verified) says its member is live again: if that is newer than its goodbye,
        its reads and pushes are taken again."""
        goodbye = self.goodbyes.get(statement.member)
        if goodbye is not None and statement.newer_than(goodbye):
            del self.goodbyes[statement.member]
            self.departed.pop(statement.member, None)
            self.log.info("%s is back (its signed return for round %d)", statement.member, statement.round)
        if self.on_statement is not None:
            self.on_statement(statement)

    def _depart(self, peer: str, reason: str, statement: Statement) -> None:
        known = self.goodbyes.get(peer)
        if known is not None and not statement.newer_than(known):
            return
        self.goodbyes[peer] = statement
        if self.on_statement is not None:
            self.on_statement(statement)
        if peer in self.departed:
            return
        self.departed[peer] = reason
        self.store.forget_reader(peer)
        self.log.warning("%s said goodbye (%s); not waiting for it again", peer, reason or "no reason given")
        for task in self._inflight.pop(peer, set()):
            task.cancel()
        if self.on_departed is not None:
            self.on_departed(peer, reason)

    async def say_goodbye(self, targets: list[str], reason: str, before_round: int, timeout: float = 3.0) -> None:
        """Tell `targets` (signed, bound to this run and round) that this node is gone before
        `before_round`, so none of them waits for it again; they pass the statement on."""
        before_round = max(before_round, 1)
        meta = {"reason": reason[:500], "statement": self.own_statement(-before_round).text}
        await asyncio.gather(*(  # a reader with no address (outbound only) hears it as news
            self.push(t, kind=GOODBYE, part="", round_=before_round, version=0, tensors={}, meta=meta, timeout=timeout)
            for t in targets if t in self.peers
        ))

    async def say_back(self, targets: Iterable[str], first_round: int, timeout: float = 3.0) -> Statement:
        """Tell `targets` (signed) that this node is live from `first_round`: a member that said
        goodbye is taken back by it. Returns the statement, for the node's news."""
        statement = self.own_statement(max(first_round, 1))
        meta = {"statement": statement.text}
        await asyncio.gather(*(
            self.push(t, kind=BACK, part="", round_=statement.round, version=0, tensors={}, meta=meta, timeout=timeout)
            for t in targets if t in self.peers
        ))
        return statement
