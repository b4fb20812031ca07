"""Local training and evaluation, shared by every strategy.

Privacy plugs in through `PrivacyMechanism`: DP-SGD wraps model, optimizer and loader for
one fit; output noise perturbs the update before it is published. The trainer knows no
algorithm and no network.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from p2pfl.training.config import TrainConfig

# What `LocalTrainer.warm_up` has run in this process: model type and parameter shapes, device,
# and the batches' shapes.
_WARMED: set[tuple[Any, ...]] = set()

@dataclass
class FitResult:
    loss: float  # mean training loss over the last epoch
    steps: int
    samples: int


class PrivacyMechanism(Protocol):
    def make_private(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loader: DataLoader,
        epochs: int,
        regularizer: Callable[[nn.Module], torch.Tensor] | None = None,
    ) -> tuple[nn.Module, torch.optim.Optimizer, Iterable[Any]]:
        """Wrap for one fit (DP-SGD); return the inputs unchanged for mechanisms that act on outputs.

        A mechanism that wraps the model (returns another module) takes over `regularizer`:
        DP-SGD replaces the gradient by its noisy clipped per-sample sum, so a term added to
        the loss would be dropped; the mechanism adds its gradient after clipping and noise.
        """
        ...

    def release(self, wrapped: nn.Module) -> None:
        """Undo `make_private` after the fit: no hooks may survive into the next round."""
        ...

    def before_publish(self, model: nn.Module, round_start: Mapping[str, torch.Tensor]) -> None:
        """Perturb the model in place before it is shared (output noise); no-op for DP-SGD."""
        ...

    def epsilon(self) -> float | None:
        """Cumulative epsilon at the run's delta so far."""
        ...

    def exhausted(self) -> bool:
        """True when one more round would exceed the configured epsilon budget."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The accountant's history and the noise's random state: what a checkpoint keeps."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from `state_dict`'s output (a resumed node)."""
        ...

    def steps(self) -> int:
        """Accounted steps so far."""
        ...

    def describe(self) -> dict[str, Any]:
        """The mechanism's settings as resolved (noise multiplier, clipping, accountant), for results."""
        ...


def rng_state_hex(state: torch.Tensor) -> str:
    """A torch generator's state (uint8 tensor) as hex, for JSON checkpoints."""
    return state.cpu().numpy().tobytes().hex()


def rng_state_from_hex(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(bytes.fromhex(text)), dtype=torch.uint8)


