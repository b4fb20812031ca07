"""Declared types and ranges of every metadata field the runtime or a strategy reads.

Metadata travels in the signed header, but a signature only says who sent a value, not
that it is sane: a roster peer may still send `n_train = "lots"` or 3e38. Each message is
checked against its schema where it enters the node (the transport), so a bad value is a
422 naming the field, the peer is skipped for that round, and no strategy ever sees it.
Fields a schema does not name pass through (bounded by the header size limit), but nothing
reads them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from p2pfl.wire import WireError
from p2pfl.wire.errors import quote


class BadMetadata(WireError):
    status = 422
    reason = "bad_metadata"

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"meta.{field}: {detail}")
        self.field = field


@dataclass(frozen=True)
class MetaField:
    """`kind` is "int", "float", "bool", "str" or "map" (str keys, values checked by `values`)."""

    kind: str
    minimum: float | None = None
    maximum: float | None = None
    required: bool = False
    nullable: bool = False
    max_length: int = 256  # str: characters; map: entries
    values: MetaField | None = None

    def check(self, name: str, value: Any) -> None:
        if value is None:
            if not self.nullable:
                raise BadMetadata(name, "must not be null")
            return
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise BadMetadata(name, f"expected a boolean, got {type(value).__name__}")
            return
        if self.kind in ("int", "float"):
            allowed = (int,) if self.kind == "int" else (int, float)
            if isinstance(value, bool) or not isinstance(value, allowed):
                raise BadMetadata(name, f"expected {'an integer' if self.kind == 'int' else 'a number'}, got {quote(value, 40)}")
            if not math.isfinite(value):
                raise BadMetadata(name, f"must be finite, got {value}")
            if self.minimum is not None and value < self.minimum:
                raise BadMetadata(name, f"must be >= {self.minimum:g}, got {quote(value, 40)}")
            if self.maximum is not None and value > self.maximum:
                raise BadMetadata(name, f"must be <= {self.maximum:g}, got {quote(value, 40)}")
            return
        if self.kind == "str":
            if not isinstance(value, str):
                raise BadMetadata(name, f"expected a string, got {type(value).__name__}")
            if len(value) > self.max_length:
                raise BadMetadata(name, f"is {len(value)} characters, limit is {self.max_length}")
            return
        if self.kind == "map":
            if not isinstance(value, Mapping):
                raise BadMetadata(name, f"expected a map, got {type(value).__name__}")
            if len(value) > self.max_length:
                raise BadMetadata(name, f"has {len(value)} entries, limit is {self.max_length}")
            for key, item in value.items():
                if not isinstance(key, str):
                    raise BadMetadata(name, f"keys must be strings, got {quote(key, 40)}")
                if self.values is not None:
                    self.values.check(f"{name}.{key[:40]}", item)
            return
        raise ValueError(f"unknown metadata kind {self.kind!r}")


Schema = Mapping[str, MetaField]


def check_meta(meta: Mapping[str, Any], schema: Schema) -> None:
    """Raise BadMetadata naming the first field of `schema` that `meta` gets wrong."""
    for name, field in schema.items():
        if name not in meta:
            if field.required:
                raise BadMetadata(name, "missing")
            continue
        field.check(name, meta[name])


MAX_SAMPLES = 10**9
FINITE = 1e12  # bound on losses and statistics: far above any real value, far below float overflow
MAX_NEWS = 256  # membership news one frame carries (p2pfl.runtime.node.neighbours)
MAX_ROUND = 10**9
#: Every model part a node publishes: the runtime adds `n_train`, which FedAvg-style weights read,
#: and the membership news it passes on (member -> its own signed statement, p2pfl.runtime.statements).
MODEL_META: dict[str, MetaField] = {
    "n_train": MetaField("int", 1, MAX_SAMPLES, required=True),
    "members": MetaField("map", max_length=MAX_NEWS, values=MetaField("str", max_length=160)),
    # A sparse part's public copy it is against (p2pfl.runtime.sparse_wire; -1: read the copy whole).
    "sparse_base": MetaField("int", -1, MAX_ROUND),
}
#: The coordinator's global model: the weights it aggregated with (nodes record their own).
GLOBAL_META: dict[str, MetaField] = {
    "weights": MetaField("map", max_length=100_000, values=MetaField("float", -FINITE, FINITE)),
}
_STAT = MetaField("float", -FINITE, FINITE, nullable=True)
_ACCURACY = MetaField("float", 0.0, 1.0, nullable=True)
#: The statistics a node pushes to the coordinator with its model (DI, GA, fedavg_global).
STATS_META: dict[str, MetaField] = {
    "n_train": MetaField("int", 1, MAX_SAMPLES, required=True),
    "train_loss": _STAT, "xi": _STAT, "phi": _STAT,
    "start_is_global": MetaField("bool", nullable=True),
    "val_loss_start": _STAT, "val_loss_local": _STAT, "val_loss_prev_local": _STAT,
    "val_acc_start": _ACCURACY, "val_acc_local": _ACCURACY, "val_acc_prev_local": _ACCURACY,
}
_STATEMENT = MetaField("str", required=True, max_length=160)  # p2pfl.runtime.statements
#: A goodbye: why, and the leaver's signed statement "left before round r" (r: the head's round).
GOODBYE_META: dict[str, MetaField] = {"reason": MetaField("str", max_length=500), "statement": _STATEMENT}
#: A return after a goodbye: the member's signed statement "live from round r".
BACK_META: dict[str, MetaField] = {"statement": _STATEMENT}
