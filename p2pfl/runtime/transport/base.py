"""What every carrier does the same way, whatever moves its bytes: the version stores, sealing an
answer, taking a verified message, goodbyes; waiting for peers by their status is `presence`.

A carrier subclasses `Carrier` and supplies the four moves that touch its medium: `start`,
`close`, `_fetch` (one read of a peer's part) and `push` (one frame to a peer's inbox), plus
`status_of`. Everything it receives goes through `open_message` before `_take`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from p2pfl.runtime.accounting import CONTROL
from p2pfl.runtime.metadata import BACK_META, GOODBYE_META, Schema, check_meta
from p2pfl.runtime.rejections import RejectionLog
from p2pfl.runtime.shared_tables import own_copy
from p2pfl.runtime.statements import Statement
from p2pfl.runtime.transport.departures import BACK, GOODBYE, Departures
from p2pfl.runtime.transport.presence import PeerPresence
from p2pfl.runtime.transport.stores import SETUP_PREFIX, PartStore, Published, SetupStore
from p2pfl.wire import EncodedBody, Frame, Message, ReplayGuard, WireError, encode_body, open_message, seal_frame
from p2pfl.wire.header import Header
from p2pfl.wire.errors import quote

if TYPE_CHECKING:
    from p2pfl.runtime.transport import TransportSettings

ExpectedSpec = Mapping[str, tuple[tuple[int, ...], str]]
REJECTED = "rejected"  # bytes of messages that failed validation still crossed the wire
MAX_WAIT_S = 600.0
MAX_VERSION = 2**62


class NotAccepted(WireError):
    """A signed push of a kind or part this node does not take."""

    status = 400
    reason = "unexpected_kind"


class Refused(Exception):
    """An answer that is not a frame: (status, text), as an HTTP server would give it."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status, self.text = status, text


