"""placement = "ray": the nodes' workers are actors on an existing Ray cluster.

Ray only places the workers and carries their files; between nodes everything still crosses
the signed HTTP wire, exactly as in the other placements and in a LAN deployment. Each actor
binds its nodes' endpoints on its own host's address, gets its share of the run folder
(scenario, node configs, keys) at start, runs the nodes in a private folder on its host, and
returns what they wrote (results, checkpoints, artefacts, its log), which the launcher puts
into the run folder. The coordinator, when an algorithm has one, runs beside the launcher.

Start a cluster with `ray start --head` (and `ray start --address HEAD:6379` on the other
machines, each with p2pfl installed), then `p2pfl run SCENARIO --out RUN --ray auto`.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from p2pfl.errors import ConfigError
from p2pfl.runtime.node import ENDED_BADLY
from p2pfl.runtime.run_folder import RunFolder

RESERVE_TIMEOUT_S = 120.0  # how long an actor may take to be placed and report its address


def import_ray() -> ModuleType:
    try:
        import ray
    except ImportError:
        raise ConfigError("runtime.placement", 'placement "ray" needs Ray: pip install -e ".[ray]"') from None
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
    """A Ray actor hosting a share of the nodes (see `p2pfl.assembly.host_nodes`)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.folder = Path(tempfile.mkdtemp(prefix=f"p2pfl-{name}-"))
        self.rounds_done = 0

    def address(self, count: int) -> tuple[str, list[int]]:
        """This host's address as peers reach it, and `count` free ports on it."""
        import ray

        from p2pfl.runtime.transport import free_ports

        host = ray.util.get_node_ip_address()
        return host, free_ports(count, host)

    def progress(self) -> int:
        return self.rounds_done

    async def run(self, files: Mapping[str, bytes], node_ids: Sequence[str], resume: bool) -> dict[str, Any]:
        """Write `files` (paths relative to the run folder) into this worker's folder, run the
        nodes `node_ids`, and return per-node status and every file they wrote."""
        from p2pfl.runtime.config import load_node_config
        from p2pfl import logs
        from p2pfl.assembly import host_nodes

        for rel, data in files.items():
            path = self.folder / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            path.chmod(0o600)  # keys among them: a node refuses a key file others can read
        folder = RunFolder(self.folder)
        folder.create()
        logs.configure(filename=folder.log(self.name))
        configs = [load_node_config(folder.node_config(nid)) for nid in node_ids]
        configs = [_relocate(c, self.folder) for c in configs]

        def counted(_: dict[str, Any]) -> None:
            self.rounds_done += 1

        results = await host_nodes(configs, resume=resume, on_round=counted)
        logging.shutdown()
        given = {self.folder / rel for rel in files}  # scenario, configs and keys: never sent back
        written = {str(p.relative_to(self.folder)): p.read_bytes()
                   for p in sorted(self.folder.rglob("*")) if p.is_file() and p not in given}
        shutil.rmtree(self.folder, ignore_errors=True)
        return {"status": {r["id"]: r["status"] for r in results}, "files": written}


def _relocate(config: Any, folder: Path) -> Any:
    """The config with its run-folder paths moved to this worker's folder."""
    from dataclasses import replace

    return replace(config, key_file=RunFolder(folder).key(config.id), scenario=RunFolder(folder).scenario, out=folder)


@dataclass
class RayWorkers:
    """The actors of one run, and which nodes each hosts."""

    ray: ModuleType
    actors: dict[str, Any]
    shares: dict[str, list[str]]

    @classmethod
    def start(cls, ray: ModuleType, node_ids: Sequence[str], workers: int) -> RayWorkers:
        cpus = float(ray.cluster_resources().get("CPU", 1.0))
        count = min(workers or max(1, int(cpus)), len(node_ids))
        remote = ray.remote(num_cpus=min(1.0, cpus / count))(NodeWorker)
        names = [f"worker-{w}" for w in range(count)]
        return cls(ray, {n: remote.remote(n) for n in names}, {n: list(node_ids[w::count]) for w, n in enumerate(names)})

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
            for nid in ids:
                files.update([entry(folder.key(nid)), entry(folder.node_config(nid))])
            futures[name] = asyncio.wrap_future(self.actors[name].run.remote(files, ids, resume).future())
        return futures

    async def rounds_done(self) -> int:
        """Rounds finished so far over every actor that still answers."""
        total = 0
        for actor in self.actors.values():
            try:
                total += await asyncio.wrap_future(actor.progress.remote().future())
            except Exception:  # a dead actor's rounds are lost with it; its nodes are reported failed
                continue
        return total

    def collect(self, out: Path, name: str, answer: dict[str, Any]) -> dict[str, int]:
        """Write what worker `name` returned into the run folder; node id -> exit status."""
        for rel, data in answer["files"].items():
            path = (out / rel).resolve()
            if out.resolve() not in path.parents:
                raise ValueError(f"{name} returned a file outside the run folder: {rel!r}")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return {nid: 1 if answer["status"].get(nid) in ENDED_BADLY else 0 for nid in self.shares[name]}

    def stop(self) -> None:
        for actor in self.actors.values():
            try:
                self.ray.kill(actor)
            except Exception:
                pass
        self.ray.shutdown()
