"""runtime.participation: a node takes part in a round with probability p from its own seeded
stream; a node sitting a round out keeps serving its last version and nobody waits for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from p2pfl.errors import ConfigError
from p2pfl.scenario.schema import load_scenario

from .helpers import build_in_process, run_in_process, write_tiny

TIMEOUT_S = 30.0


def _run(tmp_path: Path, name: str) -> list[dict]:
    path = write_tiny(tmp_path, nodes=4, rounds=5, samples=40, timeout=TIMEOUT_S)
    nodes, _ = build_in_process(path, tmp_path / name, overrides=("runtime.participation=0.5",))
    results, _, wall = run_in_process(nodes, None)
    assert wall < 4 * TIMEOUT_S
    return results


def test_nodes_sit_out_rounds_and_nobody_waits_for_them(tmp_path: Path) -> None:
    results = _run(tmp_path, "a")
    taking_part = {r["id"]: [x["participated"] for x in r["rounds"]] for r in results}
    assert all(len(v) == 5 for v in taking_part.values())
    assert any(not p for v in taking_part.values() for p in v) and any(p for v in taking_part.values() for p in v)
    for r in results:
        assert r["status"] == "ok"
        for x in r["rounds"]:
            if not x["participated"]:
                assert x["train_steps"] == 0 and x["arrived"] == []
            # Waiting for a peer that sits out would cost up to fetch_timeout_s.
            assert x["time"]["exchange_s"] < TIMEOUT_S / 3, x["time"]
    # Seeded: the same scenario sits the same nodes out in the same rounds.
    again = {r["id"]: [x["participated"] for x in r["rounds"]] for r in _run(tmp_path, "b")}
    assert again == taking_part


@pytest.mark.parametrize(("override", "algorithm"), [("runtime.participation=0", "fedavg"),
                                                      ("runtime.participation=1.5", "fedavg"),
                                                      ("runtime.participation=0.5", "di")])
def test_bad_participation_is_named(tmp_path: Path, override: str, algorithm: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_scenario(write_tiny(tmp_path, algorithm=algorithm), [override])
    assert err.value.field == "runtime.participation"
