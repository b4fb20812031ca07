"""What Client2Vec takes from outside a run: every node's index from an earlier run
(`indices_from`), and an exact text codec for tensors in a JSON checkpoint."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from p2pfl.core.client2vec import ClientIndex
from p2pfl.runtime.strategy import RunResults


def tensor_to_text(t: torch.Tensor) -> dict[str, Any]:
    """A float tensor for a JSON checkpoint, exactly: shape and float32 bytes as hex."""
    return {"shape": list(t.shape), "float32": t.detach().cpu().float().contiguous().numpy().tobytes().hex()}


def tensor_from_text(doc: dict[str, Any]) -> torch.Tensor:
    shape = [int(s) for s in doc["shape"]]
    data = bytearray(bytes.fromhex(doc["float32"]))
    if len(data) != 4 * math.prod(shape):
        raise ValueError(f"a tensor of shape {shape} needs {4 * math.prod(shape)} bytes, got {len(data)}")
    return torch.frombuffer(data, dtype=torch.float32).reshape(shape).clone()



@dataclass(frozen=True)
class ReusedIndices:
    path: str
    seed: int
    strategy: str
    indices: dict[str, ClientIndex]
    n_train: dict[str, int]


def parse_indices(run: RunResults) -> ReusedIndices:
    """The indices an earlier run recorded in its results.json (its "client2vec" block), as the
    scenario layer read it (`p2pfl.scenario.run_inputs`)."""
    field, path, results = "indices_from", run.path, run.document
    block = results.get("client2vec")
    if not isinstance(block, dict):
        raise ValueError(f"{field}: {path} holds no Client2Vec indices (not a client2vec run's results.json)")
    try:
        indices = {}
        for node, full in block["indices"].items():
            feature = torch.tensor(block["feature_indices"][node], dtype=torch.float32)
            indices[node] = ClientIndex(feature, torch.tensor(full, dtype=torch.float32)[len(feature):])
        n_train = {n["id"]: int(n["n_train"]) for n in results["nodes"] if n["id"] in indices}
        seed = int(results["scenario"]["seed"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{field}: {path} has a malformed client2vec block: {exc!r}") from exc
    return ReusedIndices(str(path), seed, str(block.get("strategy")), indices, n_train)
