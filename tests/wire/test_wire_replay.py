"""Anti-replay window and freshness, directly and through open_message."""

from __future__ import annotations

import numpy as np
import pytest

from p2pfl.wire import (
    BadSignature,
    NodeKey,
    NonFiniteValues,
    ReplayedMessage,
    ReplayGuard,
    Roster,
    StaleMessage,
    encode,
    open_message,
)

KEY = NodeKey.generate()
MALLORY = NodeKey.generate()
ROSTER = Roster({"alice": KEY.public_hex, "dave": NodeKey.generate().public_hex})


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def frame(seq: int, *, key: NodeKey = KEY, timestamp: float = 1_000_000.0, value: float = 1.0) -> bytes:
    return encode(key=key, kind="stats", sender="alice", recipient="bob", round=0, version=0, seq=seq, part="",
                  meta={}, tensors={"x": np.full(3, value, np.float32)}, timestamp=timestamp)


def open_(data: bytes, guard: ReplayGuard):
    return open_message(data, roster=ROSTER, recipient="bob", replay=guard)


def test_same_frame_twice_is_replayed() -> None:
    g = ReplayGuard(clock=Clock())
    f = frame(1)
    open_(f, g)
    with pytest.raises(ReplayedMessage, match="seq 1 from 'alice' was already accepted") as exc:
        open_(f, g)
    assert exc.value.status == 409


def test_out_of_order_inside_window_is_accepted_once() -> None:
    g = ReplayGuard(window=64, clock=Clock())
    for seq in (10, 5, 7, 11, 6, 47, 20):
        open_(frame(seq), g)
    for seq in (5, 6, 7, 10, 11, 20, 47):
        with pytest.raises(ReplayedMessage):
            open_(frame(seq), g)
    open_(frame(8), g)  # never seen, still inside the window


def test_seq_below_window_is_rejected() -> None:
    g = ReplayGuard(window=16, clock=Clock())
    open_(frame(100), g)
    open_(frame(85), g)  # 100 - 85 = 15 < 16: inside
    with pytest.raises(ReplayedMessage, match="older than the replay window"):
        open_(frame(84), g)
    with pytest.raises(ReplayedMessage, match="older than the replay window"):
        open_(frame(0), g)


def test_window_slides_forward() -> None:
    g = ReplayGuard(window=8, clock=Clock())
    g.record("alice", 3)
    g.record("alice", 2)
    g.record("alice", 1000)  # jump far beyond the window: old bits must not linger
    g.check("alice", 999, 1_000_000.0)
    g.record("alice", 999)
    with pytest.raises(ReplayedMessage):
        g.check("alice", 999, 1_000_000.0)
    with pytest.raises(ReplayedMessage, match="older"):
        g.check("alice", 992, 1_000_000.0)
    g.check("alice", 993, 1_000_000.0)


def test_senders_have_independent_windows() -> None:
    g = ReplayGuard(clock=Clock())
    g.record("alice", 5)
    g.check("dave", 5, 1_000_000.0)
    with pytest.raises(ReplayedMessage):
        g.check("alice", 5, 1_000_000.0)


def test_check_records_nothing_and_record_rechecks() -> None:
    g = ReplayGuard(clock=Clock())
    g.check("alice", 1, 1_000_000.0)
    g.check("alice", 1, 1_000_000.0)
    g.record("alice", 1)
    assert g.highest("alice") == 1
    # Two threads that both passed check(): the second record() must lose.
    with pytest.raises(ReplayedMessage):
        g.record("alice", 1)


@pytest.mark.parametrize("offset", [301.0, -301.0, float("inf"), float("-inf")])
def test_timestamp_outside_skew_is_stale(offset: float) -> None:
    clock = Clock()
    g = ReplayGuard(max_skew_s=300.0, clock=clock)
    with pytest.raises(StaleMessage) as exc:
        g.check("alice", 1, clock.now + offset)
    assert exc.value.status == 409


def test_stale_message_through_open_message_and_does_not_consume_seq() -> None:
    clock = Clock()
    g = ReplayGuard(max_skew_s=30.0, clock=clock)
    with pytest.raises(StaleMessage, match=r"-31\.0s .* allowed \+-30s"):
        open_(frame(1, timestamp=clock.now - 31), g)
    open_(frame(2, timestamp=clock.now + 29.9), g)
    clock.now += 100  # the receiver clock moves on: the same genuine frame is now stale
    with pytest.raises(StaleMessage):
        open_(frame(3, timestamp=1_000_000.0), g)
    open_(frame(1, timestamp=clock.now), g)  # seq 1 was never consumed


def test_forged_message_does_not_consume_seq() -> None:
    g = ReplayGuard(clock=Clock())
    with pytest.raises(BadSignature):
        open_(frame(7, key=MALLORY), g)
    assert g.highest("alice") is None
    msg = open_(frame(7), g)
    assert msg.header.seq == 7


def test_rejected_body_does_not_consume_seq() -> None:
    # A message failing late validation (NaN) must not burn its seq either.
    g = ReplayGuard(clock=Clock())
    with pytest.raises(NonFiniteValues):
        open_(frame(4, value=float("nan")), g)
    open_(frame(4), g)


def test_replay_none_disables_the_guard() -> None:
    f = frame(1)
    for _ in range(2):
        open_message(f, roster=ROSTER, recipient="bob", replay=None)


def test_invalid_guard_parameters() -> None:
    with pytest.raises(ValueError):
        ReplayGuard(window=0)
    with pytest.raises(ValueError):
        ReplayGuard(max_skew_s=0)
