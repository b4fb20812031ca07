"""Ed25519 node identities: a private key per node, a roster of public keys per deployment.

Signatures are libsodium's (PyNaCl): standard Ed25519 (RFC 8032), in half the time of the
OpenSSL build that `cryptography` wraps on this project's machines (a verification 54 µs against
104, a signature 20 against 32; `python benchmarks/wire_signatures.py`), and a node of a
thousand-node run signs or verifies about eighteen times a round. A key file holds the
32-byte seed as hex, as before."""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import tempfile
import time
from collections.abc import Mapping, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import nacl.bindings
import nacl.exceptions
from nacl.signing import SigningKey

from p2pfl.wire.errors import BadSignature, UnknownSender, quote

KEY_BYTES = 32
SIGNATURE_BYTES = 64


def _raw_key_from_hex(hex_str: str, what: str) -> bytes:
    if not isinstance(hex_str, str):
        raise ValueError(f"{what}: expected a hex string, got {type(hex_str).__name__}")
    text = hex_str.strip()
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"{what}: not valid hex") from None
    if len(raw) != KEY_BYTES:
        raise ValueError(f"{what}: expected {KEY_BYTES} bytes ({2 * KEY_BYTES} hex chars), got {len(raw)} bytes")
    return raw


class NodeKey:
    """A node's Ed25519 signing key."""

    __slots__ = ("_key", "_public_hex")

    def __init__(self, key: SigningKey) -> None:
        self._key = key
        # Cached: the public key is logged and compared often, and never changes.
        self._public_hex = bytes(key.verify_key).hex()

    @classmethod
    def generate(cls) -> NodeKey:
        return cls(SigningKey.generate())

    @classmethod
    def from_private_hex(cls, hex_str: str) -> NodeKey:
        return cls(SigningKey(_raw_key_from_hex(hex_str, "private key")))

    def private_hex(self) -> str:
        # A method rather than a property so leaking the secret takes a deliberate call.
        return bytes(self._key).hex()

    @property
    def public_hex(self) -> str:
        return self._public_hex

    def sign(self, data: bytes) -> bytes:
        return self._key.sign(bytes(data)).signature

    def save(self, path: str | os.PathLike[str], *, flushed: bool = True) -> None:
        """Write the private hex atomically, readable by the owner only.

        mkstemp creates the temp file 0o600 whatever the umask, so the secret is
        never briefly world-readable, and a pre-existing file with looser
        permissions is replaced rather than rewritten in place. `flushed`: on disk
        before it returns (False: the caller flushes it, `save_all`).
        """
        target = Path(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        try:
            with os.fdopen(fd, "w", encoding="ascii") as fh:
                fh.write(self.private_hex() + "\n")
                fh.flush()
                if flushed:
                    os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise

    def _save_new(self, path: Path) -> None:
        """`save` without a flush, where no file is at `path` yet made in one step (created
        0o600 and written: no temporary file to make and rename; a folder's keys are written
        before anything reads them). Over an existing file, `save`'s atomic replace."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            self.save(path, flushed=False)
            return
        try:
            with os.fdopen(fd, "w", encoding="ascii") as fh:
                fh.write(self.private_hex() + "\n")
        except BaseException:
            path.unlink(missing_ok=True)
            raise

    @staticmethod
    def save_all(keys: Mapping[Path, NodeKey], threads: int = 32) -> None:
        """`save` each key to its path, then flush them all at once. Where the system has
        `syncfs` (Linux), the keys are written without a flush each and their file system is
        flushed once (10,000 keys: 6 s with a flush each, 32 at a time, on this project's 2-core
        machine; 0.3-2 s so); elsewhere each is written and flushed, many at once (the file system
        commits flushes in flight together). Raises the first error."""
        if not keys:
            return
        if _syncfs_available():
            for path, key in keys.items():
                key._save_new(Path(path))
            for folder in sorted({Path(path).parent for path in keys}):
                _syncfs(folder)
            return
        with ThreadPoolExecutor(max_workers=min(threads, len(keys)), thread_name_prefix="p2pfl-keys") as pool:
            for done in [pool.submit(key.save, path) for path, key in keys.items()]:
                done.result()

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> NodeKey:
        try:
            return cls.from_private_hex(Path(path).read_text(encoding="ascii"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"key file {os.fspath(path)}: {exc}") from None

    def __repr__(self) -> str:
        # Never show the secret, not even in tracebacks.
        return f"NodeKey(public={self._public_hex[:16]}...)"


def roster_key(public_hex: str, what: str = "roster: public key") -> bytes:
    """The raw Ed25519 key a roster keeps for `public_hex` (checked; one object per key and process)."""
    return _interned(_raw_key_from_hex(public_hex, what))


@functools.lru_cache(maxsize=1 << 16)
def _interned(raw: bytes) -> bytes:
    """One object per process and public key: nodes hosted together each hold a roster of all N
    peers, and N keys of their own per node would be N² objects (1000 nodes: a million)."""
    return raw


class NotAMember(UnknownSender):
    """A sender the federation refused or stopped admitting: `reason` names why (revoked, expired...)."""

    def __init__(self, detail: str, cause: str) -> None:
        super().__init__(detail)
        self.reason = cause  # type: ignore[misc]  # per refusal, not per class


class Roster:
    """The members whose messages are accepted, with their public keys.

    Fixed at launch for a roster file; a federation (`p2pfl.runtime.federation`) admits members while it
    runs (`admit`) and takes them out (`refuse`, naming the cause its refusals then give), and a
    certificate's expiry ends a member's admission without anyone saying so."""

    __slots__ = ("_keys", "_expires", "_refused")

    def __init__(self, public_hex_by_id: Mapping[str, str]) -> None:
        self._keys: MutableMapping[str, bytes] = {}
        self._expires: dict[str, float] = {}
        self._refused: dict[str, tuple[str, str]] = {}
        for node_id, hex_str in public_hex_by_id.items():
            self.admit(node_id, hex_str)

    @classmethod
    def over(cls, keys: MutableMapping[str, bytes]) -> Roster:
        """A roster that keeps its members' keys in `keys` (id -> `roster_key`), the caller's table:
        nodes hosted together pass views of one shared table instead of N keys each."""
        roster = cls({})
        roster._keys = keys
        return roster

    def admit(self, node_id: str, public_hex: str, expires: float | None = None) -> None:
        if not isinstance(node_id, str) or not node_id:
            raise ValueError(f"roster: node id {quote(node_id)} must be a non-empty string")
        self._keys[node_id] = _interned(_raw_key_from_hex(public_hex, f"roster: public key of node {quote(node_id)}"))
        self._refused.pop(node_id, None)
        if expires is None:
            self._expires.pop(node_id, None)
        else:
            self._expires[node_id] = expires

    def refuse(self, node_id: str, cause: str, detail: str) -> None:
        """`node_id` is no member from now on; its messages are refused as `cause`."""
        self._keys.pop(node_id, None)
        self._expires.pop(node_id, None)
        self._refused[node_id] = (cause, detail)

    def refusal(self, node_id: str) -> str | None:
        return self._refused.get(node_id, (None, ""))[0]

    def __contains__(self, node_id: object) -> bool:
        if node_id not in self._keys:
            return False
        expires = self._expires.get(node_id)  # type: ignore[call-overload]
        return expires is None or time.time() < expires

    def __len__(self) -> int:
        return len(self._keys)

    def ids(self) -> list[str]:
        return sorted(self._keys)

    def require(self, sender: str) -> bytes:
        """`sender`'s key, or the error that says why its messages are refused."""
        key = self._keys.get(sender)
        if key is None:
            refused = self._refused.get(sender)
            if refused is not None:
                raise NotAMember(f"sender {quote(sender)} is no longer a member: {refused[1]}", refused[0])
            raise UnknownSender(f"sender {quote(sender)} is not in the roster")
        expires = self._expires.get(sender)
        if expires is not None and time.time() >= expires:
            raise NotAMember(f"sender {quote(sender)}'s certificate expired", "certificate_expired")
        return key

    def verify(self, sender: str, signature: bytes, data: bytes) -> None:
        key = self.require(sender)
        if len(signature) != SIGNATURE_BYTES:
            raise BadSignature(f"signature is {len(signature)} bytes, expected {SIGNATURE_BYTES}")
        try:
            nacl.bindings.crypto_sign_open(bytes(signature) + bytes(data), key)
        except nacl.exceptions.BadSignatureError:
            raise BadSignature(f"signature does not verify under the roster key of {quote(sender)}") from None


@functools.cache
def _libc_syncfs() -> Any:
    """libc's `syncfs`, or None where the C library has none (not Linux)."""
    try:
        return ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None


def _syncfs_available() -> bool:
    return sys.platform.startswith("linux") and _libc_syncfs() is not None


def _syncfs(folder: Path) -> None:
    """Everything written to `folder`'s file system so far, on disk (OSError where it failed)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        if _libc_syncfs()(fd) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"syncfs of {folder}: {os.strerror(error)}")
    finally:
        os.close(fd)
