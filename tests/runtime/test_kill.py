"""A node killed mid-run does not stop the others: they skip it and finish their rounds."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from p2pfl.runtime.status import PROGRESS_PREFIX
from p2pfl.scenario.launcher import write_run_folder
from p2pfl.scenario.schema import load_scenario

from .helpers import as_launched, interruptible, write_tiny

pytestmark = pytest.mark.slow


def test_survivors_finish_when_a_peer_dies(tmp_path):
    scenario = load_scenario(write_tiny(tmp_path, rounds=4, timeout=3.0))
    out = tmp_path / "run"
    node_paths, _ = write_run_folder(scenario, out)
    procs = {
        p.stem: subprocess.Popen([sys.executable, "-m", "p2pfl", "node", str(p)], stdout=subprocess.PIPE,
                                 stderr=open(out / "logs" / f"{p.stem}.log", "wb"), text=True, env=as_launched())
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


def test_sigterm_stops_the_run_like_ctrl_c_and_resume_loses_no_round(tmp_path):
    """Review finding 10: Before, `kill PID` of `p2pfl run` exited at once, orphaned its nodes (they kept training,
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


def test_sigterm_cancels_the_main_task_between_loop_turns_and_the_handler_comes_back():
    """SIGTERM reaches an asyncio process as one cancellation of its main task, as Ctrl-C does:
    its cleanup runs on a whole loop, `Terminated` comes after the loop closed, and the handler
    the process had before is back. (Raised from a Python signal handler inside the loop, it once
    left a stopped coordinator's shutdown waiting past 60 s in CI.)"""
    import asyncio
    import signal

    from p2pfl.runtime.stopping import Terminated, raise_terminated, run_stoppable

    cleaned: list[str] = []

    async def main() -> None:
        asyncio.get_running_loop().call_later(0.05, signal.raise_signal, signal.SIGTERM)
        helper = asyncio.ensure_future(asyncio.sleep(30))
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0)  # the cleanup can still await: the loop is whole
            helper.cancel()
            cleaned.append("main")

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        with pytest.raises(Terminated):
            run_stoppable(main())
        assert signal.getsignal(signal.SIGTERM) is raise_terminated
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert cleaned == ["main"]

    async def finishes() -> int:
        return 7

    assert run_stoppable(finishes()) == 7  # no signal: asyncio.run's result


def test_a_node_whose_progress_reader_is_gone_goes_on(monkeypatch):
    """A launcher that stops closes its end of the progress pipe before its nodes are killed: a
    node that wrote its round's line then failed on BrokenPipeError and left a "failed" result
    where "stopped" was true (CI, test_sigterm_stops_the_run_like_ctrl_c_... above, once). Its lines now go
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


def test_a_node_killed_during_run_is_named_at_once_and_keeps_its_own_exit_status(tmp_path):
    """Issue 67, item 2. Before: nothing until the end, then `FAILED` for every node, each
    `exit_code` 137, the dead node's last log line as the cause, the dashboard `running` for ever,
    and no pid in the run folder."""
    import os
    import signal
    import threading
    import time

    from p2pfl.report.dashboard import dashboard_state

    rounds = 8
    scenario = write_tiny(tmp_path, nodes=3, rounds=rounds, samples=40, timeout=3.0)
    out = tmp_path / "run"
    launcher = subprocess.Popen([sys.executable, "-m", "p2pfl", "run", str(scenario), "--out", str(out), "--no-progress"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    named: list[tuple[str, bool, list[int]]] = []  # the line, whether the run still ran, survivors' rounds then
    lines: list[str] = []

    def survivors_rounds() -> list[int]:
        return [(out / "nodes" / f"node-{i}.rounds.jsonl").read_text().count("\n") for i in (0, 2)]

    def read() -> None:
        assert launcher.stderr is not None
        for line in launcher.stderr:
            lines.append(line)
            if "node-1 died" in line:
                named.append((line, launcher.poll() is None, survivors_rounds()))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        victim_rounds = out / "nodes" / "node-1.rounds.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (victim_rounds.is_file() and victim_rounds.read_text().count("\n") >= 2
                                                   and (out / "pids.json").is_file()):
            time.sleep(0.05)
        pids = json.loads((out / "pids.json").read_text())
        assert set(pids) == {"node-0", "node-1", "node-2"} and len(set(pids.values())) == 3  # each node's own process
        killed_after = victim_rounds.read_text().count("\n")
        rounds_at_kill = survivors_rounds()
        os.kill(pids["node-1"], signal.SIGKILL)
        launcher.wait(timeout=300)
        reader.join(timeout=10)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert named, "".join(lines)[-3000:]
    line, still_running, rounds_then = named[0]
    assert still_running and f"(killed by SIGKILL) after round {killed_after} of {rounds}" in line
    assert f"p2pfl node {out / 'nodes' / 'node-1.toml'} --resume" in line
    assert all(then <= at + 2 for then, at in zip(rounds_then, rounds_at_kill))  # named within a round or so
    results = json.loads((out / "results.json").read_text())
    codes = {n["id"]: n["exit_code"] for n in results["nodes"]}
    assert codes == {"node-0": 0, "node-1": -9, "node-2": 0}, [(n["id"], n["status"], n["error"]) for n in results["nodes"]]
    victim = next(n for n in results["nodes"] if n["id"] == "node-1")
    assert victim["status"] == "failed" and "killed by SIGKILL" in victim["error"]
    assert len(victim["rounds"]) == killed_after  # what it did before it died is kept
    assert not (out / "pids.json").exists()  # nothing runs any more
    failed_line = next(li for li in lines if li.startswith("FAILED"))
    assert failed_line.startswith("FAILED: node-1 ")  # not the survivors
    state = dashboard_state(out)
    assert {n["id"]: n["status"] for n in state["nodes"]}["node-1"] == "crashed"
