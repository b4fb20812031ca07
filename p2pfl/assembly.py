"""Builds nodes: the one place that knows every module.

A node's data slice, model, privacy mechanism, trainer, strategy, attack, key, transport and
neighbours are made here from its config and the scenario, then handed to `runtime.Node`,
which only runs rounds. Process-wide settings (torch threads, logging) are set here too, once
per process, not by each node. `run_node` and `run_worker` are the entry points of
`p2pfl node` (one node in this process) and `p2pfl worker` (several, `placement = "shared"`).

Nodes hosted together are asyncio tasks on one event loop, with one torch import, one data
cache and one thread pool for their training; each keeps its own HTTP endpoint, keys and round
loop, so between nodes everything still crosses the signed wire on loopback, as in a
deployment. Training runs in worker threads (`asyncio.to_thread`), so one node's fit never
stops the others from serving.
"""

from __future__ import annotations

import asyncio
import copy
import errno
import functools
import gc
import json
import logging
import os
import sys
import zlib
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import torch

from p2pfl import logs
from p2pfl.algorithms import build_strategy
from p2pfl.attacks import build_attack
from p2pfl.data import build_partition
from p2pfl.models import build_model
from p2pfl.privacy import build_privacy, prepare_model
from p2pfl.runtime.accounting import ByteCounter
from p2pfl.runtime.churn import ChurnSpec, NodeScript, late_and_joining, scripts_of
from p2pfl.runtime.config import NodeConfig, load_node_config, node_id_table, node_ids
from p2pfl.runtime.federation.gossip import NoSeedAnswered
from p2pfl.runtime.federation.service import FederationMember
from p2pfl.runtime.shared_tables import Overlay, own_copy
from p2pfl.scenario.federation import federation_member
from p2pfl.runtime.node import Node, NodeParts, RoundCallback
from p2pfl.runtime.participation import rounds_taking_part
from p2pfl.runtime.coordinator import Coordinator, CoordinatorParts
from p2pfl.runtime.coordinator_half import CoordinatorEnv
from p2pfl.runtime.devices import data_to_device, node_device, seed_torch, split_to_device
from p2pfl.runtime.resources import host_many_nodes, raise_open_file_limit, release_periodically
from p2pfl.runtime.files import RecordAppender
from p2pfl.runtime.run_folder import RunFolder
from p2pfl.runtime.safeguard import DEFAULT_LEVEL, LocalReference, LocalSafeguard, MixSafeguard, Safeguard
from p2pfl.runtime.settings import CoordinatorSettings, NodeSettings
from p2pfl.runtime.status import COORDINATOR_ENDED_BADLY, PROGRESS_ENV, PROGRESS_PREFIX, exit_status
from p2pfl.runtime.stopping import run_stoppable
from p2pfl.runtime.strategy import COORDINATOR_ID
from p2pfl.runtime.topology import Topology
from p2pfl.scenario.carriers import build_carrier
from p2pfl.scenario.run_inputs import resolve_run_inputs
from p2pfl.scenario.schema import Scenario, load_scenario, settings_for
from p2pfl.training.trainer import LocalTrainer
from p2pfl.wire import NodeKey



def progress_line(record: dict[str, Any]) -> str:
    """A line per round for the launcher's progress: who finished which round. The whole record
    is in the node's rounds file (RUN/nodes/<id>.rounds.jsonl); encoding it twice per round was a
    measurable share of a thousand-node worker's time."""
    line = {"id": record.get("id"), "round": record.get("round"), "participated": record.get("participated", True)}
    return PROGRESS_PREFIX + json.dumps(line)


def print_progress(record: dict[str, Any]) -> None:
    """A process of one node: each line at once (a test kills a node right after a given round),
    in one write, so that nodes forked from one parent (`p2pfl.forked`) never mix their lines."""
    write_progress(sys.stdout, progress_line(record) + "\n")


def write_progress(stream: Any, text: str) -> None:
    """Progress lines are for a reader that may be gone: a launcher stopping closes its end of the
    pipe before its nodes are killed, and a node that failed on that BrokenPipeError wrote a
    "failed" result in place of "stopped". The round is in the node's own rounds file either way;
    later lines go nowhere."""
    try:
        stream.write(text)
        stream.flush()
    except BrokenPipeError:
        # The file descriptor itself points at /dev/null from now on, so that the interpreter's
        # flush at exit does not fail on the buffered rest either (Python's documented remedy).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)


