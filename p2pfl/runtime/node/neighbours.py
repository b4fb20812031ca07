"""The neighbour table: whom this node asks, who answered, who departed or is suspected, who sits
a round out, and since which round (Flower's `ClientManager`, for a peer-to-peer node).

A node keeps `target` neighbours (the topology's degree) out of the members it knows to be live:
a neighbour that says goodbye, or stays silent in two gathers running, is replaced by a member
drawn from the rest of the roster (who *may* be a member). A silent one is watched: probed each
round, and taken back when it answers again (a restarted node), its stand-in let go.

Membership spreads with the parts nodes already exchange, as statements each member signs about
itself (`p2pfl.runtime.statements`): "live from round r" when it starts late, joins or comes back,
"left before round r" in its goodbye. A node passes on, verbatim, the statements it verified in the
last `GOSSIP_ROUNDS` rounds (at most `MAX_NEWS`), and acts on a statement only once the member's
own signature verifies: a signed departure makes the member departed (its neighbours draw a
stand-in), a later signed return takes it back. What a third party claims without the member's
signature is at most a reason to probe that neighbour before waiting for it: never final, never a
bar from the stand-in draw. Stand-ins are drawn uniformly from the eligible members, so no member
makes itself preferred by what it reports (docs/scenarios.md, "What a liar can do").

The strategy sees `ctx.peers`, `ctx.unreachable` and `ctx.departed`: the first is set from this
table each round, the other two are this table's own sets.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from p2pfl.runtime.metadata import MAX_NEWS
from p2pfl.runtime.participation import version_to_ask
from p2pfl.runtime.peer_claims import DeclaredSizes, newly_distrusted
from p2pfl.runtime.shared_tables import keys_of, own_copy
from p2pfl.runtime.statements import ROUND_SLACK, Statement
from p2pfl.runtime.strategy import Fetch

WARN_EVERY = 5  # rounds between two warnings about the same silent peer
GOSSIP_ROUNDS = 3  # rounds a node passes on what it learned: a neighbour's neighbours hear it within them


class Neighbours:
    def __init__(self, asked: Iterable[str], peer_rounds: Mapping[str, frozenset[int]] | None = None,
                 log: logging.Logger | None = None, *, members: Mapping[str, object] | Iterable[str] = (),
                 seed: int = 0) -> None:
        self.asked: tuple[str, ...] = tuple(sorted(asked))  # whom this node fetches from and waits for
        self.target = len(self.asked)
        self.members = keys_of(members, *self.asked)  # who may be asked instead: a view of the roster, not N entries
        # The rounds each takes part in, where known (participation, joins): a view of the worker's one table of joiners.
        self.peer_rounds = own_copy(peer_rounds or {})
        self.departed: set[str] = set()      # said goodbye: never asked again
        self.unreachable: set[str] = set()   # asked last time and did not answer: probed before it is waited for
        self.watched: set[str] = set()       # replaced for its silence: probed each round, taken back when it answers
        self.stand_ins: dict[str, str] = {}  # replacement -> the neighbour it stands in for
        self.events: dict[int, dict[str, Any]] = {}  # round -> what changed in the table then
        self.probe_first: set[str] = set()  # named gone without their own word: probed in the next gather, nothing more
        self.statements: dict[str, tuple[Statement, int]] = {}  # member -> its newest verified word, round learned
        self.heard_live: dict[str, int] = {}  # member -> the round its own statement said it was live (joined, back)
        self.on_back: Callable[[str], None] = lambda member: None  # the carrier takes a member back too
        self.distrusted: set[str] = set()  # far over the bound, or refused, in most rounds: asked no more
        self.push_only: set[str] = set()  # members nobody can reach: they push their parts (outbound only)
        self.conduct: dict[str, list[int]] = {}  # peer -> [rounds it answered, of them far over or refused]
        self.declared_sizes = DeclaredSizes()
        self.seed = seed
        self._warned: dict[str, int] = {}  # peer -> the round it was last reported silent
        self.log = log or logging.getLogger("p2pfl")

    def _note(self, round_: int, kind: str, peer: str, value: Any = None) -> None:
        event = self.events.setdefault(round_, {})
        if value is None:
            event.setdefault(kind, []).append(peer)
        else:
            event.setdefault(kind, {})[peer] = value

    def depart(self, peer: str, round_: int, statement: Statement | None = None) -> None:
        """`peer` left: its signed goodbye (`statement`, passed on as news), or the federation took
        it out. It is not waited for again, and a neighbour is replaced."""
        if statement is not None:
            self._learn(statement, round_)
        if peer in self.departed:
            return
        self.departed.add(peer)
        self.heard_live.pop(peer, None)
        self.unreachable.add(peer)
        self.watched.discard(peer)
        if peer in self.asked:
            self._note(round_, "departed", peer)
            self._replace(peer, round_)

    def answered(self, asked: Iterable[str], silent: Iterable[str], round_: int) -> None:
        """The outcome of a gather: `silent` peers are suspected until they answer again; one silent
        twice running (its probe failed too) is replaced and watched."""
        silent, before = set(silent), set(self.unreachable)
        for peer in sorted(silent & before - self.departed):
            if peer in self.asked and self.target:
                self._note(round_, "suspected", peer)
                self.watched.add(peer)
                self._replace(peer, round_)
        self.unreachable.clear()
        self.unreachable.update(silent | self.departed)
        self.probe_first.clear()

    def returned(self, peer: str, round_: int) -> None:
        """A watched neighbour answered its probe: asked again, and its stand-in (if any) let go."""
        if peer not in self.watched or peer in self.departed:
            return
        self.watched.discard(peer)
        self.unreachable.discard(peer)
        self._note(round_, "returned", peer)
        self._ask_again(peer)

    def told(self, statement: Statement, round_: int) -> None:
        """A goodbye or a return the member sent this node itself (verified by the carrier)."""
        if statement.event < 0:
            self.depart(statement.member, round_, statement)
        else:
            self.back(statement, round_)

    def back(self, statement: Statement, round_: int) -> None:
        """A departed member's own signed word that it is live again (a join after its goodbye):
        taken back, asked again in place of its stand-in (or where this node has room)."""
        peer = statement.member
        self._learn(statement, round_)
        self.heard_live[peer] = round_
        if peer not in self.departed:
            return
        self.departed.discard(peer)
        self.unreachable.discard(peer)
        self._note(round_, "back", peer)
        self.on_back(peer)
        if peer not in self.distrusted and (peer in self.stand_ins.values() or len(self.asked) < self.target):
            self._ask_again(peer)

    def _ask_again(self, peer: str) -> None:
        stand_in = next((s for s, gone in self.stand_ins.items() if gone == peer and s in self.asked), None)
        asked = set(self.asked) | {peer}
        if stand_in is not None:
            asked.discard(stand_in)
            del self.stand_ins[stand_in]
        self.asked = tuple(sorted(asked))

    def judge(self, answered: Iterable[str], refused: Iterable[str], factors: Mapping[str, float], round_: int) -> None:
        """One gather's conduct (`peer_claims.newly_distrusted`): a neighbour far over the bound or
        refused in most of the rounds it answered is asked no more and replaced."""
        for peer, (rounds, bad) in newly_distrusted(self.conduct, answered, refused, factors, self.distrusted):
            self.distrusted.add(peer)
            self.log.warning("round %d: %s sent parts far over the bound or refused in %d of %d rounds; "
                             "asked no more", round_, peer, bad, rounds)
            if peer in self.asked:
                self._note(round_, "distrusted", peer)
                self._replace(peer, round_)

    def admit(self, member: str, from_round: int, rounds: int, beyond_target: bool = False) -> bool:
        """A member admitted while this node runs (a federation's newcomer, or one found at the
        start): one that may stand in from now on, and asked from `from_round` on while this node
        has fewer than `target` neighbours (`beyond_target`: whatever it has; an outbound-only
        member that chose this node and pushes to it). True if it is asked."""
        if member in self.departed or member in self.distrusted:
            return False
        self.members[member] = None
        if member in self.asked:
            return True
        if len(self.asked) >= self.target and not beyond_target:
            return False
        self.peer_rounds[member] = frozenset(range(max(from_round, 1), rounds + 1))
        self.asked = tuple(sorted(set(self.asked) | {member}))
        self._note(from_round, "admitted", member)
        return True

    # ---- membership news ------------------------------------------------------------------
    def announce(self, statement: Statement, round_: int) -> None:
        """This node's own signed word (it starts late, joins or came back): news to pass on."""
        self._learn(statement, round_)

    def news_for(self, round_: int) -> dict[str, str]:
        """The statements this node passes on with the parts it publishes in `round_`: those it
        learned in the last GOSSIP_ROUNDS rounds, newest first, at most MAX_NEWS, verbatim."""
        recent = sorted(((learned, member, statement.text) for member, (statement, learned) in self.statements.items()
                         if round_ - learned < GOSSIP_ROUNDS), reverse=True)
        return {member: text for _, member, text in recent[:MAX_NEWS]}

    def hear(self, statements: Iterable[Statement], claimed_left: Iterable[str], round_: int) -> None:
        """News in a verified part: `statements` verified with each member's own key (by the
        caller, `p2pfl.runtime.statements.read_statement`), acted on when newer than what this
        node knows; `claimed_left` the members the sender named without their signed word (a lie,
        or an older node's hint): a neighbour among them is probed before it is waited for."""
        for statement in statements:
            member = statement.member
            if member not in self.members or statement.round > round_ + 1 + ROUND_SLACK:
                continue
            known = self.statements.get(member)
            if not statement.newer_than(None if known is None else known[0]):
                continue
            if statement.event < 0:
                self.depart(member, round_, statement)
            elif member in self.departed:
                self.back(statement, round_)
            else:
                self._learn(statement, round_)
                self.heard_live[member] = round_
        for member in claimed_left:
            if member in self.asked and member not in self.departed | self.unreachable | self.probe_first:
                # Probed before it is waited for (a closed port or a 410 answers at once); not
                # "unreachable": that would count as a silence and steer the strategies' choices.
                self.probe_first.add(member)
                self._note(round_, "claimed_left", member)

    def _learn(self, statement: Statement, round_: int) -> None:
        known = self.statements.get(statement.member)
        if statement.newer_than(None if known is None else known[0]):
            self.statements[statement.member] = (statement, round_)

    # ---- the table --------------------------------------------------------------------------
    def _replace(self, gone: str, round_: int) -> None:
        """`gone` is asked no more; a member drawn from the rest stands in for it, the same draw on
        every run with this seed (one stream per node, round and departed neighbour)."""
        asked = set(self.asked) - {gone}
        excluded = asked | self.departed | self.unreachable | self.watched | self.distrusted | {gone}
        # Uniform over the eligible: a member preferred for what was said of it (or of the others)
        # is one a liar can promote. A member's own signed join makes it eligible before its schedule.
        candidates = [m for m in sorted(self.members) if m not in excluded
                      and (m in self.heard_live or self.joined_by(m, round_ + 1))]
        if candidates and len(asked) < self.target:
            rng = np.random.default_rng([self.seed, round_, zlib.crc32(gone.encode())])
            chosen = candidates[int(rng.integers(len(candidates)))]
            asked.add(chosen)
            self.stand_ins[chosen] = self.stand_ins.pop(gone, gone)
            self._note(round_, "replaced", gone, chosen)
        self.asked = tuple(sorted(asked))

    def present(self, round_: int) -> tuple[str, ...]:
        """The neighbours asked that are members by `round_` (a later joiner is not there to ask yet)."""
        return tuple(p for p in self.asked if self.joined_by(p, round_))

    def joined_by(self, peer: str, round_: int) -> bool:
        rounds_in = self.peer_rounds.get(peer)
        return rounds_in is None or any(r <= round_ for r in rounds_in)

    def to_ask(self, fetches: list[Fetch], r: int, accept_stale: bool) -> tuple[list[Fetch], dict[str, int], list[str]]:
        """The fetches worth making in round `r`, the version asked of each neighbour that sits `r`
        out (the last round it took part in: served at once), and the neighbours left out (nothing
        published yet, or stale versions not taken)."""
        kept, versions, sat_out = [], {}, set()
        for fetch in fetches:
            if self.away(fetch.peer, r):
                sat_out.add(fetch.peer)
                continue
            version = version_to_ask(self.peer_rounds.get(fetch.peer), r, accept_stale)
            if version is None:
                sat_out.add(fetch.peer)
                continue
            if version != r:
                versions[fetch.peer] = version
            kept.append(fetch)
        return kept, versions, sorted(sat_out)

    def away(self, peer: str, r: int) -> bool:
        """`peer`'s newest word says it is back from a round after `r`: away in `r`, not waited for."""
        said = self.statements.get(peer)
        return said is not None and said[0].event > r

    def warn_silent(self, r: int, silent: set[str]) -> set[str]:
        """A warning per peer that was asked for and did not answer, at most once in WARN_EVERY
        rounds; returns those peers, less the ones that said goodbye."""
        unanswered = {p for p in silent - self.departed if not self.away(p, r)}
        for peer in sorted(unanswered):
            if r - self._warned.get(peer, -WARN_EVERY) >= WARN_EVERY:
                self._warned[peer] = r
                self.log.warning("round %d: %s did not answer (no warning about it again for %d rounds)",
                                 r, peer, WARN_EVERY - 1)
        return unanswered

    def changes(self) -> dict[str, Any]:
        """What changed in the table since the last call (for the round's record): departed,
        suspected, replaced (gone -> stand-in), returned; a goodbye that came between two rounds
        is in the next one's."""
        merged: dict[str, Any] = {}
        for round_ in sorted(self.events):
            for kind, value in self.events[round_].items():
                if isinstance(value, dict):
                    merged.setdefault(kind, {}).update(value)
                else:
                    merged.setdefault(kind, []).extend(value)
        self.events.clear()
        return merged

    def goodbye_targets(self, readers: Iterable[str]) -> list[str]:
        """Whom a leaving node tells: those it asks and those that read it; the rest hear it from them."""
        return sorted((set(self.asked) | set(readers)) - self.departed)

    def state_dict(self) -> dict[str, Any]:
        return {"declared_sizes": dict(self.declared_sizes.pinned), "distrusted": sorted(self.distrusted),
                "conduct": {p: list(c) for p, c in self.conduct.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.declared_sizes = DeclaredSizes(state.get("declared_sizes"))  # checkpoints made before it carry none
        self.conduct = {str(p): [int(c[0]), int(c[1])] for p, c in (state.get("conduct") or {}).items()}
        self.distrusted = {str(p) for p in state.get("distrusted") or []}
        self.asked = tuple(p for p in self.asked if p not in self.distrusted)
