"""What one node's server grants to anybody, verified or not (every carrier honours the caps it can)."""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp


@dataclass(frozen=True)
class ServerLimits:
    read_timeout_s: float = 30.0       # to send the request's headers, and then its body
    max_connections: int = 512         # open connections in total; more are closed at once
    max_requests_per_peer: int = 16    # concurrent reads per verified requester (long-polls included)
    handshake_timeout_s: float = 5.0   # TLS: to finish the handshake (asyncio's default is 60 s)
    write_timeout_s: float = 60.0      # to write one answer; a reader that reads slower is cut off
    # Bodies of pushes being read at once, in bytes, whoever sent them; beyond it a push is
    # answered 429 before its body is read. A few of the largest messages fit (4 x 64 MiB).
    max_buffered_body_bytes: int = 256 * 2**20
    # Signed requests (reads and pushes) a second per roster member, and the burst it may make at
    # once (`p2pfl.runtime.transport.rate`); 0: no limit. An honest node makes a few a round.
    requests_per_s_per_peer: float = 50.0
    request_burst_per_peer: float = 200.0
    # A service's request body (`Carrier.services`: a federation's member exchange), and how many
    # are handled at once: unsigned as a whole (each record in it is signed), so bounded here.
    max_service_bytes: int = 4 * 2**20
    services_at_once: int = 4


async def read_bounded(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """A response's whole body; ValueError naming the limit past `limit` bytes. (`content.read(n)`
    gives what has arrived so far, not n bytes.)"""
    if response.content_length is not None:
        if response.content_length > limit:
            raise ValueError(f"response of {response.content_length} bytes exceeds the limit of {limit}")
        # A declared length is read as one buffer (aiohttp stops at it): chunk by chunk cost a
        # node as much as verifying the frame.
        return await response.content.readexactly(response.content_length)
    chunks, size = [], 0
    async for chunk in response.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            raise ValueError(f"response exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
