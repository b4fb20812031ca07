"""The dashboard screenshots of docs/scenarios.md, from real runs: a scenario's page while it runs
and after it ended, and the page of a compare folder.

    python benchmarks/dashboard_screenshots.py [--scenario scenarios/quickstart.toml]
        [--set rounds=30 ...] [--compare runs/poison/clean_b1] [--kill node-1] [--out docs]
    python benchmarks/dashboard_screenshots.py --folder ALPHA/run   # a finished folder only (a federation
                                                                    # member's): dashboard_member.png

`--kill NODE` sends SIGKILL to that node's process (RUN/pids.json) once the "during" picture is
taken, and pictures the live page once it shows the node crashed (dashboard_killed.png).

The run goes to runs/dashboard_screenshots (replaced). The "during" picture is taken once
`--during` of the node-rounds are done, while the nodes still train. Needs a headless Chromium
(Debian package `chromium`) and the `[dashboard]` extra.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from p2pfl.hosting.ports import free_ports

ROOT = Path(__file__).resolve().parents[1]


def _state(port: int) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/state", timeout=5) as resp:
            return json.loads(resp.read())
    except OSError:
        return {}


def _wait(port: int, until: Any, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = _state(port)
        if state.get("ready") and until(state):
            return state
        time.sleep(0.3)
    raise SystemExit(f"the dashboard on port {port} never showed what was waited for")


def screenshot(chromium: str, port: int, path: Path, height: int) -> None:
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=4000",
                    f"--window-size=1400,{height}", f"--screenshot={path}", f"http://127.0.0.1:{port}/"],
                   capture_output=True, timeout=120, check=True)
    if not path.is_file():
        raise SystemExit(f"Chromium wrote no {path}")
    print(f"wrote {path}")


def serve(folder: Path, port: int) -> subprocess.Popen[bytes]:
    server = subprocess.Popen([sys.executable, "-m", "p2pfl", "dashboard", str(folder), "--port", str(port)])
    _wait(port, lambda s: True, 120)
    return server


def picture_folder(chromium: str, folder: Path, port: int, path: Path, height: int) -> None:
    """`p2pfl dashboard FOLDER` served, pictured, and stopped."""
    server = serve(folder, port)
    try:
        screenshot(chromium, port, path, height)
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", type=Path, default=ROOT / "scenarios" / "quickstart.toml")
    parser.add_argument("--set", dest="overrides", action="append", default=None,
                        help="scenario overrides (default: rounds=30, so that the run lasts past a screenshot)")
    parser.add_argument("--during", type=float, default=0.4, help="share of node-rounds done for the 'during' picture")
    parser.add_argument("--compare", type=Path, default=None, help="a compare folder to picture as well")
    parser.add_argument("--kill", default=None, help="a node to kill -9 after the 'during' picture")
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    parser.add_argument("--folder", type=Path, default=None, help="picture this finished folder only, run nothing")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        raise SystemExit("needs a headless Chromium (Debian package `chromium`)")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.folder is not None:
        picture_folder(chromium, args.folder, free_ports(1, "127.0.0.1")[0], args.out / "dashboard_member.png", 1600)
        return
    overrides = args.overrides if args.overrides is not None else ["rounds=30"]
    run_dir = ROOT / "runs" / "dashboard_screenshots"
    live_port, page_port = free_ports(2, "127.0.0.1")
    run = subprocess.Popen([sys.executable, "-m", "p2pfl", "run", str(args.scenario), "--out", str(run_dir), "--force",
                            "--no-progress", "--dashboard", str(live_port), "--no-linger",
                            *[a for o in overrides for a in ("--set", o)]])
    _wait(live_port, lambda s: s["progress"]["done"] >= args.during * s["progress"]["total"], 1800)
    screenshot(chromium, live_port, args.out / "dashboard_during.png", 2300)
    if args.kill is not None:
        os.kill(json.loads((run_dir / "pids.json").read_text())[args.kill], signal.SIGKILL)
        _wait(live_port, lambda s: any(n["id"] == args.kill and n["status"] == "crashed" for n in s["nodes"]), 300)
        screenshot(chromium, live_port, args.out / "dashboard_killed.png", 2300)
    if run.wait() != 0 and args.kill is None:
        raise SystemExit(f"the run failed (exit {run.returncode}); see {run_dir / 'logs'}")
    picture_folder(chromium, run_dir, page_port, args.out / "dashboard.png", 2300)
    if args.compare is not None:
        picture_folder(chromium, args.compare, page_port, args.out / "dashboard_compare.png", 900)


if __name__ == "__main__":
    main()
