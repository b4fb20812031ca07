"""Start N node processes (and the coordinator, if the algorithm needs one) on this machine.

Writes keys, per-node configs and the resolved scenario into the run folder, shows a
progress bar of rounds done across nodes, collects each node's result into
`results.json`, and returns non-zero if any process failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import tomli_w
from tqdm import tqdm

from p2pfl.algorithms import needs_coordinator as algorithm_needs_coordinator
from p2pfl.data import build_partition, release_loaded
from p2pfl.errors import ConfigError
from p2pfl.models import build_model
from p2pfl.runtime.config import NodeConfig, load_node_config, node_ids
from p2pfl.runtime.peers import PeerInfo
from p2pfl.runtime.resources import release_freed_memory
from p2pfl.runtime.roster import ROSTER_FILE, load_roster, write_roster
from p2pfl.runtime.files import read_records
from p2pfl.runtime.run_folder import RunFolder
from p2pfl.runtime.strategy import COORDINATOR_ID
from p2pfl.runtime.stopping import run_stoppable
from p2pfl.runtime.tls import fingerprint as tls_fingerprint
from p2pfl.runtime.topology import Topology
from p2pfl.runtime.transport import addresses_of
from p2pfl.hosting import Hosting, hosting_for, warm
from p2pfl.hosting.ports import free_ports
from p2pfl.hosting.process import reap, spawn
from p2pfl.scenario.deaths import Deaths
from p2pfl.scenario.results import ENDED_BADLY, STOPPED, failure_lines, format_summary, write_results
from p2pfl.scenario.schema import (Scenario, as_today, apply_overrides, load_scenario, read_raw, scenario_differences,
                                   scenario_from_dict)
from p2pfl.runtime.settings import DEPLOYED_DEFENCES
from p2pfl.wire import NodeKey


COORDINATOR_GRACE_S = 30.0  # how long the coordinator may outlive the last node


def uses_coordinator(scenario: Scenario) -> bool:
    """Whether the scenario's algorithm, with its parameters, runs a coordinator."""
    return algorithm_needs_coordinator(scenario.algorithm.name, scenario.algorithm.params)


def peer_info(scenario: Scenario, node_id: str, key: NodeKey, host: str, port: int) -> PeerInfo:
    """How peers reach and recognise `node_id`: URL, public key, and with TLS its certificate's fingerprint."""
    url = addresses_of(scenario.runtime.transport).format(host, port, tls=scenario.runtime.tls)
    if scenario.runtime.tls:
        return PeerInfo(url, key.public_hex, tls_fingerprint(key, node_id))
    return PeerInfo(url, key.public_hex)


def write_run_folder(scenario: Scenario, out: Path,
                     addresses: Mapping[str, tuple[str, int]] | None = None) -> tuple[list[Path], Path | None]:
    """Keys, resolved scenario and one config per node (and the coordinator); returns node config
    paths and the coordinator's. `addresses` (id -> host, port) places them; default: free ports
    on `runtime.host`."""
    out = out.resolve()  # node configs hold absolute paths: their own folder is not the working directory
    folder = RunFolder(out)
    folder.create()
    folder.scenario.write_text(json.dumps(scenario.to_dict(), indent=2))
    all_ids = node_ids(scenario.nodes) + ([COORDINATOR_ID] if uses_coordinator(scenario) else [])
    keys = {i: NodeKey.generate() for i in all_ids}
    # The keys are written beside the configs, each set in a folder of its own: making a file is
    # the file system's work, not Python's (10,000 nodes: 3-8 s for the two sets one after the other).
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="p2pfl-keys") as beside:
        keys_saved = beside.submit(NodeKey.save_all, {folder.key(i): key for i, key in keys.items()})
        paths, coordinator_path = _write_configs(scenario, folder, out, all_ids, keys, addresses)
        keys_saved.result()
    return paths, coordinator_path