# A worker of many nodes sends its progress lines in batches: one write to the launcher's pipe per
# line (the launcher starts workers unbuffered), each waking the launcher, showed in py-spy's
# profiles of a 1000-node worker, and a progress bar needs no more than a few updates a second.
PROGRESS_FLUSH_EVERY_S = 0.25


class BatchedProgress:
    """`print_progress` for a worker of many nodes: lines kept, written together by `flush`."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self._lines: list[str] = []

    def __call__(self, record: dict[str, Any]) -> None:
        self._lines.append(progress_line(record) + "\n")

    def flush(self) -> None:
        if self._lines:
            lines, self._lines = self._lines, []
            write_progress(self.stream, "".join(lines))

    async def flush_every(self, every_s: float) -> None:
        """`flush` every `every_s` seconds until cancelled, and once more then."""
        try:
            while True:
                await asyncio.sleep(every_s)
                self.flush()
        finally:
            self.flush()


def node_seed(scenario_seed: int, index: int) -> int:
    return scenario_seed * 100_003 + index


def assemble_node(config: NodeConfig, scenario: Scenario | None = None, *, resume: bool = False,
                  together: bool = False, join: bool = False, on_round: RoundCallback | None = None,
                  member: FederationMember | None = None) -> Node:
    """`member`: this node's place in a federation (its config's `[federation]`, discovered
    already): it trains on this host's own data and finds its peers from the federation."""
    sc = scenario or load_scenario(config.scenario, config.overrides)
    if not 0 <= config.index < sc.nodes:
        raise ValueError(f"node index {config.index} outside the scenario's {sc.nodes} nodes")
    # Only this node's tensors: nodes sharing a worker process must not each hold everybody's images.
    # A federation's member holds this host's data, all of it: the scenario's data section as one node's.
    partition = build_partition(sc.data, 1 if member else sc.nodes, sc.seed, only=[0 if member else config.index])
    device = node_device(sc.device, config.index)
    seed = node_seed(sc.seed + sc.train.seed_offset, zlib.crc32(config.id.encode()) if member else config.index)
    attack = build_attack(sc.attack, config.index, seed)
    data = partition.node(0 if member else config.index)
    if attack is not None:
        data = attack.training_data(data, partition.num_classes)
    data = data_to_device(data, device)
    seed_torch(sc.seed + sc.train.seed_offset, device)  # the same initial model on every node, as FedAvg assumes
    model = build_model(sc.model.name, partition.in_channels, partition.image_size, partition.num_classes).to(device)
    safeguard: Safeguard = MixSafeguard() if sc.algorithm.safeguard == "mix" else Safeguard()
    if sc.algorithm.safeguard == "local":  # Local's initial model and draws, without privacy: it is never shared
        safeguard = LocalSafeguard(LocalReference(copy.deepcopy(model), LocalTrainer(sc.train, device=device, seed=seed)),
                                   sc.algorithm.safeguard_level or DEFAULT_LEVEL)
    privacy = build_privacy(sc.privacy, n_train=len(data.train), batch_size=sc.train.batch_size,
                            epochs=sc.train.epochs, rounds=sc.rounds, seed=seed)
    if privacy is not None:
        model = prepare_model(model, privacy)
    trainer = LocalTrainer(sc.train, device=device, seed=seed, privacy=privacy)
    # Start-up cost belongs to start-up, not to round 1 (see LocalTrainer.warm_up).
    trainer.warm_up(model, data.train, data.test)
    # The roster keeps every peer (anyone may verify a message); the topology says whom this
    # node fetches from and waits for.
    ids = node_id_table(sc.nodes)
    adjacency = [] if member else Topology.parse(sc.runtime.topology).neighbours_of(config.index, sc.nodes, sc.seed)
    neighbours = tuple(sorted(ids[j] for j in adjacency if ids[j] in config.peers))
    # Each neighbour's rounds, from its own seeded draws and the churn schedule's joins: a round it
    # sits out (or is not there for yet) is asked of it at once, or not at all.
    scripts = [NodeScript()] * sc.nodes if member else scripts_of(sc.churn, sc.nodes, sc.rounds, sc.seed)
    joining = frozenset() if member else late_and_joining(sc.churn, sc.nodes, sc.rounds, sc.seed)[1]
    peer_rounds: MutableMapping[str, frozenset[int]] = {}
    if not member:  # the joiners' rounds (any node may be asked one), one table a worker; the node's neighbours' its own
        peer_rounds = Overlay(joiner_rounds(sc, joining, scripts), removed=[config.id])
        peer_rounds.update(neighbour_rounds(sc, sorted(set(adjacency) - joining - {config.index}), scripts))
    key = NodeKey.load(config.key_file)
    infos = own_copy(config.peers)  # a view of the worker's one roster table, not N entries of its own
    if config.coordinator is not None:
        infos[COORDINATOR_ID] = config.coordinator
    counter = ByteCounter()
    transport = build_carrier(sc, config.id, key, infos, counter)
    params = resolve_run_inputs(sc.algorithm.name, sc.algorithm.params, sc.seed)  # an earlier run's results, read
    parts = NodeParts(
        data=data, device=device, model=model, trainer=trainer,
        strategy=build_strategy(sc.algorithm.name, params),
        fresh_strategy=lambda: build_strategy(sc.algorithm.name, params),
        privacy=privacy, attack=attack, key=key, transport=transport, counter=counter, neighbours=neighbours, seed=seed,
        safeguard=safeguard, peer_rounds=peer_rounds, script=scripts[config.index],
        joins_late=frozenset() if member else late_ids(sc.churn, sc.nodes, sc.rounds, sc.seed),
        companions=(member,) if member else (),
    )
    return Node(config, node_settings(sc), parts, resume=resume, together=together, join=join, on_round=on_round)


