"""Arguments and outcomes several commands share: `--set`, `--log-level`, `--together`, and how a
command's end becomes an exit status and one line on stderr."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from p2pfl.errors import ConfigError
from p2pfl.logs import LEVELS
from p2pfl.runtime.stopping import Terminated

EXIT_CONFIG = 2
EXIT_INTERRUPTED = 130  # as a shell reports a command stopped by Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a command stopped by `kill`
TOGETHER_HELP = ("with --resume: every node of the federation resumes now (as `p2pfl run --resume` starts them): "
                 "replay from the checkpoint's round rather than rejoin where the neighbours' checkpoints are")

Handler = Callable[[argparse.Namespace], int]


def add_set(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a scenario field, e.g. --set rounds=5 --set algorithm.params.gamma=2")


def add_log_level(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-level", choices=LEVELS, default=None, type=str.upper,
                   help="what node, worker and coordinator logs show (default INFO)")


def fields_first(scenario: Path, overrides: list[str]) -> None:
    """Check the scenario's fields before the launcher loads torch: a typo is named in about a
    second (the schema checks every table torch-free first)."""
    from p2pfl.scenario.schema import load_scenario

    load_scenario(scenario, overrides)


def no_hint(args: argparse.Namespace) -> str:
    return ""


def exit_status(handler: Handler, args: argparse.Namespace) -> int:
    """Run one command: a wrong field or a missing file is one line and exit 2, Ctrl-C or SIGTERM one
    line (with how to go on, where the command says) and 130 or 143; never a traceback for these."""
    try:
        return handler(args)
    except ConfigError as exc:
        print(f"error in {exc.field}: {exc.message}", file=sys.stderr)
        return EXIT_CONFIG
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt as exc:
        hint: Callable[[argparse.Namespace], str] = getattr(args, "resume_hint", no_hint)
        print(f"{'stopped by SIGTERM' if isinstance(exc, Terminated) else 'interrupted'}{hint(args)}",
              file=sys.stderr)
        return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED
