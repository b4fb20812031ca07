"""The `p2pfl` command: a table of subcommands (`p2pfl/commands/`), and what every one shares:
the umask, user modules found from here, the log level, SIGTERM, and the exit status."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import signal
import sys
import threading
from collections.abc import Sequence

from p2pfl.commands import deployment, experiments, federation, nodes, run
from p2pfl.commands.options import Handler, exit_status
from p2pfl.logs import set_level
from p2pfl.runtime.stopping import raise_terminated

# In the order `p2pfl --help` lists them; each module's `add` declares its subcommands.
COMMANDS = (run, nodes, experiments, deployment, federation)

# Bits no file p2pfl writes may grant, whatever the umask it was started under: a config, roster or
# scenario that others could rewrite would let them change whom a node trusts and what it runs.
NEVER_WRITABLE_BY_OTHERS = 0o022


def _version() -> str:
    try:
        return importlib.metadata.version("p2pfl-influence")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="p2pfl", description="Asynchronous peer-to-peer federated learning.")
    parser.add_argument("--version", action="version", version=f"p2pfl {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS:
        module.add(sub)
    return parser


def _user_modules_from_here() -> None:
    """`"package.module:name"` in a scenario resolves from the folder the command runs in, as
    `python -m` would, for this process and every node process it starts."""
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if here not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([here, *paths])


def _dispatch(args: argparse.Namespace) -> int:
    handler: Handler = args.handler
    return handler(args)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Read from this process's own command line, the process is the command's alone: `p2pfl run`
    # may fork its nodes' parent from it (`p2pfl.hosting.warm`); a caller's process (a test, a
    # script calling `main([...])`) is left as it is.
    args.own_process = argv is None
    os.umask(os.umask(0) | NEVER_WRITABLE_BY_OTHERS)  # a stricter umask is kept
    _user_modules_from_here()
    if getattr(args, "log_level", None):
        set_level(args.log_level)  # inherited by every process this command starts
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, raise_terminated) if on_main_thread else None
    try:
        return exit_status(_dispatch, args)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
