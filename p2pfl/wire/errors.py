"""Typed rejection reasons for incoming messages.

Each class carries the HTTP status the transport should answer with, so the
server can map a rejection to a response without a lookup table of its own.
"""

from __future__ import annotations

from typing import ClassVar


class WireError(Exception):
    """Base of every rejection raised while opening a message.

    `status` is the HTTP status code, `reason` a short stable token suitable for
    metrics labels; `str(err)` is the precise human-readable explanation.
    """

    status: ClassVar[int] = 400
    reason: ClassVar[str] = "wire_error"

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class MalformedMessage(WireError):
    status = 400
    reason = "malformed"


class BadSignature(WireError):
    status = 401
    reason = "bad_signature"


class UnknownSender(WireError):
    status = 403
    reason = "unknown_sender"


class WrongRecipient(WireError):
    status = 403
    reason = "wrong_recipient"


class ReplayedMessage(WireError):
    status = 409
    reason = "replayed"


class StaleMessage(WireError):
    status = 409
    reason = "stale"


class OversizedMessage(WireError):
    status = 413
    reason = "oversized"


class UnknownDtype(WireError):
    status = 415
    reason = "unknown_dtype"


class ShapeMismatch(WireError):
    status = 422
    reason = "shape_mismatch"


class NonFiniteValues(WireError):
    status = 422
    reason = "non_finite"


def quote(name: object, limit: int = 80) -> str:
    """repr() of a peer-supplied value, truncated so one hostile name cannot bloat logs."""
    text = repr(name)
    return text if len(text) <= limit else text[: limit - 3] + "..."
