"""The `p2pfl` command: run, node, coordinator, compare, report, data, lan, keygen, roster."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from p2pfl.errors import ConfigError
from p2pfl.logs import LEVELS, set_level
from p2pfl.runtime.stopping import Terminated, raise_terminated

EXIT_CONFIG = 2
EXIT_INTERRUPTED = 130  # as a shell reports a command stopped by Ctrl-C
NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # what a key file may be named after
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a command stopped by `kill`
TOGETHER_HELP = ("with --resume: every node of the federation resumes now (as `p2pfl run --resume` starts them): "
                 "replay from the checkpoint's round rather than rejoin where the neighbours' checkpoints are")


def _add_set(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a scenario field, e.g. --set rounds=5 --set algorithm.params.gamma=2")


def _version() -> str:
    try:
        return importlib.metadata.version("p2pfl-influence")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _add_log_level(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-level", choices=LEVELS, default=None, type=str.upper,
                   help="what node, worker and coordinator logs show (default INFO)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="p2pfl", description="Asynchronous peer-to-peer federated learning.")
    parser.add_argument("--version", action="version", version=f"p2pfl {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

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
    _add_set(run)
    _add_log_level(run)

    node = sub.add_parser("node", help="run one node from a node config (LAN deployment)")
    node.add_argument("config", type=Path)
    node.add_argument("--resume", action="store_true",
                      help="continue from the node's last checkpoint, in the round its neighbours are in if they "
                           "went on without it")
    node.add_argument("--together", action="store_true", help=TOGETHER_HELP)
    node.add_argument("--join", action="store_true",
                      help="join a federation that is already running: start from a neighbour's newest model, in "
                           "the round the neighbours are in")
    _add_log_level(node)

    worker = sub.add_parser("worker", help="run several nodes in this process (placement = \"shared\")")
    worker.add_argument("configs", type=Path, nargs="+")
    worker.add_argument("--resume", action="store_true", help="continue every node from its last checkpoint")
    worker.add_argument("--together", action="store_true", help=TOGETHER_HELP)
    _add_log_level(worker)

    forked = sub.add_parser("forked", help="run each node of CONFIG... in its own process, forked from this one after "
                                           "one import (placement = \"process\", start_method = \"fork\")")
    forked.add_argument("configs", type=Path, nargs="*")
    forked.add_argument("--wait", action="store_true",
                        help="import first, then take the configs as a JSON line on stdin (how `p2pfl run` starts it)")
    forked.add_argument("--resume", action="store_true", help="continue every node from its last checkpoint")
    forked.add_argument("--together", action="store_true", help=TOGETHER_HELP)
    _add_log_level(forked)

    coord = sub.add_parser("coordinator", help="run the optional coordinator from its config")
    coord.add_argument("config", type=Path)
    coord.add_argument("--resume", action="store_true", help="continue from the coordinator's last checkpoint")
    _add_log_level(coord)

    cmp_ = sub.add_parser("compare", help="run several algorithms over several seeds and tabulate")
    cmp_.add_argument("scenario", type=Path)
    cmp_.add_argument("--algorithms", required=True,
                      help="comma-separated; parameters in brackets: fedavg,fedc2i[gamma=1],fedc2i[variant=-lambda]; "
                           "a|b|c sweeps one parameter and keeps, per seed, the value with the best validation "
                           "accuracy: fedc2i[gamma=0.5|1|2|5|10]")
    cmp_.add_argument("--reference", default=None,
                      help="a row label: every other row gets its paired difference over seeds against it")
    cmp_.add_argument("--seeds", default="0", help="comma-separated seeds, e.g. 0,1,2")
    cmp_.add_argument("--out", type=Path, required=True)
    cmp_.add_argument("--reuse", action="store_true", help="take runs whose results.json already exists, and keep "
                                                               "the rows the --out folder already tabulates")
    cmp_.add_argument("--force", action="store_true", help="run every row again in an --out folder that holds runs, "
                                                               "replacing them")
    cmp_.add_argument("--no-progress", action="store_true")
    _add_set(cmp_)
    _add_log_level(cmp_)

    lan = sub.add_parser("lan", help="one admin's shortcut: every key, the roster and each node's config for a LAN")
    lan.add_argument("scenario", type=Path)
    lan.add_argument("--hosts", required=True, help="comma-separated host:port, one per node, in node order")
    lan.add_argument("--coordinator", default=None, help="host:port of the coordinator, for DI/GA")
    lan.add_argument("--out", type=Path, required=True)
    lan.add_argument("--force", action="store_true", help="replace the keys and configs already in --out (every host "
                                                          "then needs its new key)")
    _add_set(lan)

    keygen = sub.add_parser("keygen", help="make this host's private key and print its roster entry")
    keygen.add_argument("node_id", help='the node\'s id as the roster will list it (or "coordinator")')
    keygen.add_argument("--out", type=Path, required=True, help="folder for <node_id>.key (created, mode 0600)")
    keygen.add_argument("--url", default=None, help="how peers reach this node, e.g. http://192.0.2.10:9000")
    keygen.add_argument("--tls", action="store_true", help="add the certificate fingerprint (runtime.tls = true)")
    keygen.add_argument("--force", action="store_true", help="replace an existing key file")
    keygen.add_argument("--federation", action="store_true",
                        help="for a federation's member: no roster entry, the .pub file goes to the operator")

    roster = sub.add_parser("roster", help="the shared roster of a LAN deployment")
    roster_sub = roster.add_subparsers(dest="roster_command", required=True)
    check = roster_sub.add_parser("check", help="validate a roster and probe every host it lists")
    check.add_argument("roster", type=Path)
    check.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for each host (default 3)")
    check.add_argument("--no-probe", action="store_true", help="validate the file only")

    from p2pfl.runtime.federation.operator import add_parser as add_federation

    add_federation(sub)

    dash = sub.add_parser("dashboard", help="serve a live view of a run or compare folder, running or finished")
    dash.add_argument("run", type=Path, help="a run folder, or a compare folder (its table and per-row curves)")
    dash.add_argument("--port", type=int, default=8050)
    dash.add_argument("--host", default="127.0.0.1", help="address to bind (default: this machine only)")

    audit = sub.add_parser("audit", help="attack the parts one node read during a run (membership inference, model "
                                         "and update inversion): RUN/audit.json and RUN/report/audit.png")
    audit.add_argument("run", type=Path)
    audit.add_argument("--node", default=None, help="the auditing node (default: the run's runtime.audit)")
    audit.add_argument("--members", type=int, default=500, help="at most this many training images challenged per peer")
    audit.add_argument("--inversion-peers", type=int, default=1, help="peers both inversions run on (default 1)")
    audit.add_argument("--seed", type=int, default=0)

    rep = sub.add_parser("report", help="plots and tables from run folders or compare folders")
    rep.add_argument("folders", type=Path, nargs="+",
                     help="run or compare folders; several compare folders (one per held-out domain) also "
                          "give a held-out table across them")
    rep.add_argument("--out", type=Path, default=None,
                     help="where the cross-folder table goes (default: the first folder's parent)")

    export = sub.add_parser("export", help="a run folder's records in another tool's format")
    export.add_argument("run", type=Path)
    export.add_argument("--tensorboard", action="store_true", required=True,
                        help="TensorBoard scalars, one run per node and one for the mean (needs the tensorboard extra)")
    export.add_argument("--logdir", type=Path, default=None, help="where (default: RUN/tensorboard)")
    new = sub.add_parser("new", help="write a project folder (scenario, data, model, strategy) that runs as written")
    new.add_argument("name", help="the folder to create (letters, digits, '_', '-')")
    new.add_argument("--parent", type=Path, default=Path("."), help="where to create it (default: here)")
    data = sub.add_parser("data", help="inspect data and partitions")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    show = data_sub.add_parser("show", help="print a scenario's partition and save a picture")
    show.add_argument("scenario", type=Path)
    show.add_argument("--png", type=Path, default=None, help="save a picture of the partition there (none without it)")
    _add_set(show)
    return parser


def _has_attack(folder: Path) -> bool:
    """A compare folder whose runs have an [attack] table (with a kind other than none)."""
    import json

    return any(json.loads(p.read_text())["scenario"].get("attack", {}).get("kind", "none") != "none"
               for p in folder.glob("*/seed*/results.json"))


def _user_modules_from_here() -> None:
    """`"package.module:name"` in a scenario resolves from the folder the command runs in, as
    `python -m` would, for this process and every node process it starts."""
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if here not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([here, *paths])


# Bits no file p2pfl writes may grant, whatever the umask it was started under: a config, roster or
# scenario that others could rewrite would let them change whom a node trusts and what it runs.
NEVER_WRITABLE_BY_OTHERS = 0o022


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.umask(os.umask(0) | NEVER_WRITABLE_BY_OTHERS)  # a stricter umask is kept
    _user_modules_from_here()
    if getattr(args, "log_level", None):
        set_level(args.log_level)  # inherited by every process this command starts
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, raise_terminated) if on_main_thread else None
    try:
        return _dispatch(args)
    except ConfigError as exc:
        print(f"error in {exc.field}: {exc.message}", file=sys.stderr)
        return EXIT_CONFIG
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt as exc:
        print(f"{'stopped by SIGTERM' if isinstance(exc, Terminated) else 'interrupted'}{_resume_hint(args)}",
              file=sys.stderr)
        return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _serve_after_run(out: Path, port: int) -> None:
    """The finished run's page stays up until Ctrl-C (or SIGTERM), which then ends only this
    serving: the command still exits with the run's status."""
    from p2pfl.report.dashboard import serve_dashboard

    try:
        serve_dashboard(out, port=port, after_run=True)
    except KeyboardInterrupt:
        print("dashboard stopped", file=sys.stderr)


