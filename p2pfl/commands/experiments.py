"""The commands that make and read experiments: `compare` (rows × seeds, tabulated), `report`,
`export`, `dashboard`, `audit`, `data show` and `new` (a project folder that runs as written)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from p2pfl.commands.options import add_log_level, add_set, fields_first
from p2pfl.errors import ConfigError


def add(sub: Any) -> None:
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
    add_set(cmp_)
    add_log_level(cmp_)
    cmp_.set_defaults(handler=_compare, resume_hint=_compare_hint)

    dash = sub.add_parser("dashboard", help="serve a live view of a run or compare folder, running or finished")
    dash.add_argument("run", type=Path, help="a run folder, or a compare folder (its table and per-row curves)")
    dash.add_argument("--port", type=int, default=8050)
    dash.add_argument("--host", default="127.0.0.1", help="address to bind (default: this machine only)")
    dash.set_defaults(handler=_dashboard)

    audit = sub.add_parser("audit", help="attack the parts one node read during a run (membership inference, model "
                                         "and update inversion): RUN/audit.json and RUN/report/audit.png")
    audit.add_argument("run", type=Path)
    audit.add_argument("--node", default=None, help="the auditing node (default: the run's runtime.audit)")
    audit.add_argument("--members", type=int, default=500, help="at most this many training images challenged per peer")
    audit.add_argument("--inversion-peers", type=int, default=1, help="peers both inversions run on (default 1)")
    audit.add_argument("--seed", type=int, default=0)
    audit.set_defaults(handler=_audit)

    rep = sub.add_parser("report", help="plots and tables from run folders or compare folders")
    rep.add_argument("folders", type=Path, nargs="+",
                     help="run or compare folders; several compare folders (one per held-out domain) also "
                          "give a held-out table across them")
    rep.add_argument("--out", type=Path, default=None,
                     help="where the cross-folder table goes (default: the first folder's parent)")
    rep.set_defaults(handler=_report)

    export = sub.add_parser("export", help="a run folder's records in another tool's format")
    export.add_argument("run", type=Path)
    export.add_argument("--tensorboard", action="store_true", required=True,
                        help="TensorBoard scalars, one run per node and one for the mean (needs the tensorboard extra)")
    export.add_argument("--logdir", type=Path, default=None, help="where (default: RUN/tensorboard)")
    export.set_defaults(handler=_export)

    new = sub.add_parser("new", help="write a project folder (scenario, data, model, strategy) that runs as written")
    new.add_argument("name", help="the folder to create (letters, digits, '_', '-')")
    new.add_argument("--parent", type=Path, default=Path("."), help="where to create it (default: here)")
    new.set_defaults(handler=_new)

    data = sub.add_parser("data", help="inspect data and partitions")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    show = data_sub.add_parser("show", help="print a scenario's partition and save a picture")
    show.add_argument("scenario", type=Path)
    show.add_argument("--png", type=Path, default=None, help="save a picture of the partition there (none without it)")
    add_set(show)
    show.set_defaults(handler=_data_show)


def _compare_hint(args: argparse.Namespace) -> str:
    return f"; the runs that ended are kept in {args.out}: the same command with --reuse runs only the others"


def _compare(args: argparse.Namespace) -> int:
    fields_first(args.scenario, args.overrides)
    from p2pfl.scenario.compare import parse_algorithms, run_compare

    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    return run_compare(args.scenario, parse_algorithms(args.algorithms), seeds, args.out, args.overrides,
                       reuse=args.reuse, force=args.force, progress=not args.no_progress, reference=args.reference)


def _dashboard(args: argparse.Namespace) -> int:
    from p2pfl.report.dashboard import is_compare_folder, serve_dashboard

    if not (args.run / "scenario.json").is_file() and not is_compare_folder(args.run):
        raise ConfigError("run", f"{args.run} is neither a run folder (no scenario.json) nor a compare "
                                 "folder (no compare.json, no <row>/seed<N>/scenario.json)")
    serve_dashboard(args.run, args.host, args.port)
    return 0


def _audit(args: argparse.Namespace) -> int:
    from p2pfl.audit.command import audit_command
    from p2pfl.audit.run import AuditSettings

    audit_command(args.run, args.node, AuditSettings(members=args.members, inversion_peers=args.inversion_peers,
                                                     seed=args.seed))
    return 0


def _has_attack(folder: Path) -> bool:
    """A compare folder whose runs have an [attack] table (with a kind other than none)."""
    return any(json.loads(p.read_text())["scenario"].get("attack", {}).get("kind", "none") != "none"
               for p in folder.glob("*/seed*/results.json"))


def _report(args: argparse.Namespace) -> int:
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


def _export(args: argparse.Namespace) -> int:
    from p2pfl.report.tensorboard import export_tensorboard

    logdir = export_tensorboard(args.run, args.logdir)
    print(f"wrote {logdir}: tensorboard --logdir {logdir}")
    return 0


def _new(args: argparse.Namespace) -> int:
    from p2pfl.project import new_project

    folder = new_project(args.name, args.parent)
    print(f"wrote {folder}/: scenario.toml, data.py, model.py, strategy.py, README.md\n"
          f"run it: cd {folder} && p2pfl run scenario.toml --out runs/first")
    return 0


def _data_show(args: argparse.Namespace) -> int:
    from p2pfl.data import show
    from p2pfl.scenario.schema import load_scenario

    scenario = load_scenario(args.scenario, args.overrides)
    print(show(scenario.data, scenario.nodes, scenario.seed, args.png))
    if args.png is not None:
        print(f"picture: {args.png}")
    return 0
