"""Nodes built in code (no scenario file, no run folder to read): a tiny model, random data, the
loopback carrier and a two-line strategy; the seam below `Node` that a round is tested through."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from p2pfl.data import NodeData
from p2pfl.data.types import Split
from p2pfl.hosting.ports import free_ports
from p2pfl.models import build_model
from p2pfl.runtime.accounting import ByteCounter
from p2pfl.runtime.churn import NodeScript
from p2pfl.runtime.config import NodeConfig
from p2pfl.runtime.node import Node, NodeParts
from p2pfl.runtime.peers import PeerInfo
from p2pfl.runtime.settings import NodeSettings
from p2pfl.runtime.strategy import Fetch, PeerModel, RoundContext, Strategy
from p2pfl.runtime.transport import TransportSettings, build_transport
from p2pfl.training.config import TrainConfig
from p2pfl.training.trainer import LocalTrainer
from p2pfl.wire import NodeKey, Roster, WireLimits

SETTINGS = NodeSettings(
    algorithm="ask-everyone", rounds=4, seed=0, fetch_timeout_s=5.0, coordinator_wait_s=5.0, setup_wait_s=30.0,
    start_wait_s=5.0, linger_s=0.2, participation=1.0, accept_stale=True, wire_precision="float32",
    max_weight_ratio=4.0, max_norm_ratio=1000.0, update_bound=0.0)


class AskEveryone(Strategy):
    """Fetch every neighbour's full model; keep the own one (the arrivals are what a test looks at)."""

    name = "ask-everyone"
    shared_parts = ("full",)

    def configure_fetch(self, ctx: RoundContext) -> list[Fetch]:
        return [Fetch(peer, "full") for peer in ctx.peers]

    def aggregate(self, ctx: RoundContext, arrived: list[PeerModel]) -> None:
        ctx.artefacts.record("arrivals", sorted((m.sender, m.version) for m in arrived))


def _split(n: int, generator: torch.Generator) -> Split:
    return Split(torch.rand(n, 1, 8, 8, generator=generator), torch.randint(0, 4, (n,), generator=generator))


def code_nodes(tmp_path: Path, n: int, neighbours: Sequence[Sequence[int]], *, settings: NodeSettings = SETTINGS,
               scripts: Sequence[NodeScript] | None = None, carrier: str = "loopback", joining: Sequence[int] = (),
               **parts: Any) -> list[Node]:
    """`n` nodes `node-0`.. whose node i asks `neighbours[i]` (indices), each with 24 random samples;
    those in `joining` join a running federation (`p2pfl node --join`)."""
    ids = [f"node-{i}" for i in range(n)]
    keys = [NodeKey.generate() for _ in ids]
    roster = Roster({nid: k.public_hex for nid, k in zip(ids, keys)})
    ports = free_ports(n, "127.0.0.1")
    urls = {nid: f"http://127.0.0.1:{p}" for nid, p in zip(ids, ports)}
    scripts = scripts or [NodeScript()] * n
    joins_late = frozenset(ids[j] for j in range(n) if scripts[j].late)
    nodes = []
    for i, nid in enumerate(ids):
        generator = torch.Generator().manual_seed(i)
        torch.manual_seed(0)  # one initial model, as FedAvg assumes
        model = build_model("cnn", 1, 8, 4)
        keys[i].save(tmp_path / f"{nid}.key")
        others = {p: urls[p] for p in ids if p != nid}
        counter = ByteCounter()
        transport = build_transport(carrier, TransportSettings(
            node_id=nid, key=keys[i], roster=roster, urls=others, counter=counter,
            limits=WireLimits(max_message_bytes=2**22), retry_s=0.02, log=logging.getLogger(f"kit.{nid}")))
        node_parts = NodeParts(
            data=NodeData(i, _split(24, generator), _split(8, generator), _split(8, generator), None),
            device=torch.device("cpu"), model=model, trainer=LocalTrainer(TrainConfig(batch_size=8), seed=i),
            strategy=AskEveryone(), fresh_strategy=AskEveryone, privacy=None, attack=None, key=keys[i],
            transport=transport, counter=counter, neighbours=tuple(ids[j] for j in neighbours[i]), seed=i,
            script=scripts[i], joins_late=joins_late - {nid},
            peer_rounds={ids[j]: frozenset(range(scripts[j].join, settings.rounds + 1))
                         for j in range(n) if scripts[j].join > 1 and j != i})
        for key, value in parts.items():
            setattr(node_parts, key, value)
        config = NodeConfig(id=nid, index=i, host="127.0.0.1", port=ports[i], key_file=tmp_path / f"{nid}.key",
                            scenario=tmp_path / "none.toml", out=tmp_path / "run",
                            peers={p: PeerInfo(urls[p], keys[ids.index(p)].public_hex) for p in others})
        nodes.append(Node(config, dataclasses.replace(settings), node_parts, join=i in joining))
    return nodes
