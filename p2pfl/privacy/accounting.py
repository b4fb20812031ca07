"""Epsilon from a history of (noise_multiplier, sample_rate, steps), through Opacus' accountants.

Opacus' accountants describe every step as a Poisson-subsampled Gaussian mechanism; an
output-noise round is the same mechanism with sample rate 1.0. Edge cases Opacus does not
handle are settled here: no steps -> 0.0, a step with sigma = 0 -> inf.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

from opacus.accountants import create_accountant
from opacus.accountants.utils import get_noise_multiplier

History = list[tuple[float, float, int]]


def _clean(history: Iterable[tuple[float, float, int]]) -> History:
    return [(float(s), float(q), int(n)) for s, q, n in history if n > 0 and q > 0]


def epsilon_of(history: Iterable[tuple[float, float, int]], delta: float, accountant: str = "rdp") -> float:
    """Cumulative epsilon at `delta` of the composed steps, computed by a fresh Opacus accountant."""
    steps = _clean(history)
    if not steps:
        return 0.0
    if any(sigma <= 0 for sigma, _, _ in steps):
        return math.inf
    acc = create_accountant(mechanism=accountant)
    acc.history = steps
    with warnings.catch_warnings():  # "optimal order is the largest alpha", log(0) in PRV at q = 1
        warnings.simplefilter("ignore")
        return float(acc.get_epsilon(delta))


def noise_for_target(target_epsilon: float, delta: float, sample_rate: float, steps: int, accountant: str = "rdp") -> float:
    """Opacus' `get_noise_multiplier`: the smallest sigma (to 0.01 in epsilon) whose epsilon after
    `steps` steps at `sample_rate` stays <= `target_epsilon`."""
    if steps < 1:
        raise ValueError("target_epsilon needs at least one private step in the run")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(get_noise_multiplier(
            target_epsilon=target_epsilon, target_delta=delta, sample_rate=sample_rate,
            steps=steps, accountant=accountant,
        ))


def generator_states(generators: dict[str, torch.Generator]) -> dict[str, str]:
    """Noise generators' states by device, as hex, for checkpoints."""
    from p2pfl.training.trainer import rng_state_hex

    return {device: rng_state_hex(g.get_state()) for device, g in generators.items()}


def restore_generators(generators: dict[str, torch.Generator], states: dict[str, str],
                       make: Callable[[torch.device], torch.Generator]) -> None:
    import torch

    from p2pfl.training.trainer import rng_state_from_hex

    for device, state in states.items():
        generator = generators.get(device) or make(torch.device(device))
        generator.set_state(rng_state_from_hex(state))
