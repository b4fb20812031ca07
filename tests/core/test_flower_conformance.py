"""Conformance against Flower (issue 67): identical random inputs through Flower's aggregation
functions and strategies and through p2pfl's math core, asserting the same numbers, or the
difference docs/algorithms.md documents, exactly. Flower is an optional test dependency
(`pip install "p2pfl-influence[conformance]"`, which .ci/run installs)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="the Flower conformance tests need flwr: pip install 'p2pfl-influence[conformance]'")

from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays  # noqa: E402
from flwr.server.strategy import FedAdagrad, FedAdam, FedAvgM, FedYogi  # noqa: E402
from flwr.server.strategy.aggregate import (aggregate, aggregate_bulyan, aggregate_krum,  # noqa: E402
                                            aggregate_median, aggregate_trimmed_avg)

from p2pfl.core.influence import weighted_average  # noqa: E402
from p2pfl.core.robust import robust_aggregate, selection_aggregate  # noqa: E402
from p2pfl.core.server_opt import ServerOptimizer  # noqa: E402

KEYS = ("conv.weight", "conv.bias", "fc.weight")
SHAPES = ((4, 1, 3, 3), (4,), (3, 5))


def models(n: int, seed: int, spread: float = 1.0, offset: float = 0.0) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [[offset + spread * rng.standard_normal(shape) for shape in SHAPES] for _ in range(n)]


def states(arrays: list[list[np.ndarray]]) -> list[dict[str, torch.Tensor]]:
    return [{k: torch.from_numpy(a.copy()) for k, a in zip(KEYS, model)} for model in arrays]


def as_arrays(state: dict[str, torch.Tensor]) -> list[np.ndarray]:
    return [state[k].numpy() for k in KEYS]


def same(ours: list[np.ndarray], flower: list[np.ndarray]) -> None:
    for a, b in zip(ours, flower, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def one_coordinate(values: list[float]) -> list[list[np.ndarray]]:
    return [[np.array([v])] for v in values]


@pytest.mark.parametrize("n", [3, 10])
def test_weighted_mean_is_flowers_aggregate(n: int) -> None:
    arrays, counts = models(n, n), [int(c) for c in np.random.default_rng(n).integers(1, 500, n)]
    same(as_arrays(weighted_average(states(arrays), counts)), aggregate(list(zip(arrays, counts))))


@pytest.mark.parametrize("n", [5, 8])
def test_coordinate_median_is_flowers_aggregate_median(n: int) -> None:
    arrays = models(n, 10 + n)
    same(as_arrays(robust_aggregate(states(arrays), "median")), aggregate_median([(a, 1) for a in arrays]))


def test_an_even_median_is_the_mean_of_the_two_middles_as_the_issue_measured() -> None:
    values = [-3, -1, 0, 2, 3.5, 50, 1000, 3000]
    given = [{"w": torch.tensor([float(v)], dtype=torch.float64)} for v in values]
    assert float(robust_aggregate(given, "median")["w"]) == 2.75 == float(aggregate_median(
        [(m, 1) for m in one_coordinate(values)])[0][0])


@pytest.mark.parametrize("n,trim", [(10, 0.2), (7, 0.1), (9, 0.45)])
def test_trimmed_mean_is_flowers_aggregate_trimmed_avg(n: int, trim: float) -> None:
    arrays = models(n, 20 + n)
    same(as_arrays(robust_aggregate(states(arrays), "trimmed_mean", trim)),
         aggregate_trimmed_avg([(a, 1) for a in arrays], trim))


@pytest.mark.parametrize("n,f", [(5, 1), (7, 2), (9, 3), (30, 2)])
def test_krum_picks_flowers_model(n: int, f: int) -> None:
    for seed in range(4):
        arrays = models(n, 100 * n + seed)
        merged, _ = selection_aggregate(states(arrays), "krum", f)
        same(as_arrays(merged), aggregate_krum([(a, 1) for a in arrays], f, 0))


def test_krum_distances_are_exact_where_norms_dwarf_the_spread() -> None:
    """30 models 10⁸ from the origin and 1 apart: ‖a‖² + ‖b‖² − 2a·b loses the spread, the sum of
    squared differences keeps it, and Krum picks Flower's model."""
    arrays = models(30, 7, spread=1.0, offset=1e8)
    merged, _ = selection_aggregate(states(arrays), "krum", 2)
    same(as_arrays(merged), aggregate_krum([(a, 1) for a in arrays], 2, 0))


