"""A federation's member, beside its node: it serves the member exchange on the node's port, keeps
the node's carrier (whose messages verify, where each member is) and neighbour table in step with
the directory, and before round 1 waits until the federation has the members the scenario names.

Built before the node (discovery from the seeds runs first: a node no seed admits stops before it
builds a model), started by the node once its port is open (`p2pfl.runtime.node.parts.Companion`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import tomllib
from pathlib import Path
from typing import Any

import msgpack
import tomli_w

from p2pfl.runtime.federation.config import FederationConfig
from p2pfl.runtime.federation.directory import Directory
from p2pfl.runtime.federation.gossip import SERVICE, Gossip
from p2pfl.runtime.federation.records import MemberRecord, sign_record
from p2pfl.errors import ConfigError
from p2pfl.runtime.federation.certificates import Certificate, Refused, Revocations
from p2pfl.runtime.node.parts import NodeHandle
from p2pfl.runtime.node.peer_directory import Member
from p2pfl.runtime.tls import fingerprint
from p2pfl.wire import NodeKey

WAIT_LOG_EVERY_S = 5.0


class FederationMember:
    name = "federation"

    def __init__(self, config: FederationConfig, key: NodeKey, *, expected_members: int, degree: int | None,
                 seed: int = 0, tls: bool = False, log: logging.Logger | None = None) -> None:
        """`tls`: the members serve HTTPS (runtime.tls); each record names its certificate's
        fingerprint, which the others pin."""
        self.config = config
        self.log = log or logging.getLogger("p2pfl.federation")
        certificate = Certificate.load(config.certificate)
        own = sign_record(key, certificate, config.url, now=time.time(),
                          tls_fingerprint=fingerprint(key, certificate.member) if tls else None)
        self.directory = Directory(config.public_key, own, log=self.log)
        self._load_revocations(config.revocations_file)
        self.directory.on_revocations.append(self._keep_revocations)
        self.directory.on_revoked_self.append(self._revoked)
        self.gossip = Gossip(self.directory, period_s=config.gossip_s, seed=seed, log=self.log)
        self.expected_members = expected_members
        self.degree = degree  # neighbours to keep (None: every member, a full topology)
        self.node: NodeHandle | None = None
        self.removed: list[dict[str, Any]] = []

    def _load_revocations(self, path: Path) -> None:
        """The newest list this member kept (or its operator put there): a seed restarted from
        nothing still refuses whom the federation revoked."""
        if not path.is_file():
            return
        try:
            self.directory.offer_revocations(tomllib.loads(path.read_text()))
        except (tomllib.TOMLDecodeError, Refused) as exc:
            raise ConfigError("federation.revocations", f"{path}: not this federation's signed revocation list ({exc})") from None
        self.log.info("revocation list %d read from %s (%d revoked)", self.directory.revocations.number, path,
                      len(self.directory.revocations.revoked))

    def _keep_revocations(self, revocations: Revocations) -> None:
        path = self.config.revocations_file
        swap = path.with_name(path.name + ".swap")
        swap.write_text(tomli_w.dumps(revocations.to_dict()))
        os.replace(swap, path)

    def _revoked(self, reason: str) -> None:
        self.log.error("%s", reason)
        if self.node is not None:
            self.node.stop_soon("revoked", reason)

    @property
    def member(self) -> str:
        return self.directory.own.member

    async def discover(self) -> None:
        """Exchange with the seeds (NoSeedAnswered if none admits this node); the session ends with it."""
        try:
            await self.gossip.discover(self.config.seeds, self.config.seed_wait_s)
        finally:
            await self.gossip.close()

    # ---- beside the node ----------------------------------------------------------------------
    async def start(self, node: NodeHandle) -> None:
        self.node = node
        node.peers.serve(SERVICE, self.serve)
        self.gossip.call = node.peers.caller()
        node.peers.reachable(self.config.url is not None)
        node.peers.keep(self.degree or 1 << 30)
        if self.directory.revoked_self:  # told while it discovered: it does not start its rounds
            node.stop_soon("revoked", self.directory.revoked_self)
        self.directory.on_admitted.append(self._admitted)
        self.directory.on_removed.append(self._removed)
        for record in list(self.directory.records.values()):
            self._admitted(record)
        # Every member it knows hears of it now, not at their next gossip: one that has not would
        # refuse its reads in round 1 as from an unknown sender.
        await self.gossip.announce()
        self.gossip.start()
        if node.arrival == "fresh":
            await self._wait_for_members(node.settings.start_wait_s)

    async def _wait_for_members(self, seconds: float) -> None:
        """Until the directory knows the scenario's `nodes` members (this one included), at most `seconds`."""
        loop = asyncio.get_running_loop()
        deadline, said = loop.time() + seconds, loop.time()
        while len(self.directory.records) + 1 < self.expected_members and loop.time() < deadline:
            if loop.time() - said >= WAIT_LOG_EVERY_S:
                said = loop.time()
                self.log.info("waiting for members: %d of %d known", len(self.directory.records) + 1,
                              self.expected_members)
            await asyncio.sleep(0.2)
        if len(self.directory.records) + 1 < self.expected_members:
            self.log.warning("starting with %d of the %d members the scenario names (runtime.start_wait_s passed)",
                             len(self.directory.records) + 1, self.expected_members)

    def _admitted(self, record: MemberRecord) -> None:
        if self.node is not None:
            self.node.peers.admit(Member(record.member, record.public_key, record.certificate.expires, record.url,
                                         record.tls_fingerprint))

    def _removed(self, member: str, cause: str, detail: str) -> None:
        self.removed.append({"member": member, "cause": cause, "round": self.node.round if self.node else 0,
                             "at": time.time()})
        if self.node is not None:
            self.node.peers.refuse(member, cause, detail)

    async def serve(self, body: bytes | None) -> tuple[int, bytes]:
        """POST: a member exchange. GET: the members this node sees (public, as its status is)."""
        if body is not None:
            return await self.gossip.handle(body)
        own = self.directory.own
        members = [{"member": m, "url": r.url, "expires": r.certificate.expires}
                   for m, r in sorted(self.directory.records.items())]
        listing = {"self": {"member": own.member, "url": own.url, "round": self.node.round if self.node else 0},
                   "members": members, "revocations": self.directory.revocations.number,
                   "refused": {m: cause for m, (cause, _) in sorted(self.directory.refused.items())[:100]}}
        return 200, msgpack.packb(listing, use_bin_type=True)

    async def stop(self) -> None:
        await self.gossip.close()

    def summary(self) -> dict[str, Any]:
        return {"members": sorted(self.directory.records), "removed": self.removed,
                "refused": {m: cause for m, (cause, _) in sorted(self.directory.refused.items())},
                "revocations": self.directory.revocations.number, "exchanges": self.gossip.exchanges,
                "refused_by": self.gossip.refused_by or None}