def _write_configs(scenario: Scenario, folder: RunFolder, out: Path, all_ids: Sequence[str],
                   keys: Mapping[str, NodeKey], addresses: Mapping[str, tuple[str, int]] | None
                   ) -> tuple[list[Path], Path | None]:
    """The roster and one config per node (and the coordinator, last)."""
    host, scenario_path = scenario.runtime.host, folder.scenario
    if addresses is None:
        addresses = dict(zip(all_ids, ((host, port) for port in free_ports(len(all_ids), host))))
    infos = {i: peer_info(scenario, i, keys[i], *addresses[i]) for i in all_ids}
    # One roster for the run, named by every config: N configs that each listed all N peers
    # made start-up O(N^2) (129 KB of TOML per node at 1000 nodes, 24 ms to parse each).
    write_roster(folder.roster, {i: infos[i] for i in all_ids if i != COORDINATOR_ID}, infos.get(COORDINATOR_ID))
    configs_at = str(folder.node_config(all_ids[0]).parent.resolve())  # one folder for them all, resolved once
    paths = []
    for nid in all_ids:
        path = folder.node_config(nid)
        NodeConfig(id=nid, index=0, host=addresses[nid][0], port=addresses[nid][1], key_file=folder.key(nid),
                   scenario=scenario_path, out=out, peers={}, roster=folder.roster).save(path, configs_at)
        paths.append(path)
    coordinator_path = paths.pop() if uses_coordinator(scenario) else None
    return paths, coordinator_path


# A live view of a run folder while the run goes on (the dashboard, handed down by the CLI or the
# API, so that launching never imports the report layer): entered before the nodes start, left after.
LiveView = Callable[[Path], contextlib.AbstractAsyncContextManager[Any]]


def all_of(views: Sequence[LiveView]) -> LiveView | None:
    """Several live views of one run (the dashboard and TensorBoard) as one; None for none."""
    if not views:
        return None

    @contextlib.asynccontextmanager
    async def every(run_dir: Path) -> Any:
        async with contextlib.AsyncExitStack() as stack:
            for view in views:
                await stack.enter_async_context(view(run_dir))
            yield

    return every

async def _run_hosts(scenario: Scenario, out: Path, node_paths: list[Path], coordinator_path: Path | None,
                     progress: bool, timeout_s: float | None, resume: bool, hosting: Hosting,
                     live_view: LiveView | None = None) -> dict[str, int]:
    """Run the coordinator (as a process here) and the nodes in their placement; node id -> exit status."""
    view = contextlib.nullcontext() if live_view is None else live_view(out)
    await view.__aenter__()
    coordinator = None
    if coordinator_path is not None:
        coordinator = await spawn(
            [sys.executable, "-m", "p2pfl", "coordinator", str(coordinator_path)] + (["--resume"] if resume else []),
            RunFolder(out).log(COORDINATOR_ID), scenario.runtime.torch_threads,
        )
    total = scenario.nodes * scenario.rounds
    # A resumed run starts from the node-rounds its nodes recorded before (a replayed round is
    # not counted twice: the bar stops at its total).
    before = min(total, rounds_recorded(out, node_paths)) if resume else 0
    bar = tqdm(total=total, initial=before, desc=f"{scenario.name} ({scenario.algorithm.name})",
               unit="node-round", disable=not progress, file=sys.stderr, dynamic_ncols=True)
    bar.set_postfix_str("starting the nodes")
    start_clock = time.perf_counter()
    started = [False]

    def advance(done: int) -> None:
        if not started[0] and done > 0:  # the first round of a node ended: start-up is over
            started[0] = True
            bar.set_postfix_str(f"start-up {time.perf_counter() - start_clock:.1f} s", refresh=False)
        bar.update(max(0, min(total, before + done) - bar.n))

    kill_hosts: Callable[[], None] = lambda: None
    # A node that dies is named at once, above the bar (shown or not).
    hosting.on_exit = Deaths(out, scenario.rounds, lambda line: bar.write(line, file=sys.stderr)).heard
    try:
        hosts, kill_hosts = await hosting.start(out, node_paths, resume, advance)
        tasks = {name: asyncio.ensure_future(run) for name, (_, run) in hosts.items()}
        coordinator_task = None if coordinator is None else asyncio.ensure_future(coordinator.wait())
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        await asyncio.wait(tasks.values(), timeout=timeout_s)
        if coordinator_task is not None and not coordinator_task.done():
            # Every node is done: the coordinator has nobody left to wait for. It normally
            # stops by itself (nodes that fail say goodbye); this bounds the case where one was killed.
            grace = COORDINATOR_GRACE_S if deadline is None else max(0.0, min(COORDINATOR_GRACE_S, deadline - loop.time()))
            await asyncio.wait([coordinator_task], timeout=grace)
        codes: dict[str, int] = {}
        for name, task in tasks.items():
            if task.done():
                codes.update(task.result())
            else:
                task.cancel()
                codes.update(dict.fromkeys(hosts[name][0], -9))
        if coordinator_task is not None:
            codes[COORDINATOR_ID] = coordinator_task.result() if coordinator_task.done() else -9
        return codes
    finally:
        bar.close()
        kill_hosts()
        if coordinator is not None and coordinator.returncode is None:
            coordinator.kill()
        await reap()
        await view.__aexit__(None, None, None)


