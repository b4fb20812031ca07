"""What arrives from a peer: the carrier's callbacks (which tensors and metadata a part must carry,
pushes) and a verified message turned into a `PeerModel`, its claims bounded on the way
(`p2pfl.runtime.peer_claims`). What a round learns about arrivals lives on that round's
`RoundChecks`, made anew for each gather."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from p2pfl.models import PARTS, SplitModel, part_spec, part_state
from p2pfl.runtime.devices import to_device
from p2pfl.runtime.metadata import MODEL_META, Schema
from p2pfl.runtime.node.neighbours import Neighbours
from p2pfl.runtime.node.round_start import loaded
from p2pfl.runtime.peer_claims import (ClaimRefused, Flattened, bound_update, capped_size, check_magnitude,
                                      check_variances, flattened, own_norms, update_norm)
from p2pfl.runtime.precision import dequantize, wire_spec
from p2pfl.runtime.settings import NodeSettings, Sparsity
from p2pfl.runtime.statements import Statement
from p2pfl.runtime.sparse_wire import BASE_META, REF_SUFFIX, RESTARTED, SparseReceiver, reference_spec, sparse_spec
from p2pfl.runtime.strategy import COORDINATOR_ID, PartDecl, PeerModel
from p2pfl.wire import Message


class PushRefused(ValueError):
    status = 409
    reason = "unsolicited_push"


@dataclass
class RoundChecks:
    """One gather's arrivals: what it waits for, and what it refused or pulled back, and why."""

    round: int
    round_start: Mapping[str, torch.Tensor] = field(default_factory=dict)  # the bound's anchor (empty: unbounded)
    # (peer, part) -> the push that may answer this gather's fetch of it, while the gather waits.
    awaiting: dict[tuple[str, str], asyncio.Future[PeerModel | None]] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)          # peer -> why its part was refused
    # peer -> each count its parts were pulled back on (weights, buffers, per part), with distance and bound
    bounded: dict[str, list[str]] = field(default_factory=dict)
    bounded_factor: dict[str, float] = field(default_factory=dict)  # peer -> how many times over the bound it lay
    own_norms: dict[str, float] = field(default_factory=dict)      # part -> its norm, what a peer's is bounded by
    own_updates: dict[str, float] = field(default_factory=dict)    # part -> how far this round's training moved it
    own_buffer_updates: dict[str, float] = field(default_factory=dict)  # part -> the same, of its floating buffers

    def pulled_back(self, sender: str, factor: float, reason: str) -> None:
        """One more count `sender`'s parts were pulled back on: each is named, none overwrites another
        (a part over both its buffers' and its weights' bound names both)."""
        self.bounded.setdefault(sender, []).append(reason)
        self.bounded_factor[sender] = max(self.bounded_factor.get(sender, 0.0), round(factor, 3))


