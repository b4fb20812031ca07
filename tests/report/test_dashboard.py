"""The live view: its state from a run folder as nodes write it, and the page in a real
headless Chromium during a short run (skipped where no Chromium is installed)."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from p2pfl.report.dashboard import dashboard_state
from p2pfl.runtime.run_folder import RunFolder
from p2pfl.hosting.ports import free_ports

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def test_state_follows_the_run_folder_as_nodes_write_it(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    assert dashboard_state(tmp_path) == {"ready": False}
    folder.scenario.write_text(json.dumps({"name": "t", "nodes": 2, "rounds": 3, "algorithm": {"name": "pfedsv"}}))
    folder.append_round("node-0", {"round": 1, "test_acc": 0.5, "test_acc_aggregated": 0.6, "bytes_received": 2**20,
                                   "epsilon": None, "time": {"train_s": 1.0}})
    folder.append_round("node-0", {"round": 1, "test_acc": 0.7, "test_acc_aggregated": 0.6, "bytes_received": 2**20,
                                   "epsilon": "inf", "time": {}})  # a resumed node writes round 1 again
    (tmp_path / "artefacts").mkdir()
    (tmp_path / "artefacts" / "node-1.jsonl").write_text("\n".join(json.dumps(e) for e in [
        {"node": "node-1", "round": 1, "name": "relevance", "value": {"peers": ["node-0"], "values": [0.1]}},
        {"node": "node-1", "round": 2, "name": "relevance", "value": {"peers": ["node-0"], "values": [0.9]}},
    ]) + "\n")
    state = dashboard_state(tmp_path)
    node0, node1 = state["nodes"]
    assert (node0["status"], node0["round"], node1["status"]) == ("running", 1, "starting")
    assert [r["test_acc"] for r in node0["rounds"]] == [0.7] and node0["rounds"][0]["epsilon"] is None
    assert node0["rounds"][0]["mib_received"] == 1.0
    assert state["heatmaps"]["relevance"]["matrix"] == [[None, None], [0.9, None]]  # node-1's latest round
    folder.write_result("node-1", {"status": "isolated"})
    assert dashboard_state(tmp_path)["nodes"][1]["status"] == "isolated"


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


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs a headless Chromium (Debian package `chromium`)")
def test_the_page_shows_a_running_federation_in_a_real_browser(tmp_path: Path) -> None:
    from p2pfl.report.dashboard import live_dashboard
    from p2pfl.scenario.launcher import run_scenario
    from tests.runtime.helpers import write_tiny

    port, page_port = free_ports(2, "127.0.0.1")
    scenario = write_tiny(tmp_path, nodes=3, rounds=8, samples=80)
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
    # Chromium takes seconds to start, and a tiny run may end meanwhile, closing the launcher's
    # dashboard: the browser loads the same page from a server that outlives the run.
    page = _StandaloneDashboard(tmp_path / "run", page_port)
    try:
        browse = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=3000",
                  "--window-size=1300,1000"]
        dom = subprocess.run([*browse, "--dump-dom", f"http://127.0.0.1:{page_port}/"], capture_output=True,
                             text=True, timeout=90).stdout
        shot = tmp_path / "dashboard.png"
        subprocess.run([*browse, f"--screenshot={shot}", f"http://127.0.0.1:{page_port}/"], capture_output=True,
                       timeout=90)
    finally:
        page.close()
    runner.join(timeout=180)
    assert outcome.get("code") == 0
    for nid in ("node-0", "node-1", "node-2"):
        assert f'id="row-{nid}"' in dom  # the script ran and filled the node table
    assert "node-rounds done" in dom and "<polyline" in dom  # summary line and drawn curves
    assert shot.is_file() and shot.stat().st_size > 10_000


def test_finding_9_a_node_killed_mid_write_takes_neither_the_dashboard_nor_the_report_down(tmp_path: Path) -> None:
    """A half-written artefact line, round lines that parse but are no records, and a resumed
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
    assert node0["rounds"][1]["mib_received"] == 0.0 and node0["rounds"][1]["time"]["train"] == 0.0
    assert state["heatmaps"]["relevance"]["matrix"] == [[None, None], [None, None]]  # round 2's value is no vector
    folder.node_result("node-1").write_text('{"status": "ok", "rou')  # a file written before writes were atomic

    async def fetch() -> int:
        async with TestClient(TestServer(dashboard_app(tmp_path))) as client:
            resp = await client.get("/api/state")
            return resp.status

    assert asyncio.run(fetch()) == 200


def test_results_are_written_whole(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    folder.write_result("node-0", {"status": "ok", "rounds": [1, 2]})
    assert json.loads(folder.node_result("node-0").read_text()) == {"status": "ok", "rounds": [1, 2]}
    assert [p.name for p in folder.node_result("node-0").parent.iterdir()] == ["node-0.result.json"]