def rounds_recorded(out: Path, node_paths: Sequence[Path]) -> int:
    """The node-rounds the nodes of `node_paths` recorded in `out` so far (each round once)."""
    folder = RunFolder(out)
    return sum(len({r["round"] for r in read_records(folder.node_rounds(p.stem), ("round",))}) for p in node_paths)


def readdress_run_folder(scenario: Scenario, out: Path, config_paths: Sequence[Path],
                         addresses: Mapping[str, tuple[str, int]]) -> None:
    """Rewrite the configs `config_paths` of the run in `out` (nodes', and the coordinator's
    where there is one) for new addresses (id -> host, port), keeping every key: peers know a
    node by its key, and its checkpoint is signed with it."""
    folder = RunFolder(out)
    infos = {p.stem: peer_info(scenario, p.stem, NodeKey.load(folder.key(p.stem)), *addresses[p.stem])
             for p in config_paths}
    configs = [load_node_config(path) for path in config_paths]
    if any(c.roster is not None for c in configs):
        roster = load_roster(folder.roster)
        write_roster(folder.roster, {nid: infos.get(nid, info) for nid, info in roster.nodes.items()},
                     infos.get(COORDINATOR_ID, roster.coordinator))
    for path, config in zip(config_paths, configs):
        moved = replace(config, host=addresses[config.id][0], port=addresses[config.id][1])
        if config.roster is None:  # a run folder written before the shared roster: peers inline
            moved = replace(moved, peers={p: infos[p] for p in config.peers},
                            coordinator=infos[COORDINATOR_ID] if config.coordinator is not None else None)
        moved.save(path)


def claim_out(out: Path, force: bool) -> None:
    """Never mix two runs in one folder: a folder that holds a run is refused, or with `force`
    emptied of every entry a run writes, so nothing of the old run can be read into the new one."""
    if out.exists() and not out.is_dir():
        raise ConfigError("--out", f"{out} is a file; the run folder must be a folder (new or holding a run)")
    found = RunFolder(out).present()
    if not found:
        return
    if not force:
        raise ConfigError("--out", f"{out} already holds a run ({', '.join(found)}); choose another folder, "
                                   "or pass --force to replace it")
    for name in found:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def run_scenario(path: str | Path, out: str | Path, overrides: Sequence[str] = (), *, progress: bool = True,
                 timeout_s: float | None = None, quiet: bool = False, force: bool = False,
                 resume: bool = False, live_view: LiveView | None = None) -> tuple[dict[str, Any], int]:
    """Run one scenario file to completion; returns (results, exit code). With `resume`, the run
    goes on with the scenario it was started with (its scenario.json, `--set` given then included),
    and `overrides` apply on top of that: a field they change is refused by name."""
    scenario = load_scenario(path, overrides)
    stored = RunFolder(Path(out)).scenario
    if resume and stored.is_file():
        from_file = scenario
        scenario = scenario_from_dict(apply_overrides(as_today(json.loads(stored.read_text())), overrides),
                                      source=str(stored))
        changed = scenario_differences(scenario.to_dict(), from_file)
        if changed and not quiet:
            print(f"note: {path} differs from the scenario the run was started with ({', '.join(changed[:5])}); "
                  f"resuming with the stored one, {stored}", file=sys.stderr)
    return run_loaded(scenario, out, progress=progress, timeout_s=timeout_s, quiet=quiet, force=force, resume=resume,
                      live_view=live_view)


