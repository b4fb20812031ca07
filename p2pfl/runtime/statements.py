"""Membership statements: what a member says of itself, signed with its own key, so that whoever
relays it cannot change it (hivemind's signed DHT records, for one fact: "I am live" or "I left").

A statement is `(member, event, run)`: event `+r` (live from round r: it started, joined or came
back) or `-r` (left before round r: its goodbye). Only the member's own key makes one; a node
passes on the statements it verified, verbatim, for `GOSSIP_ROUNDS` rounds; a later round's
statement supersedes an earlier one (a member that left and joins again by its own signed word is
taken back). `run` binds it to this run: a statement signed in another run does not verify here.
On the wire a statement is the text `"<event>:<signature hex>"` under the member's id.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import msgpack

from p2pfl.wire import NodeKey, Roster, WireError

DOMAIN = "p2pfl-membership-statement/1"  # signed with the payload: a frame's signature can never pass for one
ROUND_SLACK = 6  # rounds from a node's next one within which a goodbye or return is taken (nodes drift apart)
MAX_STATEMENT_CHARS = 160  # a signed round of up to 10 digits and 128 hex characters of signature


class BadStatement(WireError):
    status = 403
    reason = "bad_statement"


@dataclass(frozen=True)
class Statement:
    member: str
    event: int  # +r: live from round r; -r: left before round r
    text: str   # as it travels: "<event>:<signature hex>"

    @property
    def round(self) -> int:
        return abs(self.event)

    def newer_than(self, other: Statement | None) -> bool:
        """A later round's word wins; in one round, coming back (live from r) follows leaving (before r)."""
        if other is None:
            return True
        return (self.round, self.event > 0) > (other.round, other.event > 0)


def _payload(run: str, member: str, event: int) -> bytes:
    return msgpack.packb([DOMAIN, run, member, event], use_bin_type=True)


def sign_statement(key: NodeKey, run: str, member: str, event: int) -> Statement:
    if event == 0:
        raise ValueError("a statement's event is +r (live from round r) or -r (left before round r), never 0")
    return Statement(member, event, f"{event}:{key.sign(_payload(run, member, event)).hex()}")


def read_statement(member: str, text: object, roster: Roster, run: str) -> Statement:
    """The statement `text` about `member`, verified with `member`'s own roster key; BadStatement
    naming what is wrong (not a string, malformed, not signed by `member` in this run)."""
    if not isinstance(text, str) or len(text) > MAX_STATEMENT_CHARS or text.count(":") != 1:
        raise BadStatement(f"statement about {member!r} must be '<round>:<signature hex>' of at most "
                           f"{MAX_STATEMENT_CHARS} characters")
    event_text, signature_hex = text.split(":")
    try:
        event, signature = int(event_text), bytes.fromhex(signature_hex)
    except ValueError:
        raise BadStatement(f"statement about {member!r}: round or signature not readable") from None
    if event == 0:
        raise BadStatement(f"statement about {member!r}: round 0 is no event")
    try:
        roster.verify(member, signature, _payload(run, member, event))
    except WireError as exc:
        raise BadStatement(f"statement about {member!r} is not its own signed word in this run: {exc}") from None
    return Statement(member, event, text)


def read_news(news: object, roster: Roster, run: str,
              known: Mapping[str, tuple[Statement, int]] | None = None) -> tuple[list[Statement], list[str]]:
    """A part's membership news: the statements that verify, and the members it says left without
    their signed word (a third party's claim: at most a reason to probe). A statement no newer
    than the one `known` holds for its member changes nothing and is not verified again: a
    thousand-node run relays the same few statements through every part for three rounds."""
    verified, claimed_left = [], []
    for member, text in (news.items() if isinstance(news, dict) else ()):
        held = None if known is None else known.get(member)
        if held is not None and isinstance(text, str) and not _newer_text(text, held[0]):
            continue
        try:
            verified.append(read_statement(member, text, roster, run))
        except BadStatement:
            if isinstance(text, str) and text.lstrip().startswith("-"):
                claimed_left.append(member)
    return verified, claimed_left


def _newer_text(text: str, held: Statement) -> bool:
    """Whether `text` claims a later word than `held` (unverified: only worth verifying if so)."""
    try:
        event = int(text.split(":", 1)[0])
    except ValueError:
        return False
    return event != 0 and Statement(held.member, event, text).newer_than(held)