def neighbour_rounds(sc: Scenario, indices: Sequence[int], scripts: Sequence[NodeScript]) -> dict[str, frozenset[int]]:
    """The rounds each node of `indices` takes part in where that is not every round: its seeded
    participation draws (its own stream, from round 1), from the round it joins."""
    ids, out = node_id_table(sc.nodes), {}
    for j in indices:
        join = scripts[j].join
        if sc.runtime.participation >= 1 and join <= 1:
            continue
        rounds = (rounds_taking_part(node_seed(sc.seed + sc.train.seed_offset, j), sc.rounds, sc.runtime.participation)
                  if sc.runtime.participation < 1 else frozenset(range(1, sc.rounds + 1)))
        out[ids[j]] = frozenset(r for r in rounds if r >= join)
    return out


@functools.lru_cache(maxsize=4)  # one set for a worker's nodes, not one each
def late_ids(spec: ChurnSpec | None, nodes: int, rounds: int, seed: int) -> frozenset[str]:
    """The ids of the nodes the churn schedule starts late."""
    ids = node_id_table(nodes)
    return frozenset(ids[j] for j in late_and_joining(spec, nodes, rounds, seed)[0])


# id of a scenario -> (the scenario, kept alive so that its id is not reused; its joiners' rounds)
_JOINER_ROUNDS: dict[int, tuple[Scenario, Mapping[str, frozenset[int]]]] = {}


def joiner_rounds(sc: Scenario, joining: frozenset[int], scripts: Sequence[NodeScript]) -> Mapping[str, frozenset[int]]:
    """`neighbour_rounds` of the nodes that join after round 1, made once for the nodes of a worker
    (they share one parsed scenario): a quarter of 10,000 nodes join in a churn run, and a table of
    them each held 0.9 MiB a node."""
    found = _JOINER_ROUNDS.get(id(sc))
    if found is None or found[0] is not sc:
        found = _JOINER_ROUNDS[id(sc)] = (sc, neighbour_rounds(sc, sorted(joining), scripts))
        while len(_JOINER_ROUNDS) > 4:  # a process that builds many runs keeps the newest only
            del _JOINER_ROUNDS[next(iter(_JOINER_ROUNDS))]
    return found[1]


def node_settings(sc: Scenario) -> NodeSettings:
    """What a node's loop reads of the scenario (`p2pfl.runtime.settings`): one frozen copy for all
    the nodes a worker builds from one scenario object, not a resolved scenario each."""
    made = _SETTINGS.get(id(sc))
    if made is None or made[0] is not sc:
        made = (sc, NodeSettings(algorithm=sc.algorithm.name, rounds=sc.rounds, seed=sc.seed, resolved=sc.to_dict(),
                                 written_as=sc.written_as, **settings_for(sc.runtime, "node")))
        _SETTINGS.clear()
        _SETTINGS[id(sc)] = made
    return made[1]


_SETTINGS: dict[int, tuple[Scenario, NodeSettings]] = {}  # the scenario it was made of is kept: its id stays its own


