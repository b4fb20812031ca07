"""A node killed mid-run does not stop the others: they skip it and finish their rounds."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from p2pfl.runtime.status import PROGRESS_PREFIX
from p2pfl.scenario.launcher import write_run_folder
from p2pfl.scenario.schema import load_scenario

from .helpers import interruptible, write_tiny

pytestmark = pytest.mark.slow


def test_survivors_finish_when_a_peer_dies(tmp_path):
    scenario = load_scenario(write_tiny(tmp_path, rounds=4, timeout=3.0))
    out = tmp_path / "run"
    node_paths, _ = write_run_folder(scenario, out)
    procs = {
        p.stem: subprocess.Popen([sys.executable, "-m", "p2pfl", "node", str(p)], stdout=subprocess.PIPE,
                                 stderr=open(out / "logs" / f"{p.stem}.log", "wb"), text=True)
        for p in node_paths
    }
    victim = procs["node-2"]
    try:
        assert victim.stdout is not None
        for line in victim.stdout:  # kill it right after its first round
            if line.startswith(PROGRESS_PREFIX):
                victim.kill()
                break
        victim.wait(timeout=30)
        for name in ("node-0", "node-1"):
            assert procs[name].wait(timeout=240) == 0, (out / "logs" / f"{name}.log").read_text()[-3000:]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    for name in ("node-0", "node-1"):
        result = json.loads((out / "nodes" / f"{name}.result.json").read_text())
        assert result["status"] == "ok"
        assert [r["round"] for r in result["rounds"]] == [1, 2, 3, 4]
        # After the kill the dead peer is skipped; the live one keeps answering.
        assert "node-2" not in result["rounds"][-1]["arrived"]
        assert [p for p in result["rounds"][-1]["arrived"]] == [n for n in ("node-0", "node-1") if n != name]
        # Once found gone, the dead peer costs one quick status probe per round, not fetch_timeout_s (3 s).
        assert result["rounds"][-1]["time"]["exchange_s"] < 1.5, result["rounds"][-1]["time"]


def _processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line names `text` (the run folder): orphans, if any."""
    from pathlib import Path

    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline:
                found.append(int(proc.name))
    return found


def test_finding_10_sigterm_stops_the_run_like_ctrl_c_and_resume_loses_no_round(tmp_path):
    """Before, `kill PID` of `p2pfl run` exited at once, orphaned its nodes (they kept training,
    then failed with BrokenPipeError) and left no results.json."""
    import os
    import signal
    import time

    rounds = 30
    scenario = write_tiny(tmp_path, nodes=2, rounds=rounds, samples=40, timeout=5.0)
    out = tmp_path / "run"
    command = [sys.executable, "-m", "p2pfl", "run", str(scenario), "--out", str(out), "--no-progress"]
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        rounds_files = [out / "nodes" / f"node-{i}.rounds.jsonl" for i in (0, 1)]
        while time.monotonic() < deadline and not all(f.is_file() and f.read_text().count("\n") >= 2
                                                      for f in rounds_files):
            time.sleep(0.1)
        assert launcher.poll() is None, "the run ended before it could be stopped"
        launcher.send_signal(signal.SIGTERM)
        _, err = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 143, err[-2000:]
    assert "stopped by SIGTERM" in err and f"--out {out} --resume" in err
    time.sleep(0.5)
    assert _processes_mentioning(str(out)) == [], "node processes outlived the launcher"
    results = json.loads((out / "results.json").read_text())
    assert {n["status"] for n in results["nodes"]} == {"stopped"}
    assert results["summary"]["nodes_stopped"] == ["node-0", "node-1"]
    done = min(len(n["rounds"]) for n in results["nodes"])
    assert 2 <= done < rounds

    resumed = subprocess.run([*command, "--resume"], capture_output=True, text=True, timeout=300,
                             env=dict(os.environ))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    for node in results["nodes"]:
        assert node["status"] == "ok"
        assert [r["round"] for r in node["rounds"]] == list(range(1, rounds + 1))



