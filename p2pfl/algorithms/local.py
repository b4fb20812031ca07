"""Local training only: no communication at all."""

from __future__ import annotations

from p2pfl.algorithms import register
from p2pfl.runtime.strategy import Strategy


@register
class Local(Strategy):
    name = "local"
    shared_parts = ()