def _resume_hint(args: argparse.Namespace) -> str:
    if args.command in ("node", "coordinator"):
        return (f"; its rounds finished are checkpointed: p2pfl {args.command} {args.config} --resume goes on "
                "from there")
    out = getattr(args, "out", None)
    if out is None:
        return ""
    if args.command == "run":
        return (f"; every round a node finished is checkpointed in {out}: "
                f"p2pfl run {args.scenario} --out {out} --resume goes on from there "
                "(with the scenario the run started with: no --set again)")
    if args.command == "compare":
        return f"; the runs that ended are kept in {out}: the same command with --reuse runs only the others"
    return ""


def _fields_first(scenario: Path, overrides: list[str]) -> None:
    """Check the scenario's fields before the launcher loads torch: a typo is named in about a
    second (the schema checks every table torch-free first)."""
    from p2pfl.scenario.schema import load_scenario

    load_scenario(scenario, overrides)


def _keygen(args: argparse.Namespace) -> int:
    from p2pfl.runtime.peers import COORDINATOR_ID, PeerInfo, parse_peer
    from p2pfl.runtime.roster import entry_toml
    from p2pfl.runtime.tls import fingerprint
    from p2pfl.wire import NodeKey

    if not NODE_ID.fullmatch(args.node_id):
        raise ConfigError("node_id", f"{args.node_id!r} is not a node id: letters, digits, '.', '_' and '-', "
                                     "starting with a letter or digit (it names the key file inside --out)")
    if args.out.exists() and not args.out.is_dir():
        raise ConfigError("--out", f"{args.out} is a file; name the folder the key goes into")
    path = args.out / f"{args.node_id}.key"
    if path.exists() and not args.force:
        raise ConfigError("--out", f"{path} exists; a new key would orphan the roster's entry (pass --force to replace it)")
    args.out.mkdir(parents=True, exist_ok=True)
    key = NodeKey.generate()
    url = args.url or ("https" if args.tls else "http") + "://HOST:PORT"
    if args.url is not None:
        parse_peer({"url": url, "public_key": key.public_hex}, "--url")
    key.save(path)
    path.with_suffix(".pub").write_text(key.public_hex + "\n")  # for `p2pfl federation admit`
    print(f"# private key: {path} (mode 600; it never leaves this host); public key: {path.with_suffix('.pub')}",
          file=sys.stderr)
    if args.federation:  # admission is by certificate: nobody keeps a roster
        print(f"give {path.with_suffix('.pub')} to the federation's operator: p2pfl federation admit "
              f"{path.with_suffix('.pub')} --id {args.node_id} --dir FED --out {args.node_id}.cert")
        return 0
    info = PeerInfo(url, key.public_hex, fingerprint(key, args.node_id) if args.tls else None)
    if args.url is None:
        print("# replace HOST:PORT with the address peers reach this host at", file=sys.stderr)
    if args.node_id == COORDINATOR_ID:
        import tomli_w

        print("[coordinator]\n" + tomli_w.dumps(info.to_dict()), end="")
    else:
        print(entry_toml(args.node_id, info), end="")
    return 0


