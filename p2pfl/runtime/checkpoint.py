"""Checkpoints as signed wire frames: the same format as the network, no pickle.

A checkpoint holds the model's tensors and, as one uint8 tensor `STATE_TENSOR`, a JSON
document with everything else a node needs to go on where it stopped (round, round
records, strategy and privacy state, random generators, replay windows); a model that never
changed is held as its digest (`AS_BUILT`). It is written atomically (a swap file, exchanged
with the checkpoint in one step), so a process killed mid-write leaves the previous one.
`durable` also syncs it to disk before the exchange, so that it survives the machine going down;
a node asks for that at its end, not each round: at 1000 nodes on one disk, a sync per node
and round held up the threads that train (`python benchmarks/scale.py`).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import torch

from p2pfl.runtime.files import swap_path, write_swapped
from p2pfl.wire import (
    NodeKey,
    Roster,
    WireError,
    WireLimits,
    encode_body,
    open_message,
    seal_frame,
)

STATE_TENSOR = "__state__"
# A checkpoint of a node whose model is still the one it was built with (it has sat out every
# round so far) holds the model's digest under this key instead of its tensors: every node
# builds the same initial model from the scenario's seed, and at 10 % participation 900 of
# 1000 nodes wrote a whole model after round 1 (Flower's Net: 2.3 MB each).
AS_BUILT = "model_as_built"
# A strategy's state may hold tensors (momentum, server optimiser moments): each is stored as a
# tensor of the checkpoint under this prefix and its place in the JSON state, never pickled.
STRATEGY_TENSORS = "__strategy__/"
TENSOR_REF = "__tensor__"
FORMAT = 1


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: corrupt, foreign, or from another scenario. Nothing was loaded."""


def finite_json(value: Any) -> Any:
    """`value` with every NaN and ±Inf float as None: a round whose model trained to NaN is
    recorded, and the checkpoint (strict JSON) is still written."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def _strict_json(document: Mapping[str, Any]) -> str:
    """`document` as strict JSON, every NaN and ±Inf as null (`finite_json`). Nearly every
    document has none: it is encoded as it is, and walked in Python only when the encoder
    refuses it (a non-finite float, or a mapping that is not a dict)."""
    try:
        return json.dumps(document, allow_nan=False)
    except (ValueError, TypeError):
        return json.dumps(finite_json(document), allow_nan=False)


def save_checkpoint(path: Path, state: Mapping[str, torch.Tensor], *, key: NodeKey, node_id: str, round_: int,
                    extra: Mapping[str, Any] | None = None, durable: bool = True) -> None:
    """Write the state signed by `node_id`."""
    tensors: dict[str, Any] = {k: v.detach().to("cpu") for k, v in state.items()}
    if extra is not None:
        document = _strict_json({"format": FORMAT, **extra}).encode()
        tensors[STATE_TENSOR] = np.frombuffer(document, dtype=np.uint8)
    # Written as the frame's buffers, one after another, not joined into one more copy first.
    frame = seal_frame(key=key, kind="checkpoint", sender=node_id, recipient=node_id, round=round_, version=round_,
                       seq=round_, part="full", meta={}, body=encode_body(tensors))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_swapped(path, frame.chunks, durable=durable)


def tensors_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """BLAKE3 of the tensors' names, dtypes, shapes and values: whether two states are the same."""
    h = blake3.blake3()
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b"")
    return h.hexdigest()


def read_checkpoint(path: Path, *, node_id: str, public_hex: str) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
    """Verify and decode a checkpoint written by `node_id`: (model tensors, state document or None).
    A damaged one names, where there is one, the intact previous checkpoint in its swap file."""
    try:
        return _read_checkpoint(path, node_id=node_id, public_hex=public_hex)
    except CheckpointError as exc:
        swap = swap_path(Path(path))
        if "valid checkpoint" not in str(exc) or not swap.is_file():
            raise
        try:
            _, previous = _read_checkpoint(swap, node_id=node_id, public_hex=public_hex)
        except CheckpointError:
            raise exc from None
        round_ = (previous or {}).get("round")
        which = "an earlier one" if round_ is None else f"round {round_}"
        raise CheckpointError(f"{exc}. The previous checkpoint ({which}) is intact in {swap}: `mv {swap} {path}` and "
                              "--resume again goes on from it") from None


def _read_checkpoint(path: Path, *, node_id: str, public_hex: str) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise CheckpointError(f"checkpoint {path} cannot be read: {exc}") from None
    try:
        message = open_message(data, roster=Roster({node_id: public_hex}), recipient=node_id, replay=None,
                               limits=WireLimits(max_message_bytes=max(len(data), 1)))
    except WireError as exc:
        raise CheckpointError(f"checkpoint {path} is not a valid checkpoint of {node_id} under its key: {exc}") from None
    if message.header.kind != "checkpoint":
        raise CheckpointError(f"{path} is a {message.header.kind!r} frame, not a checkpoint")
    tensors = {k: v.clone() for k, v in message.torch_tensors().items() if k != STATE_TENSOR}
    document = None
    if STATE_TENSOR in message.tensors:
        try:
            document = json.loads(message.tensors[STATE_TENSOR].tobytes())
        except ValueError as exc:
            raise CheckpointError(f"checkpoint {path}: state is not JSON: {exc}") from None
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise CheckpointError(f"checkpoint {path}: unknown state format {document.get('format') if isinstance(document, dict) else None!r}")
    return tensors, document


