"""Node keys and rosters."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from p2pfl.wire import BadSignature, NodeKey, Roster, UnknownSender
from p2pfl.wire import keys as keys_module


def test_hex_round_trip_and_public_key_is_stable() -> None:
    key = NodeKey.generate()
    again = NodeKey.from_private_hex(key.private_hex())
    assert again.private_hex() == key.private_hex()
    assert again.public_hex == key.public_hex
    assert len(key.private_hex()) == 64 and len(key.public_hex) == 64
    assert key.public_hex != NodeKey.generate().public_hex
    assert key.private_hex() not in repr(key)


def test_signature_is_deterministic_ed25519() -> None:
    key = NodeKey.from_private_hex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")  # RFC 8032 test 1
    assert key.public_hex == "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
    assert key.sign(b"").hex().startswith("e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e06522490155")


def test_signatures_interoperate_with_openssl() -> None:
    """libsodium signs and verifies what OpenSSL does (`cryptography`, the library before it): a
    node of this version and one of the last verify each other's messages."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = NodeKey.generate()
    openssl = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(key.private_hex()))
    roster = Roster({"node-a": key.public_hex})
    for message in (b"", b"a header", bytes(range(256)) * 3):
        openssl.public_key().verify(key.sign(message), message)  # raises if it does not verify
        roster.verify("node-a", openssl.sign(message), message)
        tampered = bytearray(openssl.sign(message))
        tampered[0] ^= 1
        with pytest.raises(BadSignature):
            roster.verify("node-a", bytes(tampered), message)


@pytest.mark.parametrize("bad", ["", "zz" * 32, "ab" * 31, "ab" * 33])
def test_from_private_hex_rejects_bad_input(bad: str) -> None:
    with pytest.raises(ValueError):
        NodeKey.from_private_hex(bad)


def test_save_load_round_trip_with_owner_only_mode(tmp_path: Path) -> None:
    key = NodeKey.generate()
    path = tmp_path / "node.key"
    key.save(path)
    assert NodeKey.load(path).private_hex() == key.private_hex()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert path.read_text().strip() == key.private_hex()


def test_save_tightens_an_existing_world_readable_file(tmp_path: Path) -> None:
    path = tmp_path / "node.key"
    path.write_text("old")
    os.chmod(path, 0o644)
    NodeKey.generate().save(str(path))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["node.key"]  # no temp file left behind


@pytest.mark.parametrize("one_flush", [True, False], ids=["syncfs", "fsync-each"])
def test_save_all_writes_each_key_as_save_does_and_names_the_first_failure(tmp_path: Path, monkeypatch,
                                                                           one_flush: bool) -> None:
    if one_flush and not keys_module._syncfs_available():
        pytest.skip("no syncfs here (Linux only)")
    if not one_flush:
        monkeypatch.setattr(keys_module, "_syncfs_available", lambda: False)
    keys = {tmp_path / f"node-{i}.key": NodeKey.generate() for i in range(40)}
    (tmp_path / "node-3.key").write_text("an older key, readable by all\n")  # replaced, not rewritten in place
    os.chmod(tmp_path / "node-3.key", 0o644)
    NodeKey.save_all(keys, threads=8)
    for path, key in keys.items():
        assert NodeKey.load(path).private_hex() == key.private_hex()
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in keys)  # no temp file left
    with pytest.raises(FileNotFoundError, match="missing"):
        NodeKey.save_all({tmp_path / "a.key": NodeKey.generate(), tmp_path / "missing" / "b.key": NodeKey.generate()})
    assert (tmp_path / "a.key").is_file()


def test_load_rejects_a_corrupt_file(tmp_path: Path) -> None:
    path = tmp_path / "node.key"
    path.write_text("not a key")
    with pytest.raises(ValueError, match="node.key"):
        NodeKey.load(path)


def test_roster_verify() -> None:
    alice, bob = NodeKey.generate(), NodeKey.generate()
    roster = Roster({"alice": alice.public_hex, "bob": bob.public_hex})
    assert "alice" in roster and "eve" not in roster and 3 not in roster
    assert roster.ids() == ["alice", "bob"]
    roster.verify("alice", alice.sign(b"data"), b"data")
    with pytest.raises(BadSignature):
        roster.verify("alice", alice.sign(b"data"), b"datA")
    with pytest.raises(BadSignature):
        roster.verify("alice", bob.sign(b"data"), b"data")
    with pytest.raises(BadSignature):
        roster.verify("alice", b"\x00" * 10, b"data")
    with pytest.raises(UnknownSender) as exc:
        roster.verify("eve", alice.sign(b"data"), b"data")
    assert exc.value.status == 403


@pytest.mark.parametrize("bad", ["xyz", "ab" * 31, "ab" * 33, 12])
def test_roster_names_the_node_with_a_bad_key(bad: object) -> None:
    with pytest.raises(ValueError, match="'node-7'"):
        Roster({"ok": NodeKey.generate().public_hex, "node-7": bad})  # type: ignore[dict-item]
