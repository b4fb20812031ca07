"""Resource limits applied to every incoming message."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WireLimits:
    # Checked before anything is parsed, so garbage cannot cost more than a len().
    max_message_bytes: int = 64 * 2**20
    max_tensors: int = 512
    max_ndim: int = 8
    # Bounds the msgpack-encoded `meta` map; the whole header may exceed it only
    # by HEADER_OVERHEAD_BYTES (ids, kind, digest...).
    max_meta_bytes: int = 64 * 2**10


# Room for the fixed header fields on top of `meta`. Node ids and kinds are short;
# 4 KiB is generous while still bounding header parsing before the signature check.
HEADER_OVERHEAD_BYTES = 4096
