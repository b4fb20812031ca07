"""The live view: its state from a run folder as nodes write it, and the page in a real
headless Chromium during a short run (skipped where no Chromium is installed)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from p2pfl.errors import ConfigError
from p2pfl.report.dashboard import dashboard_state, estimate_eta, folder_state, log_tail, round_bands
from p2pfl.hosting.ports import free_ports
from p2pfl.runtime.config import node_ids
from p2pfl.runtime.run_folder import RunFolder

# Screenshots of the pages, kept for a person to look at (CI keeps this folder).
ARTEFACTS = Path(os.environ.get("P2PFL_TEST_ARTEFACTS", Path(__file__).resolve().parents[2] / "test-artefacts"))
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def test_state_follows_the_run_folder_as_nodes_write_it(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    assert dashboard_state(tmp_path) == {"ready": False}
    folder.scenario.write_text(json.dumps({"name": "t", "nodes": 2, "rounds": 3, "algorithm": {"name": "pfedsv"}}))
    folder.append_round("node-0", {"round": 1, "test_acc": 0.5, "test_acc_aggregated": 0.6, "bytes_received": 2**20,
                                   "epsilon": None, "time": {"train_s": 1.0}, "started_at": 100.0})
    folder.append_round("node-0", {"round": 1, "test_acc": 0.7, "test_acc_aggregated": 0.6, "bytes_received": 2**20,
                                   "epsilon": "inf", "time": {}, "started_at": 100.0})  # a resumed node writes round 1 again
    (tmp_path / "artefacts").mkdir()
    (tmp_path / "artefacts" / "node-1.jsonl").write_text("\n".join(json.dumps(e) for e in [
        {"node": "node-1", "round": 1, "name": "relevance", "value": {"peers": ["node-0"], "values": [0.1]}},
        {"node": "node-1", "round": 2, "name": "relevance", "value": {"peers": ["node-0"], "values": [0.9]}},
    ]) + "\n")
    state = dashboard_state(tmp_path, now=110.0)
    node0, node1 = state["nodes"]
    assert (node0["status"], node0["round"], node1["status"]) == ("running", 1, "starting")
    assert [r["test_acc"] for r in node0["rounds"]] == [0.7] and node0["rounds"][0]["epsilon"] is None
    assert node0["rounds"][0]["mib_received"] == 1.0
    relevance = state["heatmaps"]["relevance"]
    assert relevance["matrix"] == [[None, None], [0.9, None]]  # node-1's latest round
    assert (relevance["centre"], relevance["round"]) == (0.0, 2)  # a relevance's colours are centred at 0
    # 1 of 6 node-rounds in 10 s: 5 more at that pace.
    assert state["progress"] == {"done": 1, "total": 6, "elapsed_s": 10.0, "eta_s": 50.0}
    assert state["privacy"] == {"mode": "none"} and not state["done"] and state["summary_lines"] == []
    folder.write_result("node-1", {"status": "isolated", "error": "no peer answered"})
    state = dashboard_state(tmp_path, now=110.0)
    assert state["nodes"][1]["status"] == "isolated" and state["nodes"][1]["error"] == "no peer answered"
    assert state["progress"]["done"] == 1 + 3  # an isolated node has no rounds left to wait for


def test_a_thousand_node_state_stays_small_and_lists_failed_nodes_logs_first(tmp_path: Path) -> None:
    from p2pfl.report.dashboard import LOG_NODES, PER_NODE_MAX

    folder = RunFolder(tmp_path)
    n = 1000
    folder.scenario.write_text(json.dumps({"name": "t", "nodes": n, "rounds": 30, "algorithm": {"name": "fedavg"}}))
    ids = node_ids(n)  # node-000 ... node-999
    for i, nid in enumerate(ids):
        for r in range(1, 31):
            folder.append_round(nid, {"round": r, "test_acc": i / n, "bytes_received": 2**20,
                                              "time": {"train_s": 1.0, "exchange_s": 0.5}})
    folder.log("node-999").parent.mkdir(parents=True, exist_ok=True)
    folder.log("node-999").write_text("boom\n")
    folder.write_result("node-999", {"status": "failed", "error": "RuntimeError: boom"})
    state = dashboard_state(tmp_path)
    assert n > PER_NODE_MAX and not state["per_node"] and "rounds" not in state["nodes"][0]
    assert state["nodes"][5]["last"]["test_acc"] == 0.005 and state["nodes"][5]["mib_received"] == 30.0
    assert state["curves"]["test_acc"][-1]["mean"] == pytest.approx((n - 1) / 2 / n)
    assert state["round_time"][0]["train"] == 1.0 and state["round_time"][0]["exchange"] == 0.5
    logged = [node["id"] for node in state["nodes"] if "log" in node]
    assert len(logged) == LOG_NODES and "node-999" in logged  # the failed node past the first 50 too
    assert len(json.dumps(state)) < 400_000  # each of 1000 nodes' 30 rounds would be megabytes a second


def test_curves_are_the_mean_and_spread_over_nodes_of_each_round() -> None:
    nodes = [{"records": [{"round": 1, "test_acc": 0.2}, {"round": 2, "test_acc": 0.6}]},
             {"records": [{"round": 1, "test_acc": 0.4}, {"round": 2, "test_acc": None}]},
             {"records": [{"round": 1, "test_acc": 0.9}]}]
    bands = round_bands(nodes, "test_acc")
    assert [b["round"] for b in bands] == [1, 2]
    assert bands[0]["mean"] == pytest.approx((0.2 + 0.4 + 0.9) / 3) and (bands[0]["min"], bands[0]["max"]) == (0.2, 0.9)
    assert bands[1] == {"round": 2, "mean": 0.6, "min": 0.6, "max": 0.6, "n": 1}  # a missing value is no zero
    assert round_bands(nodes, "test_loss") == []
    assert estimate_eta(0, 10, 5.0) is None and estimate_eta(5, 10, None) is None
    assert estimate_eta(4, 10, 8.0) == pytest.approx(12.0) and estimate_eta(10, 10, 8.0) == 0.0


def test_the_log_pane_reads_the_last_whole_lines_of_a_long_log(tmp_path: Path) -> None:
    log = tmp_path / "node-0.log"
    log.write_text("".join(f"line {i:05d}\n" for i in range(5000)) + "\n")  # 55 kB: read from its end
    assert log_tail(log, 3) == ["line 04997", "line 04998", "line 04999"]
    assert log_tail(tmp_path / "absent.log") == []
    short = tmp_path / "short.log"
    short.write_text("first\nsecond\n")
    assert log_tail(short) == ["first", "second"]  # a log shorter than the tail read keeps its first line


@pytest.mark.slow
def test_a_finished_run_shows_its_summary_line_its_errors_and_that_privacy_was_off(tmp_path: Path) -> None:
    from p2pfl.scenario.launcher import run_scenario
    from tests.runtime.helpers import write_tiny

    results, code = run_scenario(write_tiny(tmp_path, nodes=2, rounds=2, samples=40), tmp_path / "run",
                                 progress=False, quiet=True)
    assert code == 0
    state = dashboard_state(tmp_path / "run")
    assert state["done"] and state["progress"]["eta_s"] == 0.0
    assert state["progress"]["elapsed_s"] == pytest.approx(results["summary"]["wall_s"])
    assert state["summary_lines"][0].startswith("fedavg: mean acc ")  # as `p2pfl run` printed it
    assert state["privacy"] == {"mode": "none"}
    assert [len(state["curves"][k]) for k in ("test_acc", "train_loss", "test_loss")] == [2, 2, 2]
    assert all(n["log"] and "final accuracy" in n["log"][-1] for n in state["nodes"])
    assert [len(n["rounds"]) for n in state["nodes"]] == [2, 2]  # per-node lines, for a small run


def _write_compare(folder: Path, rows: dict[str, list[list[float]]], done: bool) -> None:
    """A compare folder by hand: per row, per seed, each node's test accuracy per round."""
    for label, seeds in rows.items():
        for seed, per_node in enumerate(seeds):
            run = RunFolder(folder / label / f"seed{seed}")
            run.root.mkdir(parents=True)
            run.scenario.write_text(json.dumps({"name": "t", "nodes": 2, "rounds": 2, "algorithm": {"name": label}}))
            for i, acc in enumerate(per_node):
                run.append_round(f"node-{i}", {"round": 1, "test_acc": acc / 2})
                run.append_round(f"node-{i}", {"round": 2, "test_acc": acc})
            if done:
                run.results.write_text(json.dumps({"summary": {"mean_acc": sum(per_node) / len(per_node),
                                                               "mean_acc_aggregated": 0.5, "total_bytes": 2**21,
                                                               "wall_s": 3.0}}))
    if done:
        (folder / "compare.json").write_text(json.dumps({"scenario": "s.toml", "seeds": [0, 1], "overrides": [],
                                                         "rows": {label: [] for label in rows}}))


