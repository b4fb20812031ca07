"""placement = "ray": the nodes' workers are started by actors on an existing Ray cluster.

Ray only places the workers and carries their files; between nodes everything still crosses
the signed HTTP wire, exactly as in the other placements and in a LAN deployment. Each actor
binds its nodes' endpoints on its own host's address, gets its share of the run folder
(scenario, node configs, keys; on --resume also its nodes' checkpoints, round lines and
artefacts) at start, runs `python -m p2pfl worker` on them in a private folder on its host
(as the "shared" placement does here, progress lines and exit status included), and returns
what they wrote (results, checkpoints, artefacts, its log) with the worker's exit status,
which the launcher puts into the run folder.
While they run, the launcher's progress poll also carries back every checkpoint, round line
and artefact that changed, so a run interrupted on the head (or an actor lost with its host)
leaves in the run folder every round its nodes finished, and `p2pfl run --resume` continues
it on new actors and new ports. The coordinator, when an algorithm has one, runs beside the
launcher.

Start a cluster with `ray start --head` (and `ray start --address HEAD:6379` on the other
machines, each with p2pfl installed), then `p2pfl run SCENARIO --out RUN --ray auto`.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from p2pfl.errors import ConfigError
from p2pfl.hosting import RESUME_TOGETHER, Hosts, Progress
from p2pfl.hosting.ports import free_ports
from p2pfl.runtime.peers import COORDINATOR_ID
from p2pfl.runtime.run_folder import RunFolder

RESERVE_TIMEOUT_S = 120.0  # how long an actor may take to be placed and report its address


def import_ray() -> ModuleType:
    try:
        import ray
    except ImportError:
        raise ConfigError("runtime.placement", "placement 'ray' needs Ray: pip install 'p2pfl-influence[ray]' (in a checkout: pip install -e '.[ray]')") from None
    return ray


def _reachable(address: str, timeout_s: float = 5.0) -> bool:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return True  # not host:port (e.g. ray://...); left to Ray to judge
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


def connect(address: str) -> ModuleType:
    """The `ray` module, connected to the cluster at `address` ("auto": the one this machine runs)."""
    ray = import_ray()
    hint = "start one with `ray start --head` and pass the address it prints (--ray HOST:PORT), or --ray auto on its head"
    # Ray retries an address where nobody listens for minutes; a closed port is a mistake to report now.
    if address != "auto" and not _reachable(address):
        raise ConfigError("runtime.ray_address", f"no Ray cluster answers at {address!r}; {hint}")
    try:
        ray.init(address=address, log_to_driver=False, ignore_reinit_error=True, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError("runtime.ray_address", f"cannot join a Ray cluster at {address!r} ({exc}); {hint}") from None
    return ray


class NodeWorker:
    """A Ray actor that runs a worker process for a share of the nodes, on its host."""

    def __init__(self, name: str, torch_threads: int = 1) -> None:
        self.name = name
        self.torch_threads = torch_threads
        self.folder = Path(tempfile.mkdtemp(prefix=f"p2pfl-{name}-"))
        self.rounds_done = 0
        self.node_ids: Sequence[str] = ()
        self.synced: dict[Path, tuple[int, int]] = {}

    def address(self, count: int) -> tuple[str, list[int]]:
        """This host's address as peers reach it, and `count` free ports on it."""
        import ray

        host = ray.util.get_node_ip_address()
        return host, free_ports(count, host)

    def sync(self) -> tuple[int, dict[str, bytes]]:
        """Rounds finished so far, and the files a resume needs (`_resume_files`) that changed
        since the last call, by path relative to the run folder."""
        changed = {}
        for path in _resume_files(self.folder, self.node_ids):
            try:
                stat = path.stat()
                mark = (stat.st_size, stat.st_mtime_ns)
                if self.synced.get(path) != mark:
                    changed[str(path.relative_to(self.folder))] = path.read_bytes()
                    self.synced[path] = mark
            except OSError:  # replaced between listing and reading: the next poll takes it
                continue
        return self.rounds_done, changed

    def _round_done(self) -> None:
        self.rounds_done += 1

    async def run(self, files: Mapping[str, bytes], node_ids: Sequence[str], resume: bool) -> dict[str, Any]:
        """Write `files` (paths relative to the run folder) into this worker's folder, run the
        nodes `node_ids` in a worker process, and return its exit status and every file they wrote."""
        from p2pfl.hosting.process import exit_after_progress, spawn
        from p2pfl.runtime.config import load_node_config

        for rel, data in files.items():
            path = self.folder / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            path.chmod(0o600)  # keys among them: a node refuses a key file others can read
        folder = RunFolder(self.folder)
        folder.create()
        self.node_ids = node_ids
        paths = [folder.node_config(nid) for nid in node_ids]
        for path in paths:
            _relocate(load_node_config(path), self.folder).save(path)
        args = [sys.executable, "-m", "p2pfl", "worker", *map(str, paths)] + RESUME_TOGETHER * resume
        proc = await spawn(args, folder.log(self.name), self.torch_threads, die_with_parent=True)
        code = await exit_after_progress(proc, self._round_done)
        # Scenario, configs and keys are never sent back; a resumed node's own state is, as it changed.
        given = {folder.scenario, folder.roster} | {p for nid in node_ids for p in (folder.key(nid), folder.node_config(nid))}
        written = {str(p.relative_to(self.folder)): p.read_bytes()
                   for p in sorted(self.folder.rglob("*")) if p.is_file() and p not in given}
        shutil.rmtree(self.folder, ignore_errors=True)
        return {"code": code, "files": written}


