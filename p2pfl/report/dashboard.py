"""A live view of a run folder in the browser: `p2pfl run ... --dashboard [PORT]` or
`p2pfl dashboard RUN_DIR`.

The page (`dashboard.html`, served from the package: no CDN, no internet) polls `/api/state`
once a second. The state is read from the run folder as nodes write it: each round's record
(`nodes/<id>.rounds.jsonl`), results as nodes end, strategies' artefacts (influence,
relevance, affinity vectors). It binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web

from p2pfl.errors import ConfigError
from p2pfl.runtime.config import node_ids
from p2pfl.runtime.run_folder import RunFolder, load_artefacts, read_records
from p2pfl.runtime.timing import PHASES

# Artefacts saved as {"peers": [...], "values": [one number per peer]}: FedC2I's λ, pFedSV's
# relevance and Shapley values (own node included), FedFomo's affinity and weights.
HEATMAPS = ("lambda", "relevance", "shapley", "affinity", "fomo_weights")


def _finite(value: Any) -> float | None:
    """A number the page can draw, or None (NaN, ±Inf, a string, or anything a bad line holds)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _node_result(path: Path) -> dict[str, Any] | None:
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError):  # not there yet (written whole, so never half)
        return None
    return result if isinstance(result, dict) else None


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


def dashboard_state(run_dir: Path) -> dict[str, Any]:
    """What the page shows, from the run folder as it is now."""
    folder = RunFolder(run_dir)
    if not folder.scenario.is_file():
        return {"ready": False}
    scenario = json.loads(folder.scenario.read_text())
    ids = node_ids(scenario["nodes"])
    nodes = []
    for nid in ids:
        rounds = _rounds(folder.node_rounds(nid))
        result = _node_result(folder.node_result(nid))
        if not rounds and result:  # a node that kept no round log (a run from before it, or a Ray worker's)
            rounds = [r for r in result.get("rounds") or [] if isinstance(r, dict) and type(r.get("round")) is int]
        nodes.append({
            "id": nid,
            "status": str(result.get("status")) if result else ("running" if rounds else "starting"),
            "round": rounds[-1]["round"] if rounds else 0,
            "rounds": [{
                "round": r["round"], "test_acc": _finite(r.get("test_acc")),
                "test_acc_aggregated": _finite(r.get("test_acc_aggregated")),
                "mib_received": (_finite(r.get("bytes_received")) or 0.0) / 2**20,
                "epsilon": _finite(r.get("epsilon")),
                "time": _phase_times(r),
            } for r in rounds],
        })
    artefacts = load_artefacts(run_dir)
    heatmaps = {}
    for name in HEATMAPS:
        if name not in artefacts:
            continue
        index = {nid: i for i, nid in enumerate(ids)}
        matrix: list[list[float | None]] = [[None] * len(ids) for _ in ids]
        for node, by_round in artefacts[name].items():
            latest = by_round[max(by_round)] if by_round else None
            if node in index and isinstance(latest, dict) and isinstance(latest.get("peers"), list) \
                    and isinstance(latest.get("values"), list):
                for peer, value in zip(latest["peers"], latest["values"]):
                    if isinstance(peer, str) and peer in index:
                        matrix[index[node]][index[peer]] = _finite(value)
        heatmaps[name] = {"ids": ids, "matrix": matrix}
    return {"ready": True, "name": scenario["name"], "algorithm": scenario["algorithm"]["name"],
            "rounds": scenario["rounds"], "nodes": nodes, "heatmaps": heatmaps, "phases": list(PHASES),
            "done": folder.results.is_file()}


def dashboard_app(run_dir: Path) -> web.Application:
    page = resources.files("p2pfl.report").joinpath("dashboard.html").read_text()

    async def index(_: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/html")

    async def state(_: web.Request) -> web.Response:
        return web.json_response(await asyncio.to_thread(dashboard_state, run_dir))

    app = web.Application()
    app.router.add_get("/", index)
    app.router.add_get("/api/state", state)
    return app


async def start_dashboard(run_dir: Path, host: str = "127.0.0.1", port: int = 8050) -> web.AppRunner:
    """Serve the page for `run_dir` on this event loop; `await runner.cleanup()` stops it."""
    runner = web.AppRunner(dashboard_app(run_dir), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigError("--dashboard", f"cannot serve on {host}:{port}: {exc.strerror or exc}; "
                                         "pick another port") from None
    return runner


def live_dashboard(port: int, host: str = "127.0.0.1") -> Callable[[Path], AbstractAsyncContextManager[None]]:
    """The dashboard as a run's live view (`run_scenario(..., live_view=live_dashboard(8050))`):
    served on `port` while the run goes on."""
    @asynccontextmanager
    async def serving(run_dir: Path) -> AsyncIterator[None]:
        runner = await start_dashboard(run_dir, host, port)
        print(f"dashboard: http://{host}:{port}/", file=sys.stderr, flush=True)
        try:
            yield
        finally:
            await runner.cleanup()

    return serving


def serve_dashboard(run_dir: Path, host: str = "127.0.0.1", port: int = 8050) -> None:
    """`p2pfl dashboard`: serve until Ctrl-C."""
    async def forever() -> None:
        runner = await start_dashboard(run_dir, host, port)
        print(f"dashboard of {run_dir}: http://{host}:{port}/ (Ctrl-C stops it)", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    asyncio.run(forever())