class Carrier(PeerPresence, Departures):
    def __init__(self, settings: TransportSettings) -> None:
        self.settings = settings
        self.node_id = settings.node_id
        self.key = settings.key
        self.roster = settings.roster
        self.urls = own_copy(settings.urls)  # the members it admits and refuses change this carrier's only
        self.counter = settings.counter
        self.limits = settings.limits
        self.server_limits = settings.server_limits
        self.retry_s = settings.retry_s
        self.expected_for: Callable[[str, str], ExpectedSpec | None] = lambda kind, part: None
        self.meta_schema_for: Callable[[str, str], Schema | None] = lambda kind, part: None
        self.on_message: Callable[[Message], None] = lambda message: None
        self.status: Callable[[], dict[str, Any]] = dict
        self.on_departed: Callable[[str, str], None] | None = None
        self.on_statement: Callable[[Statement], None] | None = None
        self.run = settings.run  # statements signed in another run do not verify here
        # Peers that said goodbye: fetches from them end at once, and their reads and pushes are
        # refused (410), until their own signed return (`BACK`) of a later round.
        self.departed: dict[str, str] = {}
        self.goodbyes: dict[str, Statement] = {}
        self._inflight: dict[str, set[asyncio.Future[Message | None]]] = {}
        self.replay = ReplayGuard(max_skew_s=settings.max_skew_s)
        self.log = settings.log or logging.getLogger(f"p2pfl.{settings.node_id}")
        self.store = PartStore(settings.held_bytes)
        # Parts named "setup.*" (the exchange before round 1) have their own versions, so setup
        # steps never shadow a round's parts.
        self.setup_store = SetupStore()
        # Sequence numbers from the clock (microseconds): a restarted node goes on above every
        # number its peers saw from it before, so they never take its new messages for replays.
        self._seq = itertools.count(time.time_ns() // 1000)
        self._reads_by_peer: dict[str, int] = {}
        self.rejections = RejectionLog(self.log)
        # name -> handler of a service served beside the parts (body in, or None for a read;
        # (status, answer) out): what a membership layer above the carrier adds, e.g. a
        # federation's member exchange. The carrier knows nothing of what they say.
        self.services: dict[str, Callable[[bytes | None], Awaitable[tuple[int, bytes]]]] = {}
        self._service_gate: asyncio.Semaphore | None = None

    @property
    def service_gate(self) -> asyncio.Semaphore:
        if self._service_gate is None:
            self._service_gate = asyncio.Semaphore(self.server_limits.services_at_once)
        return self._service_gate

    @property
    def peers(self) -> Mapping[str, str]:
        return self.urls

    def attach(self, *, expected_for: Callable[[str, str], ExpectedSpec | None], on_message: Callable[[Message], None],
               status: Callable[[], dict[str, Any]], meta_schema_for: Callable[[str, str], Schema | None],
               on_departed: Callable[[str, str], None] | None = None,
               on_statement: Callable[[Statement], None] | None = None) -> None:
        """Who handles what arrives: built before its node, the carrier learns it here (before `start`).
        `on_statement` hears each verified goodbye and return, with the member's signed statement."""
        self.expected_for, self.on_message, self.status = expected_for, on_message, status
        self.meta_schema_for, self.on_departed, self.on_statement = meta_schema_for, on_departed, on_statement

    def next_seq(self) -> int:
        return next(self._seq)

    # ---- serving ----------------------------------------------------------------------
    async def publish(self, version: int, round_: int, parts: Mapping[str, Mapping[str, Any]], meta: Mapping[str, Any],
                      addressed: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None) -> None:
        """Encode each part once; every read of this version reuses the body and only re-seals the header.

        `addressed` (part -> node -> tensors) are replies each served to its node only. Parts
        named "setup.*" go to the setup store, whose versions are setup steps, not rounds.
        The encoded body references the tensors' memory: `parts` must be snapshots that
        nobody changes afterwards (`p2pfl.runtime.devices.host_snapshot`)."""
        names = list(parts) + list(addressed or {})
        setup = [n.startswith(SETUP_PREFIX) for n in names]
        if any(setup) and not all(setup):
            raise ValueError(f"setup parts and round parts are published separately, got {names}")

        def encode() -> tuple[dict[str, EncodedBody], dict[str, dict[str, EncodedBody]]]:
            return ({name: encode_body(t) for name, t in parts.items()},
                    {name: {node: encode_body(t) for node, t in per_node.items()} for name, per_node in (addressed or {}).items()})

        bodies, addressed_bodies = await asyncio.to_thread(encode)
        store = self.setup_store if any(setup) else self.store
        await store.publish(Published(version, round_, bodies, dict(meta), addressed_bodies))

    def expect_readers(self, readers: Iterable[str]) -> None:
        """The peers that read this node's round parts (its neighbours): a
        version every one of them has read past is no longer held."""
        self.store.readers = frozenset(readers) - set(self.departed)

    def readers(self) -> set[str]:
        return set(self.store.readers_seen) - set(self.departed)

    def readers_so_far(self) -> Iterable[str]:
        """Every peer whose signed read this node has taken up (answered or still waiting)."""
        return self._reads_by_peer.keys()

    async def sit_out(self, round_: int) -> None:
        await self.store.sit_out(round_)

    async def withdraw(self) -> None:
        await self.store.withdraw()
        await self.setup_store.withdraw()

    async def answer_read(self, part: str, min_version: int, wait: float, requester: str) -> Frame:
        """The sealed frame of the earliest held version >= `min_version` of `part` for a verified
        `requester`, waiting up to `wait`; `Refused` (status, text) where there is none."""
        if requester in self.departed:  # as its pushes: a goodbye holds until its signed return
            raise Refused(410, f"{requester} said goodbye ({self.departed[requester] or 'no reason given'}); "
                               "a signed return of a later round takes it back")
        store: PartStore = self.setup_store if part.startswith(SETUP_PREFIX) else self.store
        if part.startswith(SETUP_PREFIX):
            published = await self.setup_store.wait_for_part(min_version, wait, part)
        else:
            published = await store.wait_for(min_version, wait)
            store.note_read(requester, min_version)
        if published is None:
            if store.withdrawn:
                raise Refused(410, f"{self.node_id} has withdrawn: it failed and serves nothing more")
            if store.sitting_out_through >= min_version:
                raise Refused(404, f"{self.node_id} sits out round {min_version} and has published nothing yet")
            raise Refused(204, "")
        body = published.bodies.get(part)
        if body is None and part in published.addressed:
            body = published.addressed[part].get(requester)
            if body is None:
                raise Refused(404, f"{self.node_id} has no {quote(part, 40)} for {requester}")
        if body is None:
            raise Refused(404, f"{self.node_id} does not share part {quote(part, 40)}")
        return seal_frame(
            key=self.key, kind="model", sender=self.node_id, recipient=requester, round=published.round,
            version=published.version, seq=self.next_seq(), part=part, meta=published.meta, body=body,
        )

    def answered(self, requester: str, part: str, min_version: int, frame: Frame) -> None:
        """A read's frame went out in full: counted, and (a round's part) its version need not
        wait for this reader to ask again (`PartStore.note_answered`)."""
        self.counter.sent(part, frame.nbytes, frame.param_bytes)
        if not part.startswith(SETUP_PREFIX):
            self.store.note_answered(requester, min_version, part)

    def accepted(self, header: Header) -> ExpectedSpec:
        """The tensors a pushed message with this authenticated head must carry. Before any body
        byte is read, refuses (a `WireError`) a kind or part this node does not take, meta off its
        schema, and a replayed or stale head."""
        if header.kind in (GOODBYE, BACK):
            expected: ExpectedSpec | None = {}
            schema: Schema | None = GOODBYE_META if header.kind == GOODBYE else BACK_META
        else:
            expected, schema = self.expected_for(header.kind, header.part), self.meta_schema_for(header.kind, header.part)
        if expected is None:
            raise NotAccepted(f"{self.node_id} does not accept kind={quote(header.kind, 40)} part={quote(header.part, 40)}")
        if schema is not None:
            check_meta(header.meta, schema)
        self.replay.check(header.sender, header.seq, header.timestamp)
        if header.kind in (GOODBYE, BACK):
            self.statement_in(header)
        return expected

    def take(self, message: Message) -> tuple[int, str]:
        """A verified pushed message handed to the node: (status, text) as the inbox answers it."""
        if message.header.kind in (GOODBYE, BACK):
            self.counter.received(CONTROL, message.total_bytes, 0)
            statement = self.statement_in(message.header)
            if message.header.kind == GOODBYE:
                self._depart(message.header.sender, str(message.header.meta.get("reason", "")), statement)
            else:
                self.take_back(statement)
            return 202, "accepted"
        if message.header.sender in self.departed:  # gone is gone: nothing it sends later is taken
            self.counter.received(REJECTED, message.total_bytes, 0)
            self.rejections.add(message.header.sender, 410, "departed", "said goodbye earlier")
            return 410, f"{message.header.sender} said goodbye; this node takes nothing more from it"
        try:
            self.on_message(message)
        except ValueError as exc:
            self.counter.received(REJECTED, message.total_bytes, 0)
            status = getattr(exc, "status", 400)
            self.rejections.add(message.header.sender, status, getattr(exc, "reason", "refused"), str(exc))
            return status, str(exc)[:1000]
        self.counter.received(message.header.part or message.header.kind, message.total_bytes, message.param_bytes)
        return 202, "accepted"

    # ---- the medium: a carrier's own -----------------------------------------------------
    _listen_at: tuple[str, int] = ("", 0)  # where `start` was asked to serve: `listen` serves there again

    async def listen(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot serve again after stop_listening")

    async def stop_listening(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot stop serving and go on reaching peers")

    # ---- reaching peers ---------------------------------------------------------------
    async def _fetch(self, peer: str, part: str, min_version: int, timeout: float) -> Message | None:
        raise NotImplementedError

    async def push(self, target: str, *, kind: str, part: str, round_: int, version: int,
                   tensors: Mapping[str, Any], meta: Mapping[str, Any], timeout: float) -> bool:
        raise NotImplementedError

    async def status_of(self, peer: str, timeout: float = 2.0) -> dict[str, Any] | None:
        raise NotImplementedError

    def opened_answer(self, peer: str, part: str, data: bytes) -> Message | None:
        """A fetched frame verified (signature, replay, tensors, meta, sender) and counted; None if refused."""
        try:
            message = open_message(
                data, roster=self.roster, recipient=self.node_id, replay=self.replay, limits=self.limits,
                expected=self.expected_for("model", part),
            )
            schema = self.meta_schema_for("model", part)
            if schema is not None:
                check_meta(message.header.meta, schema)
        except WireError as exc:
            self.counter.received(REJECTED, len(data), 0)
            self.rejections.add(peer, exc.status, exc.reason, f"fetched {part}: {exc}")
            return None
        self.counter.received(part, message.total_bytes, message.param_bytes)
        if message.header.sender != peer:
            self.rejections.add(peer, 403, "wrong_sender",
                                f"asked {peer} for {part} but the answer is signed by {message.header.sender}")
            return None
        return message

    async def fetch(self, peer: str, part: str, min_version: int, timeout: float) -> Message | None:
        """The earliest version >= `min_version` of the peer's `part` that it holds (else its
        latest), waiting up to `timeout` for `min_version`; None if it never answered or said
        goodbye (before or during the wait)."""
        if peer in self.departed:
            return None
        task = asyncio.ensure_future(self._fetch(peer, part, min_version, timeout))
        inflight = self._inflight.setdefault(peer, set())
        inflight.add(task)
        try:
            await asyncio.wait({task})  # unlike `await task`, returns when the task is cancelled by a goodbye
        finally:
            inflight.discard(task)
            if not task.done():  # this fetch itself was cancelled
                task.cancel()
        return None if task.cancelled() else task.result()
