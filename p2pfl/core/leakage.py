"""How well an attack's scores tell a model's training images (members) from images it never saw.

An attack gives every candidate a score, higher meaning "more likely a member". From the scores of
known members and non-members: the ROC curve's area (AUC; 0.5 is guessing), the membership
advantage max_t (TPR − FPR) (Yeom et al. 2018), the TPR at 1 % FPR (Carlini et al. 2022), and the ε
that the attack *proves* a model was trained with at least: an (ε, δ)-DP training bounds every
threshold test by FPR + e^ε·FNR ≥ 1 − δ and FNR + e^ε·FPR ≥ 1 − δ (Kairouz et al. 2015), so
ε ≥ ln((1 − δ − FPR)/FNR) and ln((1 − δ − FNR)/FPR) at every threshold (Jagielski et al. 2020,
Nasr et al. 2021). The rates in those bounds are Clopper–Pearson upper limits, Bonferroni-corrected
over the thresholds tried and both rates, so the bound holds at the stated confidence and a lucky
threshold on few samples proves nothing. Beside an accountant's ε (an upper bound) it says how much
of that budget an attack from the peer's seat can be shown to use.

Pure math over arrays; imports nothing from p2pfl.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy.stats import beta
from sklearn.metrics import roc_auc_score, roc_curve

MAX_THRESHOLDS = 100  # thresholds tried for the ε bound: each one costs confidence (Bonferroni)


@dataclass(frozen=True)
class Leakage:
    auc: float
    advantage: float            # max over thresholds of TPR − FPR
    tpr_at_1pct_fpr: float      # the highest TPR whose FPR is at most 1 %
    epsilon_lower_bound: float  # ε proven at `delta` with `confidence` (0: nothing proven)
    delta: float
    confidence: float
    members: int
    nonmembers: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _scores(values: Any, what: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64).ravel()
    if array.size == 0:
        raise ValueError(f"no {what} scores: the attack needs at least one of each")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{what} scores hold NaN or infinity")
    return array


def clopper_pearson_upper(errors: int, trials: int, alpha: float) -> float:
    """One-sided upper limit at level 1 − alpha of a rate seen as errors/trials."""
    if errors >= trials:
        return 1.0
    return float(beta.ppf(1.0 - alpha, errors + 1, trials - errors))


def epsilon_lower_bound(members: Any, nonmembers: Any, delta: float, confidence: float = 0.95,
                        max_thresholds: int = MAX_THRESHOLDS) -> float:
    """The largest ε that thresholding the scores proves, with probability `confidence`."""
    m, n = _scores(members, "member"), _scores(nonmembers, "non-member")
    if not (0 <= delta < 1 and 0 < confidence < 1):
        raise ValueError(f"delta must be in [0, 1) and confidence in (0, 1), got {delta}, {confidence}")
    pooled = np.unique(np.concatenate([m, n]))
    if pooled.size > max_thresholds:
        pooled = np.unique(np.quantile(pooled, np.linspace(0, 1, max_thresholds)))
    alpha = (1.0 - confidence) / (2 * pooled.size)
    best = 0.0
    for t in pooled:
        fpr_hi = clopper_pearson_upper(int(np.sum(n >= t)), n.size, alpha)
        fnr_hi = clopper_pearson_upper(int(np.sum(m < t)), m.size, alpha)
        for num, den in ((1.0 - delta - fpr_hi, fnr_hi), (1.0 - delta - fnr_hi, fpr_hi)):
            if num > 0 and den > 0:
                best = max(best, math.log(num / den))
    return best


def leakage(members: Any, nonmembers: Any, delta: float = 1e-5, confidence: float = 0.95) -> Leakage:
    """Every figure of how the scores separate members from non-members."""
    m, n = _scores(members, "member"), _scores(nonmembers, "non-member")
    truth = np.concatenate([np.ones(m.size), np.zeros(n.size)])
    scores = np.concatenate([m, n])
    fpr, tpr, _ = roc_curve(truth, scores)
    low = tpr[fpr <= 0.01]
    return Leakage(
        auc=float(roc_auc_score(truth, scores)), advantage=float(np.max(tpr - fpr)),
        tpr_at_1pct_fpr=float(low.max()) if low.size else 0.0,
        epsilon_lower_bound=epsilon_lower_bound(m, n, delta, confidence), delta=delta, confidence=confidence,
        members=int(m.size), nonmembers=int(n.size),
    )