def _resume_files(root: Path, node_ids: Sequence[str]) -> list[Path]:
    """What nodes `node_ids` resume from, under run folder `root`, where it exists: each one's
    checkpoint, the round lines a live view reads, and its artefacts (which it appends to)."""
    folder = RunFolder(root)
    candidates = [p for nid in node_ids
                  for p in (folder.checkpoint(nid), folder.node_rounds(nid), folder.artefacts / f"{nid}.jsonl")]
    return [p for p in candidates if p.is_file()]


def _relocate(config: Any, folder: Path) -> Any:
    """The config with its run-folder paths moved to this worker's folder."""
    from dataclasses import replace

    moved = RunFolder(folder)
    return replace(config, key_file=moved.key(config.id), scenario=moved.scenario, out=folder,
                   roster=None if config.roster is None else moved.roster)


def _write_into(out: Path, name: str, files: Mapping[str, bytes]) -> None:
    """Write files worker `name` sent (path relative to the run folder -> bytes) into `out`, each
    atomically, so a reader (the dashboard, a later --resume) never sees half a checkpoint."""
    for rel, data in files.items():
        path = (out / rel).resolve()
        if out.resolve() not in path.parents:
            raise ValueError(f"{name} returned a file outside the run folder: {rel!r}")
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial")
        partial.write_bytes(data)
        partial.replace(path)


