"""DP-SGD through Opacus, with one accountant per node for the whole run.

Each `LocalTrainer.fit` is wrapped by Opacus' `PrivacyEngine.make_private` (per-sample
gradients through a `GradSampleModule`, a `DPOptimizer` that clips each sample's gradient
to `max_grad_norm` and adds N(0, (sigma * max_grad_norm)^2), Poisson-sampled batches) and
unwrapped by `release`. The engine, and with it the accountant, lives as long as the node,
so epsilon composes over every step of every round.

Three things Opacus leaves to the caller are done here:

* Empty Poisson batches. The trainer skips an empty batch, which would drop a step the
  accountant assumes happened (and whose absence depends on the data). The loader given to
  the trainer turns each empty draw into a noise-only step of the DP optimizer (clipped sum
  of nothing + Gaussian noise), so every drawn batch is one accounted step.
* Regularizers (FedProx's proximal term). Opacus replaces `p.grad` by the noisy clipped sum
  of per-sample gradients, so a term added to the loss would be dropped silently. The
  trainer hands the regularizer to `make_private`, and its gradient is added after clipping
  and noise. It must depend on the model only, never on the data (post-processing).
* Leftovers. `release` removes every hook and every attribute Opacus put on the model
  (`grad_sample`, `summed_grad`, `_forward_counter`, per-layer `activations`, ...), so the
  shared model is the plain module, round after round.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import torch
from opacus import PrivacyEngine
from opacus.grad_sample import AbstractGradSampleModule
from opacus.optimizers import DPOptimizer
from torch import nn
from torch.utils.data import DataLoader

from p2pfl.privacy.accounting import History, epsilon_of, generator_states, restore_generators

log = logging.getLogger("p2pfl.privacy")

# Opacus' per-sample hooks fire on the first layer, whose input needs no gradient; torch
# warns about it on every backward. Expected, and harmless here.
warnings.filterwarnings(
    "ignore", message="Full backward hook is firing when gradients are computed with respect to module outputs",
    category=UserWarning,
)

PARAM_ATTRS = ("grad_sample", "summed_grad", "_forward_counter", "_current_grad_sample", "_norm_sample")
MODULE_ATTRS = ("activations", "max_batch_len", "autograd_grad_sample_hooks", "ft_compute_sample_grad")


def strip_opacus(module: nn.Module) -> None:
    """Delete every attribute Opacus may have left on the parameters and submodules."""
    for p in module.parameters():
        for attr in PARAM_ATTRS:
            if hasattr(p, attr):
                delattr(p, attr)
    for m in module.modules():
        for attr in MODULE_ATTRS:
            if attr in m.__dict__:
                delattr(m, attr)


class NoiseOnEmptyBatches:
    """Iterates a DP data loader; an empty Poisson draw becomes a noise-only optimizer step.

    The step goes through the DP optimizer (zero per-sample gradients -> clipped sum 0 ->
    Gaussian noise -> scaled by the expected batch size), so it is accounted and moves the
    model exactly as DP-SGD's analysis assumes. The empty batch itself is not yielded.
    """

    def __init__(self, loader: DataLoader, optimizer: DPOptimizer) -> None:
        self.loader = loader
        self.optimizer = optimizer
        self.dataset = loader.dataset
        self.empty_steps = 0

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            first = batch[0] if isinstance(batch, (list, tuple)) else batch
            if len(first) == 0:
                self._noise_step()
                continue
            yield batch

    def _noise_step(self) -> None:
        opt = self.optimizer
        opt.zero_grad(set_to_none=True)
        for p in opt.params:
            p.grad_sample = p.new_zeros((0, *p.shape))
        opt.step()
        opt.zero_grad(set_to_none=True)
        self.empty_steps += 1


def _add_regularizer_grad(model: nn.Module, optimizer: DPOptimizer, regularizer: Callable[[nn.Module], torch.Tensor]) -> None:
    params = [p for p in optimizer.params if p.grad is not None]
    with torch.enable_grad():
        reg = regularizer(model)
    if not isinstance(reg, torch.Tensor) or not reg.requires_grad:
        return
    grads = torch.autograd.grad(reg, params, allow_unused=True)
    for p, g in zip(params, grads):
        if g is not None:
            p.grad.add_(g)


class DPSGDMechanism:
    """`PrivacyMechanism` for DP-SGD. `noise_multiplier` is final (derived from a target
    epsilon by `build_privacy` when asked); `sample_rate` and `round_steps` describe the
    planned round (Poisson rate 1/ceil(n/batch), epochs * steps per epoch) and are used by
    `exhausted` until a round has been observed."""

    mode = "dp-sgd"

    def __init__(
        self,
        *,
        noise_multiplier: float,
        max_grad_norm: float,
        delta: float,
        accountant: str = "rdp",
        epsilon_budget: float | None = None,
        poisson_sampling: bool = True,
        sample_rate: float,
        round_steps: int,
        seed: int = 0,
    ) -> None:
        self.noise_multiplier = float(noise_multiplier)
        self.max_grad_norm = float(max_grad_norm)
        self.delta = float(delta)
        self.accountant_kind = accountant
        self.epsilon_budget = epsilon_budget
        self.poisson_sampling = poisson_sampling
        self.sample_rate = float(sample_rate)
        self.round_steps = int(round_steps)
        self.seed = seed
        with warnings.catch_warnings():  # "Secure RNG turned off": expected for experiments
            warnings.simplefilter("ignore")
            self.engine = PrivacyEngine(accountant=accountant)
        self.accountant = self.engine.accountant  # one per node, for the whole run
        self.rounds: list[History] = []  # the steps of each published round
        self._round: Counter[tuple[float, float]] = Counter()
        self._generators: dict[str, torch.Generator] = {}
        self._eps_cache: tuple[tuple, float] | None = None
        self.empty_steps = 0  # empty Poisson draws turned into noise-only steps, whole run
        self._last_loader: NoiseOnEmptyBatches | None = None

    # -- PrivacyMechanism -------------------------------------------------------------
    def make_private(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loader: DataLoader,
        epochs: int,
        regularizer: Callable[[nn.Module], torch.Tensor] | None = None,
    ) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
        if len(loader.dataset) == 0 or len(loader) == 0:
            return model, optimizer, loader  # nothing to train on, nothing to account
        self.engine.dataset = None  # each fit's loader is a new view of the same local data
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            wrapped, dp_optimizer, dp_loader = self.engine.make_private(
                module=model, optimizer=optimizer, data_loader=loader,
                noise_multiplier=self.noise_multiplier, max_grad_norm=self.max_grad_norm,
                poisson_sampling=self.poisson_sampling, noise_generator=self._generator(device),
            )
        sample_rate = 1 / len(loader)  # what Opacus' loader and accountant use
        account = self.accountant.get_optimizer_hook_fn(sample_rate=sample_rate)

        def on_step(opt: DPOptimizer) -> None:
            account(opt)
            self._round[(opt.noise_multiplier, sample_rate * opt.accumulated_iterations)] += 1
            if regularizer is not None:
                _add_regularizer_grad(model, opt, regularizer)

        dp_optimizer.attach_step_hook(on_step)
        if self.poisson_sampling:
            dp_loader = NoiseOnEmptyBatches(dp_loader, dp_optimizer)
            self._last_loader = dp_loader
        return wrapped, dp_optimizer, dp_loader

    def release(self, wrapped: nn.Module) -> None:
        loader = self._last_loader
        if loader is not None:
            self.empty_steps += loader.empty_steps
            self._last_loader = None
        if not isinstance(wrapped, AbstractGradSampleModule):
            return
        module = wrapped._module
        wrapped.to_standard_module()  # removes the hooks and Opacus' parameter attributes
        strip_opacus(module)

    def before_publish(self, model: nn.Module, round_start: Mapping[str, torch.Tensor]) -> None:
        """DP-SGD already made the trained model private; this only closes the round's books."""
        self.rounds.append([(s, q, n) for (s, q), n in self._round.items()])
        self._round = Counter()

    def epsilon(self) -> float:
        """Cumulative epsilon at the run's delta; 0.0 before any step, inf when sigma = 0."""
        key = tuple(self.accountant.history)
        if self._eps_cache is None or self._eps_cache[0] != key:
            self._eps_cache = (key, epsilon_of(self.accountant.history, self.delta, self.accountant_kind))
        return self._eps_cache[1]

    def exhausted(self) -> bool:
        """True when one more round would take epsilon above `epsilon_budget`.

        "One more round" is the costlier of the planned round (epochs * steps per epoch at
        the planned sample rate) and the last round actually run (a strategy may fit more
        than once per round)."""
        if self.epsilon_budget is None:
            return False
        candidates: list[History] = [[(self.noise_multiplier, self.sample_rate, self.round_steps)]]
        if self.rounds and self.rounds[-1] and self.rounds[-1] != candidates[0]:
            candidates.append(self.rounds[-1])
        history = list(self.accountant.history)
        return any(
            epsilon_of(history + extra, self.delta, self.accountant_kind) > self.epsilon_budget for extra in candidates
        )

    # -- checkpoints --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"history": [list(h) for h in self.accountant.history], "rounds": [[list(h) for h in r] for r in self.rounds],
                "empty_steps": self.empty_steps, "generators": generator_states(self._generators)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.accountant.history = [tuple(h) for h in state["history"]]
        self.rounds = [[tuple(h) for h in r] for r in state["rounds"]]
        self.empty_steps = int(state["empty_steps"])
        restore_generators(self._generators, state["generators"], self._generator)
        self._eps_cache = None

    # -- reporting ----------------------------------------------------------------------
    def steps(self) -> int:
        return sum(n for _, _, n in self.accountant.history)

    def describe(self) -> dict[str, Any]:
        return {
            "mode": self.mode, "noise_multiplier": self.noise_multiplier, "max_grad_norm": self.max_grad_norm,
            "sample_rate": self.sample_rate, "round_steps": self.round_steps, "delta": self.delta,
            "accountant": self.accountant_kind, "epsilon_budget": self.epsilon_budget,
            "poisson_sampling": self.poisson_sampling,
        }

    def _generator(self, device: torch.device) -> torch.Generator:
        key = str(device)
        if key not in self._generators:
            self._generators[key] = torch.Generator(device=device).manual_seed(
                (self.seed * 1_000_003 + 0xD5) % (2**63)
            )
        return self._generators[key]


def planned_round(n_train: int, batch_size: int, epochs: int, poisson_sampling: bool) -> tuple[float, int]:
    """(sample rate, steps per round) exactly as Opacus will run them: the loader has
    ceil(n / batch) batches, the sample rate is 1 / that, and a Poisson loader draws
    int(1 / sample_rate) batches per epoch (one fewer for some sizes, e.g. 93)."""
    batches = max(1, math.ceil(n_train / batch_size))
    sample_rate = 1 / batches
    per_epoch = int(1 / sample_rate) if poisson_sampling else batches
    return sample_rate, epochs * per_epoch
