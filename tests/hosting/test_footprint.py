"""What one node holds does not grow with the federation at a fixed degree (issue 66): nodes hosted
together hold views of one roster table, not N entries each, or 10,000 nodes would need N² entries."""

from __future__ import annotations

from pathlib import Path

import pytest

from p2pfl.assembly import assemble_node
from p2pfl.hosting.footprint import own_bytes
from p2pfl.runtime.config import load_node_config
from p2pfl.runtime.shared_tables import Overlay, overlay_of, own_copy
from p2pfl.scenario.launcher import write_run_folder
from p2pfl.scenario.schema import load_scenario

from ..runtime.helpers import write_tiny

# A table of every member costs 50-100 bytes an entry (a dict slot, or a dict slot and a key
# object); 450 more members in one such table would add 22-45 KiB to each node.
GROWTH_ALLOWED = 6 * 1024


# Each round 5 % of the nodes join and 5 % crash (back two rounds later), as issue 66's churn run.
CHURN = ["rounds=6", "churn.join_per_round=0.05", "churn.crash_per_round=0.05", "churn.restart_after=2"]


def _what_node_0_holds(tmp_path: Path, nodes: int, overrides: list[str] = []) -> dict[str, int]:  # noqa: B006
    """Node 0's own bytes, by component, with two more nodes of the same run hosted beside it."""
    tmp_path.mkdir()
    scenario = load_scenario(write_tiny(tmp_path, nodes=nodes, samples=8),
                             ['runtime.topology="regular:4"', 'runtime.placement="shared"', *overrides])
    paths, _ = write_run_folder(scenario, tmp_path / "run")
    return own_bytes([assemble_node(load_node_config(p), scenario) for p in paths[:3]])[0]


@pytest.mark.parametrize("overrides", [[], CHURN], ids=["steady", "churn"])
def test_what_one_node_holds_does_not_grow_with_the_federation(tmp_path: Path, overrides: list[str]) -> None:
    small = _what_node_0_holds(tmp_path / "50", 50, overrides)
    large = _what_node_0_holds(tmp_path / "500", 500, overrides)
    grew = {c: large.get(c, 0) - small.get(c, 0) for c in {*small, *large}}
    assert sum(grew.values()) < GROWTH_ALLOWED, sorted(grew.items(), key=lambda kv: -kv[1])[:5]
    assert sum(small.values()) > 100_000  # the walk found the node's model and data: it measures something


@pytest.mark.parametrize("ops", [
    [("del", "b"), ("set", "d", 4), ("set", "a", 9)],
    [("del", "a"), ("set", "a", 5), ("del", "d")],
    [("set", "b", 2), ("del", "b"), ("del", "c")],
])
def test_an_overlay_reads_as_the_dict_it_stands_for_and_never_writes_its_base(ops: list) -> None:
    base = {"a": 1, "b": 2, "c": 3}
    view, twin = Overlay(base), dict(base)
    for op in ops:
        if op[0] == "set":
            view[op[1]], twin[op[1]] = op[2], op[2]
        elif op[1] in twin:
            del view[op[1]], twin[op[1]]
        else:
            with pytest.raises(KeyError):
                del view[op[1]]
    assert dict(view) == twin and len(view) == len(twin) and set(view) == set(twin)
    assert all((k in view) == (k in twin) for k in "abcde")
    assert base == {"a": 1, "b": 2, "c": 3}
    copy = own_copy(view)
    copy["z"] = 0
    assert "z" not in view and dict(copy) == {**twin, "z": 0}
    derived = overlay_of(view, str)
    assert dict(derived) == {k: str(v) for k, v in twin.items()}
    # the table derived from the base is made once, whoever derives it
    assert isinstance(derived, Overlay) and derived.base is overlay_of(Overlay(base), str).base  # type: ignore[attr-defined]
