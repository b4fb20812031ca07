"""What a node takes of a roster peer's claims before any strategy sees its part.

A signature proves who sent a part, not that its numbers are honest. Two claims decide how much
a part can move an aggregate, and both are bounded here, for every strategy alike:

* **`n_train`** weighs a peer in every size-weighted average (FedAvg, FedC2I's prior, the
  coordinator's ω). It is pinned at the first value a peer sends: a node's training split never
  changes during a run, so a later different value is refused. And it counts at most
  `max_weight_ratio` times a reference size: the node's own `n_train` on a node; on the
  coordinator the median of the round's other submissions, and never more than the others
  together (no member above half of the round's weight unless it is alone). A peer claiming 10⁹ samples otherwise takes
  0.99999996 of the average; capped at 4x, it weighs as four honest peers of the reference size
  at most, while honest splits within 4x of each other (every partition this project ships) are
  untouched. `max_weight_ratio = 0` turns the cap off (the papers' scenarios: their averages by
  sample count as printed).
* **Magnitude**: a part whose L2 norm exceeds `max_norm_ratio` times the node's own part's norm
  (own norms under 1 count as 1, so a fresh zero-initialised part is no trap) is refused. Finite
  values of 1e37 pass the wire's NaN check, get averaged in, and the next round trains to NaN; no
  honest peer's model is a thousand times larger than one's own.
* **Update**: a model part is at most `update_bound` times as far from the node's own model at
  the round's start as the node's own training moved that model this round, ‖θ_peer − θ_start‖ ≤
  c·‖θ_own − θ_start‖; a part farther away is pulled back along the same line onto that sphere
  (norm clipping, as in Sun et al. 2019, "Can you really backdoor federated learning?"), and
  the peer is named in the round's record. A sign-flipped update ×1000 or noise as large as a
  model then moves an average no more than c honest updates would. c = 1 by default: no peer
  moves a node further than its own training did (chosen on validation accuracy, docs/security.md). The bound reads honest
  peers as near one's own model, which holds for FedAvg's neighbours; personalised models and
  nodes with far less data than their peers (smaller steps) bound honest peers too, and the
  record says how often. The coordinator's global model is not bounded: it is the reference.
  A part `update_refuse` (100) or more times over the bound is refused instead: pulled back, a
  sign-flip x1000 still adds a reversed update as long as the node's own to every average
  (honest parts lay at most 10.8 times over in the poisoning table, that attacker 482 to 1744).
* **Buffers** (BatchNorm's running means and variances, any floating non-parameter tensor) are
  bounded as a group of their own, against how far this round moved the node's own buffers:
  lumped with the weights, whose norm dwarfs theirs, a running variance could move from 1 to
  1e-30 inside the part's bound. A running variance (`*.running_var`, PyTorch's name for it)
  must be positive and finite: BatchNorm divides by its square root.

A refusal raises `ClaimRefused` (a 422 for a pushed part); the node records the peer and reason
in the round's record and goes on without that part.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from p2pfl.runtime.devices import one_buffer

class ClaimRefused(ValueError):
    status = 422
    reason = "claim_refused"


# The norms below flatten a part into one float64 vector: one norm instead of one per tensor
# (a node bounds every peer's part each round; per tensor, the small ops' overhead was the cost).

def _flat64(tensors: Sequence[torch.Tensor], device: torch.device | None = None) -> torch.Tensor:
    """A new float64 vector (`cat` always copies): callers change it in place, never a peer's part."""
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
    return flat.to(device or flat.device, torch.float64)


def _floating_keys(tensors: Mapping[str, torch.Tensor]) -> list[str]:
    return [k for k, t in tensors.items() if t.is_floating_point() and t.numel() and not t.is_meta]  # a meta tensor holds no values


