"""A run's protocol cost written to its directory: ``cost.json`` (docs/design.md §5), from the
``MeteredOracle`` every owner-asking run goes through (``coordinator/cost.py``). Past
``privacy_rows.MAX_JSON_OWNERS`` owners the per-owner rows go to ``cost_owners.npz`` (one
array per field over owners, as privacy.json's rows) and cost.json keeps a summary."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from .coordinator.cost import MeteredOracle, cost_report
from .errors import OutputFailed
from .privacy_rows import MAX_JSON_OWNERS, owner_columns
from .run_files import RunResult, reason

COST_FILE = "cost.json"
#: The columnar file of every owner's cost row, past ``MAX_JSON_OWNERS`` owners.
COST_OWNERS_FILE = "cost_owners.npz"
#: The row fields that cost.json's ``owners_summary`` gives min/median/max of.
_SUMMARISED = ("requests", "round_trips", "bytes_received", "bytes_sent", "compute_seconds")


def cost_json(cost: dict[str, Any], out: Path) -> dict[str, Any]:
    """What cost.json holds for ``cost`` (``cost_report``): itself up to ``MAX_JSON_OWNERS``
    owners; past them the rows are written to ``out / COST_OWNERS_FILE`` and cost.json keeps
    ``owners_summary`` (per field: min, median, max over owners), ``owners_file`` and no rows."""
    rows = cost["owners"]
    if len(rows) <= MAX_JSON_OWNERS:
        return cost
    columns = owner_columns(rows)
    np.savez_compressed(out / COST_OWNERS_FILE, **columns)  # type: ignore[arg-type]
    summary: dict[str, Any] = {"owners": len(rows)}
    for key in _SUMMARISED:
        values = columns[key].astype(float)
        summary[key] = {
            "min": float(values.min()),
            "median": float(np.median(values)),
            "max": float(values.max()),
        }
    return {**cost, "owners": [], "owners_summary": summary, "owners_file": COST_OWNERS_FILE}


def with_cost(
    result: RunResult, oracle: MeteredOracle, names: Sequence[str], seed: int, transport: str
) -> RunResult:
    """``result`` with its cost (``RunResult.cost``), written to ``result.out/cost.json``;
    the per-1,000-ESS figures use the least bulk ESS over the parameters."""
    ess_values = result.diagnostics.get("ess_bulk")
    ess = float(np.min(ess_values)) if ess_values else None
    ess = ess if ess is not None and np.isfinite(ess) else None
    cost = cost_report(oracle, names, ess, seed, transport)
    path = result.out / COST_FILE
    try:
        path.write_text(json.dumps(cost_json(cost, result.out), indent=2))
    except OSError as exc:
        raise OutputFailed(
            f"could not write {path} ({reason(exc)}): free space or make {result.out} writable"
        ) from exc
    return replace(result, cost=cost)
