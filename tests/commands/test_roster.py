"""The LAN operator workflow on one machine: `p2pfl keygen` per host, a shared roster, a config
per host naming key, roster and scenario; `p2pfl roster check`; every bad input exits 2 naming
the file and the problem."""

from __future__ import annotations

import os
import socket
import stat
import tomllib
from pathlib import Path

import pytest

from p2pfl.cli import main
from p2pfl.errors import ConfigError
from p2pfl.runtime.config import load_node_config
from p2pfl.runtime.roster import load_roster
from p2pfl.hosting.ports import free_ports
from p2pfl.wire import NodeKey

from ..runtime.helpers import write_tiny


def _keygen(tmp: Path, node_id: str, url: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["keygen", node_id, "--out", str(tmp / node_id), "--url", url]) == 0
    return capsys.readouterr().out


def _deployment(tmp: Path, capsys: pytest.CaptureFixture[str], nodes: int = 3) -> tuple[Path, list[Path]]:
    """What three operators and the roster's keeper would have: a key per host folder, the
    printed entries pasted into one roster, and a config per host."""
    scenario = write_tiny(tmp, nodes=nodes, rounds=1)
    ports = free_ports(nodes, "127.0.0.1")
    entries = [_keygen(tmp, f"node-{i}", f"http://127.0.0.1:{ports[i]}", capsys) for i in range(nodes)]
    roster = tmp / "roster.toml"
    roster.write_text("\n".join(entries))
    configs = []
    for i in range(nodes):
        config = tmp / f"node-{i}" / "node.toml"
        config.write_text(f'id = "node-{i}"\nkey_file = "node-{i}.key"\nroster = "../roster.toml"\n'
                          f'scenario = "{scenario}"\nout = "../run-{i}"\nhost = "127.0.0.1"\n')
        configs.append(config)
    return roster, configs


def test_keygen_writes_an_owner_only_key_and_prints_its_roster_entry(tmp_path, capsys) -> None:
    out = _keygen(tmp_path, "node-7", "http://192.0.2.7:9000", capsys)
    key_file = tmp_path / "node-7" / "node-7.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    entry = tomllib.loads(out)["node"][0]
    assert entry == {"id": "node-7", "url": "http://192.0.2.7:9000", "public_key": NodeKey.load(key_file).public_hex}
    # A second keygen would orphan the roster entry: refused unless forced.
    assert main(["keygen", "node-7", "--out", str(tmp_path / "node-7")]) == 2
    assert "exists" in capsys.readouterr().err
    assert NodeKey.load(key_file).public_hex == entry["public_key"]


def test_configs_from_keygen_and_roster_give_each_node_its_index_port_and_peers(tmp_path, capsys) -> None:
    roster, configs = _deployment(tmp_path, capsys)
    loaded = [load_node_config(c) for c in configs]
    entries = load_roster(roster).nodes
    assert [c.index for c in loaded] == [0, 1, 2]
    for c in loaded:
        assert c.port == int(entries[c.id].url.rsplit(":", 1)[1])
        assert set(c.peers) == set(entries) - {c.id}
        assert all(c.peers[p] == entries[p] for p in c.peers)


def test_roster_check_reports_unreachable_hosts_and_then_all_up(tmp_path, capsys) -> None:
    roster, _ = _deployment(tmp_path, capsys)
    # The roster's ports are held from the start, bound but not listening (a connection is refused
    # as by a host with nothing there): bound only after the first check, one was once taken by
    # another test's node meanwhile (CI, "Address already in use").
    listeners = []
    try:
        for entry in load_roster(roster).nodes.values():
            sock = socket.socket()
            listeners.append(sock)
            sock.bind(("127.0.0.1", int(entry.url.rsplit(":", 1)[1])))
        assert main(["roster", "check", str(roster), "--timeout", "1"]) == 1
        captured = capsys.readouterr()
        assert "3 nodes" in captured.out and captured.out.count("UNREACHABLE") == 3
        for sock in listeners:
            sock.listen()
        assert main(["roster", "check", str(roster), "--timeout", "1"]) == 0
        assert capsys.readouterr().out.count(" ok ") == 3
    finally:
        for sock in listeners:
            sock.close()


