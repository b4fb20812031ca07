"""What a hosted node holds: the bytes its object graph reaches, by the node attribute that first
reaches them, with what nodes hosted together share set apart (`benchmarks/node_memory.py`, and
the test that what one node holds does not grow with the federation).

A node's graph is walked from its attributes without crossing into other nodes, the event loop,
modules, classes, functions or loggers. Tensors, arrays and frames count their storage once (by
storage); every other object its `sys.getsizeof`. An object that several of the walked nodes reach
(the roster's one table, the scenario, interned keys) is shared, not any one node's.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import sys
import types
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from p2pfl.runtime.node import Node

WALK_LIMIT = 2_000_000  # objects per node; a walk that reaches this has escaped the node
# Walked past, not into: shared machinery, not what a node holds.
OPAQUE = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.FrameType,
          types.CodeType, asyncio.AbstractEventLoop, asyncio.Future, types.CoroutineType, logging.Logger,
          logging.Handler)


def storage_of(obj: Any) -> tuple[int, int] | None:
    """(key, bytes) of a tensor's storage, an array's buffer or a frame's bytes (1 KiB or more);
    None for anything else."""
    if isinstance(obj, torch.Tensor):
        try:
            storage = obj.untyped_storage()
            return storage.data_ptr(), storage.nbytes()
        except RuntimeError:  # a tensor without storage (meta, sparse)
            return None
    if isinstance(obj, (bytes, bytearray)) and len(obj) >= 1024:  # encoded frames held for peers
        return id(obj), len(obj)
    if isinstance(obj, np.ndarray):
        base = obj
        while isinstance(base.base, np.ndarray):
            base = base.base
        return id(base), base.nbytes
    return None


@dataclass(frozen=True)
class Reached:
    """What one node's walk reached: storage key -> (component, bytes), and object id -> (component, bytes)."""

    storages: dict[int, tuple[str, int]]
    objects: dict[int, tuple[str, int]]


def walk(node: Node, roots: Sequence[tuple[str, Any]] = ()) -> Reached:
    """`roots`: (component, object) walked first, in order (finer names than the node's attributes,
    e.g. ("model", node.parts.model)); then every attribute of the node, named after it."""
    reached = Reached({}, {})
    walk_from([*roots, *vars(node).items()], reached, {id(node), id(node.__dict__)}, node)
    return reached


def walk_from(roots: Sequence[tuple[str, Any]], reached: Reached, seen: set[int], node: Node | None = None) -> None:
    """Adds to `reached` what `roots` reach past `seen` (ids, grown as it goes), never entering a
    node other than `node`: a storage counts under the first root that reaches it."""
    for attr, root in roots:
        component = attr.lstrip("_")
        stack = [root]
        while stack:
            obj = stack.pop()
            if id(obj) in seen or isinstance(obj, OPAQUE) or (isinstance(obj, Node) and obj is not node):
                continue
            seen.add(id(obj))
            if len(seen) > WALK_LIMIT:
                raise RuntimeError(f"the walk from {attr} escaped its node ({WALK_LIMIT} objects)")
            storage = storage_of(obj)
            if storage is not None:
                reached.storages.setdefault(storage[0], (component, storage[1]))
                if not isinstance(obj, torch.Tensor):
                    continue
            if inspect.ismethod(obj):
                continue  # a bound method leads back to its object, walked from its own attribute
            reached.objects[id(obj)] = (component, sys.getsizeof(obj))
            if storage is None:
                stack.extend(gc.get_referents(obj))


def own_bytes(nodes: Sequence[Node]) -> list[dict[str, int]]:
    """For each node, component -> the bytes only it reaches among `nodes` (hosted together):
    what one more node costs, with what they share counted for none of them."""
    reached = [walk(n) for n in nodes]
    owners: Counter[tuple[str, int]] = Counter()
    for r in reached:
        owners.update(("s", k) for k in r.storages)
        owners.update(("o", k) for k in r.objects)
    out = []
    for r in reached:
        by_component: dict[str, int] = defaultdict(int)
        for kind, table in (("s", r.storages), ("o", r.objects)):
            for key, (component, nbytes) in table.items():
                if owners[(kind, key)] == 1:
                    by_component[component] += nbytes
        out.append(dict(by_component))
    return out
