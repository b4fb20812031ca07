"""The one timing rule the benchmarks share: the median of `repeat` wall-clock runs."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_seconds(fn: Callable[[], object], repeat: int, warmup: int = 0) -> float:
    """Median seconds of `repeat` calls of `fn`, after `warmup` untimed calls (the first call
    of a torch function pays for allocation and dispatch caches). The median, not the mean:
    the machine is shared, and a mean would mostly measure the neighbours."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
