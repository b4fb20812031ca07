"""`p2pfl data show SCENARIO --png X`: a table on stdout and a picture on disk."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from PIL import Image

from p2pfl.cli import main

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def _png_ok(path: Path) -> np.ndarray:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(path) as im:
        a = np.asarray(im.convert("RGB"))
    assert a.shape[0] > 300 and a.shape[1] > 500
    assert a.std() > 10  # not a blank canvas
    return a


def test_data_show_prints_the_partition_table_and_writes_a_png(tmp_path, capsys):
    path = ROOT / "scenarios" / "fedc2i_digits.toml"
    sc = tomllib.loads(path.read_text())
    data, nodes = sc["data"], sc["nodes"]
    assert data["partition"] == "domain" and data.get("nodes_per_domain", 1) == 1
    n = data["samples_per_node"]
    n_test, n_val = round(n * data["test_fraction"]), round(n * data["val_fraction"])
    n_train = n - n_test - n_val
    png = tmp_path / "pics" / "fedc2i.png"
    assert main(["data", "show", str(path), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith(f"dataset=digits partition=domain nodes_per_domain=1 samples_per_node={n} nodes={nodes}")
    assert lines[1].split()[:6] == ["node", "domain", "train", "val", "test", "classes"]
    rows = [ln.split() for ln in lines[3 : 3 + nodes]]
    assert [r[0] for r in rows] == [str(i) for i in range(nodes)]
    assert [r[1] for r in rows] == data["domains"]
    # the test split is topped up from the domain's samples the cap left out (data.test_samples_per_node)
    from p2pfl.data import DOMAIN_SIZES

    tests = [max(n_test, min(data.get("test_samples_per_node") or 0, DOMAIN_SIZES[d] - n_train - n_val))
             for d in data["domains"]]
    for r, t in zip(rows, tests):  # every node: its split sizes, all ten digits, ten class counts summing to n_train
        assert r[2:6] == [str(n_train), str(n_val), str(t), "0-9"]
        assert len(r) == 16 and sum(int(c) for c in r[6:16]) == n_train
    assert f"total: train={nodes * n_train} val={nodes * n_val} test={sum(tests)}" in out
    assert f"picture: {png}" in out
    _png_ok(png)


def test_data_show_with_overrides_and_held_out_domain(tmp_path, capsys):
    scenario = tmp_path / "s.toml"
    scenario.write_text('nodes = 4\nseed = 3\n[data]\ndataset = "digits"\ndomains = ["mnist", "uci", "usps"]\n'
                        'partition = "dirichlet"\nalpha = 0.1\nsamples_per_node = 100\n')
    png = tmp_path / "d.png"
    code = main(["data", "show", str(scenario), "--png", str(png), "--set", "data.held_out_domain=uci", "--set", "seed=4"])
    assert code == 0
    out = capsys.readouterr().out
    assert "partition=dirichlet alpha=0.1" in out and "seed=4" in out
    assert "held-out domain 'uci': 1797 test samples (no node has it)" in out
    assert out.count("mixed(") + out.count(" mnist ") + out.count(" usps ") >= 4
    assert "uci:" not in out.split("held-out")[0]  # no node holds a uci sample
    _png_ok(png)


def test_data_show_reports_config_errors_by_field(tmp_path, capsys):
    scenario = tmp_path / "s.toml"
    scenario.write_text(f'nodes = 2\n[data]\ndataset = "cifar10"\npath = "{tmp_path / "none"}"\n')
    assert main(["data", "show", str(scenario), "--png", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert "error in data.path" in err and "does not exist" in err
    assert not (tmp_path / "x.png").exists()


def test_show_writes_a_picture_only_where_asked(tmp_path, monkeypatch, capsys) -> None:
    """Before, `p2pfl data show` wrote partition.png into the current folder unasked."""
    from p2pfl.cli import main
    from tests.runtime.helpers import write_tiny

    scenario = write_tiny(tmp_path, nodes=3)
    monkeypatch.chdir(tmp_path)
    assert main(["data", "show", str(scenario)]) == 0
    assert "picture:" not in capsys.readouterr().out
    assert not list(tmp_path.glob("*.png"))
