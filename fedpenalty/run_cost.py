"""A run's protocol cost written to its directory: ``cost.json`` (docs/design.md §5), from the
``MeteredOracle`` every owner-asking run goes through (``coordinator/cost.py``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from .coordinator.cost import MeteredOracle, cost_report
from .errors import OutputFailed
from .run_files import RunResult, reason

COST_FILE = "cost.json"


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
        path.write_text(json.dumps(cost, indent=2))
    except OSError as exc:
        raise OutputFailed(
            f"could not write {path} ({reason(exc)}): free space or make {result.out} writable"
        ) from exc
    return replace(result, cost=cost)
