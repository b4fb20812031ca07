"""Markdown tables across the runs of a compare folder, or across several compare folders.

`p2pfl report` writes these next to its plots so that the docs' numbers are copied from files
that a command produced, never typed in:

* `relevance.md`: how well each relevance-keeping row (pFedSV, FedFomo) recovers the
  partition's ground truth, per round, mean (std) over seeds;
* `lambda_self.md`, `self_weight.md`: the weight a node gives its own model, per round
  (FedC2I's λ self-weight; pFedSV's and FedFomo's own weight);
* `gamma.md`: the γ FedC2I's nodes chose on validation data (`gamma = "auto"`), per round;
* `safeguard_weight.md`, `safeguard_kept_own.md`: the aggregate's weight in the model the
  safeguard kept, and the share of nodes that kept their own model, per round;
* `safeguard_levels.md`: for rows with `algorithm.safeguard = "local"`, what the last round's
  deployed models would have scored at other test levels, decided again from the recorded
  validation evidence (no training);
* `communication.md`: parameter bytes downloaded per round and in total, and the mean
  dynamic k per round, per row;
* `trust_ranking.md` (runs with an [attack]): at how many honest nodes an attacker is the least
  trusted peer, by the strategy's scores and by conduct (`p2pfl.scenario.trust`);
* `held_out.md` (several compare folders, one per held-out domain): the global model's
  accuracy on each held-out domain per row, and the average over domains.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from p2pfl.report.trust_figures import attacker_rank_table
from p2pfl.runtime.run_folder import RunFolder, compare_row_runs
from p2pfl.core.evidence import evidence_z, prefer_federated
from p2pfl.core.paired import holm_corrected, paired_difference

RELEVANCE_METRICS = ("precision", "recall", "precision_at_k", "spearman")
SAFEGUARD_LEVELS = (0.01, 0.05, 0.1, 0.2, 0.3, 0.5)


def _row_runs(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """Row label -> results.json of each seed, in the order compare.json lists the rows."""
    return {label: [json.loads(RunFolder(run).results.read_text()) for run in runs if RunFolder(run).results.is_file()]
            for label, runs in compare_row_runs(folder).items()}


def _finite(values: Iterable[Any]) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and v == v]


def mean_std(values: Iterable[Any], scale: float = 1.0, digits: int = 2) -> str:
    """`mean (std)` over the finite values, population std; `-` when there are none."""
    vals = [v * scale for v in _finite(values)]
    if not vals:
        return "-"
    std = statistics.pstdev(vals) if len(vals) > 1 else 0.0
    return f"{statistics.fmean(vals):.{digits}f} ({std:.{digits}f})"


def _markdown(head: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def relevance_table(runs: Mapping[str, list[dict[str, Any]]]) -> str | None:
    """Per row and round: precision, recall, precision@k and Spearman ρ of the relevance vector."""
    body = []
    for label, results in runs.items():
        scored = [r["relevance_scores"] for r in results if r.get("relevance_scores")]
        if not scored:
            continue
        by_round: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for scores in scored:
            for entry in scores["per_round"]:
                for metric in RELEVANCE_METRICS:
                    by_round[entry["round"]][metric].append(entry.get(metric))
        for round_ in sorted(by_round):
            body.append([label, str(round_)] + [mean_std(by_round[round_][m]) for m in RELEVANCE_METRICS])
    if not body:
        return None
    return _markdown(["row", "round", *RELEVANCE_METRICS], body)


def communication_table(runs: Mapping[str, list[dict[str, Any]]]) -> str:
    """Parameter MiB downloaded by all nodes per round and in total, and per round the mean number
    of peers a node read: pFedSV's dynamic k where the strategy records one, else the peers whose
    parts arrived (a top-k sparse row reads all its neighbours, each part thinned)."""
    rounds = sorted({r["round"] for results in runs.values() for res in results for n in res["nodes"] for r in n["rounds"]})
    head = ["row", "total param MiB", *[f"r{r} MiB" for r in rounds], "mean peers read per round (k)"]
    body = []
    for label, results in runs.items():
        per_round: dict[int, list[float]] = defaultdict(list)
        k_by_round: dict[int, list[float]] = defaultdict(list)
        totals = []
        for res in results:
            received: dict[int, float] = defaultdict(float)
            for n in res["nodes"]:
                for r in n["rounds"]:
                    received[r["round"]] += r["param_bytes_received"] / 2**20
                    k = r.get("strategy", {}).get("k")
                    if not isinstance(k, (int, float)) and isinstance(r.get("arrived"), list) and r.get("asked"):
                        k = len(r["arrived"])
                    if isinstance(k, (int, float)):
                        k_by_round[r["round"]].append(k)
            for round_, mib in received.items():
                per_round[round_].append(mib)
            totals.append(sum(received.values()))
        ks = " ".join(f"{statistics.fmean(k_by_round[r]):.1f}" for r in rounds if k_by_round.get(r)) or "-"
        body.append([label, mean_std(totals, digits=1), *[mean_std(per_round.get(r, []), digits=1) for r in rounds], ks])
    return _markdown(head, body)


def record_table(runs: Mapping[str, list[dict[str, Any]]], key: str) -> str | None:
    """Per row and round: a per-round record `key` of the node (`safeguard_weight`) or of its
    strategy (FedC2I's `lambda_self`), mean over nodes (a flag counts 1 when set), then mean (std)
    over seeds; None when no row records it."""
    rounds = sorted({r["round"] for results in runs.values() for res in results for n in res["nodes"] for r in n["rounds"]})
    body = []
    for label, results in runs.items():
        per_round: dict[int, list[float]] = defaultdict(list)
        for res in results:
            by_round: dict[int, list[float]] = defaultdict(list)
            for n in res["nodes"]:
                for r in n["rounds"]:
                    by_round[r["round"]] += _finite([r[key] if key in r else r.get("strategy", {}).get(key)])
            for round_, values in by_round.items():
                if values:
                    per_round[round_].append(statistics.fmean(values))
        if per_round:
            body.append([label, *[mean_std(per_round.get(r, [])) for r in rounds]])
    if not body:
        return None
    return _markdown(["row", *[f"r{r}" for r in rounds]], body)


def deployed_at_level(record: Mapping[str, Any], level: float, aggregated: bool) -> tuple[float, bool]:
    """(test accuracy, federated deployed?) of the model that a node with `algorithm.safeguard =
    "local"` would have deployed in this round record at test `level`: the record holds both
    models' test scores and the validation evidence it was decided on, so any level can be judged
    again without training. At the run's own level this is the recorded `test_acc(_aggregated)`."""
    suffix = "" if aggregated else "_trained"
    wins, losses = record["safeguard_evidence" + suffix]
    federated = prefer_federated(wins, losses, z=evidence_z(level))
    if not federated:
        return record["test_acc_local"], False
    return record["test_acc_federated_aggregated" if aggregated else "test_acc_federated"], True


@dataclass(frozen=True)
class LevelOutcome:
    """One row at one level, per seed (last round): mean accuracy over nodes, the worst node's
    gap to its own Local model, and how many nodes deployed the federated model."""
    mean: list[float]
    worst: list[float]
    federated: list[int]
    nodes: int


def safeguard_levels(runs: Mapping[str, list[dict[str, Any]]], levels: Sequence[float] = SAFEGUARD_LEVELS
                     ) -> dict[str, dict[tuple[float, bool], LevelOutcome]]:
    """Row -> (level, after aggregation?) -> outcome, for the rows whose last rounds carry the
    safeguard's evidence (`"local"` runs made since it is recorded); other rows are left out."""
    out: dict[str, dict[tuple[float, bool], LevelOutcome]] = {}
    for label, results in runs.items():
        lasts = [[n["rounds"][-1] for n in res["nodes"] if n["rounds"]] for res in results]
        if not lasts or not all(last and all("safeguard_evidence" in r for r in last) for last in lasts):
            continue
        out[label] = {}
        for level in levels:
            for aggregated in (False, True):
                mean, worst, federated = [], [], []
                for last in lasts:
                    deployed = [deployed_at_level(r, level, aggregated) for r in last]
                    mean.append(statistics.fmean(acc for acc, _ in deployed))
                    worst.append(min(acc - r["test_acc_local"] for (acc, _), r in zip(deployed, last)))
                    federated.append(sum(fed for _, fed in deployed))
                out[label][level, aggregated] = LevelOutcome(mean, worst, federated, sum(len(last) for last in lasts))
    return out


def safeguard_level_table(outcomes: Mapping[str, Mapping[tuple[float, bool], LevelOutcome]]) -> str | None:
    """Per guarded row and level: mean accuracy and worst vs local under both protocols, % mean
    (std) over seeds, and the nodes that deploy the federated model (all seeds together)."""
    if not outcomes:
        return None
    body = []
    for label, by_level in outcomes.items():
        for level in sorted({lv for lv, _ in by_level}):
            trained, aggregated = by_level[level, False], by_level[level, True]
            body.append([label, f"{level:g}", mean_std(trained.mean, 100, 1), mean_std(aggregated.mean, 100, 1),
                         mean_std(trained.worst, 100, 1), mean_std(aggregated.worst, 100, 1),
                         f"{sum(trained.federated)} / {trained.nodes}, {sum(aggregated.federated)} / {aggregated.nodes}"])
    return _markdown(["row", "level", "after training %", "after aggregation %", "worst vs local",
                      "worst aggregated vs local", "federated deployed (trained, aggregated)"], body)


def held_out_table(folders: Sequence[Path]) -> str:
    """Rows × held-out domains: final held-out accuracy of the global model, % mean (std) over seeds.
    Where the folders name one `--reference` row, each other row's average over domains gets its
    paired difference against it over the seeds both ran, Holm-corrected over the table's rows."""
    columns: list[str] = []
    cells: dict[str, dict[str, dict[int, float]]] = defaultdict(dict)
    best: dict[str, dict[str, dict[int, float]]] = defaultdict(dict)
    references = set()
    for folder in folders:
        runs = _row_runs(folder)
        references.add(_compare_reference(folder))
        domain = None
        for label, results in runs.items():
            for res in results:
                domain = res["scenario"]["data"].get("held_out_domain") or domain
            key = domain or folder.name
            cells[label][key] = {res["scenario"]["seed"]: res["summary"].get("held_out_acc") for res in results}
            best[label][key] = {res["scenario"]["seed"]: res["summary"].get("held_out_acc_best") for res in results}
        columns.append(domain or folder.name)

    def per_seed_average(table: Mapping[str, Mapping[int, Any]]) -> dict[int, float]:
        # Over domains per seed first, so that the std is across seeds; seeds every domain ran.
        seeds = set.intersection(*(set(table.get(c, {})) for c in columns)) if columns else set()
        return {s: statistics.fmean(values) for s in sorted(seeds) if (values := _finite(table[c][s] for c in columns))}

    averages = {label: per_seed_average(cells[label]) for label in cells}
    reference = next(iter(references)) if len(references) == 1 else None
    tests = {} if reference not in averages else holm_corrected(
        {label: paired_difference(avg, averages[reference]) for label, avg in averages.items() if label != reference})
    body = []
    for label in cells:
        per_domain = [mean_std(cells[label].get(c, {}).values(), scale=100, digits=1) for c in columns]
        row = [label, *per_domain, mean_std(averages[label].values(), scale=100, digits=1),
               mean_std(per_seed_average(best[label]).values(), scale=100, digits=1)]
        body.append(row + ([tests[label].cell() if label in tests else "–"] if tests else []))
    head = ["row", *columns, "avg (final round)", "avg (best round)"]
    return _markdown(head + ([f"avg − {reference}, paired over seeds (Holm over the rows)"] if tests else []), body)


def _compare_reference(folder: Path) -> str | None:
    try:
        return json.loads((folder / "compare.json").read_text()).get("reference")
    except (OSError, ValueError):
        return None


def write_compare_tables(folder: Path, out: Path) -> list[Path]:
    runs = _row_runs(folder)
    paths = []
    relevance = relevance_table(runs)
    if relevance is not None:
        (out / "relevance.md").write_text(relevance + "\n")
        paths.append(out / "relevance.md")
    (out / "communication.md").write_text(communication_table(runs) + "\n")
    paths.append(out / "communication.md")
    for key in ("lambda_self", "self_weight", "gamma", "safeguard_weight", "safeguard_kept_own"):
        table = record_table(runs, key)
        if table is not None:
            (out / f"{key}.md").write_text(table + "\n")
            paths.append(out / f"{key}.md")
    levels = safeguard_level_table(safeguard_levels(runs))
    if levels is not None:
        (out / "safeguard_levels.md").write_text(levels + "\n")
        paths.append(out / "safeguard_levels.md")
    ranks = attacker_rank_table(runs)
    if ranks is not None:
        (out / "trust_ranking.md").write_text(ranks + "\n")
        paths.append(out / "trust_ranking.md")
    return paths


def _attack_of(results: Mapping[str, Any]) -> dict[str, Any] | None:
    attack = results["scenario"].get("attack")
    return attack if attack and attack.get("kind", "none") != "none" else None


def _honest_acc(results: Mapping[str, Any], attackers: set[int]) -> float | None:
    accs = _finite(n.get("final_test_acc") for i, n in enumerate(results["nodes"]) if i not in attackers)
    return statistics.fmean(accs) if accs else None


def _stop_rounds(results: Mapping[str, Any], attackers: set[int]) -> tuple[int, float]:
    """(latest, fraction): the round from which every honest node stopped taking an attacker's
    model (one past the last round any of them took one; 1 if none ever did), and the share of
    honest nodes that still took one in the last round."""
    ids = {results["nodes"][i]["id"] for i in attackers}
    honest = [n for i, n in enumerate(results["nodes"]) if i not in attackers]
    last_taken = [max((r["round"] for r in n["rounds"] if ids & set(r.get("arrived", []))), default=0) for n in honest]
    final = max((r["round"] for n in honest for r in n["rounds"]), default=0)
    still = sum(1 for last in last_taken if last == final and final > 0)
    return max(last_taken, default=0) + 1, still / max(len(honest), 1)


def poisoning_table(folders: Sequence[Path]) -> str:
    """Attacked against attack-free compare folders of one scenario: honest nodes' accuracy, and
    when they stopped downloading the attacker (pFedSV's bound: ceil((n - m - 1) / k) + 1)."""
    attacked: dict[str, list[dict[str, Any]]] = {}
    clean: dict[str, list[dict[str, Any]]] = {}
    for folder in folders:
        for label, runs in _row_runs(Path(folder)).items():
            for results in runs:
                (attacked if _attack_of(results) else clean).setdefault(label, []).append(results)
    if not attacked:
        raise ValueError("none of these folders holds a run with an [attack]")
    spec = _attack_of(next(iter(attacked.values()))[0])
    assert spec is not None
    attackers = set(spec["nodes"])
    head = ["row", "attack", "honest acc, no attack", "honest acc, attacked",
            "change (pts), paired over seeds (Holm over the rows)",
            "stopped taking the attacker from round", "bound", "honest nodes taking it in the last round", "seeds"]

    def by_seed(runs: Sequence[Mapping[str, Any]]) -> dict[int, Any]:
        return {int(r["scenario"]["seed"]): _honest_acc(r, attackers) for r in runs}

    changes = holm_corrected({label: paired_difference(by_seed(runs), by_seed(clean.get(label, [])))
                              for label, runs in attacked.items()})
    rows = []
    for label, runs in attacked.items():
        base = [_honest_acc(r, attackers) for r in clean.get(label, [])]
        hit = [_honest_acc(r, attackers) for r in runs]
        stops = [_stop_rounds(r, attackers) for r in runs]
        scenario = runs[0]["scenario"]
        bound = "-"
        if scenario["algorithm"]["name"] == "pfedsv":
            k = scenario["algorithm"]["params"].get("k", 5)
            bound = str(-(-(scenario["nodes"] - len(attackers) - 1) // k) + 1)
        rows.append([
            label, f"{spec['kind']} x{spec.get('scale', 1.0):g}, nodes {sorted(attackers)}",
            mean_std(base, 100, 1), mean_std(hit, 100, 1), changes[label].cell(),
            f"{statistics.fmean(s[0] for s in stops):.1f} (max {max(s[0] for s in stops)})", bound,
            mean_std([s[1] for s in stops], 100, 0) + " %", str(len(runs)),
        ])
    return _markdown(head, rows)


def _honest_by_seed(folder: Path, attackers: set[int]) -> dict[str, dict[int, float]]:
    """Row label -> seed -> honest nodes' mean final accuracy, over a compare folder's runs."""
    out: dict[str, dict[int, float]] = {}
    for label, runs in _row_runs(folder).items():
        for results in runs:
            acc = _honest_acc(results, attackers)
            if acc is not None:
                out.setdefault(label, {})[int(results["scenario"]["seed"])] = acc
    return out


def poisoning_grid_table(clean: Mapping[float, Path], attacked: Mapping[str, Mapping[float, Path]]) -> str:
    """Each attack × each row, with the norm bound (factor c > 0) and without it (c = 0).

    `clean`: bound factor -> the attack-free compare folder; `attacked`: attack name -> bound
    factor -> its compare folder (same rows and seeds). Honest nodes' accuracy, mean (std) over
    seeds, and per attack the paired difference over seeds of the bounded, attacked run from the
    clean run as each method is printed (c = 0), and from the clean run under the same bound (the
    attack's own damage), each with its 95 % t interval; verdicts by the project's rule (at least
    5 seeds, Holm's correction over the table's tests)."""
    from p2pfl.core.paired import holm_corrected, paired_difference

    any_folder = next(iter(next(iter(attacked.values())).values()))
    spec = next((_attack_of(r) for runs in _row_runs(any_folder).values() for r in runs), None)
    if spec is None:
        raise ValueError(f"{any_folder} holds no run with an [attack]")
    attackers = set(spec["nodes"])
    bound = max(c for c in clean if c > 0)
    base = _honest_by_seed(clean[0.0], attackers)
    clean_bounded = _honest_by_seed(clean[bound], attackers)
    head = ["attack", "row", "clean, c = 0", f"clean, c = {bound:g}", "attacked, c = 0", f"attacked, c = {bound:g}",
            f"attacked c = {bound:g} − clean c = 0 (pts, 95 % interval)",
            f"attacked c = {bound:g} − clean c = {bound:g}", "seeds"]
    cells, tests = [], {}
    for attack, by_bound in attacked.items():
        without, with_bound = _honest_by_seed(by_bound[0.0], attackers), _honest_by_seed(by_bound[bound], attackers)
        for label in base:
            tests[f"{attack}/{label}/printed"] = paired_difference(with_bound.get(label, {}), base[label])
            tests[f"{attack}/{label}/bounded"] = paired_difference(with_bound.get(label, {}), clean_bounded.get(label, {}))
            cells.append((attack, label, [mean_std(base[label].values(), 100, 1),
                                          mean_std(clean_bounded.get(label, {}).values(), 100, 1),
                                          mean_std(without.get(label, {}).values(), 100, 1),
                                          mean_std(with_bound.get(label, {}).values(), 100, 1)]))
    tested = holm_corrected(tests)
    rows = [[attack, label, *means, tested[f"{attack}/{label}/printed"].cell(), tested[f"{attack}/{label}/bounded"].cell(),
             str(len(tested[f"{attack}/{label}/printed"].seeds))] for attack, label, means in cells]
    return _markdown(head, rows)
