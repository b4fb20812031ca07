"""Model checkpoints as signed wire frames: the same format as the network, no pickle."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

import torch

from p2pfl.wire import NodeKey, Roster, WireLimits, encode, open_message


def save_checkpoint(path: Path, state: Mapping[str, torch.Tensor], *, key: NodeKey, node_id: str, round_: int) -> str:
    """Write the state signed by `node_id`; returns the SHA-256 of the frame (to compare checkpoints)."""
    frame = encode(key=key, kind="checkpoint", sender=node_id, recipient=node_id, round=round_, version=round_,
                   seq=round_, part="full", meta={}, tensors=state)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(frame)
    return hashlib.sha256(frame).hexdigest()


def load_checkpoint(path: Path, *, node_id: str, public_hex: str) -> dict[str, torch.Tensor]:
    """Read and verify a checkpoint written by `node_id` (whose public key is `public_hex`)."""
    data = Path(path).read_bytes()
    message = open_message(data, roster=Roster({node_id: public_hex}), recipient=node_id, replay=None,
                           limits=WireLimits(max_message_bytes=max(len(data), 1)))
    return {k: v.clone() for k, v in message.torch_tensors().items()}
