"""Who is a peer, written in one place while the node runs: a member admitted (a federation's
newcomer) or refused (revoked, expired) goes through `PeerDirectory`, which tells each part that
keeps a view of membership, in order: the carrier (whose messages verify, where the member is,
whom it expects to read), the neighbour table (whom the node asks) and the intake (what the member
pushed before it was asked). A companion (`p2pfl.runtime.node.parts.Companion`) gets the node as a
`NodeHandle`: this directory, the round, and how to stop; never the carrier or the table itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from p2pfl.runtime.node.exchange import Exchange
    from p2pfl.runtime.node.neighbours import Neighbours
    from p2pfl.runtime.transport import Transport

Service = Callable[[bytes | None], Awaitable[tuple[int, bytes]]]
Call = Callable[[str, bytes, int], Awaitable[tuple[int, bytes]]]  # (url, body, answer limit) -> (status, answer)


@dataclass(frozen=True)
class Member:
    """A member as the directory admits it."""

    id: str
    public_key: str
    expires: float | None = None        # its certificate's end (None: until refused)
    url: str | None = None              # None: outbound only, a neighbour once it pushes, never read
    tls_fingerprint: str | None = None  # pinned where the carrier speaks TLS


class PeerDirectory:
    """The one writer of membership while a node runs (`admit`, `refuse`), with the carrier, the
    neighbour table and the intake as its subscribers; and the node's side of the medium a
    companion may set (`serve`, `reachable`, `keep`)."""

    def __init__(self, transport: Transport, neighbours: Neighbours, exchange: Exchange,
                 round_of: Callable[[], int], rounds: int) -> None:
        self._transport, self._neighbours, self._exchange = transport, neighbours, exchange
        self._round_of, self._rounds = round_of, rounds
        self.on_admit: list[Callable[[Member, int], None]] = [self._carrier_admits, self._table_admits]
        self.on_refuse: list[Callable[[str, str, str, int], None]] = [self._carrier_refuses, self._table_refuses]

    def admit(self, member: Member) -> None:
        round_ = self._round_of()
        for subscriber in self.on_admit:
            subscriber(member, round_)

    def refuse(self, member: str, cause: str, detail: str) -> None:
        round_ = self._round_of()
        for subscriber in self.on_refuse:
            subscriber(member, cause, detail, round_)

    def serve(self, name: str, handler: Service) -> None:
        """Answer `/v1/service/{name}` on the node's port (the carrier counts and bounds it)."""
        self._transport.services[name] = handler

    def caller(self) -> Call | None:
        """How a companion calls another member's service through the node's carrier (its bytes
        counted, its answers bounded); None where the carrier has no calls out (in memory only)."""
        return getattr(self._transport, "call", None)

    def reachable(self, reachable: bool) -> None:
        """False: nobody can reach this node (outbound only); it pushes its parts to its readers."""
        self._exchange.outbound_only = not reachable

    def keep(self, neighbours: int) -> None:
        """How many neighbours the node keeps asked out of the members it knows."""
        self._neighbours.target = neighbours

    # ---- the subscribers --------------------------------------------------------------------
    def _carrier_admits(self, member: Member, round_: int) -> None:
        transport = self._transport
        transport.roster.admit(member.id, member.public_key, member.expires)
        if member.tls_fingerprint is not None and hasattr(transport, "pin_peer"):
            transport.pin_peer(member.id, member.tls_fingerprint)
        if member.url is not None:
            transport.urls[member.id] = member.url

    def _table_admits(self, member: Member, round_: int) -> None:
        if member.url is not None:
            self._neighbours.admit(member.id, round_ + 1, self._rounds)
        else:
            self._neighbours.push_only.add(member.id)
        # whoever is admitted may read this node
        self._transport.expect_readers(set(self._transport.peers) | self._neighbours.push_only)

    def _carrier_refuses(self, member: str, cause: str, detail: str, round_: int) -> None:
        self._transport.roster.refuse(member, cause, detail)
        self._transport.urls.pop(member, None)

    def _table_refuses(self, member: str, cause: str, detail: str, round_: int) -> None:
        self._neighbours.push_only.discard(member)
        intake = self._exchange.intake
        intake.early = {k: m for k, m in intake.early.items() if k[0] != member}
        self._neighbours.depart(member, round_)
