"""Ed25519 as the wire signs and verifies: libsodium (PyNaCl, what `p2pfl.wire.keys` uses) against
OpenSSL (`cryptography`, what it used before), on the same keys and messages.

    python benchmarks/wire_signatures.py [--repeat 30] [--calls 500]

A node signs each part it publishes, each checkpoint and each read request it sends, and verifies
each part and each read request it receives: at a thousand nodes of `regular:4` about six
signatures and eight verifications a node and round. Timed: one signature and one verification
of a frame's signed header (about 160 bytes) and of a read token's payload, the
median of `--repeat` blocks of `--calls` calls each, both libraries alternating; the ratio is
libsodium's time over OpenSSL's.
"""

from __future__ import annotations

import argparse

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from timing import median_seconds
from p2pfl.wire import NodeKey, Roster, encode_body, seal_frame
from p2pfl.wire.envelope import _PREFIX, PREFIX_BYTES


def signed_header() -> bytes:
    """The bytes a model part's signature covers (header with the body's digest)."""
    key = NodeKey.generate()
    frame = seal_frame(key=key, kind="model", sender="node-0001", recipient="*", round=3, version=3, seq=3,
                       part="full", meta={"n_train": 5}, body=encode_body({}))
    start = frame.chunks[0]  # prefix, header, signature, padding
    return bytes(start[: PREFIX_BYTES + _PREFIX.unpack_from(start)[2]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=30, help="timed blocks per measurement (median reported)")
    parser.add_argument("--calls", type=int, default=500, help="calls per block")
    args = parser.parse_args()
    ours = NodeKey.generate()
    roster = Roster({"node-0001": ours.public_hex})
    theirs = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(ours.private_hex()))
    public = theirs.public_key()
    print(f"Ed25519, median of {args.repeat} blocks of {args.calls} calls; µs per call")
    print(f"{'message':<26}{'step':<8}{'libsodium':>11}{'OpenSSL':>10}{'ratio':>8}")
    for name, message in (("frame header", signed_header()), ("read token", b"node-0002|node-0001|full|3|" + bytes(16))):
        signature = ours.sign(message)
        assert theirs.sign(message) == signature  # Ed25519 is deterministic: the same key signs the same bytes

        def block(fn: object) -> float:
            def run() -> None:
                for _ in range(args.calls):
                    fn()  # type: ignore[operator]
            return median_seconds(run, args.repeat, warmup=1) / args.calls * 1e6

        rows = {
            "sign": (block(lambda: ours.sign(message)), block(lambda: theirs.sign(message))),
            "verify": (block(lambda: roster.verify("node-0001", signature, message)),
                       block(lambda: public.verify(signature, message))),
        }
        for step, (sodium, openssl) in rows.items():
            print(f"{name + f' ({len(message)} B)':<26}{step:<8}{sodium:>11.1f}{openssl:>10.1f}{sodium / openssl:>7.2f}x")


if __name__ == "__main__":
    main()
