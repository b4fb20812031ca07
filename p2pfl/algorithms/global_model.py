"""Coordinator halves of the global-model algorithms (`fedavg_global`, `ga`, `di`): pure, no HTTP.

Nodes push `kind="stats"` every round: the trained full state and the statistics in
`p2pfl.algorithms.di.STATS_KEYS`. The coordinator service collects one `Submission` per node
and calls `aggregate(round, submissions)`, which returns a `Reply`: the new global model as
part "global" for every node (meta: each node's weight), as `model` for the service's
held-out scoring and checkpoints, and a JSON-able `info` for the round's record.

Common to all three:

* a submission whose state holds NaN or ±inf is dropped (weight 0, listed in
  `info["dropped_non_finite"]`): one diverged node must not poison the global model, and
  0 · NaN is NaN, so it cannot stay in the sum with weight 0 either;
* submissions with weight 0 are left out of the average;
* `weights` covers every submission of the round and sums to 1.

Each class is the `coordinator` of its strategy in `p2pfl.algorithms.di`: one registration.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from p2pfl.core.influence import weighted_average
from p2pfl.models import part_spec
from p2pfl.runtime.metadata import STATS_META
from p2pfl.runtime.coordinator_half import CoordinatorEnv, CoordinatorHalf, Reply, Submission
from p2pfl.runtime.strategy import PartDecl
from p2pfl.core.dia import (
    GA_DEFAULT_STEP,
    dia,
    ga_step_size,
    ga_update,
    generalization_gap,
    DEFAULT_XI_MAPPING,
    influence_shares,
    validate_dia_params,
    validate_ga_params,
)


def _finite_state(state: Mapping[str, torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in state.values() if v.is_floating_point())


def _number(meta: Mapping[str, Any], key: str) -> float | None:
    """meta[key] as a finite float, or None when absent, null, non-numeric or non-finite."""
    value = meta.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _n_train(sub: Submission) -> float:
    n = _number(sub.meta, "n_train")
    return n if n is not None and n > 0 else 1.0


class GlobalModelHalf(CoordinatorHalf):
    """Base: drops non-finite states, asks `weights` for the rest, averages."""

    name: ClassVar[str] = ""
    round_kind = "stats"

    def expected(self, kind: str) -> PartDecl | None:
        return PartDecl(part_spec(self.env.model, "full"), STATS_META) if kind == "stats" else None

    def weights(self, round_: int, submissions: Sequence[Submission]) -> tuple[np.ndarray, dict[str, Any]]:
        """Weights (non-negative, summing to 1, in submission order) and info for the record."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """What the aggregator keeps across rounds (JSON-able), for the coordinator's checkpoints."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(f"{type(self).__name__} keeps no state across rounds, got {sorted(state)}")

    def aggregate(self, round_: int, submissions: list[Submission]) -> Reply:
        if not submissions:
            raise ValueError(f"round {round_}: nothing to aggregate")
        usable = [s for s in submissions if _finite_state(s.state)]
        dropped = [s.node_id for s in submissions if not _finite_state(s.state)]
        if not usable:
            raise ValueError(f"round {round_}: every submitted state is non-finite ({dropped})")
        w, info = self.weights(round_, usable)
        members = [(s, float(x)) for s, x in zip(usable, w) if x > 0]
        state = weighted_average([s.state for s, _ in members], [x for _, x in members])
        weights = {s.node_id: 0.0 for s in submissions}
        weights.update({s.node_id: float(x) for s, x in zip(usable, w)})
        info = {"rule": self.name, **info, "dropped_non_finite": dropped}
        return Reply(parts={"global": state}, meta={"weights": weights}, model=state, info=info)


class FedAvgGlobalHalf(GlobalModelHalf):
    """ω ∝ n_train (McMahan et al.)."""

    name = "fedavg_global"

    def weights(self, round_: int, submissions: Sequence[Submission]) -> tuple[np.ndarray, dict[str, Any]]:
        n = np.array([_n_train(s) for s in submissions])
        return n / n.sum(), {}


