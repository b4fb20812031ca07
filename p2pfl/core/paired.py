"""Is a row better than a reference row over seeds? Paired differences with a t interval.

Runs of two rows with the same seed share the partition and the initial weights, so the
per-seed difference d_s = a_s − b_s removes what the seed does to both. We report the mean
of d, its two-sided 95 % t interval (mean ± t_{0.975, n−1} · sd(d)/√n, sd with n − 1) and the
paired t test's p-value. A claim "holds" only where the difference is significant at 5 % over
at least `MIN_SEEDS` seeds, after Holm's correction over the tests of its table
(`holm_corrected`); otherwise the rows are "level". With few seeds the t test is the
standard choice (a bootstrap over 5 values has only 126 distinct resamples); it assumes the
differences are roughly normal, which a mean over nodes of accuracies tends to be.

Pure math over floats; imports nothing from p2pfl.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

MIN_SEEDS = 5
LEVEL = 0.05


@dataclass(frozen=True)
class PairedDifference:
    """a − b over the seeds both rows ran; `verdict` is "higher", "lower" or "level"."""

    seeds: tuple[int, ...]
    mean: float
    low: float  # 95 % interval
    high: float
    p_value: float
    verdict: str
    p_holm: float = math.nan  # the p-value after Holm's correction within its table (`holm_corrected`)

    def cell(self, scale: float = 100.0) -> str:
        """`+1.2 [+0.3, +2.1] p=0.02 higher`, in points; `p=0.02 (Holm 0.06) level` once corrected."""
        if math.isnan(self.mean):
            return "-"
        if math.isnan(self.low):
            return f"{self.mean * scale:+.1f} (n={len(self.seeds)}) {self.verdict}"
        corrected = "" if math.isnan(self.p_holm) else f" (Holm {self.p_holm:.2g})"
        return (f"{self.mean * scale:+.1f} [{self.low * scale:+.1f}, {self.high * scale:+.1f}] "
                f"p={self.p_value:.2g}{corrected} {self.verdict}")


def paired_difference(a: Mapping[int, float], b: Mapping[int, float], *, level: float = LEVEL,
                      min_seeds: int = MIN_SEEDS) -> PairedDifference:
    """a − b paired by seed (keys); seeds missing from either side, or None values, are left out."""
    from scipy import stats

    seeds = tuple(sorted(s for s in a if s in b and a[s] is not None and b[s] is not None))
    diffs = [float(a[s]) - float(b[s]) for s in seeds]
    n = len(diffs)
    if n == 0:
        return PairedDifference(seeds, math.nan, math.nan, math.nan, math.nan, "level")
    mean = statistics.fmean(diffs)
    if n < 2:
        return PairedDifference(seeds, mean, math.nan, math.nan, math.nan, "level")
    sd = statistics.stdev(diffs)
    if sd == 0.0:  # every seed moved by the same amount: an interval of width 0
        p = 1.0 if mean == 0.0 else 0.0
        low = high = mean
    else:
        half = stats.t.ppf(1 - level / 2, n - 1) * sd / math.sqrt(n)
        low, high = mean - half, mean + half
        p = float(2 * stats.t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1))
    significant = n >= min_seeds and p < level
    verdict = ("higher" if mean > 0 else "lower") if significant else "level"
    return PairedDifference(seeds, mean, low, high, p, verdict)


def holm(p_values: Mapping[str, float], *, level: float = LEVEL) -> dict[str, tuple[float, bool]]:
    """Holm's step-down correction over one table's tests: name -> (adjusted p, significant).
    Adjusted p_(i) = max over j <= i of min(1, (m - j + 1) p_(j)), p sorted ascending; a test is
    significant where its adjusted p is below `level` (NaN p-values count as 1)."""
    ordered = sorted(p_values, key=lambda k: (1.0 if math.isnan(p_values[k]) else p_values[k], k))
    m, running, out = len(ordered), 0.0, {}
    for i, name in enumerate(ordered):
        p = 1.0 if math.isnan(p_values[name]) else p_values[name]
        running = max(running, min(1.0, (m - i) * p))
        out[name] = (running, running < level)
    return out


def holm_corrected(tests: Mapping[str, PairedDifference], *, level: float = LEVEL,
                   min_seeds: int = MIN_SEEDS) -> dict[str, PairedDifference]:
    """The table's paired differences with Holm's adjusted p and the verdict taken from it: a
    claim holds only where the adjusted p is below `level` over at least `min_seeds` seeds. Tests
    without a p (fewer than 2 seeds) stay out of the family and stay "level"."""
    tested = {name: d for name, d in tests.items() if not math.isnan(d.p_value)}
    adjusted = holm({name: d.p_value for name, d in tested.items()}, level=level)
    out = dict(tests)
    for name, d in tested.items():
        p_holm, significant = adjusted[name]
        verdict = ("higher" if d.mean > 0 else "lower") if significant and len(d.seeds) >= min_seeds else "level"
        out[name] = dataclasses.replace(d, p_holm=p_holm, verdict=verdict)
    return out
