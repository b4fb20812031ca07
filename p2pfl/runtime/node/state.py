"""A node's run so far (its round records, restarts, what setup produced) and its checkpoint:
captured, written, checked and restored. Everything is checked before anything is applied, so a
corrupt, foreign or other-scenario checkpoint leaves the node as it was."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from p2pfl.models import part_spec
from p2pfl.runtime.checkpoint import (AS_BUILT, STRATEGY_TENSORS, CheckpointError, join_strategy_state, read_checkpoint,
                                      read_resumable, restore_run_state, run_state, save_checkpoint, scenario_digest,
                                      split_strategy_state, tensors_digest)
from p2pfl.runtime.node.neighbours import Neighbours
from p2pfl.runtime.node.parts import NodeParts
from p2pfl.runtime.settings import NodeSettings
from p2pfl.runtime.strategy import RoundContext
from p2pfl.training.trainer import rng_state_from_hex, rng_state_hex


_DIGESTS: dict[int, tuple[NodeSettings, str]] = {}  # the settings it was taken of are kept: their id stays theirs


def _scenario_digest(settings: NodeSettings) -> str:
    """`scenario_digest(settings.resolved)`, taken once for the nodes that share frozen settings
    (a worker's, `p2pfl.assembly.node_settings`)."""
    made = _DIGESTS.get(id(settings))
    if made is None or made[0] is not settings:
        made = (settings, scenario_digest(settings.resolved))
        _DIGESTS.clear()
        _DIGESTS[id(settings)] = made
    return made[1]


class NodeState:
    def __init__(self, node_id: str, path: Path, parts: NodeParts, settings: NodeSettings, ctx: RoundContext,
                 participation_rng: np.random.Generator, neighbours: Neighbours, log: logging.Logger) -> None:
        self.node_id, self.path, self.parts, self.settings = node_id, path, parts, settings
        self.ctx, self.participation_rng, self.neighbours, self.log = ctx, participation_rng, neighbours, log
        self.rounds: list[dict[str, Any]] = []      # each round's record, as JSON
        self.restarts: list[dict[str, Any]] = []    # each --resume of this node: after which round, when
        self.setup_record: dict[str, Any] | None = None
        self.scenario_digest = _scenario_digest(settings)  # what binds each checkpoint to the scenario
        # What a checkpoint stores instead of a model that never changed (checkpoint.AS_BUILT).
        built = self.tensors()
        self.built_digest = tensors_digest(built)
        self._built_marks = _write_marks(built)
        self.trained = False  # set by the first round taken part in, or a restored model

    def document(self, set_up: bool) -> dict[str, Any]:
        """Everything besides the model that the next round depends on."""
        parts = self.parts
        rng = {
            "trainer": rng_state_hex(parts.trainer.generator.get_state()),
            "ctx": self.ctx.rng.bit_generator.state,
            "participation": self.participation_rng.bit_generator.state,
            "torch": rng_state_hex(torch.get_rng_state()),
            "cuda": rng_state_hex(torch.cuda.get_rng_state(parts.device)) if parts.device.type == "cuda" else None,
        }
        rng.update(parts.safeguard.rng_state())
        return {
            **run_state(self.node_id, self.scenario_digest, self.rounds, parts.transport.replay, parts.counter.totals()),
            "strategy": parts.strategy.state_dict(),
            # What setup produced lives in the strategy's state; a node resumed from a checkpoint
            # that has it does not set up again, one resumed from the checkpoint before setup does.
            **({"setup": self.setup_record} if set_up else {}),
            "privacy": None if parts.privacy is None else parts.privacy.state_dict(),
            "rng": rng,
            **self.neighbours.state_dict(),
            "restarts": list(self.restarts),
        }

    def tensors(self) -> dict[str, torch.Tensor]:
        """The model's tensors, and the safeguard's (its Local model's, under their own prefix)."""
        return {**self.parts.model.state_dict(), **self.parts.safeguard.checkpoint_tensors()}

    def spec(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Names, shapes and dtypes of `tensors`, to check a checkpoint before loading it."""
        return {**part_spec(self.parts.model, "full"), **self.parts.safeguard.checkpoint_spec()}

    def write(self, set_up: bool, durable: bool = True) -> None:
        """`durable`: synced to disk (at the end); a round's checkpoint survives the process, not the machine.
        A model as built (no round taken part in) is stored as its digest (checkpoint.AS_BUILT)."""
        tensors, doc = self.tensors(), self.document(set_up)
        doc["strategy"], strategy_tensors = split_strategy_state(doc["strategy"])
        if not self.trained and (_write_marks(tensors) == self._built_marks
                                 or tensors_digest(tensors) == self.built_digest):
            tensors, doc = {}, {**doc, AS_BUILT: self.built_digest}
        save_checkpoint(self.path, {**tensors, **strategy_tensors}, key=self.parts.key, node_id=self.node_id,
                        round_=len(self.rounds), extra=doc, durable=durable)

    def from_disk(self) -> dict[str, Any]:
        """The state document of this node's checkpoint, verified, without loading it."""
        _, doc = read_checkpoint(self.path, node_id=self.node_id, public_hex=self.parts.key.public_hex)
        if doc is None:
            raise CheckpointError(f"checkpoint {self.path} holds a model but no node state")
        return doc

    def restore(self) -> tuple[int, bool]:
        """Load the last checkpoint: (the last complete round, whether setup's outcome was in it)."""
        path, parts = self.path, self.parts
        stored, doc = read_resumable(path, node_id=self.node_id, public_hex=parts.key.public_hex,
                                     scenario=self.settings.resolved, rounds=self.settings.rounds, spec=self.spec(),
                                     written_as=self.settings.written_as)
        tensors = {k: v for k, v in stored.items() if not k.startswith(STRATEGY_TENSORS)}
        doc["strategy"] = join_strategy_state(doc["strategy"], {k: v.to(parts.device) for k, v in stored.items()
                                                               if k.startswith(STRATEGY_TENSORS)})
        as_built = doc.get(AS_BUILT) if not tensors else None
        if as_built is not None and as_built != self.built_digest:
            raise CheckpointError(f"checkpoint {path} holds the model as built, and this node builds another one "
                                  "(a model factory that is not deterministic under torch.manual_seed?)")
        self._check_fits(doc)
        parts.strategy.load_state_dict(doc["strategy"])
        own = parts.model.state_dict()
        if as_built is None:  # else the model and the safeguard's are as this node built them
            parts.model.load_state_dict({k: v.to(parts.device) for k, v in tensors.items() if k in own})
            self.trained = True
        parts.safeguard.restore({k: v for k, v in tensors.items() if k not in own}, doc["rng"], parts.device)
        if parts.privacy is not None:
            parts.privacy.load_state_dict(doc["privacy"])
        _restore_rngs(doc["rng"], parts, self.ctx.rng, self.participation_rng)
        self.neighbours.load_state_dict(doc)
        self.restarts = list(doc.get("restarts") or [])
        restore_run_state(doc, parts.transport.replay, parts.counter)
        set_up = "setup" in doc  # absent from round 0's checkpoint (before setup) and older ones: set up again
        if set_up:
            self.setup_record = doc["setup"]
        self.rounds = doc["rounds"]
        self.log.info("resumed from %s after round %d", path, doc["round"])
        return doc["round"], set_up

    def checkpoints_after(self, r: int, participated: bool) -> bool:
        """Whether round `r` ends with a checkpoint: a round taken part in whose number is a
        multiple of `checkpoint_every` (a resume always has round 0's to go on from), other than
        the last. A round sat out changes no model: a resume replays it from the participation
        stream the last checkpoint holds (at 10 % participation, checkpointing the 900 of 1000
        nodes that sat a round out had cost more than the round's training). The last round's
        state is what the node's end checkpoint holds, written after it lingers: a second write
        of it was a quarter of a 1000-node run's checkpoint CPU, in the round every node is still
        finishing (`python benchmarks/round_cpu.py`); a node killed while it lingers runs its
        last round again on --resume."""
        return participated and r % self.settings.checkpoint_every == 0 and r < self.settings.rounds

    def _check_fits(self, doc: Mapping[str, Any]) -> None:
        """The state tried on a fresh strategy and throwaway generators first."""
        try:
            self.parts.fresh_strategy().load_state_dict(doc["strategy"])
            rng = np.random.default_rng()
            rng.bit_generator.state = doc["rng"]["ctx"]
            rng.bit_generator.state = doc["rng"]["participation"]
            self.parts.safeguard.check_restorable(doc["rng"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"checkpoint {self.path}: state does not fit {self.settings.algorithm}: {exc!r}") from None


def _restore_rngs(rng: Mapping[str, Any], parts: NodeParts, ctx_rng: np.random.Generator,
                  participation_rng: np.random.Generator) -> None:
    parts.trainer.generator.set_state(rng_state_from_hex(rng["trainer"]))
    ctx_rng.bit_generator.state = rng["ctx"]
    participation_rng.bit_generator.state = rng["participation"]
    torch.set_rng_state(rng_state_from_hex(rng["torch"]))
    if rng["cuda"] is not None and parts.device.type == "cuda":
        torch.cuda.set_rng_state(rng_state_from_hex(rng["cuda"]), parts.device)


def _write_marks(tensors: Mapping[str, torch.Tensor]) -> dict[str, tuple[int, int]]:
    """Each tensor's storage and in-place write count (`Tensor._version`, shared by its views and
    `detach()`): equal marks mean no tensor was replaced or written to since they were taken, so
    a model's digest need not be taken again (900 of 1000 nodes sit round 1 out, and their first
    checkpoint holds the model as built). Unequal marks say nothing: the values are compared then."""
    return {k: (t.data_ptr(), t._version) for k, t in tensors.items()}

