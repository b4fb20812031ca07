"""The neighbour table: whom this node asks, who answered, who departed or is suspected, who sits
a round out, and since which round (Flower's `ClientManager`, for a peer-to-peer node).

A node keeps `target` neighbours (the topology's degree) out of the members it knows to be live:
a neighbour that says goodbye, or stays silent in two gathers running, is replaced by a member
drawn from the rest of the roster (who *may* be a member). A silent one is watched: probed each
round, and taken back when it answers again (a restarted node), its stand-in let go.

Membership spreads with the parts nodes already exchange: each published model part carries the
news its node learned in the last `GOSSIP_ROUNDS` rounds (a member joined in round r, or left), at
most `MAX_NEWS` entries, signed with the frame. News is a hint, never a verdict: a member reported
gone is probed before it is waited for (a closed port or a 410 answers at once) and never drawn as
a stand-in; a member reported joined is preferred as one. Only roster members are news (admission
stays the roster's), and only a signed goodbye makes a peer departed.

The strategy sees `ctx.peers`, `ctx.unreachable` and `ctx.departed`: the first is set from this
table each round, the other two are this table's own sets.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from p2pfl.runtime.metadata import MAX_NEWS
from p2pfl.runtime.participation import version_to_ask
from p2pfl.runtime.peer_claims import FAR_BOUND_FACTOR, DeclaredSizes
from p2pfl.runtime.strategy import Fetch

WARN_EVERY = 5  # rounds between two warnings about the same silent peer
DISTRUST_AFTER = 3  # rounds a neighbour answered before its conduct can have it dropped
GOSSIP_ROUNDS = 3  # rounds a node passes on what it learned: a neighbour's neighbours hear it within them


class Neighbours:
    def __init__(self, asked: Iterable[str], peer_rounds: Mapping[str, frozenset[int]] | None = None,
                 log: logging.Logger | None = None, *, members: Iterable[str] = (), seed: int = 0) -> None:
        self.asked: tuple[str, ...] = tuple(sorted(asked))  # whom this node fetches from and waits for
        self.target = len(self.asked)
        self.members = tuple(sorted(set(members) | set(self.asked)))  # who may be asked instead (the roster)
        self.peer_rounds = dict(peer_rounds or {})  # the rounds each takes part in, where known (participation, joins)
        self.departed: set[str] = set()      # said goodbye: never asked again
        self.unreachable: set[str] = set()   # asked last time and did not answer: probed before it is waited for
        self.watched: set[str] = set()       # replaced for its silence: probed each round, taken back when it answers
        self.stand_ins: dict[str, str] = {}  # replacement -> the neighbour it stands in for
        self.events: dict[int, dict[str, Any]] = {}  # round -> what changed in the table then
        self.news: dict[str, tuple[int, int]] = {}  # member -> (+r joined in r / -r left before r, round learned)
        self.heard_live: dict[str, int] = {}  # member -> the round news said it was live (joined, back)
        self.reported_left: set[str] = set()  # news says it left: probed before waited for, never a stand-in
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

    def depart(self, peer: str, round_: int) -> None:
        """`peer` said goodbye (signed; the carrier keeps its reason): it is not waited for again, and
        a neighbour is replaced."""
        if peer in self.departed:
            return
        self.departed.add(peer)
        self._learn(peer, -max(round_, 1), round_)
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

    def returned(self, peer: str, round_: int) -> None:
        """A watched neighbour answered its probe: asked again, and its stand-in (if any) let go."""
        if peer not in self.watched or peer in self.departed:
            return
        self.watched.discard(peer)
        self.unreachable.discard(peer)
        self._note(round_, "returned", peer)
        self.announce(peer, round_)
        stand_in = next((s for s, gone in self.stand_ins.items() if gone == peer and s in self.asked), None)
        asked = set(self.asked) | {peer}
        if stand_in is not None:
            asked.discard(stand_in)
            del self.stand_ins[stand_in]
        self.asked = tuple(sorted(asked))

    def judge(self, answered: Iterable[str], refused: Iterable[str], factors: Mapping[str, float], round_: int) -> None:
        """One gather's conduct: a neighbour whose part lay FAR_BOUND_FACTOR or more times over the
        update bound, or was refused, in most of the (at least DISTRUST_AFTER) rounds it answered
        is asked no more and replaced: pulled back, a colluding pair just under the refusal still
        cost FedAvg 6.5 points. Honest parts lay at most 10.8 times over once (docs/security.md)."""
        refused = set(refused)
        for peer in sorted(set(answered) | refused):
            seen = self.conduct.setdefault(peer, [0, 0])
            seen[0] += 1
            seen[1] += peer in refused or factors.get(peer, 0.0) >= FAR_BOUND_FACTOR
            if seen[0] >= DISTRUST_AFTER and 2 * seen[1] > seen[0] and peer not in self.distrusted:
                self.distrusted.add(peer)
                self.log.warning("round %d: %s sent parts far over the bound or refused in %d of %d rounds; "
                                 "asked no more", round_, peer, seen[1], seen[0])
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
        self.members = tuple(sorted(set(self.members) | {member}))
        if member in self.asked:
            return True
        if len(self.asked) >= self.target and not beyond_target:
            return False
        self.peer_rounds[member] = frozenset(range(max(from_round, 1), rounds + 1))
        self.asked = tuple(sorted(set(self.asked) | {member}))
        self._note(from_round, "admitted", member)
        return True

    # ---- membership news ------------------------------------------------------------------
    def announce(self, member: str, first_round: int) -> None:
        """This node (or a member it saw come back) is live from `first_round`: news to pass on."""
        self._learn(member, max(first_round, 1), first_round)

    def news_for(self, round_: int) -> dict[str, int]:
        """The news this node passes on with the parts it publishes in `round_`: what it learned in
        the last GOSSIP_ROUNDS rounds, newest first, at most MAX_NEWS entries."""
        recent = sorted(((learned, member, event) for member, (event, learned) in self.news.items()
                         if round_ - learned < GOSSIP_ROUNDS), reverse=True)
        return {member: event for _, member, event in recent[:MAX_NEWS]}

    def hear(self, sender: str, news: Mapping[str, int] | None, round_: int) -> None:
        """News in a verified part from `sender` (`MODEL_META`'s "members"), taken for roster
        members only and passed on once: a join makes the member a preferred stand-in; a departure
        is probed before the member is waited for again."""
        for member, event in (news or {}).items():
            if member not in self.members or member in self.departed or member == sender and event < 0:
                continue
            known = self.news.get(member)
            if known is not None and (known[0] == event or known[0] < 0):  # heard already; gone is final
                continue
            self._learn(member, int(event), round_)
            if event > 0:
                self.heard_live[member] = round_
                self.reported_left.discard(member)
            else:
                self.reported_left.add(member)
                self.heard_live.pop(member, None)
                if member in self.asked:
                    self.unreachable.add(member)  # probed first: a closed port or a 410 answers at once
                    self._note(round_, "reported_left", member)

    def _learn(self, member: str, event: int, round_: int) -> None:
        self.news[member] = (event, round_)

    # ---- the table --------------------------------------------------------------------------
    def _replace(self, gone: str, round_: int) -> None:
        """`gone` is asked no more; a member drawn from the rest stands in for it, the same draw on
        every run with this seed (one stream per node, round and departed neighbour)."""
        asked = set(self.asked) - {gone}
        excluded = (asked | self.departed | self.unreachable | self.watched | self.reported_left | self.distrusted
                    | {gone})
        candidates = [m for m in self.members if m not in excluded and self.joined_by(m, round_ + 1)]
        # Members news says are live first; without any, the roster's others (a closed port costs nothing).
        candidates = [m for m in candidates if m in self.heard_live] or candidates
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
            version = version_to_ask(self.peer_rounds.get(fetch.peer), r, accept_stale)
            if version is None:
                sat_out.add(fetch.peer)
                continue
            if version != r:
                versions[fetch.peer] = version
            kept.append(fetch)
        return kept, versions, sorted(sat_out)

    def warn_silent(self, r: int, silent: set[str]) -> set[str]:
        """A warning per peer that was asked for and did not answer, at most once in WARN_EVERY
        rounds; returns those peers, less the ones that said goodbye."""
        unanswered = silent - self.departed
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