def test_a_compare_folder_shows_its_table_and_per_row_curves_while_it_runs_and_after(tmp_path: Path) -> None:
    rows = {"fedavg": [[0.6, 0.8], [0.5, 0.5]], "pfedsv": [[0.9, 0.9], [0.7, 0.9]]}
    _write_compare(tmp_path / "running", rows, done=False)
    running = folder_state(tmp_path / "running")  # no compare.json yet: the rows are the folders so far
    assert running["kind"] == "compare" and not running["done"]
    assert [(r["row"], r["seeds_done"], r["acc_mean"]) for r in running["table"]] == [("fedavg", 0, None),
                                                                                       ("pfedsv", 0, None)]
    _write_compare(tmp_path / "done", rows, done=True)
    state = folder_state(tmp_path / "done")
    assert state["done"] and [r["row"] for r in state["table"]] == ["fedavg", "pfedsv"]
    fedavg = state["table"][0]
    assert fedavg["acc_mean"] == pytest.approx((0.7 + 0.5) / 2) and fedavg["acc_std"] == pytest.approx(0.1)
    assert (fedavg["seeds_done"], fedavg["mib_total"]) == (2, 2.0)
    # Round 2 of pfedsv: the mean over nodes is 0.9 in seed 0 and 0.8 in seed 1.
    last = state["curves"]["pfedsv"][-1]
    assert last["round"] == 2 and last["mean"] == pytest.approx(0.85)
    assert (last["min"], last["max"], last["n"]) == (pytest.approx(0.8), pytest.approx(0.9), 2)