def _floating(tensors: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
    return [tensors[k] for k in _floating_keys(tensors)]


@dataclass(frozen=True)
class Flattened:
    """A peer part's floating tensors (`keys`, in the part's order) as one new float64 vector,
    made once and read by both bounds below: the magnitude bound measures it, and the update
    bound subtracts the round's start from it in place (so it is used up there)."""

    keys: tuple[str, ...]
    values: torch.Tensor


def flattened(tensors: Mapping[str, torch.Tensor]) -> Flattened:
    keys = tuple(_floating_keys(tensors))
    values = _flat64([tensors[k] for k in keys]) if keys else torch.zeros(0, dtype=torch.float64)
    return Flattened(keys, values)


def _norm(flat: Flattened) -> float:
    return float(torch.linalg.vector_norm(flat.values)) if flat.keys else 0.0


class FlatCopy(dict[str, torch.Tensor]):
    """A detached copy of a state (the model at a round's start) whose floating tensors are views
    into one flat buffer, in the state's order, where they share a dtype and a device (else each
    is a copy of its own). A peer part with the same tensors in the same order is then one
    subtraction away from it, with no copy of the state gathered for each peer (a node bounds
    four to a hundred peers' parts a round). Read-only, as any round start."""

    def __init__(self, state: Mapping[str, torch.Tensor]) -> None:
        super().__init__()
        keys = _floating_keys(state)
        gathered = one_buffer({k: state[k] for k in keys})
        self.flat, views = gathered if gathered is not None else (None, {})
        self.flat_keys: tuple[str, ...] = tuple(keys) if gathered is not None else ()
        for k, t in state.items():
            self[k] = views[k] if k in views else t.detach().clone()

    @classmethod
    def over(cls, flat: torch.Tensor, shapes: Mapping[str, torch.Size], rest: Mapping[str, torch.Tensor],
             order: Sequence[str]) -> FlatCopy:
        """One over `flat` itself, no copy: `shapes`' tensors view it in its order, `rest`'s are kept."""
        copy = cls.__new__(cls)
        copy.flat, copy.flat_keys = flat, tuple(shapes)
        pieces = dict(zip(shapes, flat.split([s.numel() for s in shapes.values()])))
        dict.update(copy, {k: pieces[k].view(shapes[k]) if k in pieces else rest[k] for k in order})
        return copy

    def origin(self, keys: Sequence[str]) -> torch.Tensor | None:
        """The flat buffer, when `keys` are exactly its tensors in its order; else None."""
        return self.flat if self.flat is not None and tuple(keys) == self.flat_keys else None


def part_norm(tensors: Mapping[str, torch.Tensor]) -> float:
    """The L2 norm over every floating tensor, in float64 (float32 squares overflow past 1.8e19)."""
    return _norm(flattened(tensors))


# Every peer's part is first measured in its own precision (at least float32): one copy and one norm,
# against the float64 path's two. Nearly all parts lie far under the magnitude bound; one within
# SCREEN_MARGIN of it, or with a non-finite screen, is measured again in float64, and a refusal is
# always the float64 value (float32's error on a norm of millions of values is far below the margin).
SCREEN_MARGIN = 1e-3


def _certainly_within(tensors: Sequence[torch.Tensor], bound: float) -> bool:
    """Whether the norm of `tensors` is under `bound` beyond doubt (False: measure it exactly)."""
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
    if flat.dtype not in (torch.float32, torch.float64):  # float16 and bfloat16 are too coarse
        flat = flat.float()
    return float(torch.linalg.vector_norm(flat)) <= bound * (1.0 - SCREEN_MARGIN)


def check_magnitude(sender: str, part: str, tensors: Mapping[str, torch.Tensor], own_norm: float,
                    max_norm_ratio: float, flat: Flattened | None = None) -> None:
    """Refuse `sender`'s `part` when its norm is over `max_norm_ratio` times `own_norm`, the node's
    own part's `part_norm` (at least 1). `flat`: `flattened(tensors)`, where the caller made it
    for the update bound; the float64 norm is then measured on it, with no screen."""
    bound = max_norm_ratio * max(own_norm, 1.0)
    if flat is not None:
        norm = _norm(flat)
    else:
        kept = _floating(tensors)
        if not kept or _certainly_within(kept, bound):
            return
        norm = float(torch.linalg.vector_norm(_flat64(kept)))  # part_norm, on the tensors already picked
    if not norm <= bound:
        raise ClaimRefused(f"{sender}/{part} has norm {norm:.3g}, over {max_norm_ratio:g} times this node's own "
                           f"({bound / max_norm_ratio:.3g}, bound {bound:.3g})")


def _paired_keys(tensors: Mapping[str, torch.Tensor], start: Mapping[str, torch.Tensor]) -> list[str]:
    return [k for k, t in tensors.items() if t.is_floating_point() and k in start and t.numel()]


def _difference(tensors: Mapping[str, torch.Tensor], start: Mapping[str, torch.Tensor],
                keys: Sequence[str], flat: Flattened | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(start, tensors − start) over `keys`, flattened, on `tensors`' device: the difference in
    float64, the start in its own dtype (widening inside `sub_` is exact: no float64 copy of it).
    `flat`, when it holds exactly `keys`, becomes the difference; a `FlatCopy` start over exactly
    `keys` is its own flat buffer, not gathered again."""
    moved = flat.values if flat is not None and flat.keys == tuple(keys) else _flat64([tensors[k] for k in keys])
    origin = start.origin(keys) if isinstance(start, FlatCopy) else None
    if origin is None:
        origin = torch.cat([start[k].detach().reshape(-1) for k in keys])
    origin = origin.to(moved.device)
    return origin, moved.sub_(origin)


def own_norms(part: Mapping[str, torch.Tensor], start: Mapping[str, torch.Tensor] | None) -> tuple[float, float | None]:
    """(`part_norm(part)`, `update_norm(part, start)`, or None without a `start`) from one float64
    copy of the node's own part: what a node measures peers' parts against, once a round."""
    flat = flattened(part)
    norm = _norm(flat)
    if start is None:
        return norm, None
    keys = _paired_keys(part, start)
    return norm, float(torch.linalg.vector_norm(_difference(part, start, keys, flat)[1])) if keys else 0.0


def update_norm(part: Mapping[str, torch.Tensor], start: Mapping[str, torch.Tensor]) -> float:
    """‖part − start‖ over the floating tensors both hold, in float64."""
    keys = _paired_keys(part, start)
    return float(torch.linalg.vector_norm(_difference(part, start, keys)[1])) if keys else 0.0


def bound_update(tensors: Mapping[str, torch.Tensor], start: Mapping[str, torch.Tensor], own_update: float,
                 update_bound: float, flat: Flattened | None = None) -> tuple[dict[str, torch.Tensor], float, float] | None:
    """`tensors` pulled onto the sphere of radius `update_bound`·`own_update` around `start`, with
    the distance it had and the bound; None when it is inside (or the bound is off: 0, or the node
    did not move, `own_update` 0, and so gives no scale). `flat`: `flattened(tensors)`, used up
    here (it becomes the difference)."""
    if not update_bound > 0 or not own_update > 0:
        return None
    keys = _paired_keys(tensors, start)
    if not keys:
        return None
    bound = update_bound * own_update
    origin, difference = _difference(tensors, start, keys, flat)
    distance = float(torch.linalg.vector_norm(difference))
    if distance <= bound:
        return None
    pulled = difference.mul_(bound / distance).add_(origin)  # start + (tensors − start)·(bound / distance), in float64
    dtypes = {tensors[k].dtype for k in keys}
    if len(dtypes) == 1:  # one conversion for the part, not one per tensor
        pulled = pulled.to(dtypes.pop())
    clipped = dict(tensors)
    for k, piece in zip(keys, pulled.split([tensors[k].numel() for k in keys])):
        clipped[k] = piece.view(tensors[k].shape).to(tensors[k].dtype)
    return clipped, distance, bound


# A peer's part this many times over runtime.update_bound looks like poisoning: in the poisoning
# table's bounded runs (runs/poison/*_b1: FedAvg, FedC2I, pFedSV, 3 seeds) honest parts lay at
# most 5.5 times over without an attacker (10.8 once, pFedSV beside a label-flipper), a sign-flip
# x1000 482 to 1744 times (refused from 100: runtime.update_refuse), Gaussian noise 4 to 24 times
# (docs/security.md). A refusal counts in a peer's conduct (`p2pfl.scenario.trust`) as a part pulled back this far;
# a neighbour this far over, or refused, in most rounds is asked no more (`Neighbours.judge`).
FAR_BOUND_FACTOR = 10.0


VARIANCE_SUFFIX = "running_var"


def check_variances(sender: str, part: str, tensors: Mapping[str, torch.Tensor]) -> None:
    """Refuse a part whose running variances are not all positive and finite."""
    for key, tensor in tensors.items():
        if key.endswith(VARIANCE_SUFFIX) and tensor.is_floating_point() and tensor.numel():
            if not bool(torch.isfinite(tensor).all()) or not bool((tensor > 0).all()):
                raise ClaimRefused(f"{sender}/{part} serves {key} with a value that is not a positive finite "
                                   f"variance (min {float(tensor.min()):.3g}): BatchNorm divides by its square root")


class DeclaredSizes:
    """Each peer's `n_train`, pinned at the first value it sends."""

    def __init__(self, pinned: Mapping[str, int] | None = None) -> None:
        self.pinned: dict[str, int] = dict(pinned or {})

    def check(self, sender: str, n_train: int) -> None:
        first = self.pinned.setdefault(sender, n_train)
        if first != n_train:
            raise ClaimRefused(f"{sender} now claims n_train = {n_train}, it declared {first}: a node's training "
                               "split does not change during a run")


def capped_size(n_train: int, reference: float, max_weight_ratio: float) -> int:
    """`n_train` counted at most `max_weight_ratio` times `reference` (and at least 1); a ratio of
    0 caps nothing (the papers' sample-count averages as printed)."""
    if max_weight_ratio == 0:
        return max(1, int(n_train))
    return max(1, min(int(n_train), int(max_weight_ratio * reference)))


def capped_sizes(sizes: Sequence[int], max_weight_ratio: float) -> list[int]:
    """What the coordinator weighs the round's submissions by: each size capped at
    `max_weight_ratio` times the median of the *other* sizes (the round's own median moves with
    the claim: of two nodes, one claiming 10⁹ set its own cap at 2·10⁹), then at the sum of the
    others, so that no member holds more than half of the round's weight unless it is alone. A
    ratio of 0 caps nothing."""
    if max_weight_ratio == 0 or len(sizes) < 2:
        return [max(1, int(n)) for n in sizes]
    capped = [capped_size(n, statistics.median(sizes[:i] + sizes[i + 1:]), max_weight_ratio)
              for i, n in enumerate(list(sizes))]
    total = sum(capped)
    # At most one member can hold more than half; held to half, the others keep their weights.
    return [min(n, total - n) for n in capped]


DISTRUST_AFTER = 3  # rounds a neighbour answered before its conduct can have it dropped


def newly_distrusted(conduct: dict[str, list[int]], answered: Iterable[str], refused: Iterable[str],
                     factors: Mapping[str, float], distrusted: Collection[str]) -> list[tuple[str, tuple[int, int]]]:
    """Count one gather into `conduct` (peer -> [rounds it answered, of them far over or refused]);
    the peers not yet `distrusted` whose part lay FAR_BOUND_FACTOR or more times over the update
    bound, or was refused, in most of the (at least DISTRUST_AFTER) rounds they answered, with
    their counts. Pulled back, a colluding pair just under the refusal still cost FedAvg 6.5
    points; honest parts lay at most 10.8 times over once (docs/security.md)."""
    refused = set(refused)
    found = []
    for peer in sorted(set(answered) | refused):
        seen = conduct.setdefault(peer, [0, 0])
        seen[0] += 1
        seen[1] += peer in refused or factors.get(peer, 0.0) >= FAR_BOUND_FACTOR
        if seen[0] >= DISTRUST_AFTER and 2 * seen[1] > seen[0] and peer not in distrusted:
            found.append((peer, (seen[0], seen[1])))
    return found
