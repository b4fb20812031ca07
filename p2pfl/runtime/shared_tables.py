"""Tables that nodes hosted together share: a mapping over one read-only base, holding only its
holder's changes.

Every node of a roster sees all N members (their addresses, their public keys). A worker that
hosts hundreds of nodes gave each its own copy of each table: N entries per node and table, N²
in the worker (1000 nodes: four million entries, a third of a MiB a node; 10,000 nodes would not
fit in memory). An `Overlay` over the roster's one table costs its holder the members it added,
replaced or removed (itself, a refused member) and nothing for the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from typing import Any, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")
W = TypeVar("W")


class Overlay(MutableMapping[K, V], Generic[K, V]):
    """`base` (shared, never written through this mapping) with this holder's own additions,
    replacements and removals on top. Reads are a dict's; a write touches this holder's part only."""

    __slots__ = ("_base", "_added", "_removed")

    def __init__(self, base: Mapping[K, V], removed: Iterable[K] = ()) -> None:
        self._base = base
        self._added: dict[K, V] = {}
        self._removed: set[K] = {k for k in removed if k in base}  # invariant: only keys of the base

    @property
    def base(self) -> Mapping[K, V]:
        return self._base

    def __getitem__(self, key: K) -> V:
        if key in self._added:
            return self._added[key]
        if key in self._removed:
            raise KeyError(key)
        return self._base[key]

    def __contains__(self, key: object) -> bool:
        return key in self._added or (key in self._base and key not in self._removed)

    def __setitem__(self, key: K, value: V) -> None:
        self._added[key] = value
        self._removed.discard(key)

    def __delitem__(self, key: K) -> None:
        if key not in self:
            raise KeyError(key)
        self._added.pop(key, None)
        if key in self._base:
            self._removed.add(key)

    def __iter__(self) -> Iterator[K]:
        for key in self._base:
            if key not in self._removed and key not in self._added:
                yield key
        yield from self._added

    def __len__(self) -> int:
        return len(self._base) - len(self._removed) + sum(1 for k in self._added if k not in self._base)

    def copy(self) -> Overlay[K, V]:
        """Another holder's view of the same base, with this one's changes (copied) to begin with."""
        out: Overlay[K, V] = Overlay(self._base)
        out._added, out._removed = dict(self._added), set(self._removed)
        return out

    def __repr__(self) -> str:
        return f"Overlay({len(self)} entries, {len(self._added)} own, {len(self._removed)} removed)"


DERIVED_KEPT = 16  # a worker's nodes share one roster: a few derivations of it (keys, addresses)
# (id of a base, a derivation) -> (the base, kept alive so that its id is not reused; the derived table)
_DERIVED: dict[tuple[int, Callable[..., Any]], tuple[Mapping[Any, Any], Mapping[Any, Any]]] = {}


def derived(base: Mapping[K, V], derive: Callable[[V], W]) -> Mapping[K, W]:
    """`{k: derive(v) for k, v in base.items()}`, made once per process for a base that nodes share
    (an `Overlay`'s base: the roster's table), so that their tables built from it are shared too."""
    key = (id(base), derive)
    found = _DERIVED.get(key)
    if found is None or found[0] is not base:
        found = (base, {k: derive(v) for k, v in base.items()})
        _DERIVED[key] = found
        while len(_DERIVED) > DERIVED_KEPT:  # a process that builds many runs keeps the newest tables only
            del _DERIVED[next(iter(_DERIVED))]
    return found[1]


def own_copy(table: Mapping[K, V]) -> MutableMapping[K, V]:
    """A copy its holder may change without changing `table`: an `Overlay`'s copy shares its base."""
    return table.copy() if isinstance(table, Overlay) else dict(table)


def keys_of(table: Mapping[K, object] | Iterable[K], *also: K) -> MutableMapping[K, object]:
    """The keys of `table` and `also` (values: whatever `table` holds, or None): an `Overlay`'s own
    copy where `table` is one, a dict where it is not."""
    out: MutableMapping[K, object] = own_copy(table) if isinstance(table, Mapping) else dict.fromkeys(table)
    out.update({key: None for key in also if key not in out})
    return out


def without(table: Mapping[K, V], *keys: K) -> MutableMapping[K, V]:
    """`own_copy(table)` less `keys`."""
    out = own_copy(table)
    for key in keys:
        out.pop(key, None)
    return out


def overlay_of(table: Mapping[K, V], derive: Callable[[V], W]) -> MutableMapping[K, W]:
    """`{k: derive(v) for k, v in table.items()}`; where `table` is an `Overlay`, an `Overlay` over
    the one table derived from its base (`derive` must be one function object, not a new lambda
    each call, for the derived table to be shared), with its own changes derived and kept."""
    if not isinstance(table, Overlay):
        return {k: derive(v) for k, v in table.items()}
    out: Overlay[K, W] = Overlay(derived(table.base, derive), table._removed)
    for k, v in table._added.items():
        out[k] = derive(v)
    return out
