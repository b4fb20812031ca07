"""Influence functions: gradients, Hessian-vector products and inverse-HVP solvers.

Everything here works on one `LossSurface`: the mean loss of a module over a fixed data
set, seen as a function of a flat vector holding a chosen subset of the module's
parameters (all of them, or e.g. only a linear head evaluated on precomputed features).
Surfaces are snapshots: they copy the parameter values at construction, so training the
module afterwards does not move them.

* `LossSurface.gradient()`  mean gradient over the data (eq. 11 of the DI paper).
* `LossSurface.hvp(v)`      H v for the mean loss, by double backward (default) or by
  forward-over-reverse differentiation (`torch.func.jvp` of `torch.func.grad`); summed over
  mini-batches, so H is never formed.
* `conjugate_gradient`      (H + λI)⁻¹ v for a symmetric positive definite operator.
* `lissa`                   (H + λI)⁻¹ v by the stochastic Neumann recursion of Agarwal et
  al. (2017) as used by Koh & Liang (2017), one mini-batch per step.
* `data_influence`          ξ = − ḡᵀ (H + λI)⁻¹ g_core (DI eq. 4, 9–11; the paper prints the
  product of the two vectors without a transpose, ALGORITHMS.md settles it as a dot
  product).
* `loss_sum`                φ = Σ_i L(z_i, θ) (DI, the term of eq. 14).

Pure math: imports nothing from p2pfl and touches no files or network.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, grad, jvp

from p2pfl.core.influence import eval_mode

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
MatVec = Callable[[torch.Tensor], torch.Tensor]

# Both are exact; double backward measured 10-40% faster on one CPU thread for the project's
# CNNs (benchmarks/dic.py), forward-over-reverse needs less memory on large models.
HVP_METHODS = ("double_backward", "fwd_rev")
DEFAULT_HVP = "double_backward"
SOLVERS = ("cg", "lissa")


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def _mean_ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits, targets)


class LossSurface:
    """Mean loss of `module` over (x, y) as a function of the flat vector of parameters `names`.

    `state` gives the values (parameters and buffers, keyed as in `module.state_dict()`) at
    which the surface is taken; missing entries default to the module's current values.
    Only `names` vary; every other parameter and buffer is held fixed. Data are processed in
    chunks of `batch_size`, and chunk results are weighted by their size, so values,
    gradients and HVPs are exact means over the whole set whatever the chunking.
    """

    def __init__(
        self,
        module: nn.Module,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        names: Sequence[str] | None = None,
        state: Mapping[str, torch.Tensor] | None = None,
        loss_fn: LossFn = _mean_ce,
        batch_size: int = 128,
    ) -> None:
        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} rows but y has {len(y)}")
        if len(y) == 0:
            raise ValueError("a loss surface needs at least one sample")
        current = {k: v.detach() for k, v in module.state_dict(keep_vars=False).items()}
        values = {**current, **{k: v.detach() for k, v in (state or {}).items()}}
        param_names = [k for k, _ in module.named_parameters()]
        self.names = list(param_names if names is None else names)
        unknown = [n for n in self.names if n not in param_names]
        if unknown:
            raise KeyError(f"not parameters of the module: {unknown}")
        if not self.names:
            raise ValueError("a loss surface needs at least one parameter")
        self.module = module
        self.x, self.y = x, y
        self.loss_fn = loss_fn
        self.batch_size = int(batch_size)
        self.shapes = [tuple(values[n].shape) for n in self.names]
        self.numels = [math.prod(s) for s in self.shapes]
        self.point = flatten([values[n] for n in self.names]).clone()
        self.fixed = {k: v.clone() for k, v in values.items() if k not in set(self.names)}

    @property
    def dim(self) -> int:
        return int(self.point.numel())

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        pieces = torch.split(flat, self.numels)
        return {n: p.view(s) for n, p, s in zip(self.names, pieces, self.shapes)}

    def subset(self, indices: torch.Tensor) -> LossSurface:
        """The same surface over the samples `indices` (a stochastic Hessian, a core set)."""
        out = copy.copy(self)  # shares the point, fixed tensors and module: only the data differ
        out.x, out.y = self.x[indices], self.y[indices]
        return out

    # ---- per-chunk functions (pure in `flat`, so torch.func can transform them) --------------
    def _loss(self, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        params = {**self.fixed, **self.unflatten(flat)}
        return self.loss_fn(functional_call(self.module, params, (x,)), y)

    def _chunks(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, float]]:
        n = len(self)
        for start in range(0, n, self.batch_size):
            xb, yb = self.x[start : start + self.batch_size], self.y[start : start + self.batch_size]
            yield xb, yb, len(yb) / n

    # ---- whole-set quantities ----------------------------------------------------------------
    def value(self, reduction: str = "mean") -> float:
        """Mean (or summed) loss at the surface's point."""
        if reduction not in ("mean", "sum"):
            raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
        total = 0.0
        with eval_mode(self.module), torch.no_grad():
            for xb, yb, w in self._chunks():
                total += w * float(self._loss(self.point, xb, yb))
        return total * len(self) if reduction == "sum" else total

    def gradient(self) -> torch.Tensor:
        """∇ of the mean loss at the point, as a flat vector."""
        out = torch.zeros_like(self.point)
        g = grad(self._loss)
        with eval_mode(self.module):
            for xb, yb, w in self._chunks():
                out += w * g(self.point, xb, yb)
        return out

    def hvp(self, v: torch.Tensor, method: str = DEFAULT_HVP) -> torch.Tensor:
        """H v with H the Hessian of the mean loss at the point; H itself is never formed."""
        if v.shape != self.point.shape:
            raise ValueError(f"v has shape {tuple(v.shape)}, expected {tuple(self.point.shape)}")
        if method not in HVP_METHODS:
            raise ValueError(f"unknown HVP method {method!r}; choose one of {HVP_METHODS}")
        v = v.to(self.point.dtype)
        out = torch.zeros_like(self.point)
        with eval_mode(self.module):
            for xb, yb, w in self._chunks():
                out += w * (_hvp_fwd_rev if method == "fwd_rev" else _hvp_double_backward)(self, xb, yb, v)
        return out


