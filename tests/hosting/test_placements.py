"""Placements: one process per node, nodes sharing worker processes, and workers as Ray actors.
Nodes talk over the signed HTTP wire in all three; same scenario and seed, same run."""

from __future__ import annotations

import json
import tomllib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from p2pfl.cli import main
from p2pfl.errors import ConfigError
from p2pfl.runtime.checkpoint import load_checkpoint, read_checkpoint
from p2pfl.hosting.ports import free_ports
from p2pfl.hosting import forks
from p2pfl.hosting import ray as ray_placement
from p2pfl.scenario.launcher import run_scenario
from p2pfl.wire import NodeKey

from ..runtime.helpers import write_tiny

pytestmark = pytest.mark.slow


def _run(tmp_path: Path, algorithm: str, placement: str, *extra: str) -> tuple[Path, dict]:
    (tmp_path / placement).mkdir(parents=True, exist_ok=True)
    scenario = write_tiny(tmp_path / placement, nodes=4, rounds=2, samples=60, algorithm=algorithm, timeout=30.0)
    out = tmp_path / placement / "run"
    results, code = run_scenario(scenario, out, [f'runtime.placement="{placement}"', "runtime.workers=2", *extra],
                                 progress=False, quiet=True)
    assert code == 0, [(n["id"], n.get("error")) for n in results["nodes"]]
    return out, results


def _assert_same_run(out_a: Path, a_results: dict, out_b: Path, b_results: dict) -> None:
    """Same arrivals every round, and the same accuracies, losses and final models up to float32
    rounding. Bit-equality is not promised across placements: nodes sharing a process train in
    concurrent threads, and the suite's own load can change which CPU kernel path (and so which
    summation order) oneDNN takes; CI once saw one weight differ in its last bits. Anything a
    placement could really change (data, seeds, peers, arrivals) moves these far past rounding."""
    for a, b in zip(a_results["nodes"], b_results["nodes"], strict=True):
        assert a["id"] == b["id"] and a["status"] == b["status"] == "ok"
        for ra, rb in zip(a["rounds"], b["rounds"], strict=True):
            assert ra["arrived"] == rb["arrived"]
            assert ra["test_acc"] == rb["test_acc"]
            assert (ra["test_loss"], ra["train_loss"]) == pytest.approx((rb["test_loss"], rb["train_loss"]), rel=1e-5)
        states = [
            load_checkpoint(out / "checkpoints" / f"{a['id']}.p2pfl", node_id=a["id"],
                            public_hex=NodeKey.load(out / "keys" / f"{a['id']}.key").public_hex)
            for out in (out_a, out_b)
        ]
        for name, tensor in states[0].items():
            torch.testing.assert_close(tensor, states[1][name], rtol=1e-5, atol=1e-6, msg=f"{a['id']} {name}")


_PER_NODE: dict[str, tuple[Path, dict]] = {}


def _process_per_node(factory: pytest.TempPathFactory, algorithm: str) -> tuple[Path, dict]:
    """The run every other placement is compared with (one process per node, forked where the
    platform forks), made once per test process: the placement comparisons share an xdist group,
    so one worker makes it once for all of them (and again on a worker that runs a Ray test)."""
    if algorithm not in _PER_NODE:
        _PER_NODE[algorithm] = _run(factory.mktemp(f"per-node-{algorithm}"), algorithm, "process")
    return _PER_NODE[algorithm]


# The "placement" group shares one process-per-node run per algorithm (`_process_per_node`). The
# Ray tests are in no group: each worker that runs one makes its own cluster (`ray_cluster`), and
# the actor test kills only the actors under its own worker's cluster (`_HOLDERS`). As one group on
# one worker, beside two busy workers, they took 270-400 s of a 503 s suite (12-70 s alone).
@pytest.mark.xdist_group("placement")
@pytest.mark.parametrize("algorithm", ["local", "fedavg"])
def test_shared_placement_gives_the_same_run_as_one_process_per_node(tmp_path: Path, algorithm: str,
                                                                    tmp_path_factory: pytest.TempPathFactory) -> None:
    (out_p, process), (out_s, shared) = _process_per_node(tmp_path_factory, algorithm), _run(tmp_path, algorithm, "shared")
    # Where the platform forks, the workers are forked from the parent warmed up during the checks.
    parent = ["forked.log"] if forks("auto") else []
    assert sorted(p.name for p in (out_s / "logs").glob("*.log")) == [*parent, "worker-0.log", "worker-1.log"]
    assert len({n["pid"] for n in shared["nodes"]}) == 2  # two worker processes, each hosting two nodes
    _assert_same_run(out_p, process, out_s, shared)
    assert json.loads((out_s / "scenario.json").read_text())["runtime"]["placement"] == "shared"