def existing_run_folder(scenario: Scenario, out: Path) -> tuple[list[Path], Path | None]:
    """The node configs of the run in `out`, for --resume: same scenario, same keys and ports."""
    folder = RunFolder(out)
    stored = folder.scenario
    if not stored.is_file():
        raise ConfigError("--resume", f"{out} holds no run to resume (no scenario.json)")
    differ = scenario_differences(json.loads(stored.read_text()), scenario)
    if differ:
        raise ConfigError("--resume", f"the scenario differs from the one the run in {out} was started with "
                                      f"({', '.join(differ[:5])})")
    paths = [folder.node_config(nid) for nid in node_ids(scenario.nodes)]
    coordinator = folder.node_config(COORDINATOR_ID) if uses_coordinator(scenario) else None
    missing = [p.name for p in [*paths, coordinator] if p is not None and not p.is_file()]
    if missing:
        raise ConfigError("--resume", f"{out} lacks the node configs {', '.join(missing)}")
    for path in [*paths, *([coordinator] if coordinator else [])]:
        config = load_node_config(path)
        if config.out.resolve() != out.resolve():  # a copied folder of a run from before relative paths
            raise ConfigError("--resume", f"{path} belongs to the run in {config.out}, not {out}: resumed, it would "
                                          f"write there. Copy a run folder made since configs name their files "
                                          f"relative to themselves, or resume the original")
    return paths, coordinator


def run_loaded(scenario: Scenario, out: str | Path, *, progress: bool = True, timeout_s: float | None = None,
               quiet: bool = False, force: bool = False, resume: bool = False,
               live_view: LiveView | None = None) -> tuple[dict[str, Any], int]:
    # A forking parent nobody took (`p2pfl run` starts one before its checks) goes with the call,
    # never to a later run with this call's environment.
    try:
        return _run_loaded(scenario, Path(out), progress=progress, timeout_s=timeout_s, quiet=quiet, force=force,
                           resume=resume, live_view=live_view)
    finally:
        warm.discard()