class GAHalf(GlobalModelHalf):
    """FedDG-GA's generalization adjustment (formula and defaults in `p2pfl.core.dia`).

    State across rounds: the current weight a_k of every node seen so far (initially 1/n).
    The gap of node k in round r is the one FedDG-GA's code uses, how much worse the global
    model of round r−1 (the model k started round r from) does on k's validation split than
    k's own model trained in round r−1:
        gap = `val_<metric>_start` vs `val_<metric>_prev_local`, both sent by the node.
    So the update made before aggregating round r (r ≥ 2) is exactly the official one made
    after round r−1, with step d_{r−1} = (d/n)(1 − (r − 2)/R). A node has no gap in round 1,
    when it did not start from the global model (`start_is_global` false) or without a
    validation split; its weight is then not moved (its gap is set to the mean of the
    others, i.e. zero after centring). A node seen for the first time starts at the mean
    weight of the nodes present. Weights are renormalised over the nodes present.
    """

    name = "ga"

    def __init__(self, env: CoordinatorEnv, step_size: float = GA_DEFAULT_STEP, fair_metric: str = "loss",
                 center: bool = True) -> None:
        super().__init__(env)
        if env.rounds < 1:
            raise ValueError(f"GA needs the total number of rounds (>= 1), got {env.rounds}")
        self.validate(step_size, fair_metric, center)
        self.rounds = int(env.rounds)
        self.step_size = float(step_size)
        self.metric = fair_metric
        self.center = bool(center)
        self.current: dict[str, float] = {}

    @staticmethod
    def validate(step_size: float = GA_DEFAULT_STEP, fair_metric: str = "loss", center: bool = True) -> None:
        validate_ga_params(float(step_size), fair_metric)

    def state_dict(self) -> dict[str, Any]:
        return {"current": dict(self.current)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.current = {str(k): float(v) for k, v in state["current"].items()}

    def gap(self, sub: Submission) -> float | None:
        if not sub.meta.get("start_is_global", False):
            return None
        start = _number(sub.meta, f"val_{self.metric}_start")
        prev = _number(sub.meta, f"val_{self.metric}_prev_local")
        if start is None or prev is None:
            return None
        return generalization_gap(start, prev, self.metric)

    def weights(self, round_: int, submissions: Sequence[Submission]) -> tuple[np.ndarray, dict[str, Any]]:
        ids = [s.node_id for s in submissions]
        known = [self.current[i] for i in ids if i in self.current]
        fill = float(np.mean(known)) if known else 1.0 / len(ids)
        a = np.array([self.current.get(i, fill) for i in ids])
        a = a / a.sum() if a.sum() > 0 else np.full(len(ids), 1.0 / len(ids))
        gaps = [self.gap(s) for s in submissions]
        valid = [g for g in gaps if g is not None]
        step = 0.0
        if len(valid) >= 2 and round_ >= 2:
            neutral = float(np.mean(valid)) if self.center else 0.0
            filled = np.array([neutral if g is None else g for g in gaps])
            step = ga_step_size(round_ - 1, self.rounds, len(ids), self.step_size)
            a = ga_update(a, filled, step, center=self.center)
        self.current.update(zip(ids, a.tolist()))
        return a, {"gaps": dict(zip(ids, gaps)), "step": step, "metric": self.metric}


class DIHalf(GlobalModelHalf):
    """DIA (DI eq. 12–15) with the Table-4 ablations (see `p2pfl.algorithms.di`).

    Missing or non-finite statistics: a node without a finite ξ gets ξ' = 0, the smallest share
    under every mapping (`p2pfl.core.dia.influence_shares`; imputing a ξ value would not do:
    under the ratio with all ξ < 0 the smallest ξ weighs most); one without a finite φ is given
    the largest finite φ. When no node has a finite ξ the round falls back to the dic-off rule,
    when none has a finite φ, φ' is uniform. Both are listed in `info["imputed"]`.
    """

    name = "di"

    def __init__(
        self,
        env: CoordinatorEnv,
        alpha: float = 1.0,
        beta: float = 1.0,
        dic: bool = True,
        dia: bool = True,
        xi_mapping: str = DEFAULT_XI_MAPPING,
    ) -> None:
        super().__init__(env)
        self.validate(alpha, beta, dic, dia, xi_mapping)
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.dic = bool(dic)
        self.dia = bool(dia)
        self.mapping = xi_mapping

    @staticmethod
    def validate(alpha: float = 1.0, beta: float = 1.0, dic: bool = True, dia: bool = True,
                 xi_mapping: str = DEFAULT_XI_MAPPING) -> None:
        validate_dia_params(float(alpha), float(beta), xi_mapping)

    @staticmethod
    def _impute(values: list[float | None], fill: str) -> tuple[list[float] | None, list[int]]:
        finite = [v for v in values if v is not None]
        if not finite:
            return None, list(range(len(values)))
        value = min(finite) if fill == "min" else max(finite)
        return [value if v is None else v for v in values], [i for i, v in enumerate(values) if v is None]

    def weights(self, round_: int, submissions: Sequence[Submission]) -> tuple[np.ndarray, dict[str, Any]]:
        ids = [s.node_id for s in submissions]
        if not self.dic and not self.dia:
            n = np.array([_n_train(s) for s in submissions])
            return n / n.sum(), {"ablation": "fedavg"}
        xi_sent = [_number(s.meta, "xi") for s in submissions]
        xi_missing = [i for i, v in enumerate(xi_sent) if v is None]
        xi = None if len(xi_missing) == len(xi_sent) else xi_sent
        phi, phi_missing = self._impute([_number(s.meta, "phi") for s in submissions], "max")
        info: dict[str, Any] = {
            "xi": dict(zip(ids, xi)) if xi is not None else None,
            "phi": dict(zip(ids, phi)) if phi is not None else None,
            "imputed": {"xi": [ids[i] for i in xi_missing], "phi": [ids[i] for i in phi_missing]},
        }
        use_xi = self.dic and xi is not None
        if use_xi and not self.dia:
            omega = influence_shares(xi, self.mapping)
            info.update(ablation="dic_only", xi_prime=omega.tolist())
            return omega, info
        terms = dia(xi if use_xi else None, phi if phi is not None else np.ones(len(ids)),
                    alpha=self.alpha, beta=self.beta, mapping=self.mapping)
        info.update(
            ablation="full" if use_xi else "dia_only",
            xi_prime=terms.xi_prime.tolist(), phi_prime=terms.phi_prime.tolist(),
            w1=terms.w1.tolist(), w2=terms.w2.tolist(),
        )
        return terms.omega, info