def test_a_sat_out_round_shows_the_latest_training_not_the_held_aggregate(tmp_path: Path) -> None:
    # Under partial participation a node that sits a round out records the model it holds (its
    # last aggregate) as test_acc; after training it is still where its last trained round left it.
    run = RunFolder(tmp_path / "fedavg" / "seed0")
    run.root.mkdir(parents=True)
    run.scenario.write_text(json.dumps({"name": "t", "nodes": 2, "rounds": 3, "algorithm": {"name": "fedavg"}}))
    run.append_round("node-0", {"round": 1, "participated": False, "test_acc": 0.1})  # the model as built
    run.append_round("node-0", {"round": 2, "participated": True, "test_acc": 0.9, "test_acc_aggregated": 0.3})
    run.append_round("node-0", {"round": 3, "participated": False, "test_acc": 0.2,
                                "test_acc_aggregated": 0.2})
    for r in (1, 2, 3):
        run.append_round("node-1", {"round": r, "participated": True, "test_acc": 0.5})
    node0 = dashboard_state(run.root)["nodes"][0]
    assert [r["test_acc"] for r in node0["rounds"]] == [0.1, 0.9, 0.9]
    assert [r["test_acc_aggregated"] for r in node0["rounds"]] == [None, 0.3, 0.2]  # the aggregated curve as recorded
    curve = folder_state(tmp_path)["curves"]["fedavg"]
    assert [c["mean"] for c in curve] == pytest.approx([0.3, 0.7, 0.7])


def test_without_plotly_the_dashboard_names_the_extra_before_any_run(monkeypatch: pytest.MonkeyPatch) -> None:
    import p2pfl.report.dashboard as dashboard

    def no_plotly(package: str) -> None:
        raise ModuleNotFoundError(f"No module named {package!r}")

    monkeypatch.setattr(dashboard.resources, "files", no_plotly)
    with pytest.raises(ConfigError, match=r"p2pfl-influence\[dashboard\]"):
        dashboard.live_dashboard(8050)


def _state(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/state", timeout=5) as resp:
        return json.loads(resp.read())


class _StandaloneDashboard:
    """`p2pfl dashboard` over a run folder on a thread of its own, so the page stays up while a
    browser loads it however soon the run itself ends (the launcher's dashboard stops with it)."""

    def __init__(self, run_dir: Path, port: int) -> None:
        import asyncio

        from p2pfl.report.dashboard import start_dashboard

        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        started = threading.Event()

        async def serve() -> None:
            runner = await start_dashboard(run_dir, port=port)
            started.set()
            await self._stop.wait()
            await runner.cleanup()

        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(serve(),), daemon=True)
        self._thread.start()
        assert started.wait(30), "the standalone dashboard did not start"

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)