def _run_loaded(scenario: Scenario, out: Path, *, progress: bool, timeout_s: float | None, quiet: bool, force: bool,
                resume: bool, live_view: LiveView | None) -> tuple[dict[str, Any], int]:
    started, started_at = time.perf_counter(), time.time()
    if scenario.runtime.transport == "loopback" and uses_coordinator(scenario):
        raise ConfigError("runtime.transport", f"{scenario.algorithm.name} runs a coordinator, which is a process of "
                                               "its own: loopback cannot reach it; use \"http\"")
    # Before any process starts: a partition that cannot be made (too few samples for
    # min_size, classes_per_node over the classes there are) is an error now, not in every node.
    partition = build_partition(scenario.data, scenario.nodes, scenario.seed, only=[])
    # A model that cannot be built (a user's factory that fails or returns the wrong type) too.
    build_model(scenario.model.name, partition.in_channels, partition.image_size, partition.num_classes)
    if "largest_share" in partition.meta and not quiet:
        print(f"warning: data.samples_per_node = {scenario.data.samples_per_node} is more than any node's share "
              f"(the largest has {partition.meta['largest_share']} samples); nodes use their whole share",
              file=sys.stderr)
    # The nodes live in other processes: the launcher keeps the truth it reports and lets the data
    # go (the data set and its assignment are 90 MB with Fashion-MNIST, all the run long).
    ground_truth = partition.ground_truth()
    del partition
    release_loaded()
    release_freed_memory()
    if resume:
        # Checked before any process starts or a cluster is joined: a wrong folder is an error now.
        node_paths, coordinator_path = existing_run_folder(scenario, out.resolve())
        RunFolder(out).results.unlink(missing_ok=True)
    else:
        claim_out(out, force)
    rt = scenario.runtime
    # Checked: the processes' forking parent imports while the run folder is written (a no-op
    # where `p2pfl run` started it before its own checks).
    warm.warm_up_for(rt.placement, rt.start_method, rt.torch_threads)
    try:
        hosting = hosting_for(rt.placement, workers=rt.workers, torch_threads=rt.torch_threads,
                              start_method=rt.start_method,
                              ray_address=rt.ray_address)
        try:
            addresses = hosting.addresses(node_ids(scenario.nodes), uses_coordinator(scenario))
            if not resume:
                node_paths, coordinator_path = write_run_folder(scenario, out, addresses)
            elif addresses is not None:  # new hosts and ports (Ray's actors); the same keys
                readdress_run_folder(scenario, out.resolve(),
                                     [*node_paths, *([coordinator_path] if coordinator_path else [])], addresses)
            codes = run_stoppable(_run_hosts(scenario, out, in_locality_order(scenario, node_paths), coordinator_path,
                                           progress, timeout_s, resume, hosting, live_view))
        finally:
            hosting.close()
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (p2pfl.runtime.stopping.Terminated): the nodes are stopped by now
        if RunFolder(out).scenario.is_file():
            _write_stopped_results(scenario, out, time.perf_counter() - started, ground_truth)
        raise
    results = write_results(scenario, out, codes, time.perf_counter() - started, ground_truth,
                            started_at=started_at)
    if not quiet:
        print(format_summary(results))
        print(f"results: {RunFolder(out).results}")
    # A worker's exit status covers all its nodes, and a node can end badly with exit 0 (a result
    # written elsewhere): both count.
    # A node whose process died but that ended well when resumed by hand keeps its exit status
    # in the results, and is not failed.
    ended_well = {n["id"] for n in results["nodes"] if n.get("status") not in (*ENDED_BADLY, "stopped")}
    failed = sorted({name for name, code in codes.items() if code != 0 and name not in ended_well}
                    | set(results["summary"]["nodes_failed"]))
    if failed and not quiet:
        print(f"FAILED: {', '.join(failed)} (logs in {out / 'logs'})", file=sys.stderr)
        for line in failure_lines(results, out):
            print(line, file=sys.stderr)
    return results, (1 if failed else 0)


def in_locality_order(scenario: Scenario, node_paths: Sequence[Path]) -> list[Path]:
    """The node configs in the topology's locality order where workers host runs of them
    (placement "shared"), so that most neighbours share a worker; as given elsewhere."""
    if scenario.runtime.placement != "shared":
        return list(node_paths)
    by_id = {p.stem: p for p in node_paths}
    ids = node_ids(scenario.nodes)
    order = Topology.parse(scenario.runtime.topology).locality_order(scenario.nodes, scenario.seed)
    return [by_id[ids[i]] for i in order]




def _write_stopped_results(scenario: Scenario, out: Path, wall_s: float, ground_truth: Mapping[str, Any]) -> None:
    """results.json of a run stopped before its end: every node that had not ended is "stopped",
    with the rounds it recorded; `--resume` goes on from its checkpoint, `compare --reuse` runs it again."""
    ids = [*node_ids(scenario.nodes), *([COORDINATOR_ID] if uses_coordinator(scenario) else [])]
    write_results(scenario, out, dict.fromkeys(ids, STOPPED), wall_s, ground_truth)


LAN_SCENARIO = "scenario"  # the scenario's copy in a `p2pfl lan` folder, with the source's suffix