def _roster_text(**overrides: str) -> str:
    keys = [NodeKey.generate().public_hex for _ in range(2)]
    fields = {"id0": "node-0", "id1": "node-1", "key0": keys[0], "key1": keys[1],
              "url0": "http://10.0.0.1:9000", "url1": "http://10.0.0.2:9000", **overrides}
    return (f'[[node]]\nid = "{fields["id0"]}"\nurl = "{fields["url0"]}"\npublic_key = "{fields["key0"]}"\n'
            f'[[node]]\nid = "{fields["id1"]}"\nurl = "{fields["url1"]}"\npublic_key = "{fields["key1"]}"\n')


@pytest.mark.parametrize(("overrides", "message"), [
    ({"id1": "node-0"}, "duplicate id 'node-0'"),
    ({"key1": "zz" * 32}, "node node-1.public_key"),
    ({"key1": "ab" * 16}, "64 hex"),
    ({"url1": "http://10.0.0.1:9000"}, "same address"),
    ({"url0": "http://HOST:PORT"}, "node node-0.url"),
    ({"id0": "coordinator"}, "other than 'coordinator'"),
])
def test_a_bad_roster_exits_2_naming_the_file_and_the_entry(tmp_path, capsys, overrides, message) -> None:
    roster = tmp_path / "roster.toml"
    roster.write_text(_roster_text(**overrides))
    assert main(["roster", "check", str(roster), "--no-probe"]) == 2
    err = capsys.readouterr().err
    assert str(roster) in err and message in err


def test_a_key_that_does_not_match_the_roster_is_refused(tmp_path, capsys) -> None:
    _, configs = _deployment(tmp_path, capsys)
    other = NodeKey.generate()
    other.save(configs[1].parent / "node-1.key")  # a host that re-ran keygen without updating the roster
    with pytest.raises(ConfigError, match="wrong key file, or a stale roster") as info:
        load_node_config(configs[1])
    assert info.value.field == "key_file" and "node-1.key" in info.value.message
    assert main(["node", str(configs[1])]) == 2


def test_a_key_file_others_can_read_is_refused(tmp_path, capsys) -> None:
    _, configs = _deployment(tmp_path, capsys)
    key_file = configs[0].parent / "node-0.key"
    os.chmod(key_file, 0o644)
    with pytest.raises(ConfigError, match="chmod 600") as info:
        load_node_config(configs[0])
    assert str(key_file) in info.value.message


def test_a_config_whose_id_is_not_in_the_roster_or_whose_index_disagrees_is_refused(tmp_path, capsys) -> None:
    _, configs = _deployment(tmp_path, capsys)
    text = configs[2].read_text()
    configs[2].write_text(text.replace('id = "node-2"', 'id = "node-9"'))
    with pytest.raises(ConfigError, match="'node-9' is not in the roster"):
        load_node_config(configs[2])
    configs[2].write_text(text + "index = 0\n")
    with pytest.raises(ConfigError, match="drop `index`"):
        load_node_config(configs[2])


def test_lan_writes_the_same_files_and_takes_set(tmp_path, capsys) -> None:
    scenario = write_tiny(tmp_path, nodes=2)
    out = tmp_path / "lan"
    assert main(["lan", str(scenario), "--hosts", "10.0.0.1:9000,10.0.0.2:9000", "--out", str(out),
                 "--set", "rounds=7"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["node-0.key", "node-0.toml", "node-1.key", "node-1.toml",
                                                     "roster.toml", "scenario.toml"]  # self-contained
    config = load_node_config(out / "node-1.toml")
    # A deployment turns the defences on that its scenario leaves at a simulation's default (off).
    assert config.overrides == ("runtime.update_bound=1.0", "runtime.max_weight_ratio=4.0", "rounds=7")
    assert config.index == 1 and config.port == 9000
    assert load_roster(out / "roster.toml").nodes["node-0"].url == "http://10.0.0.1:9000"
    assert main(["lan", str(scenario), "--hosts", "a:1,b:2", "--out", str(tmp_path / "x"), "--set", "rounds=-1"]) == 2
    assert "rounds" in capsys.readouterr().err
