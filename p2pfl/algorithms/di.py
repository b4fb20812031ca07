"""Coordinator-based global-model algorithms: `fedavg_global`, `ga` (FedDG-GA) and `di` (DI).

The three share one node-side round and differ only in how the coordinator weighs the
trained models: each strategy names its coordinator half (`p2pfl.algorithms.global_model`):

1. `fit` trains from the current model, which is the global model received at the end of the
   previous round (round 1: the common initialisation, i.e. θ_g⁰). Before training it
   snapshots the start (global) state and scores it on the validation split; after training
   it scores the local model and computes the round statistics (DI: ξ and φ).
2. `pushes` sends the full trained state and the statistics (`STATS_KEYS`) to the
   coordinator as one `kind="stats"` message.
3. `configure_fetch` long-polls the coordinator for the `global` part; `aggregate` loads it.
   If none arrived (coordinator unreachable or late), the node keeps its local model, says
   so in its records and marks its next start model as not global (GA then has no gap for it).

Statistics are computed in `fit` (a worker thread), not in `pushes`, which the runtime calls
on its event loop: the Hessian solves take seconds and must not stall the node's server.
With output-noise privacy the statistics therefore describe the model before the noise
is added, and they are not covered by the privacy accounting.

DI's node statistics (Zhou et al., eq. 4, 9–11, 14; `p2pfl.core.influence_functions`):
ξ = − ḡᵀ (H + λI)⁻¹ g_core, with g_core the mean gradient at the round's start (global)
parameters over `core_size` random training samples, ḡ the mean training gradient at the
trained parameters, H the Hessian of the mean training loss there; φ = the training-loss
sum at the trained parameters. `hessian="head"` restricts all three to the linear head,
on features computed once per model (the head's loss is convex, so H + λI is positive
definite and CG is well posed); `"all"` uses every parameter, where H may be indefinite
(CG then stops at the first negative curvature and says so in the records).

Table 4 ablation (`dic`, `dia`; base method FedAvg), as the coordinator applies it:

======  ======  =========================================================================
 dic     dia     aggregation weights ω
======  ======  =========================================================================
 off     off     FedAvg: ω ∝ n_train (identical to `fedavg_global`)
 off     on      DIA without influences: ξ' := 1/n, so w1 = 1/n and ω ∝ 1/n + w2(φ)
 on      off     DIC without adjustment: ω = ξ' (the mapped local weights; α, β, φ unused)
 on      on      DI: ω of eq. 12–15
======  ======  =========================================================================

Nodes skip the influence computation when `dic` is off; φ (one forward pass) is always
sent, so every row records it. Parameters used only by the coordinator (α, β, `dia`,
`xi_mapping`; GA's `step_size`, `fair_metric`, `center`) belong to the coordinator half;
`dic` is read by both halves.

What the numbers say (tests/algorithms/test_di.py, benchmarks/dic.py):

* Sign of ξ. With H + λI ≻ 0, ξ is most negative for a node whose training gradient at
  its trained model still aligns with its core gradient at the global model (consistent
  data, not yet fitted), and near 0 for shuffled labels (small, incoherent gradients).
  Under eq. 12's ratio (the default) with every ξ negative, the most negative ξ weighs most
  (eq. 13), so the ξ term ranks a consistent node above a label-noise one (ξ ≈ 0); the
  order-preserving maps ("shift", "rank", "softmax") read a larger ξ as more weight and rank
  them the other way round. A node that sends no finite ξ gets ξ' = 0 under every map.
* `hessian="all"`: for the project's CNNs the full Hessian is indefinite even at λ = 1, so
  CG stops at negative curvature after 1–4 HVPs and ξ is the truncated iterate (it then
  varies strongly with λ). `"head"` is well posed; at λ = 0.01 CG needs ~120–170
  iterations to a 1e-7 residual, but ξ after the default 20 is within ~10% (HVPs on the
  head cost ~1 ms, so raising `cg_iterations` is cheap).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from p2pfl.algorithms import register
from p2pfl.algorithms.global_model import DIHalf, FedAvgGlobalHalf, GAHalf
from p2pfl.core.influence_functions import SOLVERS, DataInfluence, LossSurface, data_influence, loss_sum
from p2pfl.models import SplitModel, body_features, load_part, part_spec, part_state
from p2pfl.runtime.metadata import GLOBAL_META
from p2pfl.runtime.strategy import COORDINATOR_ID, Fetch, PartDecl, PeerModel, Push, RoundContext, Strategy
from p2pfl.training.trainer import FitResult

HESSIANS = ("head", "all")

# Keys of the `stats` push's meta; `p2pfl.algorithms.global_model` reads them. Absent values
# are None (never NaN), so records and the wire stay plain JSON.
STATS_KEYS = (
    "n_train",
    "train_loss",
    "xi",  # DI only, None when dic is off
    "phi",  # DI only
    "start_is_global",  # this round started from the coordinator's model (round 1: the common init)
    "val_loss_start", "val_acc_start",  # the start (global) model on the validation split
    "val_loss_local", "val_acc_local",  # the trained local model on the validation split
    "val_loss_prev_local", "val_acc_prev_local",  # last round's trained model (None in round 1)
)


def _finite_or_none(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def _sub_state(state: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


@dataclass
class DICProblem:
    core: LossSurface  # loss over the core subset at the round's start (global) parameters
    trained: LossSurface  # training loss at the trained local parameters
    hessian: LossSurface | None  # a subsample of `trained` for H (CG with hvp_samples), else None
    generator: torch.Generator  # for LiSSA's mini-batches


class GlobalModelStrategy(Strategy):
    """Node side of the coordinator algorithms; subclasses add statistics in `round_stats`."""

    shared_parts = ()

    def __init__(self) -> None:
        self._meta: dict[str, Any] = {}
        self._prev_local: tuple[float | None, float | None] = (None, None)
        self._start_is_global = True  # round 1 starts from the common initialisation, θ_g⁰

    def extra_parts(self, model: SplitModel) -> dict[str, PartDecl]:
        return {"global": PartDecl(part_spec(model, "full"), GLOBAL_META)}

    def round_stats(self, ctx: RoundContext, start: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Extra statistics of the trained model (`start`: the round's start = global state)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"meta": dict(self._meta), "prev_local": list(self._prev_local), "start_is_global": self._start_is_global}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._meta = dict(state["meta"])
        loss, acc = state["prev_local"]
        self._prev_local = (loss, acc)
        self._start_is_global = bool(state["start_is_global"])

    def fit(self, ctx: RoundContext) -> FitResult:
        # The runtime sets ctx.round_start to the same state; taking our own snapshot keeps the strategy
        # correct when driven without the runtime (tests, benchmarks).
        start = {k: v.detach().clone() for k, v in ctx.model.state_dict().items()}
        val_acc_start, val_loss_start = ctx.trainer.evaluate(ctx.model, ctx.data.val)
        result = ctx.trainer.fit(ctx.model, ctx.data.train)
        val_acc_local, val_loss_local = ctx.trainer.evaluate(ctx.model, ctx.data.val)
        meta: dict[str, Any] = {
            "n_train": len(ctx.data.train),
            "train_loss": _finite_or_none(result.loss),
            "xi": None,
            "phi": None,
            "start_is_global": self._start_is_global,
            "val_loss_start": _finite_or_none(val_loss_start),
            "val_acc_start": _finite_or_none(val_acc_start),
            "val_loss_local": _finite_or_none(val_loss_local),
            "val_acc_local": _finite_or_none(val_acc_local),
            "val_loss_prev_local": self._prev_local[0],
            "val_acc_prev_local": self._prev_local[1],
        }
        meta.update(self.round_stats(ctx, start))
        self._prev_local = (meta["val_loss_local"], meta["val_acc_local"])
        self._meta = meta
        for key in ("val_loss_start", "val_loss_local"):
            ctx.artefacts.record(key, meta[key])
        return result

    def pushes(self, ctx: RoundContext) -> list[Push]:
        # A copy: `part_state` views the live parameters, which `aggregate` overwrites next.
        state = {k: v.clone() for k, v in part_state(ctx.model, "full").items()}
        return [Push(COORDINATOR_ID, kind="stats", part="full", tensors=state, meta=dict(self._meta))]

    def configure_fetch(self, ctx: RoundContext) -> list[Fetch]:
        return [Fetch(COORDINATOR_ID, "global")]

    def aggregate(self, ctx: RoundContext, arrived: list[PeerModel]) -> None:
        received = [m for m in arrived if m.sender == COORDINATOR_ID and m.part == "global"]
        if not received:
            self._start_is_global = False
            ctx.artefacts.record("global_received", False)
            ctx.log(f"{ctx.node_id}: no global model for round {ctx.round}; keeping the local model")
            return
        latest = max(received, key=lambda m: m.version)
        load_part(ctx.model, latest.tensors)
        # A stale global (runtime.accept_stale) is not the model GA pairs with last round's local one.
        self._start_is_global = latest.round >= ctx.round
        ctx.artefacts.record("global_received", True)
        ctx.artefacts.record("global_round", latest.round)
        weights = latest.meta.get("weights")
        ctx.artefacts.record("global_weight", weights.get(ctx.node_id) if isinstance(weights, Mapping) else None)


@register
class FedAvgGlobal(GlobalModelStrategy):
    """Coordinator FedAvg: ω ∝ n_train."""

    name = "fedavg_global"
    coordinator = FedAvgGlobalHalf


@register
class GA(GlobalModelStrategy):
    """FedDG-GA (Zhang et al., CVPR 2023); the update rule is in `p2pfl.core.dia`.

    `step_size` d (the move at round 1 is d/n), `fair_metric` ("loss" or "acc") and `center`
    (False: the official code's uncentred update) are parameters of the coordinator half.
    """

    name = "ga"
    coordinator = GAHalf


@register
class DI(GlobalModelStrategy):
    """DI (Zhou et al.): DIC on the nodes, DIA on the coordinator (module doc).

    Node parameters: `core_size` (samples in the core set), `damping` λ, `solver` ("cg" or
    "lissa"), `hessian` ("head" or "all"), `cg_iterations`, `lissa_depth`, `hvp_samples`
    (training samples in the Hessian: 0 = all, as eq. 10; otherwise a random subset, fixed for
    CG and redrawn per step for LiSSA), `dic`. Coordinator half (`DIHalf`): `alpha`, `beta`,
    `dia`, `xi_mapping` ("ratio", the paper's eq. 12 and the default; "shift", "rank", "softmax"; see
    `p2pfl.core.dia`), `dic`.
    """

    name = "di"
    coordinator = DIHalf

    def __init__(
        self,
        core_size: int = 64,
        damping: float = 0.01,
        solver: str = "cg",
        hessian: str = "head",
        cg_iterations: int = 20,
        dic: bool = True,
        lissa_depth: int = 100,
        hvp_samples: int = 0,
    ) -> None:
        super().__init__()
        if solver not in SOLVERS:
            raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")
        if hessian not in HESSIANS:
            raise ValueError(f"hessian must be one of {HESSIANS}, got {hessian!r}")
        if core_size < 1 or cg_iterations < 1 or lissa_depth < 1 or hvp_samples < 0:
            raise ValueError("core_size, cg_iterations and lissa_depth must be >= 1, hvp_samples >= 0")
        if not damping >= 0:
            raise ValueError(f"damping must be >= 0, got {damping}")
        self.core_size = int(core_size)
        self.damping = float(damping)
        self.solver = solver
        self.hessian = hessian
        self.cg_iterations = int(cg_iterations)
        self.lissa_depth = int(lissa_depth)
        self.hvp_samples = int(hvp_samples)
        self.dic = bool(dic)

    def round_stats(self, ctx: RoundContext, start: dict[str, torch.Tensor]) -> dict[str, Any]:
        train = ctx.data.train
        if not self.dic:
            # φ is one forward pass; it is sent in every ablation row so runs can be compared.
            phi = _finite_or_none(loss_sum(ctx.model, train.x, train.y))
            ctx.artefacts.record("xi", None)
            ctx.artefacts.record("phi", phi)
            return {"phi": phi}
        t0 = time.perf_counter()
        problem = self.problem(ctx, start)
        # The training surface is the full model's loss (on cached features for the head), so
        # φ comes from it without another pass through the body.
        phi = problem.trained.value("sum")
        influence = self.influence(problem)
        solve = influence.solve
        ctx.artefacts.record("dic", {
            "seconds": time.perf_counter() - t0,
            "iterations": solve.iterations,
            "residual": _finite_or_none(solve.residual),
            "converged": solve.converged,
            "negative_curvature": solve.negative_curvature,
            "core_gradient_norm": _finite_or_none(influence.core_gradient_norm),
            "train_gradient_norm": _finite_or_none(influence.train_gradient_norm),
        })
        stats = {"phi": _finite_or_none(phi), "xi": _finite_or_none(influence.xi)}
        for key, value in stats.items():
            ctx.artefacts.record(key, value)
        return stats

    def problem(self, ctx: RoundContext, start: dict[str, torch.Tensor]) -> DICProblem:
        """The surfaces of this round's ξ: core at the start state, training loss at the trained one."""
        x, y = ctx.data.train.x, ctx.data.train.y
        n = len(y)
        core_idx = torch.as_tensor(ctx.rng.choice(n, size=min(self.core_size, n), replace=False))
        generator = torch.Generator().manual_seed(int(ctx.rng.integers(2**31)))
        model: SplitModel = ctx.model
        if self.hessian == "head":
            # Features once per model: every HVP is then a pass over an (N, d) matrix only.
            core = LossSurface(model.head, body_features(model, x[core_idx], start), y[core_idx],
                               state=_sub_state(start, "head."))
            trained = LossSurface(model.head, body_features(model, x, part_state(model, "full")), y)
        else:
            core = LossSurface(model, x[core_idx], y[core_idx], state=start)
            trained = LossSurface(model, x, y)
        hessian = None
        if self.hvp_samples and self.hvp_samples < n and self.solver == "cg":
            hessian = trained.subset(torch.randperm(n, generator=generator)[: self.hvp_samples])
        return DICProblem(core, trained, hessian, generator)

    def influence(self, problem: DICProblem) -> DataInfluence:
        """ξ of a round's `problem` with this strategy's solver settings."""
        return data_influence(
            problem.core, problem.trained, hessian=problem.hessian, damping=self.damping, solver=self.solver,
            iterations=self.cg_iterations, lissa_depth=self.lissa_depth,
            lissa_samples=self.hvp_samples or None, generator=problem.generator,
        )