def _roster_check(args: argparse.Namespace) -> int:
    from p2pfl.runtime.roster import load_roster, probe_roster

    roster = load_roster(args.roster)
    extra = " and a coordinator" if roster.coordinator is not None else ""
    print(f"{args.roster}: {len(roster.nodes)} nodes{extra}; ids, addresses and keys are valid and distinct")
    if args.no_probe:
        return 0
    probes = probe_roster(roster, args.timeout)
    width = max(len(p.id) for p in probes)
    for p in probes:
        state = "ok" if p.reachable else "UNREACHABLE"
        print(f"  {p.id:<{width}}  {p.url:<32} {state:<11} {p.detail} ({p.seconds * 1000:.0f} ms)")
    down = [p.id for p in probes if not p.reachable]
    if down:
        print(f"{len(down)} of {len(probes)} hosts unreachable: {', '.join(down)} "
              "(not started yet, a firewall, or a wrong address)", file=sys.stderr)
        return 1
    return 0


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "run":
        if args.force and args.resume:
            raise ConfigError("--resume", "--force replaces the run that --resume would continue; pass one of them")
        overrides = list(args.overrides)
        if args.ray is not None:
            overrides += ['runtime.placement="ray"', f"runtime.ray_address={json.dumps(args.ray)}"]
        if args.audit is not None:
            from p2pfl.audit.command import audit_override

            overrides.append(audit_override(args.scenario, overrides, args.audit))
        from p2pfl.hosting.warm import warm_up_for

        warm_up_for(args.scenario, overrides)  # the node processes' parent imports while the fields are checked
        _fields_first(args.scenario, overrides)
        from p2pfl.scenario.launcher import all_of, run_scenario

        views = []
        if args.dashboard is not None:  # the report layer (and its plotting) only when asked for
            from p2pfl.report.dashboard import live_dashboard

            views.append(live_dashboard(args.dashboard))
        if args.tensorboard is not None:
            from p2pfl.report.tensorboard import live_tensorboard

            views.append(live_tensorboard(None if args.tensorboard is True else args.tensorboard))
        live_view = all_of(views)
        _, code = run_scenario(args.scenario, args.out, overrides, progress=not args.no_progress,
                               timeout_s=args.timeout, force=args.force, resume=args.resume, live_view=live_view)
        if (args.out / "received").is_dir() and code == 0:  # runtime.audit: the scenario asked for an audit
            from p2pfl.audit.command import audit_command

            audit_command(args.out, None)
        # Only at a terminal, where Ctrl-C ends it: started from a script (`&`, where SIGINT is
        # ignored) the page would be served for ever after its run.
        if args.dashboard is not None and not args.no_linger and sys.stdin.isatty():
            _serve_after_run(args.out, args.dashboard)
        return code
    if args.command == "dashboard":
        from p2pfl.report.dashboard import is_compare_folder, serve_dashboard

        if not (args.run / "scenario.json").is_file() and not is_compare_folder(args.run):
            raise ConfigError("run", f"{args.run} is neither a run folder (no scenario.json) nor a compare "
                                     "folder (no compare.json, no <row>/seed<N>/scenario.json)")
        serve_dashboard(args.run, args.host, args.port)
        return 0
    if args.command == "node":
        from p2pfl.runtime.config import load_node_config
        from p2pfl.assembly import run_node

        if args.join and args.resume:
            raise ConfigError("--join", "--resume goes on from this node's own checkpoint, --join from a neighbour's "
                                        "model; pass one of them")
        if args.together and not args.resume:
            raise ConfigError("--together", "it says how a --resume goes on; pass --resume with it")
        return run_node(load_node_config(args.config), resume=args.resume, together=args.together, join=args.join)
    if args.command == "worker":
        from p2pfl.assembly import run_worker

        if args.together and not args.resume:
            raise ConfigError("--together", "it says how a --resume goes on; pass --resume with it")
        return run_worker(args.configs, resume=args.resume, together=args.together)
    if args.command == "forked":
        from p2pfl.forked import run_forked, run_forked_when_told

        def node(path: Path, resume: bool = args.resume, together: bool = args.together) -> int:
            """A forked child: `p2pfl node CONFIG`, so a stop is one line and an exit status as there."""
            return main(["node", str(path), *(["--resume"] if resume else []), *(["--together"] if together else [])])

        if args.wait:
            return run_forked_when_told(lambda path, resume: node(path, resume, resume))
        if not args.configs:
            raise ConfigError("configs", "name the node configs to fork (or --wait for them on stdin)")
        return run_forked(args.configs, node)
    if args.command == "coordinator":
        from p2pfl.coordinator.service import run_coordinator
        from p2pfl.runtime.config import load_node_config

        return run_coordinator(load_node_config(args.config), resume=args.resume)
    if args.command == "compare":
        _fields_first(args.scenario, args.overrides)
        from p2pfl.scenario.compare import parse_algorithms, run_compare

        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        return run_compare(args.scenario, parse_algorithms(args.algorithms), seeds, args.out, args.overrides,
                           reuse=args.reuse, force=args.force, progress=not args.no_progress,
                           reference=args.reference)
    if args.command == "lan":
        from p2pfl.scenario.launcher import write_lan_configs

        hosts = [h.strip() for h in args.hosts.split(",") if h.strip()]
        paths = write_lan_configs(args.scenario, hosts, args.out, args.coordinator, args.overrides, force=args.force)
        print(f"roster: {args.out / 'roster.toml'} (check it with: p2pfl roster check {args.out / 'roster.toml'})")
        for path in paths:
            print(f"p2pfl {'coordinator' if path.stem == 'coordinator' else 'node'} {path}")
        return 0
    if args.command == "export":
        from p2pfl.report.tensorboard import export_tensorboard

        logdir = export_tensorboard(args.run, args.logdir)
        print(f"wrote {logdir}: tensorboard --logdir {logdir}")
        return 0
    if args.command == "new":
        from p2pfl.project import new_project

        folder = new_project(args.name, args.parent)
        print(f"wrote {folder}/: scenario.toml, data.py, model.py, strategy.py, README.md\n"
              f"run it: cd {folder} && p2pfl run scenario.toml --out runs/first")
        return 0
    if args.command == "keygen":
        return _keygen(args)
    if args.command == "roster":
        return _roster_check(args)
    if args.command == "federation":
        from p2pfl.runtime.federation.operator import main as federation_main

        return federation_main(args)
    if args.command == "audit":
        from p2pfl.audit.command import audit_command
        from p2pfl.audit.run import AuditSettings

        audit_command(args.run, args.node, AuditSettings(members=args.members, inversion_peers=args.inversion_peers,
                                                         seed=args.seed))
        return 0
    if args.command == "report":
        from p2pfl.report import make_report, report_held_out, report_poisoning

        for folder in args.folders:
            for path in make_report(folder):
                print(path)
        if len(args.folders) > 1:
            out = args.out or args.folders[0].parent
            if any(_has_attack(f) for f in args.folders):
                print(report_poisoning(args.folders, out))
            else:
                print(report_held_out(args.folders, out))
        return 0
    if args.command == "data":
        from p2pfl.data import show
        from p2pfl.scenario.schema import load_scenario

        scenario = load_scenario(args.scenario, args.overrides)
        print(show(scenario.data, scenario.nodes, scenario.seed, args.png))
        if args.png is not None:
            print(f"picture: {args.png}")
        return 0
    raise AssertionError(args.command)