@pytest.mark.parametrize("n,f,keep", [(7, 1, 3), (9, 2, 5), (12, 3, 4)])
def test_multi_krum_picks_flowers_models_and_averages_them_unweighted(n: int, f: int, keep: int) -> None:
    """Documented difference: Flower's Multi-Krum weighs its picks by their sample counts
    (`aggregate`), ours takes their plain mean (a count is a claim an attacker can inflate)."""
    arrays = models(n, 40 + n)
    merged, picked = selection_aggregate(states(arrays), "multi_krum", f, keep)
    same(as_arrays(merged), aggregate_krum([(a, 1) for a in arrays], f, keep))  # equal counts: equal
    counts = [int(c) for c in np.random.default_rng(n).integers(1, 500, n)]
    flower = aggregate_krum(list(zip(arrays, counts)), f, keep)
    same(as_arrays(weighted_average([states(arrays)[i] for i in picked], [counts[i] for i in picked])), flower)


@pytest.mark.parametrize("n,f", [(7, 1), (8, 1), (11, 2), (12, 2)])
def test_bulyan_is_flowers_aggregate_bulyan(n: int, f: int) -> None:
    for seed in range(4):
        arrays = models(n, 1000 * n + seed)
        merged, _ = selection_aggregate(states(arrays), "bulyan", f)
        same(as_arrays(merged), aggregate_bulyan([(a, 1) for a in arrays], f, aggregate_krum, to_keep=0))


@pytest.mark.parametrize("values,expected", [([-3, -1, 0, 2, 3.5, 50, 1000, 3000], 1.125),
                                             ([-2, -1, 0, 1, -1000, 50, 1000], 0.0)])
def test_bulyan_on_the_issues_inputs(values: list[float], expected: float) -> None:
    """n = 8: the median of an even count of picks; n = 7: the last pick is Krum with one
    neighbour (Flower 0 where the lowest index gave -1); n = 8 gave -0.5 with the lower middle as median."""
    given = [{"w": torch.tensor([float(v)], dtype=torch.float64)} for v in values]
    ours = float(selection_aggregate(given, "bulyan", 1)[0]["w"])
    flower = float(aggregate_bulyan([(m, 1) for m in one_coordinate(values)], 1, aggregate_krum, to_keep=0)[0][0])
    assert ours == pytest.approx(flower, abs=1e-12)
    assert ours == expected


def test_integer_tensors_keep_the_first_models_value_where_flower_averages_them() -> None:
    """Documented difference: a step counter or BatchNorm's num_batches_tracked is not averaged."""
    given = [{"w": torch.tensor([1.0, 2.0]), "steps": torch.tensor(i)} for i in (3, 8, 10)]
    for merged in (robust_aggregate(given, "median"), selection_aggregate(given * 3, "krum", 1)[0]):
        assert int(merged["steps"]) == 3
    assert aggregate_median([([np.array([1.0, 2.0]), np.array(i)], 1) for i in (3, 8, 10)])[1] == 8


def _fit_results(arrays: list[list[np.ndarray]], counts: list[int]) -> list:
    ok = Status(code=Code.OK, message="")
    return [(None, FitRes(status=ok, parameters=ndarrays_to_parameters(a), num_examples=c, metrics={}))
            for a, c in zip(arrays, counts)]


@pytest.mark.parametrize("kind", ["momentum", "adagrad", "adam", "yogi"])
def test_server_optimizers_step_as_flowers_strategies(kind: str) -> None:
    """Four rounds of FedAvgM, FedAdagrad, FedAdam and FedYogi from the same start and the same
    clients. Documented difference: Flower's FedAdam scales η by the bias correction
    √(1 − β₂^(t+1)) / (1 − β₁^(t+1)); ours (Reddi et al.'s Algorithm 2) has none, so ours is stepped
    at Flower's corrected rate here and must then agree. Flower's FedAdagrad has no momentum (β₁ = 0)."""
    lr, beta1, beta2, tau = 0.3, 0.8, 0.95, 1e-3
    start = models(1, 5)[0]
    initial = ndarrays_to_parameters(start)
    flower = {"momentum": lambda: FedAvgM(initial_parameters=initial, server_learning_rate=lr, server_momentum=beta1),
              "adagrad": lambda: FedAdagrad(initial_parameters=initial, eta=lr, tau=tau),
              "adam": lambda: FedAdam(initial_parameters=initial, eta=lr, beta_1=beta1, beta_2=beta2, tau=tau),
              "yogi": lambda: FedYogi(initial_parameters=initial, eta=lr, beta_1=beta1, beta_2=beta2, tau=tau)}[kind]()
    ours = ServerOptimizer(kind, lr, 0.0 if kind == "adagrad" else beta1, beta2, tau)
    current = states([start])[0]
    for server_round in range(1, 5):
        clients, counts = models(4, 50 + server_round), [10, 20, 30, 40 + server_round]
        if kind == "adam":
            ours.lr = lr * np.sqrt(1 - beta2 ** (server_round + 1)) / (1 - beta1 ** (server_round + 1))
        current = ours.step(current, weighted_average(states(clients), counts))
        flowers, _ = flower.aggregate_fit(server_round, _fit_results(clients, counts), [])
        same(as_arrays(current), parameters_to_ndarrays(flowers))
