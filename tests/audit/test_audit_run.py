"""`runtime.audit` and `p2pfl audit` on a real run: the auditing node keeps what it read, and the
audit attacks that and nothing else (no peer's checkpoint, records or data)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("art", reason="the audit extra: pip install -e '.[audit]'")

from p2pfl.audit.command import audit_override  # noqa: E402
from p2pfl.audit.run import AuditSettings, audit_run  # noqa: E402
from p2pfl.audit.seat import Seat  # noqa: E402
from p2pfl.errors import ConfigError  # noqa: E402
from p2pfl.scenario.launcher import run_scenario  # noqa: E402
from p2pfl.scenario.schema import load_scenario, scenario_differences  # noqa: E402
from tests.runtime.helpers import write_tiny  # noqa: E402

CHEAP = AuditSettings(members=40, shadow_epochs=2, inversion_iterations=20, update_images=2)


@pytest.fixture(scope="module")
def audited_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("audit")
    scenario = write_tiny(tmp, nodes=3, rounds=2, samples=80)
    _, code = run_scenario(scenario, tmp / "run", ['runtime.audit="node-0"'], progress=False, quiet=True)
    assert code == 0
    return tmp / "run"


@pytest.mark.slow
def test_the_auditing_node_keeps_each_part_it_read_and_nobody_else_does(audited_run: Path) -> None:
    kept = sorted(p.relative_to(audited_run / "received").as_posix() for p in (audited_run / "received").rglob("*.*"))
    assert kept == [f"node-0/round-000{r}/{name}.safetensors" for r in (1, 2)
                    for name in ("node-1.full", "node-2.full", "self.aggregated")]
    records = [json.loads(line) for line in (audited_run / "nodes" / "node-0.rounds.jsonl").read_text().splitlines()]
    assert all(sorted(r["arrived"]) == ["node-1", "node-2"] for r in records)


@pytest.mark.slow
def test_audit_attacks_what_was_read_and_nothing_of_the_peers(audited_run: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    first = audit_run(audited_run, "node-0", CHEAP)
    assert sorted(first["peers"]) == ["node-1", "node-2"]
    for peer in first["peers"].values():
        assert (peer["part"], peer["round"]) == ("full", 2)
        assert set(peer["membership"]) == {"loss", "shadow"}
        assert 0 <= peer["membership"]["loss"]["auc"] <= 1
    assert (audited_run / "report" / "audit.png").is_file()
    # the same audit with every peer's checkpoint and round records gone: nothing of theirs was read
    bare = tmp_path / "bare"
    shutil.copytree(audited_run, bare)
    shutil.rmtree(bare / "checkpoints")
    for peer in ("node-1", "node-2"):
        (bare / "nodes" / f"{peer}.rounds.jsonl").unlink()
    again = audit_run(bare, "node-0", CHEAP)
    assert [p["membership"] for p in again["peers"].values()] == [p["membership"] for p in first["peers"].values()]
    # the seat builds the auditing node's own data only
    import p2pfl.data.partition as partition

    asked: list[object] = []
    real = partition.build_partition
    monkeypatch.setattr(partition, "build_partition", lambda *a, **k: asked.append(k.get("only")) or real(*a, **k))
    Seat.open(bare, "node-0")
    assert asked == [[0]]


@pytest.mark.slow
def test_a_kept_file_the_records_do_not_name_is_refused(audited_run: Path, tmp_path: Path) -> None:
    planted = tmp_path / "planted"
    shutil.copytree(audited_run, planted)
    round1 = planted / "received" / "node-0" / "round-0001"
    shutil.copy(round1 / "node-1.full.safetensors", round1 / "node-1.head.safetensors")
    with pytest.raises(ConfigError, match="node-1's head of round 1, which node-0's records do not say it read"):
        Seat.open(planted, "node-0")
    with pytest.raises(ConfigError, match="kept nothing it read"):
        Seat.open(planted, "node-1")


def test_runtime_audit_names_a_node_of_the_scenario(tmp_path: Path) -> None:
    scenario = write_tiny(tmp_path, nodes=3)
    assert load_scenario(scenario, ['runtime.audit="node-2"']).runtime.audit == "node-2"
    with pytest.raises(ConfigError, match="runtime.audit.*'node-7' is none of this scenario's 3"):
        load_scenario(scenario, ['runtime.audit="node-7"'])
    assert audit_override(scenario, [], "") == 'runtime.audit="node-0"'
    made = load_scenario(scenario).to_dict()
    before = {**{k: v for k, v in made.items() if k != "format"},  # a format-1 run folder, made before the field
              "runtime": {k: v for k, v in made["runtime"].items() if k != "audit"}}
    assert scenario_differences(before, load_scenario(scenario)) == []  # runs made before it still match
