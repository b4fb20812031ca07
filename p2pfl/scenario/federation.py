"""A node's place in a federation, from its config's `[federation]` table and its scenario: the
checks a federation makes of the scenario, then discovery from the seeds (`p2pfl node` runs it
before it builds a model, so a node no seed admits stops at once)."""

from __future__ import annotations

import asyncio
import logging
import zlib

from p2pfl.algorithms import needs_coordinator
from p2pfl.errors import ConfigError
from p2pfl.runtime.config import NodeConfig
from p2pfl.runtime.federation.service import FederationMember
from p2pfl.runtime.topology import Topology
from p2pfl.runtime.transport.addresses import HTTP
from p2pfl.scenario.schema import load_scenario
from p2pfl.wire import NodeKey


def federation_member(config: NodeConfig) -> FederationMember:
    """This node's federation member, admitted by a seed already (NoSeedAnswered: by none)."""
    assert config.federation is not None
    sc = load_scenario(config.scenario, config.overrides)
    if sc.runtime.transport not in ("http", "colocated"):
        raise ConfigError("runtime.transport", f"a federation's members reach each other over HTTP; "
                                               f"{sc.runtime.transport!r} cannot")
    if needs_coordinator(sc.algorithm.name, sc.algorithm.params):
        raise ConfigError("algorithm.name", f"{sc.algorithm.name} has a global step, run by a coordinator, which a "
                                            "federation does not have yet; use a roster (p2pfl lan) for it")
    scheme = HTTP.scheme(sc.runtime.tls)
    for where, url in [("federation.url", config.federation.url), *(("federation.seeds", s) for s in config.federation.seeds)]:
        if url is not None and not url.startswith(f"{scheme}://"):
            raise ConfigError(where, f"{url}: runtime.tls is {str(sc.runtime.tls).lower()}, so members are reached at "
                                     f"{scheme}:// addresses")
    topology = Topology.parse(sc.runtime.topology)
    degree = None if topology.kind == "full" else 2 if topology.kind == "ring" else topology.degree
    member = FederationMember(config.federation, NodeKey.load(config.key_file), expected_members=sc.nodes,
                              degree=degree, seed=zlib.crc32(config.id.encode()), tls=sc.runtime.tls,
                              log=logging.getLogger(f"p2pfl.{config.id}"))
    logging.getLogger("p2pfl").info("trains on this host's own data (data.dataset = %r, all of it); finds its "
                                    "peers from %s", sc.data.dataset, ", ".join(config.federation.seeds))
    asyncio.run(member.discover())
    return member
