"""What an honest-but-curious node holds after a run: the parts it read, its own data, its own model.

`Seat.open` reads the files a node kept (`runtime.audit`; `p2pfl.runtime.node.kept`) and refuses
any that its round records do not say it read: a part of a peer it did not hear from that round,
or of a part it received no bytes of. It builds the node's own data split from the scenario, as
the node did, and nothing of any peer's: the attacks run from this object alone. A received
part that is not a whole model (a feature extractor, a head) is laid over the node's own
aggregate of that round, which is the model the attacker can assemble.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from p2pfl.data.types import NodeData
from p2pfl.errors import ConfigError
from p2pfl.models import SplitModel, build_model, load_part
from p2pfl.runtime.node.kept import OWN_AGGREGATE
from p2pfl.runtime.files import read_records
from p2pfl.runtime.run_folder import RunFolder
from p2pfl.scenario.schema import Scenario, load_scenario


@dataclass(frozen=True)
class Received:
    round: int
    sender: str
    part: str
    path: Path

    def tensors(self) -> dict[str, torch.Tensor]:
        from safetensors.torch import load_file

        return load_file(str(self.path))


@dataclass
class Seat:
    node: str
    index: int
    scenario: Scenario
    data: NodeData
    num_classes: int
    shape: tuple[int, ...]
    received: dict[str, list[Received]] = field(default_factory=dict)  # peer -> its parts, by round
    own: dict[int, Path] = field(default_factory=dict)                   # round -> own aggregate file

    @classmethod
    def open(cls, run: Path, node: str) -> Seat:
        from p2pfl.data.partition import build_partition

        folder = RunFolder(run)
        kept = folder.received(node)
        if not kept.is_dir():
            raise ConfigError("--node", f"{kept} does not exist: {node} kept nothing it read; run the scenario "
                                        f"with `p2pfl run ... --audit {node}` (runtime.audit)")
        scenario = load_scenario(folder.scenario)
        heard = {int(r["round"]): (set(r.get("arrived") or []), set((r.get("bytes_by_part") or {}).get("received", {})))
                 for r in read_records(folder.node_rounds(node))}
        received: dict[str, list[Received]] = defaultdict(list)
        own: dict[int, Path] = {}
        for path in sorted(kept.glob("round-*/*.safetensors")):
            round_ = int(path.parent.name.removeprefix("round-"))
            sender, part = path.name.removesuffix(".safetensors").rsplit(".", 1)
            if f"{sender}.{part}" == OWN_AGGREGATE:
                own[round_] = path
                continue
            senders, parts = heard.get(round_, (set(), set()))
            if sender not in senders or part not in parts:
                raise ConfigError("received", f"{path} holds {sender}'s {part} of round {round_}, which {node}'s "
                                              "records do not say it read: the audit attacks only what the node read")
            received[sender].append(Received(round_, sender, part, path))
        index = int(next(iter(r["index"] for r in _results_nodes(folder) if r["id"] == node), -1))
        if index < 0:
            raise ConfigError("--node", f"{node} is not a node of {run}")
        partition = build_partition(scenario.data, scenario.nodes, scenario.seed, only=[index])
        return cls(node, index, scenario, partition.node(index), partition.num_classes,
                   (partition.in_channels, partition.image_size, partition.image_size),
                   {p: sorted(v, key=lambda r: r.round) for p, v in sorted(received.items())}, own)

    def fresh_model(self) -> SplitModel:
        return build_model(self.scenario.model.name, self.shape[0], self.shape[1], self.num_classes)

    def own_model(self, round_: int) -> SplitModel:
        """The node's own model right after aggregating `round_` (its latest before, if it sat that out)."""
        model = self.fresh_model()
        before = [r for r in self.own if r <= round_]
        if before:
            from safetensors.torch import load_file

            load_part(model, _plain_names(load_file(str(self.own[max(before)])), model))
        return model

    def assembled(self, received: Received) -> SplitModel:
        """The received part laid over the node's own aggregate of the round before it."""
        model = self.own_model(received.round - 1)
        load_part(model, _plain_names(received.tensors(), model))
        return model.eval()  # built fresh for this part: nothing to copy


def _plain_names(tensors: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A DP-SGD node's names carry Opacus' wrapper prefix; the plain model's do not."""
    names = set(model.state_dict())
    return {k if k in names else k.removeprefix("_module."): v for k, v in tensors.items()}


def _results_nodes(folder: RunFolder) -> list[dict[str, Any]]:
    import json

    if folder.results.is_file():
        return list(json.loads(folder.results.read_text())["nodes"])
    return [{"id": p.name.removesuffix(".rounds.jsonl"), "index": i}
            for i, p in enumerate(sorted((folder.root / "nodes").glob("*.rounds.jsonl")))]