# A worker of many nodes returns freed heap pages this often (p2pfl.runtime.resources): every
# second, the 1000-node run's peak (both workers) fell from 5.0 to 4.4 GB; every 0.25 s (with
# published parts lent, 2026-11-28) from 3.44-3.60 to 3.34-3.43 GB, its round time within the
# spread between runs either time (`python benchmarks/scale.py --nodes 1000`, docs/benchmarks.md).
HEAP_RELEASE_EVERY_S = 0.25


async def host_nodes(configs: Sequence[NodeConfig], *, resume: bool = False, together: bool = False,
                     join: bool = False, on_round: RoundCallback | None = None,
                     members: Mapping[str, FederationMember] | None = None) -> list[dict[str, Any]]:
    """Build and run every node of `configs` on this event loop; each node's result goes into
    its run folder as it ends. Their results, in order. `resume`, `together`, `join`: as `Node`'s;
    `members`: the federation member of a node that has one (by id)."""
    # The nodes of one worker share a scenario file: parsed once, not once per node.
    scenarios: dict[tuple[Path, tuple[str, ...]], Scenario] = {}
    for c in configs:
        key = (c.scenario, tuple(c.overrides))
        if key not in scenarios:
            scenarios[key] = load_scenario(c.scenario, c.overrides)
    first = scenarios[(configs[0].scenario, tuple(configs[0].overrides))]
    torch.set_num_threads(first.runtime.torch_threads)

    def build(config: NodeConfig) -> tuple[Node, RunFolder, RecordAppender]:
        folder = RunFolder(config.out)
        rounds_file = RecordAppender(folder.node_rounds(config.id))

        def recorded(record: dict[str, Any]) -> None:
            rounds_file.append(record)  # for a live view of the run
            if on_round is not None:
                on_round(record)

        node = assemble_node(config, scenarios[(config.scenario, tuple(config.overrides))], resume=resume,
                             together=together, join=join, on_round=recorded, member=(members or {}).get(config.id))
        node.prepare()
        if not folder.scenario.is_file():  # a LAN node's own folder: `p2pfl report` needs it to merge results
            folder.scenario.parent.mkdir(parents=True, exist_ok=True)
            folder.scenario.write_text(json.dumps(node.settings.resolved, indent=2))
        return node, folder, rounds_file

    async def run(node: Node, folder: RunFolder, rounds_file: RecordAppender) -> dict[str, Any]:
        with rounds_file:
            result = await node.run()
        await asyncio.to_thread(folder.write_result, node.config.id, result)  # nodes still in a round share the loop
        return result

    # Every node of the worker is built before any listens: built one by one as each started
    # (building blocks the loop), the first nodes' round 1 also paid the last ones' building
    # (500 nodes: 5-10 s), which the run counted as round time, not start-up.
    thresholds = gc.get_threshold()
    periodic: list[asyncio.Future[None]] = []
    if len(configs) > 1:
        host_many_nodes(asyncio.get_running_loop(), first.runtime.workers)
        periodic.append(asyncio.ensure_future(release_periodically(HEAP_RELEASE_EVERY_S)))
    if isinstance(on_round, BatchedProgress):
        periodic.append(asyncio.ensure_future(on_round.flush_every(PROGRESS_FLUSH_EVERY_S)))
    try:
        built = [build(c) for c in configs]
        return list(await asyncio.gather(*(run(node, folder, rounds_file) for node, folder, rounds_file in built)))
    finally:
        gc.set_threshold(*thresholds)
        for task in periodic:
            task.cancel()
        await asyncio.gather(*periodic, return_exceptions=True)


