"""The parts a node read from its peers, kept on its disk for a privacy audit (`runtime.audit`).

Each arrived part is written as it reached the strategy (dequantized, a sparse part over its
reference, a noised part with its noise), one safetensors file per peer and part and round:
`RunFolder.received(node) / round-<r> / <peer>.<part>.safetensors`, with the sender, part, round
and version in its metadata. safetensors holds tensors and strings only, so a file is read back
without running anything in it (no pickle). The node's own aggregate is kept beside them
(`self.aggregated`): it is where an averaging peer starts its next round, which an update
inversion needs.
"""

from __future__ import annotations

from pathlib import Path

import torch

from p2pfl.errors import ConfigError
from p2pfl.runtime.strategy import PeerModel

AUDIT_EXTRA = "keeps the parts a node reads with safetensors: pip install 'p2pfl-influence[audit]'"
OWN_AGGREGATE = "self.aggregated"  # the file stem of the node's own model right after aggregation


def part_file(folder: Path, round_: int, sender: str, part: str) -> Path:
    return folder / f"round-{round_:04d}" / f"{sender}.{part}.safetensors"


class KeptParts:
    def __init__(self, folder: Path) -> None:
        try:
            import safetensors.torch  # noqa: F401
        except ImportError:
            raise ConfigError("runtime.audit", AUDIT_EXTRA) from None
        self.folder = folder

    def _write(self, path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> None:
        from safetensors.torch import save_file

        path.parent.mkdir(parents=True, exist_ok=True)
        swap = path.with_suffix(".swap")
        save_file({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, str(swap), metadata=meta)
        swap.replace(path)

    def arrived(self, round_: int, arrived: list[PeerModel]) -> None:
        for m in arrived:
            if m.tensors:
                self._write(part_file(self.folder, round_, m.sender, m.part), m.tensors,
                            {"sender": m.sender, "part": m.part, "round": str(m.round), "version": str(m.version),
                             "received_in": str(round_)})

    def own_aggregate(self, round_: int, state: dict[str, torch.Tensor]) -> None:
        path = self.folder / f"round-{round_:04d}" / f"{OWN_AGGREGATE}.safetensors"
        self._write(path, {k: v for k, v in state.items() if v.is_floating_point()},
                    {"sender": "self", "part": "full", "round": str(round_)})
