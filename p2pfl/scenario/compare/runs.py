"""`p2pfl compare`: every row over every seed, run (or with `--reuse`, taken from the run folders
already there, refused where they were made with another scenario or on other data), then
compare.json and compare.md.

A row may sweep one hyperparameter, `fedc2i[gamma=0.5|1|2|5|10]`: every value runs as its own
row (`fedc2i[gamma=0.5]`, ...), and for each seed the value with the best mean validation
accuracy over nodes (final round, after training) stands for the row, as the papers choose
theirs; the test split never chooses. With `reference`, each row gets its paired difference
over seeds against that row (`p2pfl.core.paired`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from p2pfl.errors import ConfigError
from p2pfl.runtime.run_folder import RunFolder, compare_run
from p2pfl.scenario.compare.rows import Row, parse_algorithms, row_raw
from p2pfl.scenario.compare.table import choose_on_validation, chosen_values, format_table, summarize_run, sweep_table
from p2pfl.scenario.results import degraded_warning, download_health, download_warning, refusal_warning, refused_peers
from p2pfl.scenario.schema import Scenario, apply_overrides, read_raw, scenario_differences, scenario_from_dict


PLAN_FILE = "plan.json"  # the runs a compare call is making: row -> run folders (the dashboard's progress)


# How many processes host the nodes: it changes a run's wall, not what its nodes compute, so a
# run made on a machine with more cores is reused (its results.json keeps the value it had).
HOSTING_ONLY = frozenset({"runtime.workers"})


def _stored_run(run_dir: Path, scenario: Scenario, label: str) -> dict[str, Any] | None:
    """The results.json `--reuse` takes for one run, or None where there is none or where a node
    of it failed (a run cut short runs again); a run of another scenario, or made on other data,
    is refused (ConfigError on `--reuse`)."""
    from p2pfl.scenario.results import scenario_data_fingerprint

    if not RunFolder(run_dir).results.is_file():
        return None
    stored = json.loads(RunFolder(run_dir).results.read_text())
    summary = stored.get("summary") or {}
    failed = (summary.get("nodes_failed") or []) + (summary.get("nodes_stopped") or [])
    if failed:
        print(f"{label}: {run_dir} has failed nodes ({', '.join(failed[:3])}{', …' if len(failed) > 3 else ''}); "
              "running it again", file=sys.stderr)
        return None
    differ = [f for f in scenario_differences(stored.get("scenario") or {}, scenario) if f not in HOSTING_ONLY]
    if differ:
        raise ConfigError("--reuse", f"{run_dir} was run with another scenario than row {label!r} "
                                     f"asks for ({', '.join(differ[:5])} differ); move it away or pick "
                                     "another --out")
    made_on, here = stored.get("data_fingerprint"), scenario_data_fingerprint(scenario)
    if made_on is not None and made_on != here:  # older runs carry none: nothing to check
        raise ConfigError("--reuse", f"{run_dir} was run on other data than this machine makes ({made_on} "
                                     f"there, {here} here: synth depends on the Pillow and matplotlib versions and on "
                                     "the fonts $P2PFL_FONT_DIRS adds); install the pinned versions, or run it again")
    return stored


def _row_scenario(base: Mapping[str, Any], row: Row, seed: int, scenario_path: Path) -> Scenario:
    raw = row_raw(base, row)
    raw["seed"] = seed
    return scenario_from_dict(raw, source=str(scenario_path))


def earlier_overrides(out: Path) -> dict[str, list[str]]:
    """Per row out/compare.json lists, the `--set` overrides its runs were made with. A listing
    written before rows kept their own holds the overrides of the call that wrote it, and every
    row it kept matched them then."""
    listing = out / "compare.json"
    if not listing.is_file():
        return {}
    document = json.loads(listing.read_text())
    common = list(document.get("overrides", []))
    per_row = document.get("row_overrides", {})
    return {label: list(per_row.get(label, common)) for label in document.get("rows", {})}


def earlier_rows(out: Path, scenario_path: Path, seeds: Sequence[int],
                 asked: Sequence[str]) -> dict[str, list[dict[str, Any]] | None]:
    """The rows out/compare.json lists, in its order: those this call asks for map to None
    (this call fills them in), the others to their summaries where every seed's run is there and
    still matches the scenario with the overrides that row was made with (`earlier_overrides`:
    one folder gathers rows made by several calls, each with its own `--set`, such as
    Client2Vec's rows that read an index another row built). Rows that no longer match are left
    out, saying why."""
    kept: dict[str, list[dict[str, Any]] | None] = {}
    raw = read_raw(scenario_path)
    for label, overrides in earlier_overrides(out).items():
        if label in asked:
            kept[label] = None
            continue
        try:
            (row,) = parse_algorithms(label)
            base = apply_overrides(raw, overrides)
            stored = {candidate.label: [_stored_run(compare_run(out, candidate.label, seed),
                                                    _row_scenario(base, candidate, seed, scenario_path), label)
                                        for seed in seeds] for candidate in row.runs()}
        except (ConfigError, ValueError) as exc:
            print(f"compare.md leaves out the earlier row {label!r}: {exc}", file=sys.stderr)
            continue
        missing = sorted({seed for runs in stored.values() for seed, run in zip(seeds, runs) if run is None})
        if missing:
            print(f"compare.md leaves out the earlier row {label!r}: no run for seed(s) "
                  f"{', '.join(map(str, missing))}", file=sys.stderr)
            continue
        summaries = {candidate: [summarize_run(run) for run in runs if run is not None] for candidate, runs in stored.items()}
        if row.candidates:
            try:
                kept[label] = choose_on_validation(row, summaries)[0]
            except ConfigError as exc:
                print(f"compare.md leaves out the earlier row {label!r}: {exc}", file=sys.stderr)
        else:
            kept[label] = summaries[label]
    return kept


def table_order(asked: Sequence[str], earlier: Sequence[str]) -> list[str]:
    """The rows asked for in their order, each earlier row not asked for put back right after
    the row it followed in `earlier` (first if it came first)."""
    order, previous = list(asked), None
    for label in earlier:
        if label not in order:
            order.insert(0 if previous is None else order.index(previous) + 1, label)
        previous = label
    return order


def check_out_folder(out: Path, *, reuse: bool, force: bool) -> None:
    """ConfigError on `--out` where it names a file, or a folder holding runs while neither
    `--reuse` nor `--force` says what to do with them."""
    if reuse and force:
        raise ConfigError("--force", "--force runs again what --reuse would take; pass one of them")
    if out.exists() and not out.is_dir():
        raise ConfigError("--out", f"{out} is a file; name a folder for the comparison")
    if reuse or force or not out.is_dir():
        return
    held = next(out.glob("*/*/results.json"), None) or (out / "compare.json" if (out / "compare.json").is_file() else None)
    if held is not None:
        raise ConfigError("--out", f"{out} holds runs of an earlier comparison ({held}); pass --reuse to take them "
                                   "and run only what is missing, or --force to run everything again, replacing them")


def run_compare(scenario_path: Path, rows: list[Row], seeds: list[int], out: Path, overrides: Sequence[str] = (),
                *, reuse: bool = False, force: bool = False, progress: bool = True,
                reference: str | None = None) -> int:
    """Run (or with `reuse`, take) every row over every seed and write compare.json and
    compare.md. A sweep row runs each of its values and stands for the one validation chooses
    per seed. With `reuse` the table also keeps the rows earlier calls put in `out` (see
    `earlier_rows`): this call's rows in its order, each earlier row back after the row it
    followed before. `reference` names the row every other row's paired difference is taken
    against. A folder that holds runs is refused unless `reuse` takes them or `force` runs them
    again, as `p2pfl run` refuses an existing run without `--force`."""
    from p2pfl.scenario.launcher import run_loaded

    check_out_folder(out, reuse=reuse, force=force)
    base = apply_overrides(read_raw(scenario_path), overrides)
    if reference is not None and reference not in [row.label for row in rows]:
        earlier_labels = list(json.loads((out / "compare.json").read_text()).get("rows", {})) \
            if reuse and (out / "compare.json").is_file() else []
        if reference not in earlier_labels:
            raise ConfigError("--reference", f"{reference!r} is not one of the rows: "
                                             + ", ".join([row.label for row in rows] + earlier_labels))
    # Validate every run, and every run --reuse would take, before the first run starts; a run
    # two rows need (a sweep's value asked for as a row of its own too) runs once.
    plans: dict[Path, tuple[Row, int, Scenario, dict[str, Any] | None]] = {}
    for row in rows:
        for candidate in row.runs():
            for seed in seeds:
                run_dir = compare_run(out, candidate.label, seed)
                if run_dir in plans:
                    continue
                scenario = _row_scenario(base, candidate, seed, scenario_path)
                stored = _stored_run(run_dir, scenario, candidate.label) if reuse else None
                plans[run_dir] = (candidate, seed, scenario, stored)
    earlier = earlier_rows(out, scenario_path, seeds, [row.label for row in rows]) if reuse else {}
    made_with = earlier_overrides(out) if reuse else {}
    out.mkdir(parents=True, exist_ok=True)
    # What this call will run, for a live view of the folder (compare.json comes at the end).
    planned: dict[str, list[str]] = {}
    for run_dir, (row, _, _, _) in plans.items():
        planned.setdefault(row.label, []).append(str(run_dir.relative_to(out)))
    (out / PLAN_FILE).write_text(json.dumps({"scenario": str(scenario_path), "overrides": list(overrides),
                                             "runs": planned}, indent=1))
    runs: dict[str, list[dict[str, Any]]] = {}
    failures = 0
    for run_dir, (row, seed, scenario, stored) in plans.items():
        if stored is not None:
            results, code = stored, 0 if not stored["summary"]["nodes_failed"] else 1
        else:
            results, code = run_loaded(scenario, run_dir, progress=progress, quiet=True, force=True)
        failures += code != 0
        runs.setdefault(row.label, []).append(summarize_run(results))
        s = runs[row.label][-1]
        print(f"{row.label} seed {seed}: acc {100 * s['final']:.1f} % (aggregated {100 * s['final_aggregated']:.1f} %), "
              f"{s['total_bytes'] / 2**20:.1f} MiB, {s['wall_s']:.0f} s" + ("" if code == 0 else "  [FAILED NODES]"),
              file=sys.stderr)
        for warning in (download_warning(download_health(results["nodes"])),
                        refusal_warning(refused_peers(results["nodes"])),
                        degraded_warning((results["summary"].get("nodes_degraded") or {}))):
            if warning is not None:
                print(f"{row.label} seed {seed}: {warning}", file=sys.stderr)
    summaries: dict[str, list[dict[str, Any]]] = {}
    sweeps = []
    for row in rows:
        if row.candidates:
            summaries[row.label], picks = choose_on_validation(row, runs)
            sweeps.append(sweep_table(row, runs, picks))
        else:
            summaries[row.label] = runs[row.label]
    summaries = {label: summaries[label] if earlier.get(label) is None else earlier[label]
                 for label in table_order(list(summaries), list(earlier))}
    table = "\n\n".join([format_table(summaries, reference=reference), *sweeps])
    asked = [row.label for row in rows]
    row_overrides = {label: list(overrides) if label in asked else made_with[label] for label in summaries}
    (out / "compare.json").write_text(json.dumps({"scenario": str(scenario_path), "seeds": seeds,
                                                  "overrides": list(overrides), "row_overrides": row_overrides,
                                                  "reference": reference, "chosen": chosen_values(summaries),
                                                  "rows": summaries}, indent=1))
    (out / "compare.md").write_text(table + "\n")
    print(table)
    return 1 if failures else 0
