"""The one timing rule the benchmarks share: the median of `repeat` wall-clock runs."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_seconds(fn: Callable[[], object], repeat: int, warmup: bool = False) -> float:
    """Median seconds of `repeat` calls of `fn`; `warmup` first makes one untimed call
    (the first call of a torch function pays for allocation and dispatch caches)."""
    if warmup:
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
