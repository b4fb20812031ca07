"""The setup exchange before round 1 (`p2pfl.runtime.strategy.SetupExchange`) over a node's
`Exchange`: the strategy's `setup` runs in a worker thread and calls these, which run on the
node's event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from p2pfl.runtime.devices import host_snapshot
from p2pfl.runtime.node.intake import RoundChecks
from p2pfl.runtime.strategy import Fetch, PeerModel, setup_part

if TYPE_CHECKING:
    from p2pfl.runtime.node.exchange import Exchange


class SetupExchange:
    """`p2pfl.runtime.strategy.SetupExchange` over an `Exchange`: blocking calls from the strategy's
    worker thread, run on the node's event loop."""

    def __init__(self, exchange: Exchange, loop: asyncio.AbstractEventLoop, *, late: bool = False,
                 joiners: bool = False) -> None:
        self.exchange, self.loop, self.late, self.joiners = exchange, loop, late, joiners
        settings = exchange.settings
        self.wait = settings.fetch_timeout_s if late else settings.setup_wait_s

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def publish(self, step: int, parts: Mapping[str, Mapping[str, torch.Tensor]], meta: Mapping[str, Any]) -> None:
        snapshot = {setup_part(name): host_snapshot(dict(t)) for name, t in parts.items()}
        meta = {"n_train": self.exchange.intake.n_train, **meta}
        self._run(self.exchange.transport.publish(step, 0, snapshot, meta))

    def push(self, step: int, pushes: Any) -> None:
        async def send() -> list[bool]:
            timeout = self.exchange.settings.fetch_timeout_s
            return await asyncio.gather(*(
                self.exchange.transport.push(p.target, kind=p.kind, part=p.part, round_=0, version=step,
                                             tensors=host_snapshot(dict(p.tensors)), meta=p.meta, timeout=timeout)
                for p in pushes
            ))

        refused = [p.target for p, ok in zip(pushes, self._run(send())) if not ok]
        if refused:
            raise RuntimeError(f"setup step {step}: {refused} did not take this node's push (see their rejections)")

    def fetch(self, step: int, fetches: Any) -> list[PeerModel]:
        """Waits up to setup_wait_s: a step may need many earlier ones (other nodes' training) first."""
        named = [Fetch(f.peer, setup_part(f.part)) for f in fetches]
        return self._run(self.exchange.gather(named, step, RoundChecks(0), wait=self.wait))

    def first(self, step: int, part: str, peers: Sequence[str]) -> PeerModel | None:
        """The first of `peers` to serve `part` at `step` or later, within this exchange's wait
        (fetch_timeout_s for a late node: what it needs was served long ago; None: none did)."""
        message = self._run(self.exchange.first_served(peers, setup_part(part), step, self.wait))
        return None if message is None else self.exchange.intake.peer_model(message, RoundChecks(0))
