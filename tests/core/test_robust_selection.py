"""Krum, Multi-Krum and Bulyan against their definitions written out as loops (Blanchard et al.
2017; El Mhamdi et al. 2018), and what they are for: a far-off model is never picked."""

from __future__ import annotations

import pytest
import torch

from p2pfl.core.robust import models_needed, selection_aggregate


def states(n: int, seed: int, scale: float = 1.0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [{"w": torch.randn(3, 2, generator=g) * scale, "b": torch.randn(2, generator=g), "steps": torch.tensor(i)}
            for i in range(n)]


def vector(state: dict[str, torch.Tensor]) -> list[float]:
    return [float(x) for k in ("w", "b") for x in state[k].reshape(-1)]


def squared(a: list[float], b: list[float]) -> float:
    return sum((x - y) ** 2 for x, y in zip(a, b))


def krum_by_hand(vectors: list[list[float]], f: int, m: int = 1) -> list[int]:
    n = len(vectors)
    scores = []
    for i in range(n):
        others = sorted(squared(vectors[i], vectors[j]) for j in range(n) if j != i)
        scores.append(sum(others[: max(1, n - f - 2)]))  # at least one neighbour, as Flower's aggregate_krum
    return sorted(sorted(range(n), key=lambda i: (scores[i], i))[:m])


def bulyan_by_hand(vectors: list[list[float]], f: int) -> list[float]:
    left, picked = list(range(len(vectors))), []
    for _ in range(len(vectors) - 2 * f):
        sub = [vectors[i] for i in left]
        choice = krum_by_hand(sub, f)[0]  # Krum down to the last pick
        picked.append(left.pop(choice))
    beta = len(picked) - 2 * f
    out = []
    for c in range(len(vectors[0])):
        values = sorted(vectors[i][c] for i in picked)
        middle = values[(len(values) - 1) // 2: len(values) // 2 + 1]
        median = sum(middle) / len(middle)  # numpy's median: the mean of the two middles of an even count
        closest = sorted(values, key=lambda v: abs(v - median))[:beta]
        out.append(sum(closest) / beta)
    return out


@pytest.mark.parametrize("n,f", [(5, 1), (7, 2), (9, 3), (6, 1)])
def test_krum_and_multi_krum_pick_what_the_definition_picks(n: int, f: int) -> None:
    for seed in range(5):
        given = states(n, seed)
        vectors = [vector(s) for s in given]
        for m in (1, 2, n - f):
            rule = "krum" if m == 1 else "multi_krum"
            merged, picked = selection_aggregate(given, rule, f, m)
            assert picked == krum_by_hand(vectors, f, m)
            expected = [sum(vectors[i][c] for i in picked) / m for c in range(len(vectors[0]))]
            assert vector(merged) == pytest.approx(expected)
            assert int(merged["steps"]) == 0  # integer tensors: the first state's


@pytest.mark.parametrize("n,f", [(7, 1), (11, 2), (8, 1)])
def test_bulyan_is_its_definition(n: int, f: int) -> None:
    for seed in range(5):
        given = states(n, seed)
        merged, _ = selection_aggregate(given, "bulyan", f)
        assert vector(merged) == pytest.approx(bulyan_by_hand([vector(s) for s in given], f))


@pytest.mark.parametrize("rule", ["krum", "multi_krum", "bulyan"])
def test_a_far_off_model_is_never_picked(rule: str) -> None:
    given = states(7, 0)
    given[3] = {**given[3], "w": given[3]["w"] * 1000.0}
    merged, picked = selection_aggregate(given, rule, 1, 3 if rule == "multi_krum" else 0)
    assert 3 not in picked
    honest = torch.stack([s["w"] for i, s in enumerate(given) if i != 3])
    assert merged["w"].abs().max() <= honest.abs().max()


def test_too_few_models_and_bad_parameters_are_named() -> None:
    assert models_needed("krum", 1) == 5 and models_needed("bulyan", 1) == 7
    with pytest.raises(ValueError, match="bulyan with byzantine = 1 needs at least 7 models, got 6"):
        selection_aggregate(states(6, 0), "bulyan", 1)
    with pytest.raises(ValueError, match="multi_krum keeps 1 to n - byzantine = 4"):
        selection_aggregate(states(5, 0), "multi_krum", 1, 5)
    with pytest.raises(ValueError, match="byzantine must be >= 0"):
        selection_aggregate(states(5, 0), "krum", -1)


def test_multi_krum_keeping_all_but_f_with_f_zero_is_the_plain_mean() -> None:
    given = states(4, 3)
    merged, picked = selection_aggregate(given, "multi_krum", 0)
    assert picked == [0, 1, 2, 3]
    assert torch.allclose(merged["w"], torch.stack([s["w"] for s in given]).mean(0))