class Intake:
    """The node's side of its carrier's callbacks. `current` is the gather in progress (or the
    last one): a push is taken only while it waits for exactly that (sender, part)."""

    def __init__(self, model: SplitModel, n_train: int, device: torch.device, settings: NodeSettings,
                 extra: dict[str, PartDecl], neighbours: Neighbours) -> None:
        self.model, self.n_train, self.device, self.settings = model, n_train, device, settings
        self.specs = {part: part_spec(model, part) for part in PARTS}
        floating_buffers = {name for name, b in model.named_buffers() if b.is_floating_point()}
        # part -> its floating buffers' keys: bounded as a group of their own (p2pfl.runtime.peer_claims)
        self.buffer_keys = {part: frozenset(k for k in part_state(model, part) if k in floating_buffers)
                            for part in PARTS}
        self.extra = extra  # parts besides the model's own (the coordinator's replies, setup parts)
        self.gave_up = False  # the node stops after this round: no gather waits for a part any more
        self.sparsity = Sparsity.parse(settings.wire_sparsity)
        # Each peer's public copy of each part it sends sparse (p2pfl.runtime.sparse_wire): at
        # first the initial model, which every node builds from the same seed.
        self.sparse = None if self.sparsity is None else SparseReceiver(
            {part: part_state(model, part) for part in PARTS})
        self.neighbours = neighbours
        # A part's membership news -> (statements verified with each member's key, unsigned "left"
        # claims); the node sets it from its carrier's roster and run.
        self.read_news: Callable[[Any], tuple[list[Statement], list[str]]] = lambda news: ([], [])
        self.current = RoundChecks(0)
        # (outbound-only neighbour, part) -> the newest part it pushed before a gather waited for it.
        self.early: dict[tuple[str, str], Message] = {}

    def expected(self, kind: str, part: str) -> dict[str, tuple[tuple[int, ...], str]] | None:
        if kind != "model":
            return None
        if part in self.extra:  # declared by the strategy; they travel at full precision
            return self.extra[part].spec
        if self.sparsity is not None:
            if part.endswith(REF_SUFFIX) and part.removesuffix(REF_SUFFIX) in self.specs:
                return reference_spec(self.specs[part.removesuffix(REF_SUFFIX)])
            return None if part not in self.specs else sparse_spec(self.specs[part], self.sparsity.fraction)
        spec = self.specs.get(part)
        return None if spec is None else wire_spec(spec, self.settings.wire_precision)

    def meta_schema(self, kind: str, part: str) -> Schema | None:
        if kind != "model":
            return None
        return self.extra[part].meta if part in self.extra else MODEL_META

    def give_up_waits(self) -> None:
        """Every part the gather under way (or a later one) still waits for is answered with nothing."""
        self.gave_up = True
        for waiting in self.current.awaiting.values():
            if not waiting.done():
                waiting.set_result(None)

    def on_push(self, message: Message) -> None:
        """A peer pushed a part. Taken only while this node's gather waits for exactly that
        (sender, part), at a version within one round of its own; it then answers the fetch."""
        h, checks = message.header, self.current
        waiting = checks.awaiting.get((h.sender, h.part.removesuffix(REF_SUFFIX)))
        if (waiting is None or waiting.done()) and h.sender in self.neighbours.push_only:
            self._keep_early(message)
            return
        if waiting is None or waiting.done():
            raise PushRefused(f"{h.sender}/{h.part} was not asked for (this node is in round {checks.round})")
        if not checks.round - 1 <= h.version <= checks.round + 1:
            raise PushRefused(f"version {h.version} of {h.sender}/{h.part} is not within one round of {checks.round}")
        try:
            waiting.set_result(self.peer_model(message, checks))
        except ClaimRefused as exc:
            checks.refused[h.sender] = str(exc)
            raise

    def _keep_early(self, message: Message) -> None:
        """An outbound-only neighbour pushes when it is done, whether or not this node waits yet:
        its newest part is kept for the next gather (one per part), and it becomes a neighbour."""
        h = message.header
        if h.version < self.current.round or h.version > self.settings.rounds:
            raise PushRefused(f"version {h.version} of {h.sender}/{h.part}: this node is in round {self.current.round}")
        part = h.part.removesuffix(REF_SUFFIX)
        if part not in self.specs:
            raise PushRefused(f"{h.sender} pushed {h.part!r}, not a model part")
        kept = self.early.get((h.sender, part))
        if kept is None or kept.header.version <= h.version:
            self.early[(h.sender, part)] = message
        self.neighbours.admit(h.sender, self.current.round + 1, self.settings.rounds, beyond_target=True)

    def peer_model(self, message: Message, checks: RoundChecks) -> PeerModel:
        """A verified message as a strategy sees it: every tensor already on this node's device,
        its claims bounded (ClaimRefused when over a bound)."""
        h = message.header
        tensors = message.torch_tensors()
        meta: dict[str, Any] = dict(h.meta)
        settings = self.settings
        part = h.part.removesuffix(REF_SUFFIX) if self.sparse is not None else h.part
        if part not in self.extra:  # a model part; the strategy's extra parts (setup steps, statistics) are its own
            if self.sparse is None:
                tensors = dequantize(tensors, self.specs[part], settings.wire_precision)
            elif part != h.part:  # the public copy, read whole
                tensors = self.sparse.take_reference(h.sender, part, h.version, tensors, self.specs[part])
            else:  # NeedReference: read `part#ref` (p2pfl.runtime.node.exchange)
                tensors = self.sparse.rebuild(h.sender, part, h.version, int(meta.get(BASE_META, RESTARTED)), tensors,
                                              self.specs[part])
            if self.sparse is not None:  # in the model's own dtypes, as dequantize gives them
                tensors = {k: v.to(getattr(torch, self.specs[part][k][1])) for k, v in tensors.items()}
            meta.pop(BASE_META, None)
            bounded = h.sender != COORDINATOR_ID and bool(checks.round_start) and settings.update_bound > 0
            # Read once for this part; nothing below keeps a view of it (round_start.py's scratch).
            start = loaded(checks.round_start, scratch=True) if bounded else None
            if part not in checks.own_norms:  # once per part and round: the own model is still while parts arrive
                checks.own_norms[part], update = own_norms(part_state(self.model, part), start)
                if update is not None:
                    checks.own_updates[part] = update
            flat = flattened(tensors) if bounded else None  # one float64 copy of the part for both bounds
            check_magnitude(h.sender, part, tensors, checks.own_norms[part], settings.max_norm_ratio, flat)
            check_variances(h.sender, part, tensors)
            if bounded and self.buffer_keys[part]:
                within = self.bounded_buffers(h.sender, part, tensors, checks, start)
                if within is not tensors:  # the weights' bound below is of the part with its buffers pulled back
                    tensors, flat = within, flattened(within)
            if bounded:
                tensors = self.bounded(h.sender, part, tensors, checks, flat, start)
            if h.sender != COORDINATOR_ID:
                self.neighbours.hear(*self.read_news(meta.pop("members", None)), checks.round)
            if h.sender != COORDINATOR_ID and "n_train" in meta:
                self.neighbours.declared_sizes.check(h.sender, int(meta["n_train"]))
                meta["n_train"] = capped_size(meta["n_train"], self.n_train, settings.max_weight_ratio)
        return PeerModel(h.sender, part, h.round, h.version, to_device(tensors, self.device), meta)

    def bounded_buffers(self, sender: str, part: str, tensors: dict[str, torch.Tensor], checks: RoundChecks,
                        round_start: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """The part with its floating buffers within `update_bound` times this node's own
        buffers' move this round; pulled back, the sender is named as for the weights."""
        keys = self.buffer_keys[part]
        start = {k: v for k, v in (round_start or loaded(checks.round_start)).items() if k in keys}
        if part not in checks.own_buffer_updates:
            own = {k: v for k, v in part_state(self.model, part).items() if k in keys}
            checks.own_buffer_updates[part] = update_norm(own, start)
        buffers = {k: v for k, v in tensors.items() if k in keys}
        clipped = bound_update(buffers, start, checks.own_buffer_updates[part], self.settings.update_bound)
        if clipped is None:
            return tensors
        pulled, distance, bound = clipped
        checks.pulled_back(sender, distance / bound,
                           f"{part}'s buffers moved {distance:.3g} from this node's round start, over "
                           f"{self.settings.update_bound:g} x its own buffers' move ({bound:.3g}); pulled back")
        return {**tensors, **pulled}

    def bounded(self, sender: str, part: str, tensors: dict[str, torch.Tensor], checks: RoundChecks,
                flat: Flattened | None = None, round_start: Mapping[str, torch.Tensor] | None = None
                ) -> dict[str, torch.Tensor]:
        """`tensors` within `update_bound` times this node's own update of `part` this round
        (`p2pfl.runtime.peer_claims.bound_update`, which uses up `flat`); a part pulled back names
        its sender in the round."""
        settings = self.settings
        if not settings.update_bound > 0:
            return tensors
        start = round_start or loaded(checks.round_start)  # the bound pairs each tensor of the part with its start
        if part not in checks.own_updates:
            checks.own_updates[part] = update_norm(part_state(self.model, part), start)
        clipped = bound_update(tensors, start, checks.own_updates[part], settings.update_bound, flat)
        if clipped is None:
            return tensors
        tensors, distance, bound = clipped
        refuse = settings.update_refuse
        if refuse > 0 and distance >= refuse * bound:
            raise ClaimRefused(f"{sender}/{part} moved {distance:.3g} from this node's round start, {distance / bound:.0f} "
                               f"times over {settings.update_bound:g} x its own update ({bound:.3g}; refused from "
                               f"{refuse:g} times over, runtime.update_refuse)")
        checks.pulled_back(sender, distance / bound,
                           f"{part} moved {distance:.3g} from this node's round start, over "
                           f"{settings.update_bound:g} x its own update ({bound:.3g}); pulled back to it")
        return tensors
