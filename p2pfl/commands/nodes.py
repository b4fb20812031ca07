"""The commands that host nodes from configs the launcher (or `p2pfl lan`) wrote: `node` (one, a
LAN host's), `worker` (several in one process), `forked` (each forked from one warm process) and
`coordinator` (DI's and Client2Vec's global steps)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from p2pfl.commands.options import TOGETHER_HELP, add_log_level, exit_status
from p2pfl.errors import ConfigError


def add(sub: Any) -> None:
    node = sub.add_parser("node", help="run one node from a node config (LAN deployment)")
    node.add_argument("config", type=Path)
    node.add_argument("--resume", action="store_true",
                      help="continue from the node's last checkpoint, in the round its neighbours are in if they "
                           "went on without it")
    node.add_argument("--together", action="store_true", help=TOGETHER_HELP)
    node.add_argument("--join", action="store_true",
                      help="join a federation that is already running: start from a neighbour's newest model, in "
                           "the round the neighbours are in")
    add_log_level(node)
    node.set_defaults(handler=_node, resume_hint=resume_hint)

    worker = sub.add_parser("worker", help="run several nodes in this process (placement = \"shared\")")
    worker.add_argument("configs", type=Path, nargs="+")
    worker.add_argument("--resume", action="store_true", help="continue every node from its last checkpoint")
    worker.add_argument("--together", action="store_true", help=TOGETHER_HELP)
    add_log_level(worker)
    worker.set_defaults(handler=_worker)

    forked = sub.add_parser("forked", help="run each node of CONFIG... in its own process, forked from this one after "
                                           "one import (placement = \"process\", start_method = \"fork\"; with "
                                           "--wait, also the workers of placement = \"shared\")")
    forked.add_argument("configs", type=Path, nargs="*")
    forked.add_argument("--wait", action="store_true",
                        help="import first, then take the configs as a JSON line on stdin (how `p2pfl run` starts it)")
    forked.add_argument("--resume", action="store_true", help="continue every node from its last checkpoint")
    forked.add_argument("--together", action="store_true", help=TOGETHER_HELP)
    add_log_level(forked)
    forked.set_defaults(handler=_forked)

    coord = sub.add_parser("coordinator", help="run the optional coordinator from its config")
    coord.add_argument("config", type=Path)
    coord.add_argument("--resume", action="store_true", help="continue from the coordinator's last checkpoint")
    add_log_level(coord)
    coord.set_defaults(handler=_coordinator, resume_hint=resume_hint)


def resume_hint(args: argparse.Namespace) -> str:
    return (f"; its rounds finished are checkpointed: p2pfl {args.command} {args.config} --resume goes on "
            "from there")


def _node(args: argparse.Namespace) -> int:
    from p2pfl.assembly import run_node
    from p2pfl.runtime.config import load_node_config

    if args.join and args.resume:
        raise ConfigError("--join", "--resume goes on from this node's own checkpoint, --join from a neighbour's "
                                    "model; pass one of them")
    if args.together and not args.resume:
        raise ConfigError("--together", "it says how a --resume goes on; pass --resume with it")
    return run_node(load_node_config(args.config), resume=args.resume, together=args.together, join=args.join)


def _worker(args: argparse.Namespace) -> int:
    from p2pfl.assembly import run_worker

    if args.together and not args.resume:
        raise ConfigError("--together", "it says how a --resume goes on; pass --resume with it")
    return run_worker(args.configs, resume=args.resume, together=args.together)


def _forked(args: argparse.Namespace) -> int:
    from p2pfl.forked import run_forked, run_forked_when_told

    def host(name: str, paths: Sequence[Path], resume: bool = args.resume, together: bool = args.together) -> int:
        """A forked child runs as `p2pfl node CONFIG` (a host named after its one node) or `p2pfl
        worker CONFIG...` would, so a stop is one line and an exit status as there."""
        if not (len(paths) == 1 and name == paths[0].stem):
            return exit_status(_worker, argparse.Namespace(command="worker", configs=list(paths), resume=resume,
                                                           together=together))
        child = argparse.Namespace(command="node", config=paths[0], resume=resume, together=together, join=False,
                                   resume_hint=resume_hint)
        return exit_status(_node, child)

    if args.wait:
        return run_forked_when_told(lambda name, paths, resume: host(name, paths, resume, resume))
    if not args.configs:
        raise ConfigError("configs", "name the node configs to fork (or --wait for them on stdin)")
    return run_forked({p.stem: [p] for p in args.configs}, host)


def forking_parent() -> int:
    """`p2pfl forked --wait`, in a process forked from `p2pfl run`'s (`p2pfl.hosting.warm`)."""
    return exit_status(_forked, argparse.Namespace(command="forked", wait=True, configs=[], resume=False,
                                                   together=False))


def _coordinator(args: argparse.Namespace) -> int:
    from p2pfl.assembly import run_coordinator
    from p2pfl.runtime.config import load_node_config

    return run_coordinator(load_node_config(args.config), resume=args.resume)
