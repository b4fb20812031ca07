"""Where a round's time goes: every second of a round is charged to exactly one phase.

    train      the strategy's fit (DP-SGD's per-sample gradients and noise included)
    privacy    output noise before publishing, and the accountant's epsilon
    evaluate   test accuracy after training and after aggregation
    publish    snapshot to host and encoding of the shared parts
    exchange   pushes, and waiting for peers' parts or the coordinator's global model
    aggregate  the strategy's own math: the statistics it pushes and its aggregation

`compute_fraction` = (train + evaluate + aggregate) / wall: the share of a round spent on
work a centralized run would do too; the rest is the price of being peer-to-peer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

PHASES = ("train", "privacy", "evaluate", "publish", "exchange", "aggregate")
COMPUTE_PHASES = ("train", "evaluate", "aggregate")


class PhaseClock:
    """Charges the time since the last `switch` to the phase that was running.

    `sync` (e.g. `torch.cuda.synchronize`) runs at every switch, so that work a GPU queued
    during one phase is not charged to the next.
    """

    def __init__(self, phase: str, sync: Callable[[], None] | None = None,
                 now: Callable[[], float] = time.perf_counter) -> None:
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; phases are {PHASES}")
        self._sync = sync
        self._now = now
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._phase: str | None = phase
        self._since = now()

    def switch(self, phase: str | None) -> None:
        if phase is not None and phase not in self.seconds:
            raise ValueError(f"unknown phase {phase!r}; phases are {PHASES}")
        if self._sync is not None and self._phase is not None:
            self._sync()
        now = self._now()
        if self._phase is not None:
            self.seconds[self._phase] += now - self._since
        self._phase, self._since = phase, now

    def stop(self) -> dict[str, float]:
        """End the running phase; `{train_s, privacy_s, ...}`. The clock runs from construction
        to here without a gap, so the phases sum to the round's wall time."""
        self.switch(None)
        return {f"{p}_s": s for p, s in self.seconds.items()}


def device_synchronizer(device: Any) -> Callable[[], None] | None:
    """Waits for the GPU's queued work, so that a phase's time includes the kernels it launched."""
    if getattr(device, "type", None) != "cuda":
        return None
    import torch

    return lambda: torch.cuda.synchronize(device)


def compute_fraction(rounds: Iterable[Mapping[str, Any]]) -> float | None:
    """(train + evaluate + aggregate) / wall over `rounds` that carry a `time` record."""
    compute = wall = 0.0
    for r in rounds:
        t = r.get("time")
        if not t:
            continue
        compute += sum(t.get(f"{p}_s", 0.0) for p in COMPUTE_PHASES)
        wall += r.get("wall_s", 0.0)
    return compute / wall if wall > 0 else None