def _hvp_fwd_rev(surface: LossSurface, x: torch.Tensor, y: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # Forward-mode derivative of the gradient along v: one extra forward pass through the
    # backward graph, cheaper in memory than differentiating the gradient a second time.
    g = grad(lambda flat: surface._loss(flat, x, y))
    return jvp(g, (surface.point,), (v,))[1]


def _hvp_double_backward(surface: LossSurface, x: torch.Tensor, y: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    flat = surface.point.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        (g,) = torch.autograd.grad(surface._loss(flat, x, y), flat, create_graph=True)
        (hv,) = torch.autograd.grad(g @ v, flat)
    return hv


# ---- inverse Hessian-vector products ----------------------------------------------------------
@dataclass(frozen=True)
class Solve:
    """Result of an inverse-HVP solver.

    `residual` is ‖(H + λI)x − b‖ / ‖b‖ for CG (the solver's own recurrence) and the relative
    change of the last LiSSA step; `negative_curvature` is set when CG met pᵀ(H + λI)p ≤ 0,
    i.e. the damped Hessian is not positive definite there, and stopped with its current x.
    """

    x: torch.Tensor
    iterations: int
    residual: float
    converged: bool
    negative_curvature: bool = False


def conjugate_gradient(
    matvec: MatVec,
    b: torch.Tensor,
    *,
    damping: float = 0.0,
    max_iterations: int = 100,
    tol: float = 1e-6,
) -> Solve:
    """Solve (A + damping·I) x = b for a symmetric A given only as `matvec`.

    Stops when the relative residual is below `tol`, after `max_iterations`, or on
    non-positive curvature (A + λI indefinite along the search direction): a truncated CG
    as in Newton-CG, which still returns the best iterate so far rather than diverging.
    """
    if damping < 0:
        raise ValueError(f"damping must be >= 0, got {damping}")
    if max_iterations < 1:
        raise ValueError(f"max_iterations must be >= 1, got {max_iterations}")
    b_norm = float(b.norm())
    x = torch.zeros_like(b)
    if b_norm == 0.0:
        return Solve(x, 0, 0.0, True)
    r = b.clone()
    p = r.clone()
    rs = float(r @ r)
    for it in range(1, max_iterations + 1):
        ap = matvec(p) + damping * p
        curvature = float(p @ ap)
        if not curvature > 0.0:  # also catches NaN
            return Solve(x, it - 1, math.sqrt(rs) / b_norm, False, negative_curvature=True)
        step = rs / curvature
        x = x + step * p
        r = r - step * ap
        rs_new = float(r @ r)
        residual = math.sqrt(rs_new) / b_norm
        if residual <= tol:
            return Solve(x, it, residual, True)
        p = r + (rs_new / rs) * p
        rs = rs_new
    return Solve(x, max_iterations, residual, False)


def lissa(
    sample_matvec: Callable[[torch.Tensor, int], torch.Tensor],
    b: torch.Tensor,
    *,
    damping: float = 0.0,
    scale: float,
    depth: int = 100,
    repeats: int = 1,
    tol: float = 1e-6,
) -> Solve:
    """(A + damping·I)⁻¹ b by the Neumann series of the scaled operator (LiSSA).

    With B = (A + λI)/scale, (A + λI)⁻¹ b = (1/scale) Σ_j (I − B)^j b, computed by the
    recursion h_0 = b, h_j = b + h_{j−1} − B_j h_{j−1}, result h/scale, where B_j uses the
    stochastic estimate `sample_matvec(v, j)` of A v (a fresh mini-batch per step).
    Converges when 0 < eigenvalues of B < 2, i.e. scale > (λ_max(A) + λ)/2 and A + λI ≻ 0;
    `scale` ≥ λ_max(A) + λ (e.g. from `top_eigenvalue`) is the safe choice. The error shrinks
    like (1 − (λ_min + λ)/scale)^depth, so small damping needs a large depth. Unlike
    Koh & Liang's code, `damping` here is the same λ as in `conjugate_gradient`.
    `repeats` independent recursions are averaged to reduce the variance. A recursion stops
    early once a step changes h by less than `tol` (relative); LiSSA has no residual, so
    `Solve.residual` is that last relative change and `converged` says it fell below `tol`.
    """
    if scale <= 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    if depth < 1 or repeats < 1:
        raise ValueError("depth and repeats must be >= 1")
    total = torch.zeros_like(b)
    step = 0
    residual = float("nan")
    steps_done = 0
    for _ in range(repeats):
        h = b.clone()
        for j in range(depth):
            new = b + h - (sample_matvec(h, step) + damping * h) / scale
            step += 1
            change = float((new - h).norm()) / max(float(new.norm()), 1e-300)
            h = new
            steps_done = j + 1
            residual = change
            if not torch.isfinite(h).all():
                raise FloatingPointError("LiSSA diverged: increase `scale` (it must exceed the top eigenvalue)")
            if change <= tol:
                break
        total += h / scale
    return Solve(total / repeats, steps_done, residual, residual <= tol)


def top_eigenvalue(matvec: MatVec, dim: int, *, iterations: int = 20, generator: torch.Generator | None = None,
                   dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> float:
    """|λ|_max of a symmetric operator by power iteration (to pick a LiSSA scale).

    The start vector is drawn on the host (where `generator` lives) and moved to `device`."""
    v = torch.randn(dim, generator=generator, dtype=dtype).to(device)
    v /= v.norm()
    estimate = 0.0
    for _ in range(iterations):
        w = matvec(v)
        estimate = float(w.norm())
        if estimate == 0.0:
            return 0.0
        v = w / estimate
    return estimate


# ---- DI's quantities ---------------------------------------------------------------------------
@dataclass(frozen=True)
class DataInfluence:
    """ξ and what produced it (for logs and artefacts)."""

    xi: float
    core_gradient_norm: float
    train_gradient_norm: float
    solve: Solve


def inverse_hvp(
    surface: LossSurface,
    v: torch.Tensor,
    *,
    damping: float,
    solver: str = "cg",
    iterations: int = 20,
    tol: float = 1e-6,
    lissa_depth: int = 100,
    lissa_scale: float | None = None,
    lissa_samples: int | None = None,
    generator: torch.Generator | None = None,
    method: str = DEFAULT_HVP,
) -> Solve:
    """(H + λI)⁻¹ v with H the Hessian of `surface`'s mean loss.

    CG uses the whole surface (a fixed operator, which CG needs). LiSSA draws
    `lissa_samples` samples per step (all of them when None: a deterministic recursion);
    its scale defaults to 1.1·(|λ|_max + λ) from 20 power iterations on the full surface.
    """
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; choose one of {SOLVERS}")
    if solver == "cg":
        return conjugate_gradient(lambda p: surface.hvp(p, method), v, damping=damping, max_iterations=iterations, tol=tol)
    if lissa_scale is None:
        top = top_eigenvalue(lambda p: surface.hvp(p, method), surface.dim, generator=generator,
                             dtype=surface.point.dtype, device=surface.point.device)
        lissa_scale = 1.1 * (top + damping)
    n = len(surface)

    def sample_matvec(h: torch.Tensor, _step: int) -> torch.Tensor:
        if lissa_samples is None or lissa_samples >= n:
            return surface.hvp(h, method)
        idx = torch.randperm(n, generator=generator)[:lissa_samples]
        return surface.subset(idx).hvp(h, method)

    return lissa(sample_matvec, v, damping=damping, scale=lissa_scale, depth=lissa_depth)


def data_influence(
    core: LossSurface,
    train: LossSurface,
    *,
    hessian: LossSurface | None = None,
    damping: float = 0.01,
    solver: str = "cg",
    **solver_options: object,
) -> DataInfluence:
    """ξ = − ḡᵀ (H + λI)⁻¹ g_core (DI eq. 4 with eq. 9–11).

    `core`: the loss over the random core subset at the GLOBAL parameters (g_core, eq. 11);
    `train`: the training loss at the trained LOCAL parameters (ḡ = (1/N) Σ ∇L(z_i, θ̂), and H,
    eq. 10); `hessian` overrides the surface H is taken on (a subsample of `train` to bound
    the cost). H is symmetric, so solving against g_core and dotting with ḡ equals the
    paper's order (ḡ's influence vector −H⁻¹ḡ dotted with g_core). By Koh & Liang's
    convention ξ is the first-order change of the core loss when the training data are
    up-weighted; DI maps it to a weight by eq. 12 (`p2pfl.core.dia`: under the ratio with all
    ξ < 0 the most negative ξ weighs most).
    `solver_options` go to `inverse_hvp`.
    """
    if core.names != train.names or core.dim != train.dim:
        raise ValueError("core and train surfaces must vary the same parameters")
    g_core = core.gradient()
    g_train = train.gradient()
    solve = inverse_hvp(hessian or train, g_core, damping=damping, solver=solver, **solver_options)  # type: ignore[arg-type]
    xi = -float(g_train @ solve.x)
    return DataInfluence(xi, float(g_core.norm()), float(g_train.norm()), solve)


def loss_sum(
    module: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    state: Mapping[str, torch.Tensor] | None = None,
    loss_fn: LossFn = _mean_ce,
    batch_size: int = 128,
) -> float:
    """φ = Σ_i L(z_i, θ): the summed (not mean) loss, as DI's eq. 14 defines it."""
    return LossSurface(module, x, y, state=state, loss_fn=loss_fn, batch_size=batch_size).value("sum")


def mean_gradient(
    module: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    names: Sequence[str] | None = None,
    state: Mapping[str, torch.Tensor] | None = None,
    loss_fn: LossFn = _mean_ce,
    batch_size: int = 128,
) -> torch.Tensor:
    """(1/N) Σ_i ∇L(z_i, θ) over the parameters `names` (all by default), flat."""
    return LossSurface(module, x, y, names=names, state=state, loss_fn=loss_fn, batch_size=batch_size).gradient()
