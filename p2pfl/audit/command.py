"""`p2pfl audit` and `p2pfl run --audit`: which node audits, and the lines a person reads."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from p2pfl.errors import ConfigError


def audit_override(scenario: Path, overrides: Sequence[str], node: str) -> str:
    """`runtime.audit` for `p2pfl run --audit [NODE]`: NODE, or the scenario's first node."""
    if not node:
        from p2pfl.runtime.config import node_ids
        from p2pfl.scenario.schema import load_scenario

        node = node_ids(load_scenario(scenario, overrides).nodes)[0]
    return f"runtime.audit={json.dumps(node)}"


def _auditor(run: Path) -> str:
    stored = json.loads((run / "scenario.json").read_text()) if (run / "scenario.json").is_file() else {}
    node = stored.get("runtime", {}).get("audit", "")
    if not node:
        raise ConfigError("--node", f"{run} was not run with runtime.audit; name the auditing node, or run the "
                                    "scenario again with `p2pfl run ... --audit`")
    return str(node)


def _line(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def audit_command(run: Path, node: str | None, settings: Any = None) -> dict[str, Any]:
    from p2pfl.audit.run import AuditSettings, audit_run

    node = node or _auditor(run)
    doc = audit_run(run, node, settings or AuditSettings())
    s = doc["summary"]
    print(f"audit from {node}'s seat, {s['peers_attacked']} peers: membership AUC "
          f"{_line(s['membership_auc_loss'], '.3f')} (loss) / {_line(s['membership_auc_shadow'], '.3f')} (shadow), "
          f"advantage {_line(s['membership_advantage'], '.3f')}, ε proven ≥ {_line(s['epsilon_lower_bound'], '.2f')} "
          f"(accounted {_line(s['accounted_epsilon'], '.2f')}); model inversion SSIM "
          f"{_line(s['inversion_ssim'], '.2f')}, update inversion PSNR {_line(s['update_psnr'], '.1f')} dB")
    print(f"audit: {run / 'audit.json'}")
    return doc