@pytest.mark.xdist_group("placement")
@pytest.mark.skipif(not hasattr(os, "fork"), reason="the platform cannot fork")
def test_forked_node_processes_give_the_same_run_as_spawned_ones(tmp_path: Path,
                                                                 tmp_path_factory: pytest.TempPathFactory) -> None:
    """`runtime.start_method`: one import, then a fork per node (the default, "auto", where the
    platform forks), against a fresh interpreter per node. Each forked node is its own process
    with its own log; the run is the same."""
    out_f, forked = _process_per_node(tmp_path_factory, "fedavg") if forks("auto") else \
        _run(tmp_path / "f", "fedavg", "process", 'runtime.start_method="fork"')
    out_s, spawned = _run(tmp_path / "s", "fedavg", "process", 'runtime.start_method="spawn"')
    _assert_same_run(out_f, forked, out_s, spawned)
    assert sorted(p.name for p in (out_f / "logs").glob("*.log")) == ["forked.log"] + [f"node-{i}.log" for i in range(4)]
    assert sorted(p.name for p in (out_s / "logs").glob("*.log")) == [f"node-{i}.log" for i in range(4)]
    pids = set()
    for i in range(4):
        log = (out_f / "logs" / f"node-{i}.log").read_text()
        assert f"node-{i} INFO listening on" in log
        pids.add(json.loads((out_f / "nodes" / f"node-{i}.result.json").read_text()).get("pid"))
    assert len(pids) == 4 and None not in pids  # four processes, not four tasks of one


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the platform cannot fork")
def test_p2pfl_run_hands_its_nodes_to_the_parent_it_warmed_up_during_the_checks(tmp_path: Path) -> None:
    """`p2pfl run` starts the forking parent before it checks the scenario (its torch import then
    runs beside the launcher's), gives it the configs once written, and the run is the usual one."""
    from p2pfl.hosting import warm

    scenario = write_tiny(tmp_path, nodes=3, rounds=2, samples=40)
    assert main(["run", str(scenario), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    assert warm._WARM is None  # taken by the hosting, not left over
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert [n["status"] for n in results["nodes"]] == ["ok"] * 3
    assert len({n["pid"] for n in results["nodes"]}) == 3
    assert (tmp_path / "run" / "logs" / "forked.log").is_file()
    # A parent nobody gives configs to (the checks failed) ends at the end of its input.
    idle = subprocess.Popen([sys.executable, "-m", "p2pfl", "forked", "--wait"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, err = idle.communicate(b"", timeout=120)
    assert idle.returncode == 0 and b"Traceback" not in err


_FORK_HERE = """
import os, sys, threading
from p2pfl.hosting import warm

def entry():
    order = sys.stdin.readline().strip()
    print(os.getppid(), order.upper(), os.environ["OMP_NUM_THREADS"], flush=True)
    return 3

warm.warm_up(2, entry)
proc = warm.take()
print(type(proc).__name__, flush=True)
proc.stdin.write(b"order\\n")
proc.stdin.close()
print(proc.stdout.read().decode().strip(), proc.wait(), os.getpid(), flush=True)
warm.warm_up(1, lambda: len(sys.stdin.read()))  # waits for its input: stopped instead
proc, codes = warm.take(), []
waiter = threading.Thread(target=lambda: codes.append(proc.wait()))
waiter.start()
proc.kill()
waiter.join()
print(codes[0], proc.poll(), flush=True)
threading.Thread(target=threading.Event().wait, daemon=True).start()  # a second thread: no fork here
warm.warm_up(1, entry)
print(type(warm.take()).__name__, flush=True)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the platform cannot fork")
def test_the_forking_parent_is_forked_from_a_process_that_runs_nothing_else() -> None:
    """`p2pfl run`'s own process forks the parent from itself (torch and the node code one copy,
    shared): the entry runs in a child of it, reads its order from the pipe, writes its lines to
    the other, and its exit status is the entry's; a kill ends a wait on another thread. With
    another thread running (a caller's process), a fresh `p2pfl forked --wait` is started
    instead: a fork copies only the calling thread."""
    done = subprocess.run([sys.executable, "-c", _FORK_HERE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    kind, line, killed, fallback = done.stdout.strip().splitlines()
    parent, order, threads, code, launcher = line.split()
    assert (kind, fallback) == ("ForkedHere", "Popen")
    assert parent == launcher and order == "ORDER" and threads == "2" and code == "3"
    assert killed.split() == ["-9", "-9"]  # waited for on one thread, killed from another


def test_the_launcher_lets_the_data_go_once_checked(tmp_path: Path) -> None:
    """Its nodes live in other processes: the launcher keeps the partition's truth for the results,
    not the data set (90 MB with Fashion-MNIST, all the run long)."""
    from p2pfl.data import partition

    scenario = write_tiny(tmp_path, nodes=3, rounds=1, samples=40)
    results, code = run_scenario(scenario, tmp_path / "run", progress=False, quiet=True)
    assert code == 0
    assert partition._pool.cache_info().currsize == 0 and partition._assignment.cache_info().currsize == 0
    assert [n["n_train"] for n in results["ground_truth"]["nodes"]] == [n["n_train"] for n in results["nodes"]]


def test_an_unknown_start_method_is_named(tmp_path: Path) -> None:
    scenario = write_tiny(tmp_path, nodes=2, rounds=1)
    with pytest.raises(ConfigError, match=r"runtime.start_method.*'fork', 'spawn'"):
        run_scenario(scenario, tmp_path / "run", ['runtime.start_method="thread"'], progress=False, quiet=True)


_HOLDERS: set[int] = set()  # the processes holding this test process's Ray clusters


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """A local Ray cluster with 2 CPUs, held by a child process; gone when its stdin closes.
    Without token authentication, as `ray start --head` starts one; the launcher joins it from
    this process, so this process must not ask for a token either. Its workers (the nodes'
    actors) at niceness 0, not Ray's 15: beside the suite's other workers a 0.2 s round took 10 s
    and the actor test 140 s (12 s alone)."""
    pytest.importorskip("ray")
    auth, os.environ["RAY_AUTH_MODE"] = os.environ.get("RAY_AUTH_MODE"), "disabled"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, ray\n"
         "info = ray.init(num_cpus=2, include_dashboard=False, logging_level='ERROR')\n"
         "print(info.address_info['gcs_address'], flush=True)\n"
         "sys.stdin.read()\n"
         "ray.shutdown()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "RAY_worker_niceness": "0"},
    )
    assert holder.stdout is not None and holder.stdin is not None
    _HOLDERS.add(holder.pid)  # its Ray processes (and their actors) descend from it
    address = holder.stdout.readline().strip()
    assert address, "the Ray head did not start"
    try:
        yield address
    finally:
        holder.stdin.close()
        try:
            holder.wait(timeout=60)
        except subprocess.TimeoutExpired:
            holder.kill()
        if auth is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = auth


@pytest.mark.parametrize("algorithm", ["local", "fedavg"])
def test_ray_placement_gives_the_same_run_as_one_process_per_node(tmp_path: Path, algorithm: str, ray_cluster: str,
                                                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    out_p, process = _process_per_node(tmp_path_factory, algorithm)
    out_r, on_ray = _run(tmp_path, algorithm, "ray", f'runtime.ray_address="{ray_cluster}"')
    _assert_same_run(out_p, process, out_r, on_ray)
    # What the actors wrote came back into the run folder; what they were given stayed here.
    assert sorted(p.name for p in (out_r / "logs").glob("*.log")) == ["worker-0.log", "worker-1.log"]
    assert "p2pfl.node-0 INFO listening on" in (out_r / "logs" / "worker-0.log").read_text()
    assert all((out_r / "nodes" / f"node-{i}.result.json").is_file() for i in range(4))
    urls = {e["id"]: e["url"] for e in tomllib.loads((out_r / "nodes" / "roster.toml").read_text())["node"]}
    assert urls["node-1"].startswith("http://") and not urls["node-1"].startswith("http://0.0.0.0")


def _parent(pid: int) -> int:
    try:
        return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _ray_actor_pids() -> list[int]:
    """The process ids of the NodeWorker actors (Ray titles an actor's process so) of the clusters
    this test process holds: never another test's (another xdist worker's cluster, a two-host one)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if not (proc.name.isdigit() and (proc / "cmdline").read_bytes().startswith(b"ray::NodeWorker")):
                continue
        except OSError:
            continue
        ancestor = int(proc.name)
        while ancestor > 1 and ancestor not in _HOLDERS:
            ancestor = _parent(ancestor)
        if ancestor in _HOLDERS:
            pids.append(int(proc.name))
    return pids


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the actors through /proc")
@pytest.mark.timeout(600)  # two lives on Ray, each joining the cluster and placing its actors
def test_a_ray_run_whose_actors_die_resumes_on_new_actors_with_no_round_lost(tmp_path: Path,
                                                                            ray_cluster: str) -> None:
    # Rounds enough that the kill lands mid-run: the round files come back from the actors with
    # the progress poll, a few rounds behind the nodes (with 6 rounds a node had finished once).
    rounds = 20
    scenario = write_tiny(tmp_path, nodes=4, rounds=rounds, samples=200, timeout=30.0)
    out = (tmp_path / "run").resolve()
    on_ray = ['runtime.placement="ray"', "runtime.workers=2", f'runtime.ray_address="{ray_cluster}"',
              "runtime.linger_s=2"]
    killed: list[int] = []

    def rounds_synced(nid: str) -> int:
        path = out / "nodes" / f"{nid}.rounds.jsonl"
        return len(path.read_text().splitlines()) if path.is_file() else 0

    def kill_every_actor_after_round_2() -> None:
        deadline = time.monotonic() + 600  # joining the cluster and placing the actors comes first
        while time.monotonic() < deadline and min(rounds_synced(f"node-{i}") for i in range(4)) < 2:
            time.sleep(0.05)
        for pid in _ray_actor_pids():
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    killer = threading.Thread(target=kill_every_actor_after_round_2)
    killer.start()
    first, code = run_scenario(scenario, out, on_ray, progress=False, quiet=True)
    killer.join()
    assert killed and code == 1
    assert all(n["status"] == "failed" for n in first["nodes"])
    # What the progress poll carried back before the actors died: every node's checkpoint of
    # round 2 or later, with the round records of its first life.
    first_life = {}
    for i in range(4):
        nid = f"node-{i}"
        _, document = read_checkpoint(out / "checkpoints" / f"{nid}.p2pfl", node_id=nid,
                                      public_hex=NodeKey.load(out / "keys" / f"{nid}.key").public_hex)
        assert document is not None and 2 <= document["round"] < rounds, (nid, document and document["round"])
        first_life[nid] = document["rounds"]
    old_peers = {e.pop("id"): e for e in tomllib.loads((out / "nodes" / "roster.toml").read_text())["node"]}

    resumed, code = run_scenario(scenario, out, on_ray, progress=False, quiet=True, resume=True)
    assert code == 0, [(n["id"], n.get("error")) for n in resumed["nodes"]]
    new_peers = {e.pop("id"): e for e in tomllib.loads((out / "nodes" / "roster.toml").read_text())["node"]}
    # Same keys, new ports: the old actors' ports are gone.
    assert {p: v["public_key"] for p, v in new_peers.items()} == {p: v["public_key"] for p, v in old_peers.items()}
    assert [v["url"] for v in new_peers.values()] != [v["url"] for v in old_peers.values()]
    for node in resumed["nodes"]:
        assert node["status"] == "ok"
        assert [r["round"] for r in node["rounds"]] == list(range(1, rounds + 1)), node["id"]
        kept = first_life[node["id"]]
        assert node["rounds"][:len(kept)] == json.loads(json.dumps(kept)), node["id"]  # its first life, as it was
        assert all(r["arrived"] for r in node["rounds"][len(kept):]), node["id"]  # peers at new ports answered
    logs = "".join((out / "logs" / f"worker-{w}.log").read_text() for w in (0, 1))
    assert logs.count("resumed from") == 4


def test_a_ray_resume_of_a_folder_without_a_run_is_refused_before_joining_a_cluster(tmp_path: Path) -> None:
    scenario = write_tiny(tmp_path, nodes=2, rounds=1)
    with pytest.raises(ConfigError, match=r"--resume.*no scenario.json"):
        run_scenario(scenario, tmp_path / "empty", ['runtime.placement="ray"', 'runtime.ray_address="127.0.0.1:1"'],
                     progress=False, quiet=True, resume=True)


def test_ray_runs_an_algorithm_with_a_coordinator(tmp_path: Path, ray_cluster: str) -> None:
    out, results = _run(tmp_path, "di", "ray", f'runtime.ray_address="{ray_cluster}"')
    assert results["coordinator"] is not None and results["summary"]["nodes_ok"] == 4


def test_ray_without_a_cluster_or_without_ray_is_a_clear_config_error(tmp_path: Path, monkeypatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    scenario = write_tiny(tmp_path, nodes=2, rounds=1)
    nobody = f"127.0.0.1:{free_ports(1, '127.0.0.1')[0]}"
    code = main(["run", str(scenario), "--out", str(tmp_path / "run"), "--ray", nobody, "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err
    assert "runtime.ray_address" in err and "ray start --head" in err
    assert not (tmp_path / "run" / "results.json").exists()
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"runtime.placement.*pip install 'p2pfl-influence\[ray\]'"):
        ray_placement.connect("auto")


def test_a_worker_that_dies_fails_its_nodes_and_the_others_finish(tmp_path: Path) -> None:
    scenario = write_tiny(tmp_path, nodes=4, rounds=4, samples=60, timeout=3.0)
    out = (tmp_path / "run").resolve()
    killed: list[int] = []

    def kill_the_worker_of_node_1_after_its_round_1() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (out / "checkpoints" / "node-1.p2pfl").exists():
            time.sleep(0.05)
        # The run folder names each running node's process: worker-0 hosts node-0 and node-1.
        pid = json.loads((out / "pids.json").read_text())["node-1"]
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    killer = threading.Thread(target=kill_the_worker_of_node_1_after_its_round_1)
    killer.start()
    results, code = run_scenario(scenario, out, ['runtime.placement="shared"', "runtime.workers=2", "runtime.linger_s=2"],
                                 progress=False, quiet=True)
    killer.join()
    assert killed, "the worker of node-1 was not found"
    assert code == 1
    by_id = {n["id"]: n for n in results["nodes"]}
    assert sorted(results["summary"]["nodes_failed"]) == ["node-0", "node-1"]
    for nid in ("node-0", "node-1"):
        assert by_id[nid]["status"] == "failed" and by_id[nid]["exit_code"] == -signal.SIGKILL
    for nid in ("node-2", "node-3"):
        assert by_id[nid]["status"] == "ok" and len(by_id[nid]["rounds"]) == 4


@pytest.mark.parametrize("code", [0, 1, 2, 130])
def test_ray_keeps_a_worker_process_exit_status_for_its_nodes(tmp_path: Path, code: int) -> None:
    """Before, a Ray worker's nodes were 1 (failed) or 0: "could not start" (2) and "interrupted"
    (130) were lost. Now an actor runs a worker process and returns its exit status."""
    from p2pfl.hosting.ray import RayWorkers

    workers = RayWorkers(ray=None, actors={}, shares={"worker-0": ["node-0", "node-2"]})  # type: ignore[arg-type]
    log = {"logs/worker-0.log": b"worker log\n"}
    assert workers.collect(tmp_path, "worker-0", {"code": code, "files": log}) == {"node-0": code, "node-2": code}
    assert (tmp_path / "logs" / "worker-0.log").read_bytes() == b"worker log\n"