def load_checkpoint(path: Path, *, node_id: str, public_hex: str) -> dict[str, torch.Tensor]:
    """The model tensors of a checkpoint written by `node_id` (whose public key is `public_hex`)."""
    return read_checkpoint(path, node_id=node_id, public_hex=public_hex)[0]


def scenario_digest(scenario: Mapping[str, Any]) -> str:
    """Identifies a resolved scenario, so that a checkpoint is never resumed under another one."""
    return hashlib.sha256(json.dumps(scenario, sort_keys=True).encode()).hexdigest()


def split_strategy_state(state: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """A strategy's state as JSON values, each tensor replaced by a reference to a checkpoint
    tensor of its own; anything else that JSON cannot hold is refused, naming its key."""
    tensors: dict[str, torch.Tensor] = {}

    def walk(value: Any, key: str) -> Any:
        if isinstance(value, torch.Tensor):
            name = f"{STRATEGY_TENSORS}{key}"
            tensors[name] = value.detach().cpu().contiguous()
            return {TENSOR_REF: name}
        if isinstance(value, Mapping):
            return {k: walk(v, f"{key}/{k}" if key else str(k)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [walk(v, f"{key}/{i}" if key else str(i)) for i, v in enumerate(value)]
        if value is None or isinstance(value, (str, bool, int, float)):
            return value
        raise TypeError(f"strategy state {key or '(root)'!r} holds a {type(value).__name__}: a strategy's "
                        "state_dict may hold JSON values (dicts, lists, strings, numbers) and torch tensors only")

    return walk(state, ""), tensors


def join_strategy_state(state: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """`split_strategy_state` undone: each reference replaced by its tensor."""
    if isinstance(state, Mapping):
        if set(state) == {TENSOR_REF}:
            if state[TENSOR_REF] not in tensors:
                raise CheckpointError(f"the strategy's state names tensor {state[TENSOR_REF]!r}, which the checkpoint lacks")
            return tensors[state[TENSOR_REF]]
        return {k: join_strategy_state(v, tensors) for k, v in state.items()}
    if isinstance(state, list):
        return [join_strategy_state(v, tensors) for v in state]
    return state


def read_resumable(path: Path, *, node_id: str, public_hex: str, scenario: Mapping[str, Any], rounds: int,
                   spec: Mapping[str, tuple[tuple[int, ...], str]], written_as: Mapping[str, Any] | None = None,
                   ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A checkpoint that this node (or coordinator) can resume from, verified in full before the
    caller loads anything: its signature, owner, scenario, model shapes and round records.
    `written_as`: the same scenario as an older format wrote it, whose checkpoints are bound to
    that form."""
    if not Path(path).exists():
        raise CheckpointError(f"--resume: no checkpoint at {path}")
    tensors, doc = read_checkpoint(path, node_id=node_id, public_hex=public_hex)
    if doc is None:
        raise CheckpointError(f"checkpoint {path} holds a model but no node state; it cannot be resumed")
    if doc.get("node") != node_id:
        raise CheckpointError(f"checkpoint {path} belongs to {doc.get('node')!r}, not {node_id}")
    if doc.get("scenario") not in {scenario_digest(form) for form in (scenario, written_as) if form is not None}:
        raise CheckpointError(f"checkpoint {path} was written for another scenario; resume with the same one")
    model = {k: v for k, v in tensors.items() if not k.startswith(STRATEGY_TENSORS)}
    if model or doc.get(AS_BUILT) is None:  # a model as built is rebuilt, not stored (the caller checks its digest)
        if set(model) != set(spec) or any(tuple(model[k].shape) != tuple(spec[k][0]) for k in spec):
            raise CheckpointError(f"checkpoint {path} does not hold this scenario's model")
    records = doc.get("rounds")
    if not isinstance(records, list) or len(records) != doc.get("round") or doc["round"] > rounds:
        raise CheckpointError(f"checkpoint {path}: round {doc.get('round')!r} does not match its records")
    return tensors, doc


def run_state(node_id: str, scenario: str, rounds: list[dict[str, Any]], replay: Any,
              totals: Mapping[str, int]) -> dict[str, Any]:
    """The fields every resumable checkpoint holds (node or coordinator); callers add their own.
    `scenario`: the resolved scenario's `scenario_digest`, made once by the caller (it never
    changes during a run, and a node writes a checkpoint every round)."""
    return {"node": node_id, "scenario": scenario, "round": len(rounds), "rounds": rounds,
            "replay": replay.snapshot(), "totals": dict(totals)}


def restore_run_state(doc: Mapping[str, Any], replay: Any, counter: Any) -> None:
    """Put back what `run_state` saved about the wire: peers' replay windows and byte totals."""
    replay.restore({str(k): int(v) for k, v in doc["replay"].items()})
    counter.earlier = {k: int(v) for k, v in doc["totals"].items()}
