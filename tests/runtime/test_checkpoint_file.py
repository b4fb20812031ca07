"""Writing a checkpoint: the file a reader opens is whole at every moment, and rewriting it goes over one swap file in place."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch

from p2pfl.runtime import files
from p2pfl.runtime.checkpoint import read_checkpoint, save_checkpoint
from p2pfl.wire import NodeKey


def _save(path: Path, key: NodeKey, value: float, round_: int) -> None:
    save_checkpoint(path, {"w": torch.full((4,), value)}, key=key, node_id="node-0", round_=round_,
                    extra={"round": round_}, durable=round_ % 2 == 0)


def _read(path: Path, key: NodeKey) -> tuple[float, int]:
    tensors, doc = read_checkpoint(path, node_id="node-0", public_hex=key.public_hex)
    return float(tensors["w"][0]), doc["round"]


@pytest.mark.parametrize("exchange", [True, False])
def test_each_write_replaces_the_checkpoint_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool) -> None:
    if not exchange:  # a system without renameat2's exchange: renamed over, as before
        monkeypatch.setattr(files, "_exchange", lambda a, b: False)
    key, path = NodeKey.generate(), tmp_path / "checkpoints" / "node-0.p2pfl"
    swap = path.with_name(".node-0.p2pfl.swap")
    for r in range(1, 4):
        _save(path, key, float(r), r)
        assert _read(path, key) == (float(r), r)
        if r == 1 and exchange and files._renameat2() is not None:
            assert swap.stat().st_size == 0  # made with the first checkpoint: the next write makes no file
    if exchange and files._renameat2() is not None:
        assert _read(swap, key) == (2.0, 2)  # the previous checkpoint: the next write goes over it in place
        inode = swap.stat().st_ino
        _save(path, key, 4.0, 4)
        assert path.stat().st_ino == inode  # no new file was made
    else:
        assert not swap.exists()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # a node's state: private, whichever file it was written in


def test_a_shorter_checkpoint_over_a_longer_one_keeps_nothing_of_it(tmp_path: Path) -> None:
    key, path = NodeKey.generate(), tmp_path / "node-0.p2pfl"
    for round_, size in enumerate((1000, 10, 1000, 3, 2), start=1):  # the swap file held 1000 values, then 10
        save_checkpoint(path, {"w": torch.full((size,), float(round_))}, key=key, node_id="node-0", round_=round_,
                        extra={"round": round_}, durable=False)
        tensors, doc = read_checkpoint(path, node_id="node-0", public_hex=key.public_hex)
        assert tensors["w"].shape == (size,) and bool((tensors["w"] == round_).all()) and doc["round"] == round_
    assert path.stat().st_size < 1000  # no tail of a longer checkpoint after the frame


def test_a_write_that_fails_halfway_leaves_the_last_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key, path = NodeKey.generate(), tmp_path / "node-0.p2pfl"
    _save(path, key, 1.0, 1)
    _save(path, key, 2.0, 2)
    real_write = os.write

    def full_disk(fd: int, buffers: list) -> int:
        real_write(fd, bytes(buffers[0])[:10])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "writev", full_disk)
    with pytest.raises(OSError, match="No space"):
        _save(path, key, 3.0, 3)
    monkeypatch.undo()
    assert _read(path, key) == (2.0, 2)
    assert not path.with_name(".node-0.p2pfl.swap").exists()
    _save(path, key, 4.0, 4)
    assert _read(path, key) == (4.0, 4)


def test_a_state_document_is_strict_json_with_non_finite_values_as_null(tmp_path: Path) -> None:
    """Encoded as it is when it can be, walked only when not: the same bytes either way."""
    from types import MappingProxyType

    from p2pfl.runtime.checkpoint import _strict_json, finite_json

    finite = {"rounds": [{"acc": 0.5, "time": {"train_s": 1.25}, "arrived": ("node-1", "node-2")}], "rng": "00ff"}
    non_finite = {"rounds": [{"acc": float("nan"), "loss": float("inf"), "deep": [[-float("inf"), 1.0]]}]}
    proxied = {"strategy": MappingProxyType({"w": (1.0, 2.0)})}
    for document in (finite, non_finite, proxied):
        assert _strict_json(document) == json.dumps(finite_json(document), allow_nan=False)
    assert json.loads(_strict_json(non_finite)) == {"rounds": [{"acc": None, "loss": None, "deep": [[None, 1.0]]}]}
    key, path = NodeKey.generate(), tmp_path / "node-0.p2pfl"
    save_checkpoint(path, {"w": torch.zeros(2)}, key=key, node_id="node-0", round_=1, extra=non_finite)
    _, doc = read_checkpoint(path, node_id="node-0", public_hex=key.public_hex)
    assert doc is not None and doc["rounds"] == [{"acc": None, "loss": None, "deep": [[None, 1.0]]}]


def test_short_writes_go_on_where_they_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write may take fewer bytes than it was given (a signal, a pipe): the rest follows, and the
    checkpoint reads back whole, over one system call per buffer or none."""
    key, path = NodeKey.generate(), tmp_path / "node-0.p2pfl"
    real_write = os.write
    calls = []

    def a_few_bytes(fd: int, buffers: list) -> int:
        calls.append(len(buffers))
        return real_write(fd, bytes(buffers[0])[:7])

    monkeypatch.setattr(files.os, "writev", a_few_bytes)
    _save(path, key, 5.0, 5)
    assert len(calls) > 10 and _read(path, key) == (5.0, 5)
    monkeypatch.delattr(files.os, "writev")  # a system without writev: one write per buffer
    _save(path, key, 6.0, 6)
    assert _read(path, key) == (6.0, 6)


def test_a_write_that_takes_no_bytes_fails_instead_of_spinning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key, path = NodeKey.generate(), tmp_path / "node-0.p2pfl"
    _save(path, key, 1.0, 1)
    monkeypatch.setattr(files.os, "writev", lambda fd, buffers: 0)
    with pytest.raises(OSError, match="took no bytes"):
        _save(path, key, 2.0, 2)
    monkeypatch.undo()
    assert _read(path, key) == (1.0, 1)
