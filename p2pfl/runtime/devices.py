"""Where a node's tensors live. The runtime alone moves tensors between host and device.

* `node_device`: the scenario's `device` for node `index` ("cuda" spreads nodes over the
  visible GPUs, node i on GPU i mod count; "cuda:N" pins one).
* `to_device`: everything a strategy receives (peer parts, the coordinator's global model)
  goes through it, so strategies never see a tensor on another device than their model.
* `host_snapshot`: publishing copies a part to host memory once; the wire encodes that
  copy without copying it again, and training may go on changing the model meanwhile.
* `lend` and `take_back`: a model on the host publishes its own tensors instead, and takes
  fresh storage back before anything writes to it (the round's aggregation): between the two,
  while the node waits for its peers' parts, it holds one copy of its model, not two.
* `data_to_device`: a node's splits are moved once at start, so every training,
  evaluation and influence batch is already where the model is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from p2pfl.data import NodeData, Split
from p2pfl.errors import ConfigError


def node_device(setting: str, index: int) -> torch.device:
    """The device of node `index` for the scenario's `device` setting; a clear error if it does not exist."""
    if setting == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("device", f"{setting!r} was asked for but torch.cuda.is_available() is False on this machine")
    count = torch.cuda.device_count()
    if setting == "cuda":
        return torch.device("cuda", index % count)
    try:
        device = torch.device(setting)
    except RuntimeError as exc:
        raise ConfigError("device", f"expected 'cpu', 'cuda' or 'cuda:N', got {setting!r} ({exc})") from None
    if device.type != "cuda" or device.index is None:
        raise ConfigError("device", f"expected 'cpu', 'cuda' or 'cuda:N', got {setting!r}")
    if device.index >= count:
        raise ConfigError("device", f"{setting!r} does not exist: this machine has {count} visible GPU(s)")
    return device


def seed_torch(seed: int, device: torch.device) -> None:
    """`torch.manual_seed`, where the node's device is the CPU only the CPU's generator: torch
    seeds CUDA's too while CUDA is not initialized, and formats the caller's stack for it each
    time (6 % of a 1000-node worker's start-up, one seeding a node)."""
    if device.type == "cpu":
        torch.random.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)


def to_device(tensors: Mapping[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """The tensors on `device` (no copy for those already there)."""
    return {name: t.to(device, non_blocking=True) for name, t in tensors.items()}


def one_buffer(tensors: Mapping[str, torch.Tensor],
               device: torch.device | str | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]] | None:
    """A detached copy of `tensors` as one flat buffer (on `device`, else theirs) and a contiguous
    view of it per tensor, in order; None where they do not share a dtype and a device. One
    gathering call instead of a copy per tensor: a node copies its model this way several times
    a round (round start, before aggregation, publishing)."""
    if not tensors or len({(t.dtype, t.device) for t in tensors.values()}) != 1:
        return None
    flat = torch.cat([t.detach().reshape(-1) for t in tensors.values()])
    if device is not None:
        flat = flat.to(device)
    pieces = flat.split([t.numel() for t in tensors.values()])
    return flat, {name: piece.view(t.shape) for (name, t), piece in zip(tensors.items(), pieces)}


def host_snapshot(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous host copies, detached from the model: what the wire may reference while training goes on."""
    gathered = one_buffer(tensors, "cpu")
    if gathered is not None:
        return gathered[1]
    # copy=True also on the host, where .to("cpu") would return the model's own tensor;
    # contiguous_format so the wire can take each as one buffer.
    return {name: t.detach().to("cpu", copy=True, memory_format=torch.contiguous_format) for name, t in tensors.items()}


def device_of(module: torch.nn.Module) -> torch.device:
    first = next(module.parameters(), None)
    return first.device if first is not None else torch.device("cpu")


def split_to_device(split: Split, device: torch.device) -> Split:
    return Split(split.x.to(device), split.y.to(device))


def data_to_device(data: NodeData, device: torch.device) -> NodeData:
    return dataclasses.replace(
        data, train=split_to_device(data.train, device), val=split_to_device(data.val, device),
        test=split_to_device(data.test, device),
        extra_tests={name: split_to_device(split, device) for name, split in data.extra_tests.items()},
    )


def lend(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A host model's own tensors, detached and not copied, for the wire to reference until the
    model `take_back`s its storage; a `host_snapshot` where they are on a device or not contiguous."""
    if all(t.device.type == "cpu" and t.is_contiguous() for t in tensors.values()):
        return {name: t.detach() for name, t in tensors.items()}
    return host_snapshot(tensors)


def take_back(model: torch.nn.Module) -> None:
    """Every parameter and buffer of `model` on storage of its own again (a copy; the tensor
    objects stay, so optimizers and hooks still hold them): what `lend` gave the wire keeps its
    values while the model changes."""
    for tensor in [*model.parameters(), *model.buffers()]:
        tensor.data = tensor.data.clone()
