"""The members one node knows of: their newest checked records, the newest revocation list, and
who was refused and why. No networking: records and lists come in (`offer`), verdicts go out to
whoever listens (the node's carrier and neighbour table, through `p2pfl.runtime.federation.service`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from p2pfl.runtime.federation.certificates import (EXPIRED, REVOKED, Refused, Revocations, check_revocations,
                                           empty_revocations)
from p2pfl.runtime.federation.records import MemberRecord, check_record
from p2pfl.wire.errors import quote

MAX_RECORDS = 4096  # in one exchange: a federation larger than this spreads over several
MAX_REFUSED = 256  # claimed ids whose refusal is kept (and logged) by name
# Refused records after which the rest of an exchange is not read: each costs two signature
# checks, and an honest member passes on few a member refuses (a revocation it had not heard of).
REFUSED_PER_EXCHANGE = 16

Admitted = Callable[[MemberRecord], None]
Removed = Callable[[str, str, str], None]  # member, cause, detail


class Directory:
    def __init__(self, federation_public: str, own: MemberRecord, *, log: logging.Logger | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.federation = federation_public
        self.own = own
        self.records: dict[str, MemberRecord] = {}
        self.revocations: Revocations = empty_revocations(federation_public)
        self.refused: dict[str, tuple[str, str]] = {}  # claimed id -> (cause, detail): the last refusal of each
        self.refusals = 0  # records refused, all told
        self.clock = clock
        self.log = log or logging.getLogger("p2pfl.federation")
        self.on_admitted: list[Admitted] = []
        self.on_removed: list[Removed] = []
        self.on_revocations: list[Callable[[Revocations], None]] = []  # a newer list taken (kept on disk)
        self.revoked_self: str | None = None  # why this member itself is out, once a list says so
        self.on_revoked_self: list[Callable[[str], None]] = []

    # ---- what comes in ------------------------------------------------------------------------
    def offer_revocations(self, raw: Any) -> bool:
        """Take a revocation list newer than the one held (checked first); True if it was newer.
        Every member it revokes is removed now."""
        revocations = raw if isinstance(raw, Revocations) else Revocations.from_dict(raw)
        check_revocations(revocations, self.federation)
        if revocations.number <= self.revocations.number:
            return False
        self.revocations = revocations
        for member in sorted(set(self.records) & set(revocations.revoked)):
            record = self.records[member]
            if record.certificate.issued <= revocations.revoked[member]:
                self._remove(member, REVOKED, f"{member} was revoked by the federation")
        for keep in self.on_revocations:
            keep(revocations)
        own = self.own.member
        if own in revocations.revoked and self.own.certificate.issued <= revocations.revoked[own] and not self.revoked_self:
            self.revoked_self = (f"{own} was revoked by the federation (revocation list {revocations.number}); "
                                 "the operator admits it again with a new certificate")
            for told in self.on_revoked_self:
                told(self.revoked_self)
        return True

    def offer(self, raw: Any) -> MemberRecord | None:
        """Take one member record: the newly admitted (or moved) member's record, None if it changes
        nothing. Refused (after noting it) if the record is not admissible."""
        try:
            record = raw if isinstance(raw, MemberRecord) else MemberRecord.from_dict(raw)
        except Refused as refused:
            claimed = raw.get("member") if isinstance(raw, Mapping) else None
            self.note_refusal(claimed if isinstance(claimed, str) and claimed else "?", refused)
            raise
        if record.member == self.own.member:
            return None
        known = self.records.get(record.member)
        if known is not None and known.at >= record.at:
            return None
        try:
            check_record(record, self.federation, now=self.clock(), revocations=self.revocations)
        except Refused as refused:
            self.note_refusal(record.member, refused)
            raise
        self.records[record.member] = record
        self.refused.pop(record.member, None)
        if known is None:
            self.log.info("member %s admitted (%s)", record.member, record.url or "outbound only")
        for listener in self.on_admitted:
            listener(record)
        return record

    def offer_many(self, raws: Iterable[Any]) -> list[MemberRecord]:
        """Each of `raws` as `offer` takes it; a refused one is noted and skipped, not fatal."""
        admitted, refused = [], 0
        for i, raw in enumerate(raws):
            if i >= MAX_RECORDS or refused >= REFUSED_PER_EXCHANGE:
                break
            try:
                record = self.offer(raw)
            except Refused:
                refused += 1
                continue
            if record is not None:
                admitted.append(record)
        return admitted

    def note_refusal(self, member: str, refused: Refused) -> None:
        """Kept for the first MAX_REFUSED claimed ids (each chosen by whoever sent it); the rest counted."""
        self.refusals += 1
        if member not in self.refused and len(self.refused) >= MAX_REFUSED:
            return
        if self.refused.get(member, (None,))[0] != refused.cause:
            self.log.warning("refused member %s: %s", quote(member, 40), refused)
        self.refused[member] = (refused.cause, refused.detail)

    def expire(self) -> list[str]:
        """Remove the members whose certificates have expired by now; their ids."""
        now = self.clock()
        gone = [m for m, r in self.records.items() if r.certificate.expires is not None and now >= r.certificate.expires]
        for member in gone:
            self._remove(member, EXPIRED, f"{member}'s certificate expired")
        return gone

    def _remove(self, member: str, cause: str, detail: str) -> None:
        self.records.pop(member, None)
        self.refused[member] = (cause, detail)
        self.log.warning("member %s removed: %s", member, detail)
        for listener in self.on_removed:
            listener(member, cause, detail)

    # ---- what goes out -------------------------------------------------------------------------
    def reachable(self) -> dict[str, str]:
        """member -> URL, of the members others can reach."""
        return {m: r.url for m, r in sorted(self.records.items()) if r.url is not None}

    def payload(self, with_records: bool = True) -> dict[str, Any]:
        """What this node says in an exchange: its own record, what it knows, the newest revocations."""
        out: dict[str, Any] = {"from": self.own.to_dict(), "revocations": self.revocations.to_dict()}
        if with_records:
            out["records"] = [r.to_dict() for r in list(self.records.values())[:MAX_RECORDS]]
        return out

    def take(self, payload: Mapping[str, Any]) -> tuple[bool, list[MemberRecord]]:
        """An exchange's payload (a peer's, or its answer): (a newer revocation list came,
        the members it admitted). The sender's own record, if any, is offered first; its refusal
        is raised (the exchange is refused), the others' are noted."""
        newer, revocations = False, payload.get("revocations")
        if isinstance(revocations, Mapping) and revocations.get("number"):  # number 0: it knows of none
            newer = self.offer_revocations(revocations)
        admitted = []
        if payload.get("from") is not None:
            own = self.offer(payload["from"])
            admitted += [own] if own is not None else []
        return newer, admitted + self.offer_many(payload.get("records") or [])
