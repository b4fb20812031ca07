"""HVPs, inverse HVPs and ξ against explicit Hessians of tiny float64 models."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from p2pfl.core.influence_functions import (
    LossSurface,
    conjugate_gradient,
    data_influence,
    inverse_hvp,
    lissa,
    loss_sum,
    mean_gradient,
    top_eigenvalue,
)


def tiny_mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()


def logistic(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Linear(4, 3).double()


def data(n: int = 40, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g, dtype=torch.float64), torch.randint(3, (n,), generator=g)


def explicit_hessian(surface: LossSurface) -> torch.Tensor:
    """Reference H of the mean loss over the whole set, flattened (tests only)."""
    def f(flat: torch.Tensor) -> torch.Tensor:
        return surface._loss(flat, surface.x, surface.y)

    return torch.autograd.functional.hessian(f, surface.point)


def damped_solve(surface: LossSurface, v: torch.Tensor, damping: float) -> torch.Tensor:
    h = explicit_hessian(surface)
    return torch.linalg.solve(h + damping * torch.eye(len(v), dtype=h.dtype), v)


@pytest.mark.parametrize("method", ["fwd_rev", "double_backward"])
@pytest.mark.parametrize("batch_size", [7, 1000])
def test_hvp_matches_explicit_hessian(method: str, batch_size: int) -> None:
    x, y = data()
    surface = LossSurface(tiny_mlp(), x, y, batch_size=batch_size)
    v = torch.randn(surface.dim, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    expected = explicit_hessian(surface) @ v
    torch.testing.assert_close(surface.hvp(v, method), expected, rtol=1e-10, atol=1e-12)


def test_hvp_on_a_parameter_subset_is_the_hessian_block() -> None:
    x, y = data()
    model = tiny_mlp()
    full = LossSurface(model, x, y)
    head = LossSurface(model, x, y, names=["2.weight", "2.bias"])
    offset = full.dim - head.dim  # the last layer's parameters come last in parameter order
    block = explicit_hessian(full)[offset:, offset:]
    v = torch.randn(head.dim, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    torch.testing.assert_close(head.hvp(v), block @ v, rtol=1e-10, atol=1e-12)


def test_gradient_and_loss_sum_are_whole_set_quantities() -> None:
    x, y = data(33)
    model = tiny_mlp()
    loss = nn.functional.cross_entropy(model(x), y)
    expected = torch.autograd.grad(loss, list(model.parameters()))
    got = mean_gradient(model, x, y, batch_size=5)
    torch.testing.assert_close(got, torch.cat([g.reshape(-1) for g in expected]), rtol=1e-10, atol=1e-12)
    assert loss_sum(model, x, y, batch_size=4) == pytest.approx(float(loss.detach()) * 33, rel=1e-12)


def test_surface_is_a_snapshot_and_state_overrides() -> None:
    x, y = data()
    model = tiny_mlp()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    surface = LossSurface(model, x, y)
    value = surface.value()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    assert surface.value() == pytest.approx(value, rel=1e-12)
    assert LossSurface(model, x, y, state=before).value() == pytest.approx(value, rel=1e-12)


@pytest.mark.parametrize("damping", [0.01, 0.1])
def test_cg_solves_the_damped_system(damping: float) -> None:
    x, y = data(60)
    surface = LossSurface(logistic(), x, y)
    v = torch.randn(surface.dim, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    solve = inverse_hvp(surface, v, damping=damping, solver="cg", iterations=100, tol=1e-12)
    assert solve.converged and not solve.negative_curvature
    torch.testing.assert_close(solve.x, damped_solve(surface, v, damping), rtol=1e-8, atol=1e-10)


def test_cg_on_an_explicit_matrix_and_negative_curvature() -> None:
    a = torch.tensor([[4.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
    b = torch.tensor([1.0, 2.0], dtype=torch.float64)
    solve = conjugate_gradient(lambda p: a @ p, b, damping=0.5, max_iterations=10, tol=1e-14)
    torch.testing.assert_close(solve.x, torch.linalg.solve(a + 0.5 * torch.eye(2, dtype=a.dtype), b))
    assert solve.iterations <= 2  # CG is exact in at most dim steps
    indefinite = torch.diag(torch.tensor([1.0, -2.0], dtype=torch.float64))
    stopped = conjugate_gradient(lambda p: indefinite @ p, torch.tensor([0.0, 1.0], dtype=torch.float64))
    assert stopped.negative_curvature and not stopped.converged and torch.isfinite(stopped.x).all()


def test_lissa_full_batch_matches_solve() -> None:
    x, y = data(60)
    surface = LossSurface(logistic(), x, y)
    v = torch.randn(surface.dim, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    solve = inverse_hvp(surface, v, damping=0.1, solver="lissa", lissa_depth=3000,
                        generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(solve.x, damped_solve(surface, v, 0.1), rtol=1e-4, atol=1e-5)


def test_lissa_stochastic_is_close() -> None:
    x, y = data(200)
    surface = LossSurface(logistic(), x, y)
    v = torch.randn(surface.dim, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    expected = damped_solve(surface, v, 0.1)
    g = torch.Generator().manual_seed(0)
    solve = inverse_hvp(surface, v, damping=0.1, solver="lissa", lissa_depth=400, lissa_samples=64, generator=g)
    assert float((solve.x - expected).norm() / expected.norm()) < 0.15


def test_lissa_rejects_a_too_small_scale() -> None:
    a = torch.diag(torch.tensor([10.0, 1.0], dtype=torch.float64))
    with pytest.raises(FloatingPointError):
        lissa(lambda h, _: a @ h, torch.ones(2, dtype=torch.float64), scale=1.0, depth=2000)


def test_top_eigenvalue() -> None:
    a = torch.diag(torch.tensor([3.0, 1.0, 0.5], dtype=torch.float64))
    assert top_eigenvalue(lambda v: a @ v, 3, iterations=100, dtype=torch.float64) == pytest.approx(3.0, rel=1e-6)


@pytest.mark.parametrize("solver", ["cg", "lissa"])
def test_data_influence_matches_closed_form(solver: str) -> None:
    x, y = data(80)
    core_idx = torch.arange(16)
    global_model = logistic(0)
    local_model = logistic(1)  # stands in for the trained model: a different point
    core = LossSurface(global_model, x[core_idx], y[core_idx])
    train = LossSurface(local_model, x, y)
    damping = 0.1
    h = explicit_hessian(train) + damping * torch.eye(train.dim, dtype=torch.float64)
    g_core = core.gradient()
    g_train = train.gradient()
    expected = -float(g_train @ torch.linalg.solve(h, g_core))
    options = {"iterations": 100, "tol": 1e-12} if solver == "cg" else {"lissa_depth": 3000}
    got = data_influence(core, train, damping=damping, solver=solver, **options)
    rel = 1e-8 if solver == "cg" else 1e-3
    assert got.xi == pytest.approx(expected, rel=rel)
    # the paper's order, −(H⁻¹ ḡ)ᵀ g_core, is the same number because H is symmetric
    assert -float(torch.linalg.solve(h, g_train) @ g_core) == pytest.approx(expected, rel=1e-10)


def test_data_influence_head_only_on_a_cnn_is_finite() -> None:
    torch.manual_seed(0)
    body = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
    model = nn.Sequential(body, nn.Linear(4 * 3 * 3, 3))
    x = torch.randn(24, 1, 8, 8)
    y = torch.randint(3, (24,))
    full = LossSurface(model, x, y)
    head = LossSurface(model, x, y, names=["1.weight", "1.bias"])
    for surface in (full, head):
        inf = data_influence(surface.subset(torch.arange(8)), surface, damping=0.01, iterations=5)
        assert torch.isfinite(torch.tensor(inf.xi)) and inf.solve.iterations >= 1


def test_mismatched_surfaces_are_rejected() -> None:
    x, y = data()
    model = tiny_mlp()
    with pytest.raises(ValueError):
        data_influence(LossSurface(model, x, y, names=["0.weight"]), LossSurface(model, x, y))
    with pytest.raises(KeyError):
        LossSurface(model, x, y, names=["nope"])
