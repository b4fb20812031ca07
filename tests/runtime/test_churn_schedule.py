"""`[churn]`: the schedule a scenario declares, validated, and the scripts every node reads from it."""

from __future__ import annotations

import pytest

from p2pfl.errors import ConfigError
from p2pfl.runtime.churn import ChurnSpec, NodeScript, scripts_of


def spec(**table: object) -> ChurnSpec:
    return ChurnSpec.from_dict(table, nodes=20, rounds=8)


def test_listed_events_become_each_nodes_script() -> None:
    s = spec(join=[{"node": 3, "round": 4}], leave=[{"node": 5, "round": 6}],
             crash=[{"node": 1, "round": 3, "restart": 5}], slow=[{"node": 2, "factor": 10}])
    scripts = scripts_of(s, 20, 8, 0)
    assert scripts[3] == NodeScript(join=4) and scripts[5] == NodeScript(leave=6)
    assert scripts[1] == NodeScript(crash=3, restart=5) and scripts[2] == NodeScript(slowdown=10.0)
    assert not any(scripts[i].active for i in (0, 4, 6))
    assert [r for r in range(1, 9) if scripts[1].live_in(r)] == [1, 2, 5, 6, 7, 8]
    assert ChurnSpec.from_dict(s.to_dict(), nodes=20, rounds=8) == s


def test_a_flapping_member_is_away_every_other_round_from_its_first() -> None:
    s = spec(flap=[{"node": 4, "round": 2}])
    scripts = scripts_of(s, 6, 9, 0)
    assert scripts[4] == NodeScript(flap=2) and scripts[4].active
    assert [r for r in range(1, 10) if scripts[4].live_in(r)] == [1, 3, 5, 7, 9]
    assert [r for r in range(1, 10) if scripts[4].away_in(r)] == [2, 4, 6, 8]
    assert not scripts[3].away_in(2) and ChurnSpec.from_dict(s.to_dict(), nodes=6, rounds=9) == s


@pytest.mark.parametrize(("table", "field"), [
    ({"join": [{"node": 20, "round": 3}]}, "churn.join[0].node"),
    ({"join": [{"node": 1, "round": 9}]}, "churn.join[0].round"),
    ({"join": [{"node": 1}]}, "churn.join[0].round"),
    ({"crash": [{"node": 1, "round": 2, "restart": 0}]}, "churn.crash[0].restart"),
    ({"slow": [{"node": 1, "factor": 0.5}]}, "churn.slow[0].factor"),
    ({"leave": {"node": 1}}, "churn.leave"),
    ({"crash_per_round": 1.5}, "churn.crash_per_round"),
    ({"restart_after": -1}, "churn.restart_after"),
    ({"joins": []}, "churn.joins"),
    ({"join": [{"node": 1, "round": 4}], "leave": [{"node": 1, "round": 3}]}, "churn.leave"),
    ({"crash": [{"node": 1, "round": 4, "restart": 3}]}, "churn.crash"),
    ({"leave": [{"node": 1, "round": 1}]}, "churn.leave"),
    ({"join": [{"node": 1, "round": 3, "second": 2.0}]}, "churn.join[0].round"),
    ({"join": [{"node": 1, "second": -1.0}]}, "churn.join[0].second"),
    ({"crash": [{"node": 1, "second": 5.0, "restart": 4}]}, "churn.crash[0].restart"),
    ({"crash": [{"node": 1, "round": 2, "restart_after_s": 4.0}]}, "churn.crash[0].restart_after_s"),
    ({"leave": [{"node": 1, "second": 5.0}], "crash": [{"node": 1, "second": 2.0}]}, "churn.leave"),
    ({"flap": [{"node": 1, "round": 1}]}, "churn.flap"),
    ({"flap": [{"node": 1, "round": 3}], "leave": [{"node": 1, "round": 6}]}, "churn.flap"),
    ({"flap": [{"node": 1, "second": 3.0}]}, "churn.flap[0].second"),
    ({"flap": [{"node": 1, "round": 2, "restart": 4}]}, "churn.flap[0].restart"),
])
def test_a_wrong_schedule_is_named(table: dict, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        spec(**table)
    assert err.value.field == field, err.value


def test_events_at_a_time_are_scripts_of_their_own() -> None:
    s = spec(join=[{"node": 3, "second": 20}], leave=[{"node": 5, "second": 60.0}],
             crash=[{"node": 1, "second": 30.0, "restart_after_s": 15}])
    scripts = scripts_of(s, 20, 8, 0)
    assert scripts[3] == NodeScript(join_s=20.0) and scripts[3].late and scripts[3].timed
    assert scripts[5] == NodeScript(leave_s=60.0) and not scripts[5].late
    assert scripts[1] == NodeScript(crash_s=30.0, restart_after_s=15.0)
    assert ChurnSpec.from_dict(s.to_dict(), nodes=20, rounds=8) == s


def test_a_drawn_schedule_is_the_seeds_and_respects_its_rates() -> None:
    s = spec(join_per_round=0.05, crash_per_round=0.1, restart_after=2, slow_share=0.2, slow_factor=5.0)
    scripts = scripts_of(s, 20, 8, 3)
    assert scripts == scripts_of(s, 20, 8, 3) and scripts != scripts_of(s, 20, 8, 4)
    assert [sum(x.join == r for x in scripts) for r in range(2, 9)] == [1] * 7  # 5 % of 20 in each round
    assert sum(x.slowdown == 5.0 for x in scripts) == 4
    for x in scripts:
        if x.crash is not None:
            assert x.crash > x.join and (x.restart is None or x.restart == x.crash + 2)
    assert any(x.crash is not None for x in scripts)


def test_a_scenario_carries_its_schedule_only_when_there_is_one(tmp_path) -> None:
    from p2pfl.scenario.schema import load_scenario

    from .helpers import write_tiny

    plain = load_scenario(write_tiny(tmp_path))
    assert plain.to_dict()["churn"] == {} and not plain.churn.active  # written, empty: nobody comes or goes
    churned = load_scenario(write_tiny(tmp_path, nodes=4, rounds=4), ['churn.join=[{node = 2, round = 3}]'])
    assert churned.to_dict()["churn"] == {"join": [{"node": 2, "round": 3}]}
    # Client2Vec's coordinator sets nodes up before round 1; a joiner is set up from its peers.
    assert load_scenario(write_tiny(tmp_path, nodes=4, rounds=4, algorithm="client2vec"),
                         ['churn.join=[{node = 2, round = 3}]']).churn.active
    assert load_scenario(write_tiny(tmp_path, nodes=4, rounds=4, algorithm="ga"),
                         ['churn.join=[{node = 2, round = 3}]']).churn.active  # a coordinator that only aggregates
