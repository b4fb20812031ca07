"""Node configs (LAN), compare row parsing and the report on a finished run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from p2pfl.errors import ConfigError
from p2pfl.scenario.compare import parse_algorithms
from p2pfl.runtime.config import load_node_config
from p2pfl.scenario.launcher import write_lan_configs
from p2pfl.scenario.schema import load_scenario, read_raw
from p2pfl.wire import NodeKey

from ..runtime.helpers import write_tiny


def test_lan_configs_load_and_point_at_each_other(tmp_path):
    scenario = write_tiny(tmp_path, nodes=3)
    paths = write_lan_configs(scenario, ["10.0.0.1:9000", "10.0.0.2:9000", "10.0.0.3:9001"], tmp_path / "lan")
    configs = [load_node_config(p) for p in paths]
    assert [c.id for c in configs] == ["node-0", "node-1", "node-2"]
    assert [c.index for c in configs] == [0, 1, 2]
    assert configs[0].peers["node-2"].url == "http://10.0.0.3:9001"
    # The folder is self-contained: the scenario is copied in, and every path stays inside it.
    assert all(c.scenario.resolve() == (tmp_path / "lan" / "scenario.toml").resolve() for c in configs)
    assert (tmp_path / "lan" / "scenario.toml").read_text() == scenario.read_text()
    for c in configs:
        key = NodeKey.load(c.key_file)
        for other in configs:
            if other.id != c.id:
                assert other.peers[c.id].public_key == key.public_hex
    moved = tmp_path / "elsewhere"
    (tmp_path / "lan").rename(moved)
    assert [load_node_config(moved / p.name).scenario.resolve() for p in paths] == [(moved / "scenario.toml").resolve()] * 3


def test_a_run_folders_json_scenario_deploys_as_json(tmp_path):
    # benchmarks/links.py deploys a run folder's resolved scenario.json; copied in under a TOML
    # name, every node refused it ("not valid TOML") and the benchmark found no result.
    resolved = tmp_path / "run" / "scenario.json"
    resolved.parent.mkdir()
    resolved.write_text(json.dumps(read_raw(write_tiny(tmp_path, nodes=2)), indent=1))
    paths = write_lan_configs(resolved, ["10.0.0.1:9000", "10.0.0.2:9000"], tmp_path / "lan")
    configs = [load_node_config(p) for p in paths]
    assert load_scenario(configs[0].scenario).nodes == 2
    assert {c.scenario.name for c in configs} == {"scenario.json"}


def test_lan_configs_reject_wrong_host_count(tmp_path):
    with pytest.raises(ConfigError, match="3 nodes"):
        write_lan_configs(write_tiny(tmp_path, nodes=3), ["a:1", "b:2"], tmp_path / "lan")


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('{"id": "n", "index": 0, "port": 1, "key_file": "k", "scenario": "s", "peers": {}, "colour": 1}', "colour"),
        ('{"id": "n", "index": 0, "port": 1, "key_file": "k", "scenario": "s"}', "peers"),
        ('{"id": "n", "index": -1, "port": 1, "key_file": "k", "scenario": "s", "peers": {}}', "index"),
        ('{"id": "n", "index": 0, "port": 1, "key_file": "k", "scenario": "s", '
         '"peers": {"m": {"url": "ftp://x", "public_key": "00"}}}', "peers.m.url"),
        ('{"id": "n", "index": 0, "port": 1, "key_file": "k", "scenario": "s", '
         '"peers": {"m": {"url": "http://x:1", "public_key": "zz"}}}', "peers.m.public_key"),
    ],
)
def test_node_config_errors_name_the_field(tmp_path, text, field):
    path = tmp_path / "node.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_node_config(path)
    assert info.value.field == field


def test_compare_rows_parse_parameters():
    rows = parse_algorithms("local,fedc2i[gamma=1,variant=-lambda], pfedsv[variant=D+C,privacy.noise_multiplier=2]")
    assert [r.algorithm for r in rows] == ["local", "fedc2i", "pfedsv"]
    assert rows[1].params == {"gamma": 1, "variant": "-lambda"}
    assert rows[2].params == {"variant": "D+C"}
    assert rows[2].overrides == {"privacy.noise_multiplier": 2}
    with pytest.raises(ConfigError):
        parse_algorithms("fed avg")


def test_a_compare_row_can_replace_a_whole_scenario_table() -> None:
    from p2pfl.scenario.compare import row_raw
    from p2pfl.scenario.schema import read_raw, scenario_from_dict

    base = read_raw(Path("scenarios/pfedsv_dp.toml"))
    assert scenario_from_dict(base, source="dp").privacy.mode == "dp-sgd"
    (row,) = parse_algorithms('local[privacy={mode="none"}]')
    assert row.overrides == {"privacy": {"mode": "none"}} and row.params == {}
    scenario = scenario_from_dict(row_raw(base, row), source="dp")
    assert scenario.privacy.mode == "none" and scenario.privacy.noise_multiplier is None
    assert scenario.data == scenario_from_dict(base, source="dp").data  # the rest of the scenario is kept


def test_a_run_folder_holds_one_roster_that_every_config_reads_its_peers_from(tmp_path):
    from p2pfl.runtime.roster import load_roster
    from p2pfl.runtime.run_folder import RunFolder
    from p2pfl.scenario.launcher import write_run_folder
    from p2pfl.scenario.schema import load_scenario

    scenario = load_scenario(write_tiny(tmp_path, nodes=4))
    paths, _ = write_run_folder(scenario, tmp_path / "run")
    roster = load_roster(RunFolder(tmp_path / "run").roster)
    assert list(roster.nodes) == ["node-0", "node-1", "node-2", "node-3"]
    # A config names the roster instead of listing every peer: its size does not grow with N.
    assert all("[peers" not in p.read_text() and "roster" in p.read_text() for p in paths)
    configs = [load_node_config(p) for p in paths]
    assert [c.index for c in configs] == [0, 1, 2, 3]
    for c in configs:
        assert c.peers == {nid: info for nid, info in roster.nodes.items() if nid != c.id}
        assert roster.nodes[c.id].url == f"http://{c.host}:{c.port}"
        assert roster.nodes[c.id].public_key == NodeKey.load(c.key_file).public_hex
    # Parsed once per process while the file stays as it is.
    assert load_roster(RunFolder(tmp_path / "run").roster) is roster


def test_readdressing_a_run_folder_rewrites_its_roster_and_keeps_every_key(tmp_path):
    from p2pfl.runtime.roster import load_roster
    from p2pfl.runtime.run_folder import RunFolder
    from p2pfl.scenario.launcher import readdress_run_folder, write_run_folder
    from p2pfl.scenario.schema import load_scenario

    scenario = load_scenario(write_tiny(tmp_path, nodes=3))
    paths, _ = write_run_folder(scenario, tmp_path / "run")
    keys = {p.stem: NodeKey.load(load_node_config(p).key_file).public_hex for p in paths}
    moved = {p.stem: (f"10.0.0.{i + 1}", 9000 + i) for i, p in enumerate(paths)}
    readdress_run_folder(scenario, tmp_path / "run", paths, moved)
    roster = load_roster(RunFolder(tmp_path / "run").roster)
    assert {nid: info.url for nid, info in roster.nodes.items()} == {
        nid: f"http://{host}:{port}" for nid, (host, port) in moved.items()}
    assert {nid: info.public_key for nid, info in roster.nodes.items()} == keys
    configs = [load_node_config(p) for p in paths]
    assert [(c.host, c.port) for c in configs] == list(moved.values())
    assert configs[0].peers["node-2"].url == "http://10.0.0.3:9002"


def test_lan_configs_turn_the_defences_on_unless_the_scenario_sets_them(tmp_path):
    """A simulation's nodes are all the user's own: the defences that change the arithmetic are off.
    On a LAN a peer is another operator's machine: the configs turn them on, unless the scenario
    (or --set) says otherwise."""
    from p2pfl.scenario.schema import apply_overrides, load_scenario, read_raw, scenario_from_dict

    scenario = write_tiny(tmp_path, nodes=3)
    assert load_scenario(scenario).runtime.update_bound == 0 and load_scenario(scenario).runtime.max_weight_ratio == 0
    paths = write_lan_configs(scenario, ["10.0.0.1:9000", "10.0.0.2:9000", "10.0.0.3:9001"], tmp_path / "lan",
                              overrides=["runtime.max_weight_ratio=2"])
    config = load_node_config(paths[0])
    deployed = scenario_from_dict(apply_overrides(read_raw(config.scenario), list(config.overrides)))
    assert deployed.runtime.update_bound == 1.0 and deployed.runtime.max_weight_ratio == 2.0  # --set wins
