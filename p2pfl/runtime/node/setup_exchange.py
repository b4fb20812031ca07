"""The setup exchange before round 1 (`p2pfl.runtime.strategy.SetupExchange`) over a node's
`Exchange`: `run_setup` runs the strategy's `setup` in a worker thread, whose calls run on the
node's event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from p2pfl.runtime.devices import host_snapshot
from p2pfl.runtime.node.intake import RoundChecks
from p2pfl.runtime.run_folder import ArtefactSink
from p2pfl.runtime.strategy import Fetch, PeerModel, Strategy, overrides, setup_part

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


async def run_setup(exchange: Exchange, counter: Any, artefacts: ArtefactSink, *, late: bool = False,
                    joiners: bool = False) -> tuple[bool, dict[str, Any] | None]:
    """`Strategy.setup` with the setup exchange open; its bytes and records are round 0's.
    Returns whether it ran (the base class's is a no-op) and what the run keeps of it (None:
    it exchanged and recorded nothing). `late`, `joiners`: `SetupExchange`'s."""
    t0 = time.perf_counter()
    counter.begin_round(0)
    artefacts.begin_round(0)
    if not overrides(exchange.strategy, Strategy, "setup"):  # no thread for nothing (a worker starts hundreds of nodes)
        return False, None
    loop = asyncio.get_running_loop()
    exchange.ctx.exchange = SetupExchange(exchange, loop, late=late, joiners=joiners)
    # Not a neighbour that joins later: none to wait for.
    exchange.ctx.peers = exchange.neighbours.present(exchange.ctx.round + 1)
    # A thread of its own: setup blocks on exchanges that need the loop's default executor
    # (encoding), which nodes sharing a process would otherwise fill with waiting setups.
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"{exchange.ctx.node_id}-setup") as pool:
        try:
            await loop.run_in_executor(pool, exchange.strategy.setup, exchange.ctx)
        finally:
            exchange.ctx.exchange = None
    summary = counter.round_summary(0)
    if summary.get("bytes_sent") or summary.get("bytes_received") or artefacts.records:
        return True, {**summary, "wall_s": time.perf_counter() - t0, "strategy": dict(artefacts.records)}
    return True, None