def _split_tensors(split: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return split.x, split.y


class LocalTrainer:
    def __init__(
        self,
        config: TrainConfig,
        *,
        device: torch.device | str = "cpu",
        seed: int = 0,
        privacy: PrivacyMechanism | None = None,
    ) -> None:
        self.config = config
        self.device = torch.device(device)
        self.privacy = privacy
        self.generator = torch.Generator().manual_seed(seed)

    def loader(self, split: Any, batch_size: int | None = None, shuffle: bool = True) -> DataLoader:
        x, y = _split_tensors(split)
        return DataLoader(
            TensorDataset(x, y),
            batch_size=batch_size or self.config.batch_size,
            shuffle=shuffle,
            generator=self.generator if shuffle else None,
        )

    def epoch(self, split: Any) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """One epoch of `loader(split)`'s batches, drawn with the same calls on the generator.

        A `DataLoader` over a `TensorDataset` builds a few dozen Python objects per epoch, on
        every fit of every node (1000 nodes of 3 samples each fit every round). Its draws, in
        order: the iterator's base seed (one int64), the sampler's permutation, and, as the
        sampler runs out, a second permutation for its empty remainder. The batches index the
        split with that permutation, as its collation stacks the same rows
        (`tests/training/test_fit.py` checks batches and generator state against the loader's)."""
        x, y = _split_tensors(split)
        n = len(y)
        if n == 0:  # the loader's own error (a sampler over no samples)
            yield from self.loader(split)
            return
        torch.empty((), dtype=torch.int64).random_(generator=self.generator)
        order = torch.randperm(n, generator=self.generator)
        torch.randperm(n, generator=self.generator)
        batch_size = self.config.batch_size
        for start in range(0, n, batch_size):
            rows = order[start : start + batch_size]
            yield x[rows], y[rows]

    def make_optimizer(self, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        cfg = self.config
        params = [p for p in params if p.requires_grad]
        # `foreach`: each step's arithmetic over all parameters in one call. On the CPU torch's
        # default is a Python loop of several ops per parameter: a tenth to a fifth of the small
        # CNN's fit, warm or over hundreds of models in turn as a worker trains them
        # (`python benchmarks/optimizer_step.py`). The parameters are bitwise those of the loop
        # (tests/training/test_fit.py).
        if cfg.optimizer == "adam":
            return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=True)
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, foreach=True)

    def fit(
        self,
        model: nn.Module,
        split: Any,
        *,
        epochs: int | None = None,
        params: Iterable[nn.Parameter] | None = None,
        regularizer: Callable[[nn.Module], torch.Tensor] | None = None,
    ) -> FitResult:
        """Train `params` (default: all of `model`) for `epochs` with a fresh optimizer.

        `regularizer(model)` is added to the batch loss (FedProx's proximal term). A fresh
        optimizer per fit keeps the round's update a function of the round's start model,
        which is what peers aggregate.
        """
        epochs = self.config.epochs if epochs is None else epochs
        self._on_device(model)
        model.train()
        selected = list(model.parameters()) if params is None else list(params)
        selected_ids = {id(p) for p in selected}
        frozen = [p for p in model.parameters() if id(p) not in selected_ids and p.requires_grad]
        for p in frozen:
            p.requires_grad_(False)
        optimizer = self.make_optimizer(selected)
        trained: nn.Module = model
        loss_regularizer = regularizer
        loader: Iterable[Any] | None = None  # without privacy, each epoch is `epoch(split)`
        if self.privacy is not None:
            loader = self.loader(split)
            if epochs > 0:
                trained, optimizer, loader = self.privacy.make_private(model, optimizer, loader, epochs, regularizer)
                if trained is not model:
                    loss_regularizer = None  # the private optimizer adds its gradient after clipping and noise
        loss_fn = nn.CrossEntropyLoss()
        steps = samples = 0
        last_epoch_loss, last_epoch_n = 0.0, 0
        try:
            for _ in range(epochs):
                last_epoch_loss, last_epoch_n = 0.0, 0
                for xb, yb in self.epoch(split) if loader is None else loader:
                    if len(yb) == 0:  # Poisson sampling in DP-SGD can draw empty batches
                        continue
                    xb, yb = xb.to(self.device), yb.to(self.device)
                    optimizer.zero_grad(set_to_none=True)
                    loss = loss_fn(trained(xb), yb)
                    total = loss + loss_regularizer(model) if loss_regularizer is not None else loss
                    total.backward()
                    optimizer.step()
                    steps += 1
                    samples += len(yb)
                    last_epoch_loss += float(loss.detach()) * len(yb)
                    last_epoch_n += len(yb)
        finally:
            if trained is not model and self.privacy is not None:
                self.privacy.release(trained)
            for p in frozen:
                p.requires_grad_(True)
            # The last step's gradients are read by nobody after the fit (each step starts by
            # dropping them): held until the next round, they were a model's size per node.
            model.zero_grad(set_to_none=True)
        return FitResult(loss=last_epoch_loss / max(last_epoch_n, 1), steps=steps, samples=samples)

    def warm_up(self, model: nn.Module, split: Any, eval_split: Any, eval_batch_size: int = 1024) -> None:
        """One training-sized forward/backward and one evaluation-sized forward, changing nothing.

        The first pass at each batch shape pays one-off costs (kernel selection, allocator
        growth, lazy imports: torch's first optimizer imports torch._dynamo); a node runs
        this at start-up so that they are not charged to round 1. The costs are the process's:
        a pass at shapes this process has warmed up already is skipped (a worker's nodes share
        a few shapes; one pass each was a sixth of a 1000-node worker's start-up)."""
        self.make_optimizer(model.parameters())
        x, y = _split_tensors(split)
        if len(y) == 0:
            return
        ex, _ = _split_tensors(eval_split)
        n = min(self.config.batch_size, len(y))
        shapes = (type(model).__qualname__, tuple(tuple(p.shape) for p in model.parameters()), str(self.device),
                  tuple(x[:n].shape), str(x.dtype), tuple(ex[:eval_batch_size].shape))
        if shapes in _WARMED:
            return
        _WARMED.add(shapes)
        model.to(self.device)
        was_training = model.training
        model.eval()  # no running statistics (BatchNorm) may change
        try:
            nn.functional.cross_entropy(model(x[:n].to(self.device)), y[:n].to(self.device)).backward()
            with torch.no_grad():
                if len(ex):
                    model(ex[:eval_batch_size].to(self.device))
        finally:
            model.zero_grad(set_to_none=True)
            model.train(was_training)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: Any, batch_size: int = 1024) -> tuple[float, float]:
        """(accuracy, mean cross-entropy) of `model` on `split`."""
        self._on_device(model)
        return evaluate_logits(model, model, split, batch_size)

    @torch.no_grad()
    def evaluate_together(self, model: nn.Module, splits: list[Any]) -> list[tuple[float, float]]:
        """`evaluate` on each split, through one forward pass where they fit one small batch
        together: on a few samples the pass's fixed cost is most of its time, and a node scores
        its test and validation splits twice a round."""
        tensors = [_split_tensors(split) for split in splits]
        sizes = [len(y) for _, y in tensors]
        if len(splits) < 2 or min(sizes) == 0 or sum(sizes) > CPU_EVAL_BATCH:
            return [self.evaluate(model, split) for split in splits]
        joined = _Joined(torch.cat([x for x, _ in tensors]), torch.cat([y for _, y in tensors]))
        self._on_device(model)
        [(logits, labels)] = list(_eval_batches(model, model, joined, sum(sizes)))
        scores = []
        for part_logits, part_labels in zip(logits.split(sizes), labels.split(sizes)):
            loss = float(nn.functional.cross_entropy(part_logits, part_labels, reduction="sum"))
            scores.append((int((part_logits.argmax(1) == part_labels).sum()) / len(part_labels), loss / len(part_labels)))
        return scores

    def _on_device(self, model: nn.Module) -> None:
        """`model` on this trainer's device; `to` walks every module, so only when it is elsewhere
        (a node trains once and scores four times a round)."""
        first = next(model.parameters(), None)
        if first is None or first.device != self.device:
            model.to(self.device)