def _browse(url: str, shot: Path) -> tuple[str, list[str]]:
    """The page's DOM after its scripts ran, and what it wrote to the browser console (a
    Plotly error, an uncaught exception, a resource that failed to load); a screenshot to `shot`."""
    browse = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=4000",
              "--window-size=1400,2400"]
    done = subprocess.run([*browse, "--enable-logging=stderr", "--v=0", "--dump-dom", url], capture_output=True,
                          text=True, timeout=90)
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    subprocess.run([*browse, f"--screenshot={shot}", url], capture_output=True, timeout=90)
    shot.parent.mkdir(parents=True, exist_ok=True)
    assert shot.is_file() and shot.stat().st_size > 20_000, f"no screenshot of {url}"
    keep = ARTEFACTS / "dashboard"
    keep.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, keep / shot.name)  # for a person to look at: CI keeps test-artefacts/
    return done.stdout, console


def _mid_run_copy(run: Path, to: Path, last_round: int) -> Path:
    """The finished run's folder as it was when its nodes had ended `last_round`: a page taken
    from it shows a run going on, whatever the speed of the machine that runs the test."""
    shutil.copytree(run, to)
    RunFolder(to).results.unlink()
    for rounds in (to / "nodes").glob("*.rounds.jsonl"):
        kept = [line for line in rounds.read_text().splitlines() if json.loads(line)["round"] <= last_round]
        rounds.write_text("".join(line + "\n" for line in kept))
    for result in (to / "nodes").glob("*.result.json"):
        result.unlink()
    for artefacts in (to / "artefacts").glob("*.jsonl"):
        kept = [line for line in artefacts.read_text().splitlines() if json.loads(line)["round"] <= last_round]
        artefacts.write_text("".join(line + "\n" for line in kept))
    return to


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs a headless Chromium (Debian package `chromium`)")
def test_the_page_shows_a_running_federation_in_a_real_browser(tmp_path: Path) -> None:
    from p2pfl.report.dashboard import live_dashboard
    from p2pfl.scenario.launcher import run_scenario
    from tests.runtime.helpers import write_tiny

    port, page_port = free_ports(2, "127.0.0.1")
    scenario = write_tiny(tmp_path, nodes=3, rounds=8, samples=80, algorithm="pfedsv")
    outcome: dict = {}
    runner = threading.Thread(target=lambda: outcome.update(code=run_scenario(
        scenario, tmp_path / "run", progress=False, quiet=True, live_view=live_dashboard(port))[1]))
    runner.start()
    deadline = time.monotonic() + 120
    state: dict = {}
    while time.monotonic() < deadline:  # until at least one round is done, while the run goes on
        try:
            state = _state(port)
            if state.get("ready") and any(n["round"] >= 1 for n in state["nodes"]):
                break
        except OSError:
            pass
        time.sleep(0.2)
    assert state.get("ready") and not state["done"], "the launcher's dashboard never showed a running round"
    runner.join(timeout=180)
    assert outcome.get("code") == 0
    during = _mid_run_copy(tmp_path / "run", tmp_path / "during", last_round=4)
    compare = tmp_path / "compare"
    _write_compare(compare, {"fedavg": [[0.6, 0.8], [0.5, 0.5]], "pfedsv": [[0.9, 0.9], [0.7, 0.9]]}, done=True)
    pages = {}
    for name, folder in (("after", tmp_path / "run"), ("during", during), ("compare", compare)):
        # Chromium takes seconds to start: each page is served by `p2pfl dashboard`'s server.
        page = _StandaloneDashboard(folder, page_port)
        try:
            pages[name] = _browse(f"http://127.0.0.1:{page_port}/", tmp_path / f"dashboard_{name}.png")
        finally:
            page.close()
    for name, (dom, console) in pages.items():
        assert console == [], f"the {name} page wrote to the browser console: {console}"
    after, during_dom, compare_dom = (pages[k][0] for k in ("after", "during", "compare"))
    for nid in ("node-0", "node-1", "node-2"):
        assert f'id="row-{nid}"' in after  # the script ran and filled the node table
    assert "24 of 24 node-rounds done" in after and "serving until Ctrl-C" in after
    assert "pfedsv: mean acc" in after  # the final summary line
    assert after.count('class="main-svg"') >= 2 * 7  # Plotly drew every chart (each has two main-svg layers)
    assert "privacy off" in after and "relevance" in after  # no ε panel for a run without privacy; a heatmap
    assert "12 of 24 node-rounds done" in during_dom and " left" in during_dom  # a pace and an ETA
    assert "relevance, round 4" in during_dom
    assert "compare: compare" in compare_dom and "<td>pfedsv</td>" in compare_dom and 'class="main-svg"' in compare_dom