@dataclass
class RayWorkers:
    """The actors of one run, and which nodes each hosts."""

    ray: ModuleType
    actors: dict[str, Any]
    shares: dict[str, list[str]]
    collected: set[str] = field(default_factory=set)  # workers whose final files are in; no older poll may overwrite them

    @classmethod
    def start(cls, ray: ModuleType, node_ids: Sequence[str], workers: int, torch_threads: int = 1) -> RayWorkers:
        cpus = float(ray.cluster_resources().get("CPU", 1.0))
        count = min(workers or max(1, int(cpus)), len(node_ids))
        remote = ray.remote(num_cpus=min(1.0, cpus / count))(NodeWorker)
        names = [f"worker-{w}" for w in range(count)]
        return cls(ray, {n: remote.remote(n, torch_threads) for n in names},
                   {n: list(node_ids[w::count]) for w, n in enumerate(names)})

    def addresses(self) -> dict[str, tuple[str, int]]:
        """node id -> (host, port) on the host of the actor that runs it."""
        names = list(self.actors)
        try:
            found = self.ray.get([self.actors[n].address.remote(len(self.shares[n])) for n in names],
                                 timeout=RESERVE_TIMEOUT_S)
        except self.ray.exceptions.GetTimeoutError:
            raise ConfigError("runtime.workers", f"the Ray cluster did not place {len(names)} workers within "
                                                 f"{RESERVE_TIMEOUT_S:.0f} s; ask for fewer (runtime.workers)") from None
        return {nid: (host, port) for n, (host, ports) in zip(names, found) for nid, port in zip(self.shares[n], ports)}

    def launch(self, out: Path, resume: bool) -> dict[str, asyncio.Future[Any]]:
        """Start every actor on its nodes; worker name -> the future of its `run`."""
        folder = RunFolder(out)

        def entry(path: Path) -> tuple[str, bytes]:
            return str(path.relative_to(out)), path.read_bytes()

        futures = {}
        for name, ids in self.shares.items():
            files = dict([entry(folder.scenario)])
            if folder.roster.is_file():
                files.update([entry(folder.roster)])
            for nid in ids:
                files.update([entry(folder.key(nid)), entry(folder.node_config(nid))])
            if resume:
                files.update(entry(p) for p in _resume_files(out, ids))
            futures[name] = asyncio.wrap_future(self.actors[name].run.remote(files, ids, resume).future())
        return futures

    async def sync(self, out: Path) -> int:
        """Rounds finished so far over every actor that still answers; what changed of their
        nodes' resume state is written into the run folder `out` on the way."""
        total = 0
        for name, actor in self.actors.items():
            try:
                rounds, files = await asyncio.wrap_future(actor.sync.remote().future())
            except Exception:  # a dead actor: its nodes are reported failed, its last synced rounds kept
                continue
            if name not in self.collected:
                _write_into(out, name, files)
            total += rounds
        return total

    def collect(self, out: Path, name: str, answer: dict[str, Any]) -> dict[str, int]:
        """Write what worker `name` returned into the run folder; node id -> exit status (the
        worker process's, as for a local worker: 2 could not start, 130 interrupted, 1 failed)."""
        self.collected.add(name)
        _write_into(out, name, answer["files"])
        return dict.fromkeys(self.shares[name], int(answer["code"]))

    def stop(self) -> None:
        for actor in self.actors.values():
            try:
                self.ray.kill(actor)
            except Exception:
                pass
        self.ray.shutdown()


class RayHosting:
    """The "ray" placement: actors reserve their hosts' ports before the run folder is written."""

    def __init__(self, ray_address: str, workers: int, torch_threads: int) -> None:
        self.ray = connect(ray_address)
        self.workers_asked, self.torch_threads = workers, torch_threads
        self.workers: RayWorkers | None = None
        self.on_exit: Callable[[str, int], None] | None = None

    def addresses(self, ids: Sequence[str], coordinator: bool) -> dict[str, tuple[str, int]]:
        self.workers = RayWorkers.start(self.ray, ids, self.workers_asked, self.torch_threads)
        addresses = self.workers.addresses()
        if coordinator:  # beside the launcher, at an address every actor reaches (not loopback)
            here = self.ray.util.get_node_ip_address()
            addresses[COORDINATOR_ID] = (here, free_ports(1, here)[0])
        return addresses

    async def start(self, out: Path, node_paths: list[Path], resume: bool,
                    progress: Progress) -> tuple[Hosts, Callable[[], None]]:
        """Start every actor on its share; progress is polled, as actors have no stdout to read."""
        workers = self.workers
        assert workers is not None, "addresses() places the actors first"
        futures = workers.launch(out, resume)

        async def follow(name: str) -> dict[str, int]:
            try:
                answer = await futures[name]
            except Exception as exc:  # the actor died (or its host did): its nodes have no results
                print(f"{name} on Ray failed: {exc!r}", file=sys.stderr)
                codes = dict.fromkeys(workers.shares[name], -9)
            else:
                codes = workers.collect(out, name, answer)
            for node, code in codes.items():
                if self.on_exit is not None:
                    self.on_exit(node, code)
            return codes

        async def poll() -> None:
            while not all(f.done() for f in futures.values()):
                progress(await workers.sync(out))
                await asyncio.sleep(0.5)

        poller = asyncio.ensure_future(poll())
        return {name: (ids, follow(name)) for name, ids in workers.shares.items()}, poller.cancel

    def close(self) -> None:
        if self.workers is not None:
            self.workers.stop()
        else:
            self.ray.shutdown()