@dataclass(frozen=True)
class _Joined:
    x: torch.Tensor
    y: torch.Tensor


@torch.no_grad()
def evaluate_logits(forward: Callable[[torch.Tensor], torch.Tensor], module: nn.Module, split: Any,
                    batch_size: int = 1024) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of `forward(x)` on `split`, on `module`'s device and with
    `module` in eval mode (`forward` may be `module` itself or a functional call on it)."""
    n = len(_split_tensors(split)[1])
    if n == 0:
        return float("nan"), float("nan")
    correct, loss_sum = 0, 0.0
    for logits, yb in _eval_batches(forward, module, split, batch_size):
        loss_sum += float(nn.functional.cross_entropy(logits, yb, reduction="sum"))
        correct += int((logits.argmax(1) == yb).sum())
    return correct / n, loss_sum / n


@torch.no_grad()
def correct_per_sample(model: nn.Module, split: Any, batch_size: int = 1024) -> torch.Tensor:
    """Which samples of `split` `model` classifies right (bool, on the CPU), in eval mode."""
    hits = [(logits.argmax(1) == yb).cpu() for logits, yb in _eval_batches(model, model, split, batch_size)]
    return torch.cat(hits) if hits else torch.zeros(0, dtype=torch.bool)


# On the CPU, oneDNN runs a convolution on channels-last weights about 3x faster than on the
# default layout, and fastest on small batches (LeNet, 1000 digits, one thread: 0.74 s at
# batch 1024 as stored, 0.25 s channels-last at batch 64; `python benchmarks/evaluation.py`).
# Scoring a thousand test samples twice a round was most of a digits run's time.
CPU_EVAL_BATCH = 64


def scores_faster_channels_last(module: nn.Module) -> bool:
    """Whether `module` is a CPU model with 2-D convolutions, which oneDNN scores faster with
    channels-last weights and input in batches of `CPU_EVAL_BATCH`."""
    return any(isinstance(m, nn.Conv2d) for m in module.modules()) and all(
        p.device.type == "cpu" for p in module.parameters())


def _cpu_eval_copy(module: nn.Module) -> nn.Module | None:
    """A channels-last copy of a CPU model with 2-D convolutions, for scoring only; None where
    the stored layout is as fast (no convolution, not on the CPU) or the module cannot be copied.

    A copy, not a conversion in place: the model's own layout (and so its training arithmetic)
    stays as it was."""
    if not scores_faster_channels_last(module):
        return None
    try:
        copied = copy.deepcopy(module)
    except Exception:  # noqa: BLE001 - a module holding hooks or handles that do not copy: score it as it is
        return None
    return copied.to(memory_format=torch.channels_last).eval()


def _eval_batches(forward: Callable[[torch.Tensor], torch.Tensor], module: nn.Module, split: Any,
                  batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(logits, labels) per batch on `module`'s device, `module` in eval mode meanwhile."""
    x, y = _split_tensors(split)
    first = next(module.parameters(), None)
    device = first.device if first is not None else torch.device("cpu")
    if forward is module and len(y) > CPU_EVAL_BATCH:
        fast = _cpu_eval_copy(module)
        if fast is not None:
            for start in range(0, len(y), CPU_EVAL_BATCH):
                yield fast(x[start : start + CPU_EVAL_BATCH]), y[start : start + CPU_EVAL_BATCH]
            return
    was_training = module.training
    module.eval()
    try:
        for start in range(0, len(y), batch_size):
            yb = y[start : start + batch_size].to(device)
            yield forward(x[start : start + batch_size].to(device)), yb
    finally:
        module.train(was_training)