@pytest.mark.slow
def test_run_with_a_dashboard_keeps_serving_the_finished_run_until_ctrl_c(tmp_path: Path) -> None:
    """Started at a terminal (a pseudo-terminal here), the finished run's page stays up."""
    import os
    import pty

    from tests.runtime.helpers import interruptible, write_tiny

    (port,) = free_ports(1, "127.0.0.1")
    scenario = write_tiny(tmp_path, nodes=2, rounds=2, samples=40)
    terminal, seat = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "p2pfl", "run", str(scenario), "--out", str(tmp_path / "run"),
                             "--no-progress", "--dashboard", str(port)], stdin=seat, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)
    os.close(seat)
    try:
        deadline = time.monotonic() + 240
        state: dict = {}
        while time.monotonic() < deadline and not state.get("done"):
            try:
                state = _state(port)
            except OSError:  # not up yet, or between the run's server and the one after it
                time.sleep(0.3)
        assert state.get("done"), "the run never finished"
        time.sleep(2.0)
        assert proc.poll() is None and _state(port)["done"]  # the run ended; the page is still there
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    os.close(terminal)
    assert proc.returncode == 0, err  # Ctrl-C ended the serving, not the run: its status is kept
    assert "(Ctrl-C stops it)" in err and "dashboard stopped" in err


def test_a_node_killed_mid_write_takes_neither_the_dashboard_nor_the_report_down(tmp_path: Path) -> None:
    """Review finding 9: A half-written artefact line, round lines that parse but are no records, and a resumed
    node appending after its killed self's half line: before, /api/state answered 500 and
    `load_artefacts` raised; now every reader skips what is not a whole record."""
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from p2pfl.report.dashboard import dashboard_app
    from p2pfl.runtime.run_folder import load_artefacts

    folder = RunFolder(tmp_path)
    folder.scenario.write_text(json.dumps({"name": "t", "nodes": 2, "rounds": 3, "algorithm": {"name": "pfedsv"}}))
    folder.append_round("node-0", {"round": 1, "test_acc": 0.5, "bytes_received": 2**20, "time": {"train_s": 1.0}})
    rounds = folder.node_rounds("node-0")
    with rounds.open("a") as fh:  # what a kill mid-write, and hand-made or foreign lines, leave behind
        fh.write('{}\n[1, 2]\n{"round": "two"}\n{"round": 2, "time": [1], "bytes_received": "x"}\n{"round": 3, "te')
    folder.append_round("node-0", {"round": 3, "test_acc": 0.7})  # the resumed node ends the half line first
    (tmp_path / "artefacts").mkdir()
    (tmp_path / "artefacts" / "node-1.jsonl").write_text(
        json.dumps({"node": "node-1", "round": 1, "name": "relevance", "value": {"peers": ["node-0"], "values": [0.4]}})
        + '\n{"node": "node-1", "round": 2, "name": "rel\n[]\n{"node": "node-1", "round": 2, "name": "relevance", '
        '"value": 7}\n')
    assert load_artefacts(tmp_path)["relevance"]["node-1"] == {1: {"peers": ["node-0"], "values": [0.4]}, 2: 7}
    state = dashboard_state(tmp_path)
    node0 = state["nodes"][0]
    assert [r["round"] for r in node0["rounds"]] == [1, 2, 3] and node0["rounds"][2]["test_acc"] == 0.7
    assert node0["rounds"][1]["mib_received"] == 0.0 and state["round_time"][1]["train"] == 0.0
    assert state["heatmaps"]["relevance"]["matrix"] == [[None, None], [None, None]]  # round 2's value is no vector
    folder.node_result("node-1").write_text('{"status": "ok", "rou')  # a file written before writes were atomic

    async def fetch() -> int:
        async with TestClient(TestServer(dashboard_app(tmp_path))) as client:
            resp = await client.get("/api/state")
            return resp.status

    assert asyncio.run(fetch()) == 200


def test_polls_within_a_states_age_share_one_reading_of_the_folder(tmp_path: Path) -> None:
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from p2pfl.report.dashboard import dashboard_app

    folder = RunFolder(tmp_path)
    folder.scenario.write_text(json.dumps({"name": "t", "nodes": 1, "rounds": 3, "algorithm": {"name": "fedavg"}}))

    async def polls() -> list[int]:
        rounds = []
        for min_age_s in (3600.0, 0.0):
            async with TestClient(TestServer(dashboard_app(tmp_path, min_age_s=min_age_s))) as client:
                first = await (await client.get("/api/state")).json()
                folder.append_round("node-0", {"round": len(first["nodes"][0].get("rounds", [])) + 1})
                await asyncio.sleep(0.5)  # older than a few times the millisecond this folder takes to read
                second = await (await client.get("/api/state")).json()
                rounds.append(len(second["nodes"][0]["rounds"]) - len(first["nodes"][0]["rounds"]))
        return rounds

    assert asyncio.run(polls()) == [0, 1]  # the same state while young; read again once old


