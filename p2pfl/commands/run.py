"""`p2pfl run SCENARIO --out RUN`: N nodes on this machine (or a Ray cluster), with live views."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from p2pfl.commands.options import add_log_level, add_set, fields_first
from p2pfl.errors import ConfigError


def add(sub: Any) -> None:
    run = sub.add_parser("run", help="run a scenario: N node processes on this machine")
    run.add_argument("scenario", type=Path)
    run.add_argument("--out", type=Path, required=True, help="run folder (results.json, logs, artefacts)")
    run.add_argument("--no-progress", action="store_true")
    run.add_argument("--timeout", type=float, default=None, help="kill the run after this many seconds")
    run.add_argument("--force", action="store_true",
                     help="replace a run already in --out (its results, logs, checkpoints and keys are deleted first)")
    run.add_argument("--resume", action="store_true",
                     help="continue the run in --out from each node's last complete round (same scenario)")
    run.add_argument("--dashboard", metavar="PORT", nargs="?", type=int, const=8050, default=None,
                     help="serve a live view of the run on http://127.0.0.1:PORT/ (default port 8050); "
                          "the page stays up after the run until Ctrl-C")
    run.add_argument("--no-linger", action="store_true",
                     help="with --dashboard: stop serving the page when the run ends (it does anyway when "
                          "not started at a terminal)")
    run.add_argument("--tensorboard", metavar="DIR", nargs="?", type=Path, const=True, default=None,
                     help="write TensorBoard scalars as rounds end (default DIR: OUT/tensorboard); "
                          "`tensorboard --logdir DIR` shows them while the run goes")
    run.add_argument("--ray", metavar="auto|HOST:PORT", default=None,
                     help='run the nodes on a Ray cluster (runtime.placement = "ray"); start one with `ray start --head`')
    run.add_argument("--audit", metavar="NODE", nargs="?", const="", default=None,
                     help="NODE (default: the first) keeps every part it reads, and after the run `p2pfl audit` "
                          "attacks them from its seat (runtime.audit; needs the audit extra)")
    add_set(run)
    add_log_level(run)
    run.set_defaults(handler=handle, resume_hint=resume_hint)


def resume_hint(args: argparse.Namespace) -> str:
    return (f"; every round a node finished is checkpointed in {args.out}: "
            f"p2pfl run {args.scenario} --out {args.out} --resume goes on from there "
            "(with the scenario the run started with: no --set again)")


def warm_up_for(scenario: Path, overrides: Sequence[str], own_process: bool) -> None:
    """Start the forking parent if the scenario, as its fields read torch-free, places its nodes
    in forked processes; a scenario that cannot be read is left to the launcher's checks. In a
    process of its own, the parent is forked from this one once the launcher is imported: one copy
    of torch and the node code for the launcher, the parent and the nodes (`p2pfl.hosting.warm`)."""
    from p2pfl.hosting import warm
    from p2pfl.scenario.schema import apply_overrides, read_raw

    try:
        runtime = apply_overrides(read_raw(scenario), overrides).get("runtime", {})
    except (ConfigError, OSError, ValueError):
        return
    if not isinstance(runtime, dict):
        return
    entry = None
    if own_process:
        import p2pfl.scenario.launcher  # noqa: F401  (before the fork: then shared, not imported twice)
        from p2pfl.commands.nodes import forking_parent as entry
    warm.warm_up_for(runtime.get("placement", "process"), runtime.get("start_method", "auto"),
                     runtime.get("torch_threads", 1), entry)


def handle(args: argparse.Namespace) -> int:
    if args.force and args.resume:
        raise ConfigError("--resume", "--force replaces the run that --resume would continue; pass one of them")
    overrides = list(args.overrides)
    if args.ray is not None:
        overrides += ['runtime.placement="ray"', f"runtime.ray_address={json.dumps(args.ray)}"]
    if args.audit is not None:
        from p2pfl.audit.command import audit_override

        overrides.append(audit_override(args.scenario, overrides, args.audit))
    try:
        return _checked_and_run(args, overrides)
    finally:
        # A forking parent the run did not take (fields refused, a run that ended first) goes with
        # the command: called in-process (`main(["run", ...])`), a later run took it, with the
        # environment of the earlier call (a user strategy's PYTHONPATH missing: every node failed).
        from p2pfl.hosting.warm import discard

        discard()


def _checked_and_run(args: argparse.Namespace, overrides: list[str]) -> int:
    fields_first(args.scenario, overrides)
    # The node processes' parent imports what nodes import while the launcher checks the rest.
    warm_up_for(args.scenario, overrides, getattr(args, "own_process", False))
    from p2pfl.scenario.launcher import all_of, run_scenario

    views = []
    if args.dashboard is not None:  # the report layer (and its plotting) only when asked for
        from p2pfl.report.dashboard import live_dashboard

        views.append(live_dashboard(args.dashboard))
    if args.tensorboard is not None:
        from p2pfl.report.tensorboard import live_tensorboard

        views.append(live_tensorboard(None if args.tensorboard is True else args.tensorboard))
    _, code = run_scenario(args.scenario, args.out, overrides, progress=not args.no_progress,
                           timeout_s=args.timeout, force=args.force, resume=args.resume, live_view=all_of(views))
    if (args.out / "received").is_dir() and code == 0:  # runtime.audit: the scenario asked for an audit
        from p2pfl.audit.command import audit_command

        audit_command(args.out, None)
    # Only at a terminal, where Ctrl-C ends it: started from a script (`&`, where SIGINT is
    # ignored) the page would be served for ever after its run.
    if args.dashboard is not None and not args.no_linger and sys.stdin.isatty():
        _serve_after_run(args.out, args.dashboard)
    return code


def _serve_after_run(out: Path, port: int) -> None:
    """The finished run's page stays up until Ctrl-C (or SIGTERM), which then ends only this
    serving: the command still exits with the run's status."""
    from p2pfl.report.dashboard import serve_dashboard

    try:
        serve_dashboard(out, port=port, after_run=True)
    except KeyboardInterrupt:
        print("dashboard stopped", file=sys.stderr)
