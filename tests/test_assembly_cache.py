"""What a worker makes once for all the nodes it builds from one scenario."""

from __future__ import annotations

from p2pfl.assembly import node_settings
from p2pfl.scenario.schema import load_scenario


def test_nodes_built_from_one_scenario_share_its_settings_and_another_scenario_gets_its_own() -> None:
    one = load_scenario("scenarios/scale.toml", ["rounds=3"])
    settings = node_settings(one)
    assert node_settings(one) is settings and settings.rounds == 3
    other = load_scenario("scenarios/scale.toml", ["rounds=4"])
    assert node_settings(other).rounds == 4
    assert node_settings(one) is not settings and node_settings(one) == settings  # made again, the same
