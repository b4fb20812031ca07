"""Issue 33, item 4: a wrong scenario field is named before torch is imported (it took 6-16 s)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

QUICKSTART = str(Path(__file__).parents[2] / "scenarios" / "quickstart.toml")
PROBE = """
import sys
from p2pfl.cli import main
code = main(sys.argv[1:])
print("torch imported:", "torch" in sys.modules, "exit", code)
"""


@pytest.mark.parametrize(("command", "field"), [
    (["run", QUICKSTART, "--out", "OUT", "--set", "rouds=3"], "did you mean 'rounds'"),
    (["run", QUICKSTART, "--out", "OUT", "--set", "train.lrr=0.1"], "train.lrr"),
    (["run", QUICKSTART, "--out", "OUT", "--set", 'runtime.topology="ring:x"'], "runtime.topology"),
    (["compare", QUICKSTART, "--algorithms", "fedavg", "--out", "OUT", "--set", 'data.partitoin="iid"'],
     "did you mean 'partition'"),
])
@pytest.mark.slow
def test_a_wrong_field_is_named_before_torch_loads(tmp_path: Path, command: list[str], field: str) -> None:
    argv = [a.replace("OUT", str(tmp_path / "out")) for a in command]
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120)
    assert "torch imported: False exit 2" in done.stdout, done.stdout + done.stderr[-1500:]
    assert field in done.stderr
