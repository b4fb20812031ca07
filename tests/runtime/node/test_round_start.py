"""runtime.round_start = "disk": the model at a round's start waits in a file while the node
waits for its peers (issue 66), and every read of it gives what the copy in memory gave."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from p2pfl.errors import ConfigError
from p2pfl.runtime.node import round as round_module
from p2pfl.runtime.node import round_start
from p2pfl.runtime.node.intake import RoundChecks
from p2pfl.runtime.node.round_start import (
    RoundStartDamaged,
    SharedStart,
    SpilledStart,
    loaded,
    shared_start,
)
from p2pfl.runtime.peer_claims import FlatCopy
from p2pfl.scenario.schema import RuntimeSpec
from p2pfl.wire import NodeKey, Roster, open_message

from ..helpers import build_in_process, model_frame, run_in_process, write_tiny
from ..test_hardening import _serving


def _state() -> dict[str, torch.Tensor]:
    """A model's state with a buffer of another dtype (a batch-norm layer's step count)."""
    g = torch.Generator().manual_seed(0)
    return {"body.w": torch.randn(8, 3, generator=g), "body.bn.num_batches_tracked": torch.tensor(7),
            "head.w": torch.randn(5, 8, generator=g), "head.b": torch.randn(5, generator=g)}


def test_a_round_start_read_back_from_disk_is_the_copy_bit_for_bit(tmp_path: Path) -> None:
    copy = FlatCopy(_state())
    spilled = SpilledStart(copy, tmp_path / "checkpoints" / ".node-0.round-start")
    assert spilled.path.stat().st_size == copy.flat.numel() * copy.flat.element_size()
    assert list(spilled) == list(copy) and len(spilled) == 4 and bool(spilled)
    assert list(spilled.rest) == ["body.bn.num_batches_tracked"]  # only what the flat buffer does not hold stays
    back = spilled.load()
    assert isinstance(back, FlatCopy) and list(back) == list(copy)
    for k in copy:
        assert back[k].dtype == copy[k].dtype and back[k].shape == copy[k].shape and torch.equal(back[k], copy[k])
    flat_keys = ["body.w", "head.w", "head.b"]
    assert back.origin(flat_keys) is not None and torch.equal(back.origin(flat_keys), copy.origin(flat_keys))
    assert back.flat.data_ptr() == back["body.w"].data_ptr()  # views of the one buffer read, no copy per tensor
    assert loaded(spilled) is not spilled and loaded(copy) is copy


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_round_start_changed_on_disk_is_refused_by_name(tmp_path: Path, damage: str) -> None:
    spilled = SpilledStart(FlatCopy(_state()), tmp_path / ".node-0.round-start")
    data = bytearray(spilled.path.read_bytes())
    if damage == "flip":
        data[17] ^= 0x01
    else:
        del data[-4:]
    spilled.path.write_bytes(bytes(data))
    with pytest.raises(RoundStartDamaged, match=r"\.node-0\.round-start: the round start this node wrote changed"):
        spilled.load()


def test_a_model_on_another_device_or_of_mixed_dtypes_is_not_kept_on_disk(tmp_path: Path) -> None:
    mixed = FlatCopy({"a": torch.zeros(3), "b": torch.zeros(3, dtype=torch.float64)})
    assert mixed.flat is None
    with pytest.raises(ValueError, match="one host buffer"):
        SpilledStart(mixed, tmp_path / "x")


def test_an_unknown_round_start_is_named() -> None:
    with pytest.raises(ConfigError, match=r"runtime.round_start.*'memory', 'disk'|runtime.round_start.*memory, disk"):
        RuntimeSpec(round_start="swap")


def test_a_part_is_bounded_the_same_from_disk_as_from_memory(tmp_path: Path) -> None:
    """The update bound's arithmetic on a part far outside and one inside: the same tensors, bit
    for bit, and the same record, whichever place the round start waited in."""
    peer_key = NodeKey.generate()
    node = _serving(tmp_path, peer_key)
    intake = node.exchange.intake
    intake.settings = dataclasses.replace(intake.settings, update_bound=1.0, update_refuse=0.0)
    start = FlatCopy(node.model.state_dict())
    with torch.no_grad():  # this node's own training this round
        for name, p in node.model.named_parameters():
            p.add_(0.01 * torch.sin(torch.arange(p.numel(), dtype=p.dtype)).view(p.shape))
    roster = Roster({"node-1": peer_key.public_hex})
    parts = {"far": {k: v - 3 * (0.01 + v.abs()) if v.is_floating_point() else v for k, v in start.items()},
             "near": {k: v + 1e-4 if v.is_floating_point() else v for k, v in start.items()}}
    outcomes = []
    for where in ("memory", "disk"):
        round_start = start if where == "memory" else SpilledStart(start, tmp_path / ".node-0.round-start")
        checks = RoundChecks(1, round_start=round_start)
        taken = {}
        for seq, (name, tensors) in enumerate(parts.items(), 1):
            message = open_message(model_frame(peer_key, node, seq=seq, part="full", tensors=tensors), roster=roster,
                                   recipient="node-0", replay=None)
            taken[name] = intake.peer_model(message, checks).tensors
        outcomes.append((taken, checks.bounded, checks.bounded_factor, checks.own_norms, checks.own_updates))
    (memory, *rest_m), (disk, *rest_d) = outcomes
    assert rest_m == rest_d and "node-1" in rest_m[0]  # the far part was pulled back, named the same
    for name in parts:
        assert all(torch.equal(memory[name][k], disk[name][k]) for k in memory[name]), name


def test_a_run_keeps_each_round_start_on_disk_and_leaves_no_file(tmp_path: Path, monkeypatch) -> None:
    """Each node-round after the first writes its start once and reads it back (for its parts and
    its aggregation); the first round's start, the model as built, is one copy the nodes share,
    written by none. The run is the run that kept every round start in memory, each node its own."""
    written, read = [], []
    init, load = SpilledStart.__init__, SpilledStart.load
    monkeypatch.setattr(SpilledStart, "__init__", lambda self, *a: (written.append(a[1]), init(self, *a))[1])
    monkeypatch.setattr(SpilledStart, "load", lambda self, scratch=False: (read.append(self.path), load(self, scratch))[1])
    shared = []
    monkeypatch.setattr(round_module, "shared_start",
                        lambda start: (shared.append(found := round_start.shared_start(start)), found)[1])
    runs = {}
    for where in ("own copies", "memory", "disk"):
        folder = tmp_path / where.replace(" ", "-")
        folder.mkdir()
        path = write_tiny(folder, nodes=3, rounds=2, samples=60)
        nodes, _ = build_in_process(path, folder / "run", overrides=(
            "runtime.update_bound=1", f'runtime.round_start="{"memory" if where == "own copies" else where}"'))
        with monkeypatch.context() as unshared:
            if where == "own copies":
                unshared.setattr(round_module, "shared_start", lambda start: None)
            runs[where], _, _ = run_in_process(nodes, None)
    assert len(written) == 3 and all(p.name.endswith(".round-start") for p in written)  # round 2's, not round 1's
    assert len(read) >= len(written) * 2  # a part from each of two peers and the aggregation, each round
    assert not list((tmp_path / "disk" / "run" / "checkpoints").glob(".*.round-start"))
    assert len(shared) == 6 and all(isinstance(s, SharedStart) for s in shared)  # round 1, memory and disk
    assert len({id(s) for s in shared[:3]}) == 1  # one copy for the three nodes
    for a, b, c in zip(runs["own copies"], runs["memory"], runs["disk"], strict=True):
        assert a["status"] == b["status"] == c["status"] == "ok"
        for ra, rb, rc in zip(a["rounds"], b["rounds"], c["rounds"], strict=True):
            assert ra["arrived"] == rb["arrived"] == rc["arrived"] and ra["test_acc"] == rb["test_acc"] == rc["test_acc"]
            assert ra["test_acc_aggregated"] == rb["test_acc_aggregated"] == rc["test_acc_aggregated"]
            assert ra["train_loss"] == rb["train_loss"] == rc["train_loss"]
            assert set(ra.get("peers_bounded", {})) == set(rb.get("peers_bounded", {})) == set(rc.get("peers_bounded", {}))


def test_nodes_whose_round_start_is_the_same_model_share_one_copy_and_others_keep_their_own(monkeypatch) -> None:
    monkeypatch.setattr(round_start, "_shared", None)
    first, same = FlatCopy(_state()), FlatCopy(_state())
    held = shared_start(first)
    assert isinstance(held, SharedStart) and held.flat.data_ptr() == first.flat.data_ptr()  # the first one's, no copy
    assert shared_start(same) is held  # the same tensors, bit for bit: the one copy
    other = _state()
    other["head.b"][2] = torch.nextafter(other["head.b"][2], torch.tensor(9.0))  # one value, one ulp away
    assert shared_start(FlatCopy(other)) is None
    steps = _state()
    steps["body.bn.num_batches_tracked"] = torch.tensor(8)  # outside the flat buffer
    assert shared_start(FlatCopy(steps)) is None
    own = held.own_copy()  # what a strategy aggregates with: values the same, the buffer its own
    assert type(own) is FlatCopy and own.flat.data_ptr() != held.flat.data_ptr()
    assert all(torch.equal(own[k], held[k]) for k in held)
    del held, own
    fresh = FlatCopy(other)  # once no node waits on the copy, the next round start becomes it
    assert shared_start(fresh).flat.data_ptr() == fresh.flat.data_ptr()