def test_results_are_written_whole(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    folder.write_result("node-0", {"status": "ok", "rounds": [1, 2]})
    assert json.loads(folder.node_result("node-0").read_text()) == {"status": "ok", "rounds": [1, 2]}
    assert [p.name for p in folder.node_result("node-0").parent.iterdir()] == ["node-0.result.json"]


def test_a_run_with_churn_shows_who_ran_each_round_so_far(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    folder.scenario.write_text(json.dumps({"name": "t", "nodes": 3, "rounds": 4, "algorithm": {"name": "fedavg"},
                                           "churn": {"join": [{"node": 2, "round": 2}]}}))
    for nid, rounds in (("node-0", [1, 2, 3]), ("node-1", [1]), ("node-2", [2, 3])):
        for r in rounds:
            folder.append_round(nid, {"round": r, "test_acc": 0.5, "time": {}, "started_at": 100.0 + r})
    membership = dashboard_state(tmp_path, now=110.0)["membership"]
    assert membership["rounds"] == [1, 2, 3] and membership["live"] == [2, 2, 2]
    assert membership["grid"] == [[1, 1, 1], [1, 0, 0], [0, 1, 1]] and membership["ids"] == ["node-0", "node-1", "node-2"]
    folder.scenario.write_text(json.dumps({"name": "t", "nodes": 3, "rounds": 4, "algorithm": {"name": "fedavg"}}))
    assert dashboard_state(tmp_path, now=110.0)["membership"] is None  # no churn, no panel


@pytest.mark.slow
def test_run_with_a_dashboard_ends_with_its_run_when_not_at_a_terminal(tmp_path: Path) -> None:
    """Started from a script (no terminal, SIGINT ignored under `&`), `p2pfl run --dashboard`
    stops serving when the run ends instead of serving for ever."""
    pytest.importorskip("plotly")
    import subprocess
    import sys

    from p2pfl.hosting.ports import free_ports
    from tests.runtime.helpers import write_tiny

    [port] = free_ports(1, "127.0.0.1")
    scenario = write_tiny(tmp_path, nodes=2, rounds=1, samples=40)
    done = subprocess.run([sys.executable, "-m", "p2pfl", "run", str(scenario), "--out", str(tmp_path / "run"),
                           "--no-progress", "--dashboard", str(port)], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "run" / "results.json").is_file()


def test_the_clock_runs_from_the_folder_and_a_compare_counts_the_runs_it_planned(tmp_path: Path) -> None:
    """Before any round ends the page says how long the run has gone (start-up included), and a
    compare mid-way counts every run it will make, not only the folders made so far."""
    folder = RunFolder(tmp_path / "run")
    (tmp_path / "run" / "nodes").mkdir(parents=True)
    folder.scenario.write_text(json.dumps({"name": "t", "nodes": 2, "rounds": 3, "algorithm": {"name": "fedavg"}}))
    started = folder.scenario.stat().st_mtime
    state = dashboard_state(tmp_path / "run", now=started + 12.0)
    assert state["progress"]["elapsed_s"] == pytest.approx(12.0) and state["progress"]["done"] == 0

    out = tmp_path / "cmp"
    for row in ("local", "fedavg"):
        (out / row / "seed0").mkdir(parents=True)
    (out / "plan.json").write_text(json.dumps({"scenario": "s.toml", "overrides": [], "runs": {
        "local": ["local/seed0", "local/seed1", "local/seed2"], "fedavg": ["fedavg/seed0", "fedavg/seed1", "fedavg/seed2"]}}))
    (out / "local" / "seed0" / "results.json").write_text(json.dumps({"summary": {"mean_acc": 0.5, "wall_s": 1.0}}))
    compare = folder_state(out)
    assert [(r["row"], r["seeds_done"], r["seeds"]) for r in compare["table"]] == [("local", 1, 3), ("fedavg", 0, 3)]
    assert compare["done"] is False


def test_a_lan_nodes_finished_folder_is_finished_and_waits_for_no_other_host(tmp_path: Path) -> None:
    """`p2pfl node` on one host writes its own node's files only: the other nodes are on other
    hosts, not "starting", and the folder's run is over when its node's is."""
    folder = RunFolder(tmp_path)
    (tmp_path / "nodes").mkdir()
    folder.scenario.write_text(json.dumps({"name": "t", "nodes": 3, "rounds": 2, "algorithm": {"name": "fedavg"}}))
    for r in (1, 2):
        folder.append_round("node-1", {"round": r, "test_acc": 0.5, "started_at": time.time()})
    folder.node_result("node-1").write_text(json.dumps({"id": "node-1", "status": "ok", "wall_s": 42.0,
                                                         "rounds": [{"round": 1}, {"round": 2}]}))
    state = dashboard_state(tmp_path)
    assert [n["status"] for n in state["nodes"]] == ["on another host", "ok", "on another host"]
    assert state["done"] and state["progress"]["elapsed_s"] == 42.0
    assert state["progress"]["done"] == state["progress"]["total"] == 2


def test_the_dashboard_refuses_a_host_it_does_not_serve(tmp_path: Path) -> None:
    """Review finding 10: A DNS-rebinding page (its own name resolved to 127.0.0.1) sends its own name as Host:
    before, it could read /api/state."""
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from p2pfl.report.dashboard import dashboard_app, host_allowed

    assert host_allowed("127.0.0.1:8050", "127.0.0.1") and host_allowed("localhost:8050", "127.0.0.1")
    assert host_allowed("[::1]:8050", "127.0.0.1") and host_allowed("10.0.0.5:8050", "0.0.0.0")
    assert host_allowed("lab-box:8050", "lab-box") and not host_allowed(None, "127.0.0.1")
    assert not host_allowed("rebind.attacker.example:8050", "127.0.0.1")

    async def ask() -> tuple[int, int]:
        async with TestClient(TestServer(dashboard_app(tmp_path))) as client:
            ok = await client.get("/api/state")
            evil = await client.get("/api/state", headers={"Host": "rebind.attacker.example:8050"})
            return ok.status, evil.status

    assert asyncio.run(ask()) == (200, 421)


@pytest.mark.slow
def test_a_busy_dashboard_port_leaves_no_run_folder_and_each_command_names_its_own_option(tmp_path: Path) -> None:
    """Issue 67, item 6. Before: the run folder was written before the port was tried, so the
    retry on another port was refused ("already holds a run ... --force"); `p2pfl dashboard
    --port` named `--dashboard` in its error."""
    import asyncio
    import socket

    from tests.runtime.helpers import write_tiny

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        out = tmp_path / "run"
        proc = subprocess.run([sys.executable, "-m", "p2pfl", "run", str(write_tiny(tmp_path, nodes=2, rounds=1)),
                               "--out", str(out), "--dashboard", str(port), "--no-progress"],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and "--dashboard" in proc.stderr and str(port) in proc.stderr, proc.stderr
        assert not out.exists(), "nothing written before the port is known to be free"

        from p2pfl.report.dashboard import start_dashboard

        with pytest.raises(ConfigError) as info:
            asyncio.run(start_dashboard(tmp_path, "127.0.0.1", port, "--port"))
        assert info.value.field == "--port"


def test_a_federation_members_finished_folder_shows_its_own_node_and_its_events(tmp_path: Path) -> None:
    """Issue 67, item 4: a federation member's folder holds `alpha`'s files, which no scenario's
    node-i names; before, the page read "0 of 400 node-rounds done · 4 starting" for ever."""
    folder = RunFolder(tmp_path)
    (tmp_path / "nodes").mkdir()
    folder.scenario.write_text(json.dumps({"name": "t", "nodes": 4, "rounds": 3, "algorithm": {"name": "fedavg"}}))
    for r in (2, 3):
        folder.append_round("alpha", {"round": r, "test_acc": 0.5, "started_at": time.time()})
    state = dashboard_state(tmp_path)
    assert [(n["id"], n["status"]) for n in state["nodes"]] == [("alpha", "running")] and not state["done"]
    folder.node_result("alpha").write_text(json.dumps({
        "id": "alpha", "status": "revoked", "wall_s": 9.0, "rounds": [{"round": 2}, {"round": 3}],
        "membership": [{"round": 2, "event": "joined"}, {"round": 4, "event": "revoked"}]}))
    state = dashboard_state(tmp_path)
    assert [(n["id"], n["status"]) for n in state["nodes"]] == [("alpha", "revoked")]
    assert state["done"] and state["progress"]["done"] == state["progress"]["total"] == 3
    assert state["membership"]["events"] == [{"id": "alpha", "round": 2, "event": "joined"},
                                             {"id": "alpha", "round": 4, "event": "revoked"}]


def test_a_federations_merged_report_gathers_its_members_and_draws_their_membership(tmp_path: Path) -> None:
    """Before, `p2pfl report` over the members' results gathered node-0..3 (none there: four
    failures) and drew no membership timeline though a join and a revocation were in them."""
    from p2pfl.report import make_report

    folder = RunFolder(tmp_path)
    (tmp_path / "nodes").mkdir()
    scenario = {"name": "t", "nodes": 2, "seed": 0, "rounds": 3, "algorithm": {"name": "fedavg", "params": {}},
                "data": {"dataset": "mnist", "partition": "iid", "samples_per_node": 40}, "model": {"name": "cnn"}}
    folder.scenario.write_text(json.dumps(scenario))
    rounds = [{"round": r, "test_acc": 0.5, "test_acc_aggregated": 0.5, "arrived": [], "started_at": 1.0 + r,
               "train_loss": 1.0, "test_loss": 1.0, "bytes_received": 0, "param_bytes_received": 0, "bytes_sent": 0,
               "param_bytes_sent": 0, "time": {}} for r in (1, 2, 3)]
    for nid, status, events in (("alpha", "ok", []), ("beta", "ok", [{"round": 2, "event": "joined"}]),
                                ("gamma", "revoked", [{"round": 3, "event": "revoked"}])):
        own = rounds[1:] if nid == "beta" else rounds[:2] if nid == "gamma" else rounds
        folder.node_result(nid).write_text(json.dumps({"id": nid, "status": status, "wall_s": 5.0, "rounds": own,
                                                       "final_test_acc": 0.5, "membership": events}))
    paths = make_report(tmp_path)
    results = json.loads(folder.results.read_text())
    assert [(n["id"], n["status"]) for n in results["nodes"]] == [("alpha", "ok"), ("beta", "ok"), ("gamma", "revoked")]
    timeline = results["membership"]
    assert timeline[1]["joined"] == ["beta"] and timeline[2]["revoked"] == ["gamma"]
    assert tmp_path / "report" / "membership.png" in paths


def test_the_strategys_hooks_get_a_curve_each(tmp_path: Path) -> None:
    """Issue 67, item 7: `evaluate`'s metrics and `fit_config`'s learning rate, live."""
    folder = RunFolder(tmp_path)
    folder.scenario.write_text(json.dumps({"name": "t", "nodes": 2, "rounds": 3, "algorithm": {"name": "fedavg"}}))
    for nid, scale in (("node-0", 1.0), ("node-1", 3.0)):
        folder.append_round(nid, {"round": 1, "test_acc": 0.5, "metrics": {"acc_weighted": 0.1 * scale},
                                  "fit_config": {"lr": 0.01, "optimizer": "sgd"}})
    hooks = dashboard_state(tmp_path, now=110.0)["hooks"]
    assert sorted(hooks) == ["fit/lr", "metrics/acc_weighted"]  # numbers only
    [band] = hooks["metrics/acc_weighted"]
    assert band["round"] == 1 and abs(band["mean"] - 0.2) < 1e-12 and band["n"] == 2


def test_an_audited_run_shows_what_its_auditing_node_learned_of_each_peer(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    folder.scenario.write_text(json.dumps({"name": "t", "nodes": 2, "rounds": 1, "algorithm": {"name": "fedavg"}}))
    folder.append_round("node-0", {"round": 1, "test_acc": 0.5, "test_acc_aggregated": 0.5})
    assert dashboard_state(tmp_path)["audit"] is None
    leak = {"auc": 0.61, "advantage": 0.2, "epsilon_lower_bound": 0.4}
    folder.audit.write_text(json.dumps({"node": "node-0", "summary": {"update_psnr": 9.1}, "peers": {
        "node-1": {"part": "full", "round": 1, "membership": {"loss": leak, "shadow": {**leak, "auc": 0.55,
                                                                                      "epsilon_lower_bound": 0.7}},
                   "accounted_epsilon": 3.9},
        "node-2": {"skipped": "no model part was read from it", "accounted_epsilon": None}}}))
    audit = dashboard_state(tmp_path)["audit"]
    assert audit["node"] == "node-0" and audit["summary"] == {"update_psnr": 9.1}
    first, second = audit["peers"]
    assert (first["auc_loss"], first["auc_shadow"], first["epsilon_proven"], first["epsilon_accounted"]) == (
        0.61, 0.55, 0.7, 3.9)
    assert second["skipped"] == "no model part was read from it"
