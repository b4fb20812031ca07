"""A live view of a run folder, or of a `compare` folder, in the browser: `p2pfl run ...
--dashboard [PORT]` or `p2pfl dashboard FOLDER`.

The page (`dashboard.html`) draws with Plotly, whose `plotly.min.js` is served from the plotly
package itself (the `[dashboard]` extra): no CDN, nothing from the internet. It polls
`/api/state` once a second; the state is read from the folder as nodes write it: each round's
record (`nodes/<id>.rounds.jsonl`), results as nodes end, strategies' artefacts (influence,
relevance, affinity vectors) and the last lines of each node's log. It binds 127.0.0.1 unless
told otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import math
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web

from p2pfl.errors import ConfigError
from p2pfl.report.tensorboard import hook_scalars
from p2pfl.runtime.config import node_ids
from p2pfl.runtime.files import read_records
from p2pfl.runtime.node.records import TEST_ACC, TEST_ACC_AGGREGATED, accuracies
from p2pfl.runtime.run_folder import RunFolder, compare_row_runs, load_artefacts
from p2pfl.runtime.stopping import run_stoppable
from p2pfl.runtime.timing import PHASES
from p2pfl.runtime.transport.addresses import host_of
from p2pfl.scenario.deaths import read_death
from p2pfl.scenario.membership import EVENTS as MEMBERSHIP_EVENTS
from p2pfl.scenario.results import format_summary
from p2pfl.scenario.trust import run_trust, trust_places

# Artefacts saved as {"peers": [...], "values": [one number per peer]}: FedC2I's λ, pFedSV's
# relevance and Shapley values (own node included), FedFomo's affinity and weights.
HEATMAPS = ("lambda", "relevance", "shapley", "affinity", "fomo_weights")
# Where a heatmap's colour scale is centred: 0 means "neither helps nor hurts" for an influence,
# a relevance, a Shapley value and an affinity; FedFomo's weights are never negative (sequential).
HEATMAP_CENTRE: dict[str, float | None] = {"lambda": 0.0, "relevance": 0.0, "shapley": 0.0, "affinity": 0.0,
                                           "fomo_weights": None}
LOG_LINES = 8  # a node's last log lines in the page's log pane
# Past this many nodes the state leaves out each node's round list (the page's per-node lines stop
# there too: the band shows the spread) and the log pane lists the nodes that ended badly and the
# first LOG_NODES others: a 1000-node run's state stays a few hundred kB a second.
PER_NODE_MAX = 200
LOG_NODES = 50
STATE_REUSE = 4.0  # a state is served again until it is this many times its reading time old
_LOG_TAIL_BYTES = 16_384
_RUNNING = ("running", "starting")
ELSEWHERE = "on another host"  # a LAN node's folder: a node it holds nothing of
INSTALL_HINT = "the dashboard draws with Plotly: pip install 'p2pfl-influence[dashboard]'"


def plotly_bundle() -> bytes:
    """plotly.min.js from the installed plotly wheel (offline), or a ConfigError naming the extra."""
    try:
        return resources.files("plotly").joinpath("package_data", "plotly.min.js").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError):
        raise ConfigError("--dashboard", INSTALL_HINT) from None


def _finite(value: Any) -> float | None:
    """A number the page can draw, or None (NaN, ±Inf, a string, or anything a bad line holds)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _json_file(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):  # not there yet (written whole, so never half)
        return None
    return doc if isinstance(doc, dict) else None


def _phase_times(record: dict[str, Any]) -> dict[str, float]:
    times = record.get("time") if isinstance(record.get("time"), dict) else {}
    return {p: _finite(times.get(f"{p}_s")) or 0.0 for p in PHASES}


def _rounds(path: Path) -> list[dict[str, Any]]:
    """A node's round records, the last one per round (a resumed node writes rounds again)."""
    by_round: dict[int, dict[str, Any]] = {}
    for record in read_records(path, ("round",)):  # skips a line being written now, or left by a kill
        if type(record["round"]) is int:
            by_round[record["round"]] = record
    return [by_round[r] for r in sorted(by_round)]


