"""A stored scenario of every older format is read with today's meaning (`p2pfl.scenario.migrations`),
and a runtime field is declared once (`setting` in `p2pfl.scenario.schema`)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from p2pfl.errors import ConfigError
from p2pfl.runtime.settings import NodeSettings
from p2pfl.scenario.migrations import FORMAT
from p2pfl.scenario.schema import (RuntimeSpec, as_today, load_scenario, runtime_absent, scenario_differences,
                                   scenario_from_dict, settings_for)

# A real run folder's scenario.json of format 1 (pFedSV's calibrated Fashion-MNIST run, seed 0):
# runtime fields at their defaults left out, no attack, churn, plugins or safeguard.
FORMAT_1 = Path(__file__).parent / "format_1_pfedsv_fmnist.json"


def _format_1() -> dict[str, Any]:
    return json.loads(FORMAT_1.read_text())


def test_a_format_1_run_folder_reads_as_the_run_it_was() -> None:
    stored = _format_1()
    assert "format" not in stored and "max_norm_ratio" not in stored["runtime"] and "attack" not in stored
    scenario = scenario_from_dict(as_today(stored))
    assert scenario.runtime.max_norm_ratio == 1000.0 and scenario.runtime.transport == "http"
    assert scenario.runtime.wire_sparsity == "none" and scenario.runtime.error_feedback is True
    assert scenario.runtime.checkpoint_every == 1 and scenario.runtime.audit == ""
    assert scenario.attack.kind == "none" and not scenario.churn.active and scenario.plugins == ()
    assert scenario.algorithm.safeguard is None
    # read in today's format, it is the scenario it is: nothing differs from its own upgrade
    assert scenario_differences(stored, scenario) == []
    assert scenario.to_dict() == as_today(stored)


def test_the_stored_file_loads_as_a_run_folder_would(tmp_path: Path) -> None:
    path = tmp_path / "scenario.json"
    path.write_text(FORMAT_1.read_text())
    assert load_scenario(path).to_dict() == as_today(_format_1())


@pytest.mark.parametrize("absent, meant", [
    ("update_bound", 0.0),  # made before the bound existed: it bounded nothing
    ("max_norm_ratio", 1000.0), ("buffered_mb", 256.0), ("transport", "http"), ("checkpoint_every", 1),
    ("start_method", "auto"), ("wire_sparsity", "none"), ("error_feedback", True), ("audit", ""),
    ("round_start", "memory"),
])
def test_each_runtime_field_absent_from_format_1_means_what_it_did(absent: str, meant: Any) -> None:
    stored = _format_1()
    stored["runtime"].pop(absent, None)
    assert getattr(scenario_from_dict(as_today(stored)).runtime, absent) == meant


def test_a_bound_run_from_before_refusals_refused_nothing() -> None:
    stored = _format_1()
    stored["runtime"]["update_bound"] = 1.0  # bounded, but made before update_refuse existed
    upgraded = scenario_from_dict(as_today(stored))
    assert upgraded.runtime.update_bound == 1.0 and upgraded.runtime.update_refuse == 0.0
    today = scenario_from_dict({**as_today(stored), "runtime": {**as_today(stored)["runtime"], "update_refuse": 100.0}})
    assert scenario_differences(stored, today) == ["runtime.update_refuse"]


def test_a_format_1_run_that_predates_the_test_split_was_scored_on_its_own_distribution() -> None:
    stored = _format_1()
    del stored["data"]["test_split"]
    assert scenario_from_dict(as_today(stored)).data.test_split == "own_distribution"


def test_a_field_nobody_recorded_is_named_and_never_guessed() -> None:
    stored = _format_1()
    del stored["runtime"]["max_weight_ratio"]
    assert "max_weight_ratio" not in as_today(stored)["runtime"]
    differ = scenario_differences(stored, scenario_from_dict(as_today(_format_1())))
    assert differ == ["runtime.max_weight_ratio (not recorded: made before it was stored)"]


def test_format_2_writes_every_field_and_reads_back_as_written() -> None:
    made = scenario_from_dict(as_today(_format_1())).to_dict()
    assert made["format"] == FORMAT == 2
    assert set(made["runtime"]) == {f.name for f in dataclasses.fields(RuntimeSpec)}
    assert {"attack", "churn", "plugins"} <= set(made) and "safeguard" in made["algorithm"]
    assert scenario_from_dict(made).to_dict() == made and as_today(made) == made


def test_a_newer_format_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="format 3 by a newer p2pfl") as info:
        scenario_from_dict({**as_today(_format_1()), "format": 3})
    assert info.value.field == "format"
    with pytest.raises(ConfigError, match="format number"):
        as_today({**_format_1(), "format": "2"})


def test_every_runtime_field_says_what_it_feeds_and_the_node_takes_all_its_own() -> None:
    fields = dataclasses.fields(RuntimeSpec)
    readers = {"node", "carrier", "coordinator", "hosting"}
    assert all(f.metadata.get("feeds") and set(f.metadata["feeds"]) <= readers for f in fields)
    node = settings_for(RuntimeSpec(), "node")
    assert set(node) <= {f.name for f in dataclasses.fields(NodeSettings)}
    assert NodeSettings(algorithm="fedavg", rounds=1, seed=0, **node).update_refuse == RuntimeSpec().update_refuse
    # an absence is declared only for fields added after runs were published, never for the first ones
    assert "fetch_timeout_s" not in runtime_absent() and "max_weight_ratio" not in runtime_absent()


def test_a_checkpoint_bound_to_the_format_1_form_resumes_under_the_scenario_that_folder_loads_as(tmp_path: Path) -> None:
    import torch

    from p2pfl.runtime.checkpoint import CheckpointError, read_resumable, save_checkpoint, scenario_digest
    from p2pfl.wire import NodeKey

    folder = tmp_path / "scenario.json"
    folder.write_text(FORMAT_1.read_text())
    loaded = load_scenario(folder)
    assert loaded.written_as == _format_1()
    key, path = NodeKey.generate(), tmp_path / "node-0.p2pfl"
    spec = {"w": ((2,), "torch.float32")}
    state = {"node": "node-0", "scenario": scenario_digest(_format_1()), "round": 0, "rounds": []}
    save_checkpoint(path, {"w": torch.zeros(2)}, key=key, node_id="node-0", round_=0, extra=state)
    with pytest.raises(CheckpointError, match="another scenario"):  # today's form alone does not take it
        read_resumable(path, node_id="node-0", public_hex=key.public_hex, scenario=loaded.to_dict(), rounds=20, spec=spec)
    tensors, doc = read_resumable(path, node_id="node-0", public_hex=key.public_hex, scenario=loaded.to_dict(),
                                  rounds=20, spec=spec, written_as=loaded.written_as)
    assert doc["round"] == 0 and tensors["w"].tolist() == [0.0, 0.0]
    other = {**_format_1(), "seed": 1}
    with pytest.raises(CheckpointError, match="another scenario"):  # nor the older form of another scenario
        read_resumable(path, node_id="node-0", public_hex=key.public_hex, scenario=loaded.to_dict(), rounds=20,
                       spec=spec, written_as=other)
