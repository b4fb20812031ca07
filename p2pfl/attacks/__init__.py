"""Poisoning peers, for robustness tests and experiments (scenario table `[attack]`).

The chosen nodes (`nodes`, by index) misbehave from round `start_round` on, in one of three
ways; everything else about them (keys, metadata, timing) is honest, as a compromised roster
member's would be:

* `noise`: publish Gaussian noise instead of their parts, each tensor with `scale` times the
  standard deviation of the honest one (so magnitudes look plausible);
* `sign-flip`: publish θ_start − scale · (θ − θ_start), the round's update reversed;
* `label-flip`: train on labels y → C − 1 − y (the published model is what that training gives);
* `membership-lie`: publish honest parts whose membership news says every other member left
  (statements it signs itself, as a liar holding only its own key can) and that it joined this round.

Only what leaves the node is poisoned; attackers evaluate their own honest-looking copy.
"""

from __future__ import annotations

import dataclasses

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from p2pfl.errors import ConfigError, check_table

if TYPE_CHECKING:  # torch loads with the first attacker, not with the schema that reads [attack]
    import torch

    from p2pfl.data import NodeData

KINDS = ("none", "noise", "sign-flip", "label-flip", "membership-lie")


@dataclass(frozen=True)
class AttackSpec:
    kind: str = "none"
    nodes: tuple[int, ...] = field(default_factory=tuple)
    scale: float = 1.0
    start_round: int = 1

    @classmethod
    def from_dict(cls, table: Any, *, nodes: int, prefix: str = "attack") -> AttackSpec:
        check_table(table, ["kind", "nodes", "scale", "start_round"], prefix)
        kind = table.get("kind", "none")
        if kind not in KINDS:
            raise ConfigError(f"{prefix}.kind", f"unknown attack {kind!r}; choose one of {KINDS}")
        chosen = table.get("nodes", [])
        if not isinstance(chosen, list) or not all(type(i) is int for i in chosen):
            raise ConfigError(f"{prefix}.nodes", f"expected a list of node indices, got {chosen!r}")
        bad = [i for i in chosen if not 0 <= i < nodes]
        if bad:
            raise ConfigError(f"{prefix}.nodes", f"indices {bad} are outside the scenario's {nodes} nodes")
        scale = table.get("scale", 1.0)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
            raise ConfigError(f"{prefix}.scale", f"must be a number > 0, got {scale!r}")
        start = table.get("start_round", 1)
        if type(start) is not int or start < 1:
            raise ConfigError(f"{prefix}.start_round", f"must be an integer >= 1, got {start!r}")
        if kind != "none" and not chosen:
            raise ConfigError(f"{prefix}.nodes", f"attack {kind!r} needs at least one node index")
        return cls(kind, tuple(sorted(set(chosen))), float(scale), start)

    def attacks(self, index: int) -> bool:
        return self.kind != "none" and index in self.nodes


class Attack:
    """One attacking node's behaviour; the runtime calls it where the node trains and publishes."""

    def __init__(self, spec: AttackSpec, seed: int) -> None:
        import torch

        self.spec = spec
        self.generator = torch.Generator().manual_seed(seed * 7919 + 17)

    def active(self, round_: int) -> bool:
        return round_ >= self.spec.start_round

    def training_data(self, data: NodeData, num_classes: int) -> NodeData:
        """Label flip poisons the training split; the node's own val/test splits stay true."""
        from p2pfl.data import Split

        if self.spec.kind != "label-flip":
            return data
        flipped = Split(data.train.x, (num_classes - 1) - data.train.y)
        return dataclasses.replace(data, train=flipped)

    def published(self, parts: Mapping[str, Mapping[str, torch.Tensor]], start: Mapping[str, torch.Tensor],
                  round_: int) -> dict[str, dict[str, torch.Tensor]]:
        """What the node publishes instead of `parts` (host tensors; `start`: the round's start state)."""
        import torch

        if not self.active(round_) or self.spec.kind not in ("noise", "sign-flip"):
            return {p: dict(t) for p, t in parts.items()}
        out: dict[str, dict[str, torch.Tensor]] = {}
        for part, tensors in parts.items():
            out[part] = {}
            for name, value in tensors.items():
                if not value.is_floating_point():
                    out[part][name] = value
                elif self.spec.kind == "noise":
                    std = float(value.float().std()) if value.numel() > 1 else 1.0
                    noise = torch.randn(value.shape, generator=self.generator, dtype=value.dtype)
                    out[part][name] = noise * (self.spec.scale * (std if std > 0 else 1.0))
                else:
                    anchor = start[name].to(value.device, value.dtype)
                    out[part][name] = anchor - self.spec.scale * (value - anchor)
        return out


    def news(self, meta: Mapping[str, Any], members: Iterable[str], own: str, forge: Callable[[str, int], str],
             round_: int) -> dict[str, Any]:
        """The metadata a `membership-lie` node publishes in `round_`: every other member "left
        before this round" (`forge(member, event)`: signed with the liar's key, not theirs), itself
        "live from this round" (its own, valid word: as if it had just joined)."""
        if not self.active(round_) or self.spec.kind != "membership-lie":
            return dict(meta)
        lies = {m: forge(m, -round_) for m in sorted(members) if m != own}
        return {**meta, "members": {**lies, own: forge(own, round_)}}


def build_attack(spec: AttackSpec, index: int, seed: int) -> Attack | None:
    return Attack(spec, seed) if spec.attacks(index) else None
