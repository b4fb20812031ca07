"""Output noise (pFedSV, Section V-B): Gaussian noise on the shared model after local training.

Before a node publishes, its round update Δ = θ − θ_round_start (every floating-point
entry of the state dict) is clipped to L2 norm `clip_norm` = C and N(0, (σ·C)²) is added to
every coordinate, in place: the node keeps training from the noisy model, so everything it
does afterwards is post-processing of what it published.

Accounting. One publication is a Gaussian mechanism. Its L2 sensitivity is 2C, not C:
changing one record of the node's data can move the clipped update anywhere in the ball
of radius C, so two neighbouring datasets give updates up to 2C apart. (Sensitivity C is
the client-level bound of DP-FedAvg, where a client's absence removes its update from a
server-side sum; here each node's model is downloaded on its own.) So each round is
accounted as one step of Opacus' accountant (RDP or PRV, as configured) with sample rate
1.0 and noise multiplier σ·C / 2C = σ/2, and the rounds compose at the run's δ. With
`target_epsilon`, σ = 2 · get_noise_multiplier(target, δ, sample_rate=1, steps=rounds).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from opacus.accountants import create_accountant
from torch import nn
from torch.utils.data import DataLoader

from p2pfl.privacy.accounting import epsilon_of, generator_states, restore_generators

SENSITIVITY_FACTOR = 2.0  # L2 sensitivity of the clipped update, in units of clip_norm


def clip_and_noise(
    model: nn.Module,
    round_start: Mapping[str, torch.Tensor],
    clip_norm: float,
    noise_std: float,
    generator: torch.Generator | None = None,
) -> float:
    """Clip θ − θ_start to `clip_norm`, add N(0, noise_std²) per coordinate, in place.
    Returns the update's norm before clipping."""
    state = model.state_dict()
    keys = [k for k, v in state.items() if v.is_floating_point()]
    missing = [k for k in keys if k not in round_start]
    if missing:
        raise KeyError(f"round_start lacks {missing[:5]}{'...' if len(missing) > 5 else ''}")
    with torch.no_grad():
        deltas = {k: state[k] - round_start[k].to(state[k].device, state[k].dtype) for k in keys}
        norm = math.sqrt(sum(float(d.double().pow(2).sum()) for d in deltas.values()))
        scale = min(1.0, clip_norm / norm) if norm > 0 else 1.0
        for k in keys:
            target = state[k]
            update = deltas[k] * scale
            if noise_std > 0:
                update += noise_std * torch.randn(
                    target.shape, generator=generator, device=target.device, dtype=target.dtype
                )
            target.copy_(round_start[k].to(target.device, target.dtype) + update)
    return norm


class OutputNoiseMechanism:
    mode = "output-noise"

    def __init__(
        self,
        *,
        noise_multiplier: float,
        clip_norm: float,
        delta: float,
        accountant: str = "rdp",
        epsilon_budget: float | None = None,
        seed: int = 0,
    ) -> None:
        self.noise_multiplier = float(noise_multiplier)
        self.clip_norm = float(clip_norm)
        self.delta = float(delta)
        self.accountant_kind = accountant
        self.epsilon_budget = epsilon_budget
        self.seed = seed
        self.accountant = create_accountant(mechanism=accountant)  # one per node, whole run
        self.last_update_norm: float | None = None
        self._generators: dict[str, torch.Generator] = {}
        self._eps_cache: tuple[tuple, float] | None = None

    @property
    def accounted_noise_multiplier(self) -> float:
        """Noise std over the L2 sensitivity (2 · clip_norm): what the accountant sees."""
        return self.noise_multiplier / SENSITIVITY_FACTOR

    def make_private(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader, epochs: int,
        regularizer: Callable[[nn.Module], torch.Tensor] | None = None,
    ) -> tuple[nn.Module, torch.optim.Optimizer, DataLoader]:
        return model, optimizer, loader

    def release(self, wrapped: nn.Module) -> None:
        pass

    def before_publish(self, model: nn.Module, round_start: Mapping[str, torch.Tensor]) -> None:
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        self.last_update_norm = clip_and_noise(
            model, round_start, self.clip_norm, self.noise_multiplier * self.clip_norm, self._generator(device)
        )
        self.accountant.step(noise_multiplier=self.accounted_noise_multiplier, sample_rate=1.0)

    def epsilon(self) -> float:
        """Cumulative epsilon at the run's delta; 0.0 before the first publication."""
        key = tuple(self.accountant.history)
        if self._eps_cache is None or self._eps_cache[0] != key:
            self._eps_cache = (key, epsilon_of(self.accountant.history, self.delta, self.accountant_kind))
        return self._eps_cache[1]

    def exhausted(self) -> bool:
        """True when one more publication would take epsilon above `epsilon_budget`."""
        if self.epsilon_budget is None:
            return False
        history = list(self.accountant.history) + [(self.accounted_noise_multiplier, 1.0, 1)]
        return epsilon_of(history, self.delta, self.accountant_kind) > self.epsilon_budget

    def state_dict(self) -> dict[str, Any]:
        return {"history": [list(h) for h in self.accountant.history], "last_update_norm": self.last_update_norm,
                "generators": generator_states(self._generators)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.accountant.history = [tuple(h) for h in state["history"]]
        self.last_update_norm = state["last_update_norm"]
        restore_generators(self._generators, state["generators"], self._generator)
        self._eps_cache = None

    def steps(self) -> int:
        return sum(n for _, _, n in self.accountant.history)

    def describe(self) -> dict[str, Any]:
        return {
            "mode": self.mode, "noise_multiplier": self.noise_multiplier, "clip_norm": self.clip_norm,
            "accounted_noise_multiplier": self.accounted_noise_multiplier, "delta": self.delta,
            "accountant": self.accountant_kind, "epsilon_budget": self.epsilon_budget,
        }

    def _generator(self, device: torch.device) -> torch.Generator:
        key = str(device)
        if key not in self._generators:
            self._generators[key] = torch.Generator(device=device).manual_seed((self.seed * 1_000_003 + 0x0A) % (2**63))
        return self._generators[key]