def log_tail(path: Path, lines: int = LOG_LINES) -> list[str]:
    """The last `lines` lines of a log (read from its end: logs of long runs are large)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - _LOG_TAIL_BYTES))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    tail = text.splitlines()
    if size > _LOG_TAIL_BYTES:
        tail = tail[1:]  # the first line read is cut
    return [line for line in tail if line.strip()][-lines:]


def estimate_eta(done: int, total: int, elapsed_s: float | None) -> float | None:
    """Seconds left at the pace so far (node-rounds per second), or None before the first round."""
    if done <= 0 or elapsed_s is None or elapsed_s <= 0:
        return None
    return max(0.0, (total - done) * elapsed_s / done)


def _band(values: Iterable[float | None]) -> dict[str, float] | None:
    """Mean, min and max of one round's values over nodes (None when no node has one)."""
    xs = [v for v in values if v is not None]
    if not xs:
        return None
    return {"mean": statistics.fmean(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def round_bands(nodes: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """Per round: mean over the nodes that recorded `key`, and the spread (min to max)."""
    by_round: dict[int, list[float | None]] = {}
    for node in nodes:
        for record in node["records"]:
            by_round.setdefault(record["round"], []).append(record.get(key))
    bands = []
    for r in sorted(by_round):
        band = _band(by_round[r])
        if band is not None:
            bands.append({"round": r, **band})
    return bands


def _round_time(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per round, each phase's mean seconds over the nodes that ended it."""
    by_round: dict[int, list[dict[str, float]]] = {}
    for node in nodes:
        for record in node["records"]:
            by_round.setdefault(record["round"], []).append(record["time"])
    return [{"round": r, **{p: statistics.fmean(t[p] for t in times) for p in PHASES}}
            for r, times in sorted(by_round.items())]


def _heatmaps(run_dir: Path, ids: list[str]) -> dict[str, Any]:
    artefacts = load_artefacts(run_dir)
    index = {nid: i for i, nid in enumerate(ids)}
    heatmaps = {}
    for name in HEATMAPS:
        if name not in artefacts:
            continue
        matrix: list[list[float | None]] = [[None] * len(ids) for _ in ids]
        latest_round = 0
        for node, by_round in artefacts[name].items():
            latest = by_round[max(by_round)] if by_round else None
            if node in index and isinstance(latest, dict) and isinstance(latest.get("peers"), list) \
                    and isinstance(latest.get("values"), list):
                latest_round = max(latest_round, max(by_round))
                for peer, value in zip(latest["peers"], latest["values"]):
                    if isinstance(peer, str) and peer in index:
                        matrix[index[node]][index[peer]] = _finite(value)
        heatmaps[name] = {"ids": ids, "matrix": matrix, "centre": HEATMAP_CENTRE[name], "round": latest_round}
    return heatmaps


def _membership(nodes: list[dict[str, Any]], rounds_total: int, per_node: bool,
                events: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A run with churn: how many nodes ran each round so far, and (few nodes) who: 1 ran it, 0 not,
    with each node's events (joined, left, crashed, restarted, revoked) where they happened."""
    ran = {n["id"]: {r["round"] for r in n["records"]} for n in nodes}
    last = max((max(rs) for rs in ran.values() if rs), default=0)
    out: dict[str, Any] = {"rounds": list(range(1, last + 1)),
                           "live": [sum(1 for rs in ran.values() if k in rs) for k in range(1, last + 1)],
                           "of": len(nodes), "total_rounds": rounds_total}
    if per_node:
        out["ids"] = list(ran)
        out["grid"] = [[1 if k in ran[nid] else 0 for k in range(1, last + 1)] for nid in ran]
        out["events"] = events or []
    return out


def _trust_heatmap(nodes: list[dict[str, Any]], ids: list[str]) -> dict[str, Any]:
    """Each node's place for each peer in its trust ranking so far (`p2pfl.scenario.trust`)."""
    trust = run_trust(nodes) if len(ids) <= PER_NODE_MAX else None
    if trust is None:
        return {}
    latest = max((r["round"] for n in nodes for r in n["rounds"]), default=0)
    return {"trust": {"ids": ids, "matrix": trust_places(trust, ids), "centre": None, "round": latest}}


def dashboard_state(run_dir: Path, now: float | None = None) -> dict[str, Any]:
    """What the page shows of a run folder, as it is now."""
    folder = RunFolder(run_dir)
    if not folder.scenario.is_file():
        return {"ready": False}
    scenario = json.loads(folder.scenario.read_text())
    named = node_ids(scenario["nodes"])
    ids = folder.ids_here(named)  # a federation member's folder: its own name
    rounds_total = scenario["rounds"]
    nodes = []
    ended_walls: dict[str, float | None] = {}  # the nodes that wrote a result: their wall
    raw: list[dict[str, Any]] = []  # each node's round records as written, for the trust over the run
    events: list[dict[str, Any]] = []  # each node's membership events, for the membership grid
    per_node = len(ids) <= PER_NODE_MAX
    for nid in ids:
        rounds = _rounds(folder.node_rounds(nid))
        result = _json_file(folder.node_result(nid))
        if result:
            ended_walls[nid] = _finite(result.get("wall_s"))
        if not rounds and result:  # a node that kept no round log (a run from before it, or a Ray worker's)
            rounds = [r for r in result.get("rounds") or [] if isinstance(r, dict) and type(r.get("round")) is int]
        death = None if result else read_death(folder.root, nid)  # its process died and it was not resumed
        status = str(result.get("status")) if result else "crashed" if death else ("running" if rounds else "starting")
        error = result.get("error") if result else (f"{death['cause']} after round {death['after_round']}; resume "
                                                    f"it: {death['resume']}" if death else None)
        raw.append({"id": nid, "rounds": rounds})
        for event in (result.get("membership") or []) if result else []:
            if isinstance(event, dict) and event.get("event") in MEMBERSHIP_EVENTS and type(event.get("round")) is int:
                events.append({"id": nid, "round": event["round"], "event": event["event"]})
        if death:  # died without a result: marked where its records end
            events.append({"id": nid, "round": (rounds[-1]["round"] + 1) if rounds else 1, "event": "crashed"})
        # A sat-out round's own `test_acc` is the held aggregate; the curve shows the latest training.
        trained = accuracies(rounds, TEST_ACC)
        records = [{
            "round": r["round"], "test_acc": _finite(acc),
            TEST_ACC_AGGREGATED: _finite(r.get(TEST_ACC_AGGREGATED)),
            "train_loss": _finite(r.get("train_loss")), "test_loss": _finite(r.get("test_loss")),
            "mib_received": (_finite(r.get("bytes_received")) or 0.0) / 2**20,
            "epsilon": _finite(r.get("epsilon")),
            "started_at": _finite(r.get("started_at")), "time": _phase_times(r), **hook_scalars(r),
        } for r, acc in zip(rounds, trained)]
        nodes.append({
            "id": nid, "status": status, "round": rounds[-1]["round"] if rounds else 0,
            "error": str(error) if error else None, "last": records[-1] if records else None,
            "mib_received": sum(r["mib_received"] for r in records), "records": records,
        })
    results_doc = _json_file(folder.results)
    if results_doc is None and ended_walls:
        # A LAN node's folder holds its own node's files only: the nodes that left no trace here
        # (no round, no result, no log of their own) run on other hosts; nothing to wait for here.
        for node in nodes:
            if node["status"] == "starting" and not folder.log(node["id"]).is_file():
                node["status"] = ELSEWHERE
    ended_badly = [n for n in nodes if n["error"] or n["status"] in ("failed", "isolated", "stopped", "crashed")]
    shown = ended_badly + [n for n in nodes if n not in ended_badly][:max(0, LOG_NODES - len(ended_badly))]
    for node in shown:
        node["log"] = log_tail(folder.log(node["id"]))
    results = results_doc
    here = [n for n in nodes if n["status"] != ELSEWHERE]
    member_folder = ids is not named  # a federation member's: only its own node is here to wait for
    done = results is not None or ((len(here) < len(nodes) or member_folder) and bool(here)
                                   and all(n["status"] not in _RUNNING for n in here))
    # A node that ended (isolated, failed, out of budget) has no rounds left to wait for.
    node_rounds_done = sum(rounds_total if n["status"] not in _RUNNING else n["round"] for n in here)
    node_rounds_total = len(here) * rounds_total
    # The run's clock starts with its folder (scenario.json is written before any node starts),
    # so start-up counts and the page says how long it has run before the first round ends.
    starts = [r["started_at"] for n in nodes for r in n["records"] if r["started_at"] is not None]
    with contextlib.suppress(OSError):
        starts.append(folder.scenario.stat().st_mtime)
    now = time.time() if now is None else now
    elapsed = max(0.0, now - min(starts)) if starts else None
    wall = _finite(results.get("summary", {}).get("wall_s")) if results is not None and isinstance(results.get("summary"), dict) \
        else None
    if wall is None and done:  # a LAN node's folder: its own nodes' time
        walls = [ended_walls.get(n["id"]) for n in here]
        wall = max((w for w in walls if w is not None), default=None)
    privacy = scenario.get("privacy") if isinstance(scenario.get("privacy"), dict) else {}
    summary_lines: list[str] = []
    if results is not None:
        try:  # what `p2pfl run` printed under its node table: the summary line and any warnings
            printed = format_summary(results).splitlines()
            summary_lines = [line for line in printed[max(i for i, line in enumerate(printed) if set(line) == {"-"}) + 1:]
                             if line.strip()]
        except (KeyError, TypeError, ValueError, AttributeError):  # a results.json of another version
            summary_lines = []
    membership = _membership(nodes, rounds_total, per_node, events) if scenario.get("churn") or events else None
    curves = {key: round_bands(nodes, key) for key in
              (TEST_ACC, TEST_ACC_AGGREGATED, "train_loss", "test_loss", "mib_received", "epsilon")}
    # The strategy hooks' numbers (evaluate's metrics, fit_config's learning rate), each its own curve.
    hooks = sorted({k for n in nodes for r in n["records"] for k in r if k.startswith(("metrics/", "fit/"))})
    hook_curves = {key: round_bands(nodes, key) for key in hooks}
    round_time = _round_time(nodes)
    for node in nodes:
        records = node.pop("records")
        if per_node:
            node["rounds"] = [{k: v for k, v in r.items() if k not in ("time", "started_at")} for r in records]
    return {
        "ready": True, "kind": "run", "name": scenario["name"], "algorithm": scenario["algorithm"]["name"],
        "rounds": rounds_total, "nodes": nodes, "phases": list(PHASES), "per_node": per_node,
        "heatmaps": {**_heatmaps(run_dir, ids), **_trust_heatmap(raw, ids)}, "curves": curves, "hooks": hook_curves, "round_time": round_time, "membership": membership,
        "progress": {"done": node_rounds_done, "total": node_rounds_total,
                     "elapsed_s": wall if wall is not None else elapsed,
                     "eta_s": 0.0 if done else estimate_eta(node_rounds_done, node_rounds_total, elapsed)},
        "privacy": {"mode": str(privacy.get("mode", "none"))},
        "summary_lines": summary_lines, "done": done, "audit": audit_view(run_dir),
    }


def audit_view(run_dir: Path) -> dict[str, Any] | None:
    """`p2pfl audit`'s findings per peer, where RUN/audit.json exists (`p2pfl.audit`)."""
    doc = _json_file(RunFolder(run_dir).audit)
    if not doc or "peers" not in doc:
        return None
    rows = []
    for peer, found in sorted(doc["peers"].items()):
        attacks = found.get("membership") or {}
        rows.append({"peer": peer, "part": found.get("part"), "round": found.get("round"),
                     **{f"auc_{name}": _finite(a.get("auc")) for name, a in attacks.items()},
                     "advantage": max((_finite(a.get("advantage")) or 0.0 for a in attacks.values()), default=None),
                     "epsilon_proven": max((_finite(a.get("epsilon_lower_bound")) or 0.0 for a in attacks.values()),
                                           default=None),
                     "epsilon_accounted": _finite(found.get("accounted_epsilon")), "skipped": found.get("skipped")})
    return {"node": doc.get("node"), "summary": doc.get("summary", {}), "peers": rows}


def is_compare_folder(folder: Path) -> bool:
    return ((folder / "compare.json").is_file() or (folder / "plan.json").is_file()
            or any(folder.glob("*/seed*/scenario.json")))


def _compare_rows(folder: Path) -> dict[str, list[Path]]:
    if (folder / "compare.json").is_file():
        return compare_row_runs(folder)
    # A compare still running writes compare.json at its end: its rows are those it planned
    # (plan.json, from compare's start), else the folders so far.
    plan = _json_file(folder / "plan.json")
    if isinstance(plan, dict) and isinstance(plan.get("runs"), dict):
        return {str(label): [folder / str(run) for run in runs] for label, runs in plan["runs"].items()
                if isinstance(runs, list)}
    rows: dict[str, list[Path]] = {}
    for scenario in sorted(folder.glob("*/seed*/scenario.json")):
        rows.setdefault(scenario.parent.parent.name, []).append(scenario.parent)
    return rows


def _run_curve(run_dir: Path, key: str) -> dict[int, float]:
    """Round -> mean over a run's nodes of `key` (`test_acc` read as after the latest training)."""
    folder = RunFolder(run_dir)
    try:
        ids = node_ids(json.loads(folder.scenario.read_text())["nodes"])
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    per_round: dict[int, list[float]] = {}
    for nid in ids:
        rounds = _rounds(folder.node_rounds(nid))
        for record, raw in zip(rounds, accuracies(rounds, key)):
            value = _finite(raw)
            if value is not None:
                per_round.setdefault(record["round"], []).append(value)
    return {r: statistics.fmean(v) for r, v in sorted(per_round.items())}


def compare_state(folder: Path) -> dict[str, Any]:
    """What the page shows of a compare folder: its table so far and each row's curves (the
    mean over nodes, then the mean and spread over seeds)."""
    rows = _compare_rows(folder)
    if not rows:
        return {"ready": False}
    listing = _json_file(folder / "compare.json") or _json_file(folder / "plan.json") or {}
    table, curves = [], {}
    for label, runs in rows.items():
        summaries = [s for s in ((_json_file(RunFolder(run).results) or {}).get("summary") for run in runs)
                     if isinstance(s, dict)]

        def column(key: str, summaries: list[dict[str, Any]] = summaries) -> list[float]:
            return [v for v in (_finite(s.get(key)) for s in summaries) if v is not None]

        acc, agg = column("mean_acc"), column("mean_acc_aggregated")
        table.append({
            "row": label, "seeds_done": len(summaries), "seeds": len(runs),
            "acc_mean": statistics.fmean(acc) if acc else None,
            "acc_std": statistics.pstdev(acc) if len(acc) > 1 else (0.0 if acc else None),
            "agg_mean": statistics.fmean(agg) if agg else None,
            "mib_total": statistics.fmean(column("total_bytes")) / 2**20 if column("total_bytes") else None,
            "wall_s": statistics.fmean(column("wall_s")) if column("wall_s") else None,
        })
        by_round: dict[int, list[float]] = {}
        for run in runs:
            for r, v in _run_curve(run, "test_acc").items():
                by_round.setdefault(r, []).append(v)
        curves[label] = [{"round": r, **band} for r in sorted(by_round)
                         if (band := _band(by_round[r])) is not None]
    done = (folder / "compare.json").is_file() and all(row["seeds_done"] == row["seeds"] for row in table)
    return {"ready": True, "kind": "compare", "name": folder.name, "scenario": listing.get("scenario"),
            "overrides": listing.get("overrides") or [], "table": table, "curves": curves, "done": done}


def folder_state(folder: Path) -> dict[str, Any]:
    """A run folder's state, or a compare folder's."""
    if not RunFolder(folder).scenario.is_file() and is_compare_folder(folder):
        return compare_state(folder)
    return dashboard_state(folder)


def host_allowed(header: str | None, served: str) -> bool:
    """Whether a request's `Host` names this dashboard: an IP address, `localhost`, or the name it
    serves on (`served`). A page from another site that rebinds its own DNS name to 127.0.0.1
    sends that name, and so cannot read the run's state."""
    if not header:
        return False
    name = host_of(header)
    if name in ("localhost", served.lower()):
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def dashboard_app(folder: Path, min_age_s: float = 1.0, served: str = "127.0.0.1") -> web.Application:
    page = resources.files("p2pfl.report").joinpath("dashboard.html").read_text()
    bundle = plotly_bundle()

    async def index(_: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/html")

    async def plotly(_: web.Request) -> web.Response:
        return web.Response(body=bundle, content_type="application/javascript",
                            headers={"Cache-Control": "max-age=86400"})

    latest: dict[str, Any] = {"state": None, "at": 0.0, "cost": 0.0}
    computing = asyncio.Lock()

    async def state(_: web.Request) -> web.Response:
        # Reading a 1000-node folder takes seconds of a core the nodes need: while a state is
        # younger than a few times its cost, every poll (every open page) gets that one.
        async with computing:
            if latest["state"] is None or time.monotonic() - latest["at"] > max(min_age_s, STATE_REUSE * latest["cost"]):
                started = time.monotonic()
                latest["state"] = await asyncio.to_thread(folder_state, folder)
                latest["at"], latest["cost"] = time.monotonic(), time.monotonic() - started
        return web.json_response(latest["state"])

    @web.middleware
    async def same_host(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                        ) -> web.StreamResponse:
        if not host_allowed(request.headers.get("Host"), served):
            return web.Response(status=421, text=f"this dashboard answers to its own address, not Host "
                                                 f"{request.headers.get('Host')!r}")
        return await handler(request)

    app = web.Application(middlewares=[same_host])
    app.router.add_get("/", index)
    app.router.add_get("/plotly.min.js", plotly)
    app.router.add_get("/api/state", state)
    return app


def check_port_free(host: str, port: int, option: str = "--dashboard") -> None:
    """A ConfigError naming `option` where `port` is taken: checked before a run writes its folder,
    so that the retry on another port is not refused as a folder already holding a run."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp listens: a TIME_WAIT is no owner
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ConfigError(option, f"cannot serve on {host}:{port}: {exc.strerror or exc}; pick another port") \
                from None


async def start_dashboard(folder: Path, host: str = "127.0.0.1", port: int = 8050,
                          option: str = "--dashboard") -> web.AppRunner:
    """Serve the page for `folder` on this event loop; `await runner.cleanup()` stops it. A port
    that cannot be served is a ConfigError naming `option`, the command line's name for it."""
    runner = web.AppRunner(dashboard_app(folder, served=host), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigError(option, f"cannot serve on {host}:{port}: {exc.strerror or exc}; pick another port") from None
    return runner


def live_dashboard(port: int, host: str = "127.0.0.1") -> Callable[[Path], AbstractAsyncContextManager[None]]:
    """The dashboard as a run's live view (`run_scenario(..., live_view=live_dashboard(8050))`):
    served on `port` while the run goes on (`p2pfl run --dashboard` then serves it on until Ctrl-C)."""
    plotly_bundle()  # a missing extra is said before the run starts, not after
    check_port_free(host, port)  # and a port taken, before the run writes its folder

    @asynccontextmanager
    async def serving(run_dir: Path) -> AsyncIterator[None]:
        runner = await start_dashboard(run_dir, host, port)
        print(f"dashboard: http://{host}:{port}/", file=sys.stderr, flush=True)
        try:
            yield
        finally:
            await runner.cleanup()

    return serving


def serve_dashboard(folder: Path, host: str = "127.0.0.1", port: int = 8050, *, after_run: bool = False) -> None:
    """`p2pfl dashboard` (and `p2pfl run --dashboard` once its run ended): serve until Ctrl-C."""
    async def forever() -> None:
        runner = await start_dashboard(folder, host, port, "--dashboard" if after_run else "--port")
        what = "the finished run" if after_run else str(folder)
        print(f"dashboard of {what}: http://{host}:{port}/ (Ctrl-C stops it)", file=sys.stderr, flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    run_stoppable(forever())