@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_a_stopped_run_says_one_line_and_no_traceback(tmp_path, how):
    """Ctrl-C reaches the launcher and its nodes at once (one process group, as at a terminal);
    SIGTERM the launcher alone. Either way stderr holds the one line with the resume hint."""
    import os
    import signal
    import time

    scenario = write_tiny(tmp_path, nodes=2, rounds=30, samples=40, timeout=5.0)
    out = tmp_path / "run"
    command = [sys.executable, "-m", "p2pfl", "run", str(scenario), "--out", str(out), "--no-progress"]
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, preexec_fn=interruptible)
    try:
        deadline = time.monotonic() + 120
        rounds_file = out / "nodes" / "node-0.rounds.jsonl"
        while time.monotonic() < deadline and not (rounds_file.is_file() and rounds_file.read_text().count("\n") >= 1):
            time.sleep(0.1)
        assert launcher.poll() is None, "the run ended before it could be stopped"
        if how == "ctrl-c":
            os.killpg(launcher.pid, signal.SIGINT)
        else:
            launcher.send_signal(signal.SIGTERM)
        _, err = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    assert launcher.returncode == (130 if how == "ctrl-c" else 143), err[-2000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and f"--out {out} --resume" in lines[0], err[-3000:]


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_stopped_node_and_dashboard_say_one_line_and_no_traceback(tmp_path, sig):
    """`p2pfl node` (a LAN host's node) and `p2pfl dashboard`, stopped by either signal."""
    import signal
    import time

    from p2pfl.hosting.ports import free_ports
    from p2pfl.scenario.launcher import write_run_folder
    from p2pfl.scenario.schema import load_scenario

    signum = getattr(signal, sig)
    scenario = load_scenario(write_tiny(tmp_path, nodes=2, rounds=5000, samples=40, timeout=5.0))
    out = tmp_path / "run"
    paths, _ = write_run_folder(scenario, out)
    nodes = [subprocess.Popen([sys.executable, "-m", "p2pfl", "node", str(p)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, preexec_fn=interruptible) for p in paths]
    [port] = free_ports(1, "127.0.0.1")
    dashboard = subprocess.Popen([sys.executable, "-m", "p2pfl", "dashboard", str(out), "--port", str(port)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)
    try:
        rounds_file = out / "nodes" / "node-0.rounds.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (rounds_file.is_file() and rounds_file.read_text().count("\n") >= 2):
            time.sleep(0.1)
        assert nodes[0].poll() is None and dashboard.poll() is None
        nodes[0].send_signal(signum)
        dashboard.send_signal(signum)
        _, node_err = nodes[0].communicate(timeout=60)
        _, dashboard_err = dashboard.communicate(timeout=60)
    finally:
        for proc in [*nodes, dashboard]:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert "Traceback" not in node_err and "Traceback" not in dashboard_err, node_err[-2000:] + dashboard_err[-2000:]
    assert [line for line in node_err.splitlines() if "interrupted" in line or "stopped" in line][-1:], node_err[-1000:]
    said = [line for line in dashboard_err.splitlines() if line.strip() and not line.startswith("dashboard of ")]
    assert len(said) == 1 and said[0] in ("interrupted", "stopped by SIGTERM"), dashboard_err


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_stopped_coordinator_says_one_line_and_no_traceback(tmp_path, sig):
    """`p2pfl coordinator` (the optional coordinator of a global-step algorithm), stopped mid-run."""
    import signal
    import time

    from p2pfl.scenario.launcher import write_run_folder
    from p2pfl.scenario.schema import load_scenario

    scenario = load_scenario(write_tiny(tmp_path, nodes=2, rounds=5000, samples=40, timeout=5.0,
                                        algorithm="fedavg_global"))
    out = tmp_path / "run"
    paths, coordinator_path = write_run_folder(scenario, out)
    assert coordinator_path is not None
    coordinator = subprocess.Popen([sys.executable, "-m", "p2pfl", "coordinator", str(coordinator_path)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                   preexec_fn=interruptible)
    nodes = [subprocess.Popen([sys.executable, "-m", "p2pfl", "node", str(p)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for p in paths]
    try:
        rounds_file = out / "nodes" / "node-0.rounds.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (rounds_file.is_file() and rounds_file.read_text().count("\n") >= 2):
            time.sleep(0.1)
        assert coordinator.poll() is None, "the coordinator ended before it could be stopped"
        coordinator.send_signal(getattr(signal, sig))
        _, err = coordinator.communicate(timeout=60)
    finally:
        for proc in [*nodes, coordinator]:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert coordinator.returncode == (130 if sig == "SIGINT" else 143), err[-2000:]
    assert "Traceback" not in err, err[-3000:]
    said = [line for line in err.splitlines() if "interrupted" in line or "stopped by SIGTERM" in line]
    assert len(said) == 1 and "--resume" in said[0], err[-2000:]


def test_a_node_whose_progress_reader_is_gone_goes_on(monkeypatch):
    """A launcher that stops closes its end of the progress pipe before its nodes are killed: a
    node that wrote its round's line then failed on BrokenPipeError and left a "failed" result
    where "stopped" was true (CI, test_finding_10_sigterm_... above, once). Its lines now go
    nowhere; the round is in its rounds file."""
    import os

    from p2pfl.assembly import BatchedProgress, print_progress

    read_end, write_end = os.pipe()
    os.close(read_end)
    with os.fdopen(write_end, "w") as stream:
        monkeypatch.setattr(sys, "stdout", stream)
        print_progress({"id": "node-0", "round": 3})
        print_progress({"id": "node-0", "round": 4})
        batched = BatchedProgress(stream)
        batched({"id": "node-1", "round": 4})
        batched.flush()
