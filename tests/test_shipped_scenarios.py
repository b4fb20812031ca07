"""Every scenario in scenarios/ loads, and every compare row its comment suggests is a valid scenario."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from p2pfl.scenario.compare import parse_algorithms, row_raw
from p2pfl.scenario.schema import read_raw, scenario_from_dict

SCENARIOS = sorted((Path(__file__).resolve().parents[1] / "scenarios").glob("*.toml"))


def suggested_rows(path: Path) -> list[str]:
    """The `--algorithms` values of the commands in the file's comment (continued lines joined)."""
    comment = " ".join(line.lstrip("# ").rstrip().rstrip("\\") for line in path.read_text().splitlines()
                       if line.startswith("#"))
    found = re.findall(r"""--algorithms\s+(?:'([^']+)'|"([^"]+)"|([^\s'"]+))""", comment)
    return ["".join(groups) for groups in found]


def test_the_scenarios_folder_is_found() -> None:
    assert len(SCENARIOS) >= 10


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_a_shipped_scenario_and_its_suggested_rows_load(path: Path) -> None:
    raw = read_raw(path)
    scenario_from_dict(raw, source=str(path))
    for text in suggested_rows(path):
        for row in parse_algorithms(text):
            if "indices_from" in row.params:
                continue  # reads an earlier run's results
            scenario_from_dict(row_raw(raw, row), source=f"{path} row {row.label}")