def build_coordinator(config: NodeConfig, scenario: Scenario | None = None, *, resume: bool = False) -> Coordinator:
    """The coordinator of DI's and Client2Vec's global steps, built as a node is: from its config
    and the scenario, which only this function reads."""
    from p2pfl.algorithms import build_coordinator_half

    sc = scenario or load_scenario(config.scenario, config.overrides)
    torch.set_num_threads(sc.runtime.torch_threads)
    partition = build_partition(sc.data, sc.nodes, sc.seed)
    device = node_device(sc.device, 0)
    held_out = None if partition.held_out is None else split_to_device(partition.held_out, device)
    torch.manual_seed(sc.seed + sc.train.seed_offset)  # the nodes' initial model
    model = build_model(sc.model.name, partition.in_channels, partition.image_size, partition.num_classes).to(device)
    env = CoordinatorEnv(model=model, rounds=sc.rounds, seed=sc.seed, num_classes=partition.num_classes,
                         nodes=tuple(sorted(config.peers)), device=device)
    # Not waited for: nodes the churn schedule brings in later (they submit from their round on).
    scripts = scripts_of(sc.churn, sc.nodes, sc.rounds, sc.seed)
    late = {nid for nid, script in zip(node_ids(sc.nodes), scripts) if script.late}
    key, counter = NodeKey.load(config.key_file), ByteCounter()
    settings = CoordinatorSettings(algorithm=sc.algorithm.name, rounds=sc.rounds, resolved=sc.to_dict(),
                                   written_as=sc.written_as, **settings_for(sc.runtime, "coordinator"))
    return Coordinator(config, CoordinatorParts(
        settings=settings, model=model, device=device,
        build_half=lambda: build_coordinator_half(sc.algorithm.name, sc.algorithm.params, env),
        evaluator=LocalTrainer(sc.train, device=device), held_out=held_out, held_out_domain=partition.held_out_domain,
        expected=set(config.peers) - late, key=key, counter=counter,
        endpoint=build_carrier(sc, config.id, key, config.peers, counter, logging.getLogger("p2pfl.coordinator")),
    ), resume=resume)


def run_coordinator(config: NodeConfig, resume: bool = False) -> int:
    logs.configure(f"%(asctime)s {config.id} %(levelname)s %(message)s")
    return exit_status([run_stoppable(build_coordinator(config, resume=resume).run())], COORDINATOR_ENDED_BADLY)


def run_worker(config_paths: Sequence[Path], resume: bool = False, together: bool = False) -> int:
    """Run every node of `config_paths` in this process; exit status 1 if any of them failed."""
    logs.configure()
    raise_open_file_limit()
    return exit_status(_hosting([load_node_config(p) for p in config_paths], resume, together))


def run_node(config: NodeConfig, resume: bool = False, together: bool = False, join: bool = False) -> int:
    # Started by hand, a node logs to its terminal and to the run folder's logs/, as under a launcher
    # (which sends the process's stderr there itself).
    by_hand = not os.environ.get(PROGRESS_ENV)
    logs.configure(f"%(asctime)s {config.id} %(levelname)s %(message)s",
                   also_to=RunFolder(config.out).log(config.id) if by_hand else None)
    members = None
    if config.federation is None:
        logging.getLogger("p2pfl").info("trains on slice %d of the scenario's partition (the roster's order)",
                                        config.index)
    else:
        try:
            members = {config.id: federation_member(config)}
        except NoSeedAnswered as exc:
            print(f"{config.id}: {exc}", file=sys.stderr)
            return 2
    [result] = _hosting([config], resume, together, join, members)
    if result.get("rounds") is not None:
        print(f"{config.id}: {result['status']}, final accuracy {result.get('final_test_acc')}; "
              f"result in {RunFolder(config.out).node_result(config.id)}", file=sys.stderr)
    return exit_status([result])


def _hosting(configs: Sequence[NodeConfig], resume: bool, together: bool = False,
             join: bool = False, members: Mapping[str, FederationMember] | None = None) -> list[dict[str, Any]]:
    """Run the nodes; a port already taken is one line and exit 2 (an empty result), not a traceback."""
    for config in configs:  # running again (--resume): no longer the process the launcher saw die
        RunFolder(config.out).node_exit(config.id).unlink(missing_ok=True)
    try:
        # Machine lines for the launcher that started this process (it says so in the environment);
        # a node started by hand, at a terminal or through a pipe, logs its rounds instead.
        on_round: RoundCallback | None = None if not os.environ.get(PROGRESS_ENV) else (
            print_progress if len(configs) == 1 else BatchedProgress(sys.stdout))
        return run_stoppable(host_nodes(configs, resume=resume, together=together, join=join, on_round=on_round,
                                      members=members))
    except KeyboardInterrupt:  # Ctrl-C reaches every process of the run: the checkpoints keep the rounds done
        logging.getLogger("p2pfl").warning("interrupted; rounds finished so far are checkpointed (--resume)")
        return [{"status": "interrupted"} for _ in configs]
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        taken = ", ".join(f"{c.host}:{c.port}" for c in configs)
        logging.getLogger("p2pfl").error("cannot listen: an address of %s is already in use (%s)", taken, exc.strerror)
        return [{} for _ in configs]
