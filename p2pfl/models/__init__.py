"""Models split into a feature extractor (`body`) and a linear classifier (`head`).

State-dict keys are prefixed `body.` and `head.`, so a model "part" is just the subset of
the state dict with that prefix; that is what travels on the wire.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn
from torch.func import functional_call

from p2pfl.errors import ConfigError
from p2pfl.plugins import call, is_reference

PARTS = ("body", "head", "full")


class SplitModel(nn.Module):
    """`forward(x) = head(body(x))`; `head` is one `nn.Linear(feature_dim, num_classes)`."""

    def __init__(self, body: nn.Module, feature_dim: int, num_classes: int) -> None:
        super().__init__()
        self.body = body
        self.head = nn.Linear(feature_dim, num_classes)
        self.feature_dim = feature_dim
        self.num_classes = num_classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class MaxPool2(nn.MaxPool2d):
    """`nn.MaxPool2d(2)`. Without gradients on the CPU (a node scoring its model, twice a round),
    each output is the maximum of the four strided views instead, the same values
    (`tests/models/test_pooling.py`): torch's NCHW max-pool kernel takes 1.1 ms of CPU for a
    24x16x28x28 activation where the maximum takes 0.1 ms, and a CNN's scoring pass on 24 images
    3.6 ms against 2.0 (`python benchmarks/pooling.py`). Training keeps torch's kernel (its
    backward sends each window's gradient to its first maximum)."""

    def __init__(self) -> None:
        super().__init__(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or x.device.type != "cpu":
            return super().forward(x)
        x = x[..., : x.shape[-2] // 2 * 2, : x.shape[-1] // 2 * 2]  # an odd last row or column is dropped, as there
        return torch.maximum(torch.maximum(x[..., 0::2, 0::2], x[..., 0::2, 1::2]),
                             torch.maximum(x[..., 1::2, 0::2], x[..., 1::2, 1::2]))


def _flat_size(body: nn.Module, in_channels: int, image_size: int) -> int:
    with torch.no_grad():
        return int(body(torch.zeros(1, in_channels, image_size, image_size)).shape[1])


def lenet(in_channels: int = 3, image_size: int = 28, num_classes: int = 10) -> SplitModel:
    """The FedC2I paper's LeNet: two 5x5 conv layers of 64 maps, fc 384, fc 192, fc classes."""
    conv = nn.Sequential(
        nn.Conv2d(in_channels, 64, 5), nn.ReLU(), MaxPool2(),
        nn.Conv2d(64, 64, 5), nn.ReLU(), MaxPool2(),
        nn.Flatten(),
    )
    flat = _flat_size(conv, in_channels, image_size)
    body = nn.Sequential(*conv, nn.Linear(flat, 384), nn.ReLU(), nn.Linear(384, 192), nn.ReLU())
    return SplitModel(body, 192, num_classes)


def cnn(in_channels: int = 3, image_size: int = 28, num_classes: int = 10, width: int = 16) -> SplitModel:
    """A small CNN for quick runs on 2 cores: two 3x3 conv blocks and one hidden fc layer."""
    conv = nn.Sequential(
        nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU(), MaxPool2(),
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), MaxPool2(),
        nn.Flatten(),
    )
    flat = _flat_size(conv, in_channels, image_size)
    body = nn.Sequential(*conv, nn.Linear(flat, 64), nn.ReLU())
    return SplitModel(body, 64, num_classes)


MODELS = {"lenet": lenet, "cnn": cnn}


def build_model(name: str, in_channels: int, image_size: int, num_classes: int) -> SplitModel:
    """A built-in model by name, or the user's: `"package.module:factory"` (see `p2pfl.plugins`)."""
    if is_reference(name):
        made = call(name, "model.name", in_channels=in_channels, image_size=image_size, num_classes=num_classes)
        if isinstance(made, SplitModel):
            return made
        if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], nn.Module) and isinstance(made[1], str):
            return split_at(made[0], made[1], name)
        raise ConfigError("model.name", f"{name} returned {type(made).__name__}; expected a SplitModel or "
                                        "(nn.Module, name of its final nn.Linear)")
    if name not in MODELS:
        raise ConfigError("model.name", f"unknown model {name!r}; choose one of {sorted(MODELS)} or 'package.module:factory'")
    return MODELS[name](in_channels=in_channels, image_size=image_size, num_classes=num_classes)


def split_at(module: nn.Module, head_name: str, source: str = "the model") -> SplitModel:
    """`module` as body + head: its linear layer `head_name` becomes the head (weights kept) and
    an identity takes its place in the body."""
    try:
        head = module.get_submodule(head_name)
    except AttributeError:
        raise ConfigError("model.name", f"{source} has no submodule {head_name!r}") from None
    if not isinstance(head, nn.Linear):
        raise ConfigError("model.name", f"{source}: {head_name!r} is a {type(head).__name__}, not the final nn.Linear")
    parent_name, _, leaf = head_name.rpartition(".")
    parent = module.get_submodule(parent_name) if parent_name else module
    setattr(parent, leaf, nn.Identity())
    split = SplitModel(module, head.in_features, head.out_features)
    split.head.load_state_dict(head.state_dict())
    return split


def part_state(model: nn.Module, part: str) -> dict[str, torch.Tensor]:
    """The detached tensors of one part (`body`, `head` or `full`), keyed as in the state dict."""
    if part not in PARTS:
        raise ValueError(f"unknown part {part!r}; expected one of {PARTS}")
    state = model.state_dict()
    if part == "full":
        return {k: v.detach() for k, v in state.items()}
    prefix = part + "."
    return {k: v.detach() for k, v in state.items() if k.startswith(prefix)}


def part_spec(model: nn.Module, part: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """Expected names, shapes and dtypes of a part, to validate tensors that arrive from peers."""
    return {k: (tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in part_state(model, part).items()}


def load_part(model: nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
    """Copy `tensors` into the model's parameters in place; names must be a subset of the state dict."""
    state = model.state_dict()
    unknown = set(tensors) - set(state)
    if unknown:
        raise KeyError(f"tensors not in the model: {sorted(unknown)}")
    with torch.no_grad():
        for name, value in tensors.items():
            state[name].copy_(value)


@torch.no_grad()
def body_features(model: SplitModel, x: torch.Tensor, state: Mapping[str, torch.Tensor] | None = None,
                  batch_size: int = 1024) -> torch.Tensor:
    """body(x) in eval mode, in batches on the model's device: at the model's own parameters, or at
    those of `state` (full-model keys, `body.` prefix) without loading them into the model."""
    body = model.body
    first = next(model.parameters(), None)
    device = first.device if first is not None else torch.device("cpu")
    body_state = None if state is None else {k[len("body."):]: v for k, v in state.items() if k.startswith("body.")}
    was_training = body.training
    body.eval()
    try:
        chunks = [body(xb) if body_state is None else functional_call(body, body_state, (xb,))
                  for xb in (x[i : i + batch_size].to(device) for i in range(0, len(x), batch_size))]
    finally:
        body.train(was_training)
    return torch.cat(chunks) if chunks else torch.empty(0, device=device)