def deployed_defences(raw: Mapping[str, Any]) -> list[str]:
    """`--set` overrides that turn on, for a LAN deployment, each defence its scenario leaves at the
    simulation's default (off): on a LAN a peer is another operator's machine."""
    runtime = raw.get("runtime") if isinstance(raw.get("runtime"), Mapping) else {}
    return [f"runtime.{key}={value}" for key, value in DEPLOYED_DEFENCES.items() if key not in runtime]


def write_lan_configs(scenario_path: Path, addresses: Sequence[str], out: Path,
                      coordinator_address: str | None = None, overrides: Sequence[str] = (), *,
                      force: bool = False) -> list[Path]:
    """The single-admin shortcut for a LAN deployment: every key, the shared roster and one
    config per node (and the coordinator), as the operator workflow would have them
    (`p2pfl keygen` on each host, one roster, one config per host). `addresses` are
    `host:port`, one per node; `overrides` (`--set`) go into every config.

    Copy `out` to every machine (each needs only its own key) and start `p2pfl node out/<id>.toml`.
    """
    overrides = [*deployed_defences(apply_overrides(read_raw(scenario_path), overrides)), *overrides]
    scenario = load_scenario(scenario_path, overrides)  # a bad --set fails here, not on every host
    if len(addresses) != scenario.nodes:
        raise ConfigError("--hosts", f"the scenario has {scenario.nodes} nodes but {len(addresses)} addresses were given")
    if scenario.runtime.transport == "loopback":
        raise ConfigError("runtime.transport", "loopback reaches nodes of one process only; a LAN needs \"http\"")
    with_coordinator = uses_coordinator(scenario)
    if with_coordinator and coordinator_address is None:
        raise ConfigError("--coordinator", f"{scenario.algorithm.name} needs a coordinator address (host:port)")
    ids = node_ids(scenario.nodes)
    hostports = dict(zip(ids, addresses))
    if with_coordinator:
        hostports[COORDINATOR_ID] = coordinator_address  # type: ignore[assignment]
    if out.exists() and not out.is_dir():
        raise ConfigError("--out", f"{out} is a file; name the folder for the keys, the roster and the configs")
    existing = sorted(p.name for p in out.glob("*.key")) if out.is_dir() else []
    if existing and not force:
        raise ConfigError("--out", f"{out} already holds keys ({', '.join(existing[:4])}{' ...' if len(existing) > 4 else ''}): "
                                   "new ones would orphan every roster entry and checkpoint signed with them; "
                                   "pass --force to replace them all")
    out.mkdir(parents=True, exist_ok=True)
    infos: dict[str, PeerInfo] = {}
    for nid, address in hostports.items():
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError("--hosts", f"expected host:port, got {address!r}")
        key = NodeKey.generate()
        key.save(out / f"{nid}.key")
        infos[nid] = peer_info(scenario, nid, key, host, int(port))
    write_roster(out / ROSTER_FILE, {nid: infos[nid] for nid in ids}, infos.get(COORDINATOR_ID))
    # The folder is what an operator copies to every host: the scenario goes in it, so that no
    # config points outside (a relative path out of it breaks on the hosts).
    # A resolved run-folder scenario (.json, what benchmarks/links.py deploys) stays JSON: it is
    # read by its suffix, so a TOML name would make every node refuse it.
    scenario_rel = LAN_SCENARIO + (".json" if Path(scenario_path).suffix == ".json" else ".toml")
    local_scenario = out / scenario_rel
    if Path(scenario_path).resolve() != local_scenario.resolve():
        shutil.copyfile(scenario_path, local_scenario)
    paths = []
    for nid in hostports:
        path = out / f"{nid}.toml"
        path.write_text(tomli_w.dumps({
            "id": nid, "key_file": f"{nid}.key", "roster": ROSTER_FILE, "scenario": scenario_rel,
            "out": "run", "host": "0.0.0.0", "overrides": list(overrides),
        }))
        paths.append(path)
    return paths
