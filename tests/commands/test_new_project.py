"""`p2pfl new NAME` writes a project folder that runs as written (issue 33, item 1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from p2pfl.cli import main
from p2pfl.scenario.compare import parse_algorithms


@pytest.mark.slow
def test_a_new_project_runs_as_written_from_its_folder(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["new", "demo", "--parent", str(tmp_path)]) == 0
    folder = tmp_path / "demo"
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "data.py", "model.py", "scenario.toml",
                                                          "strategy.py"]
    assert "cd " in capsys.readouterr().out
    # The README's run command, with one round for the test's sake.
    done = subprocess.run([sys.executable, "-m", "p2pfl", "run", "scenario.toml", "--out", "runs/first",
                           "--no-progress", "--set", "rounds=1"], cwd=folder, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((folder / "runs" / "first" / "results.json").read_text())
    assert [n["status"] for n in results["nodes"]] == ["ok"] * 4
    assert results["algorithm"] == "strategy:TrimmedMean" and results["summary"]["mean_acc"] > 0.3
    readme = (folder / "README.md").read_text()
    rows = readme.split("--algorithms '")[1].split("'")[0]
    assert [r.label for r in parse_algorithms(rows)] == ["strategy:TrimmedMean", "fedavg", "local"]


@pytest.mark.parametrize("name", ["1demo", "de mo", "class", "../up"])
def test_a_name_that_is_not_a_folder_name_is_refused(tmp_path: Path, name: str) -> None:
    assert main(["new", name, "--parent", str(tmp_path)]) == 2
    assert list(tmp_path.iterdir()) == []


def test_an_existing_folder_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "mine.txt").write_text("keep")
    assert main(["new", "demo", "--parent", str(tmp_path)]) == 2
    assert [p.name for p in (tmp_path / "demo").iterdir()] == ["mine.txt"]
