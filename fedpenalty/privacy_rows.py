"""Per-owner privacy rows of a run with many owners (docs/design.md §5, "privacy.json"): past
``MAX_JSON_OWNERS`` owners every owner's entry goes to a compressed columnar file,
``privacy_owners.npz`` (one array per field over owners, read by ``numpy.load`` without
pickle), and privacy.json keeps a summary — ε over owners (min, median, max), the owners over
their budget and the ``WORST_OWNERS`` entries of the largest ε. Up to that many owners
privacy.json is written as before, with every owner's entry and no other file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

#: Owners up to which privacy.json holds every owner's entry (past it: a summary and the file).
MAX_JSON_OWNERS = 1000
#: The owners of the largest ε whose whole entries privacy.json keeps past ``MAX_JSON_OWNERS``.
WORST_OWNERS = 10
#: The columnar file of every owner's entry, in the run directory.
OWNERS_FILE = "privacy_owners.npz"


def owner_columns(owners: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Every field of the owners' entries as one array ``(K,)`` in owner order: integers as
    int64, numbers as float64 (null: NaN), text as strings (null: ""), booleans as bool, any
    other value as JSON text (``inference_data._column``, as posterior.nc's privacy group)."""
    from .inference_data import _column  # here: xarray costs every command ~0.5 s of start-up

    keys = dict.fromkeys(k for o in owners for k in o)
    return {k: _column([o.get(k) for o in owners]) for k in keys}


def over_budget(owners: list[dict[str, Any]]) -> list[str]:
    """The owners whose ledger ε (all their sessions) exceeds their budget, in owner order."""
    return [
        o["owner"]
        for o in owners
        if o.get("budget_epsilon") is not None
        and o.get("ledger_epsilon") is not None
        and o["ledger_epsilon"] > o["budget_epsilon"]
    ]


def owners_summary(owners: list[dict[str, Any]]) -> dict[str, Any]:
    """privacy.json's ``owners_summary``: how many owners, ε over them (min, median, max; null
    when no owner has an ε) and the owners over their budget (count and the first
    ``WORST_OWNERS`` names)."""
    eps = np.array([np.nan if o.get("epsilon") is None else o["epsilon"] for o in owners])
    finite = eps[np.isfinite(eps)]
    over = over_budget(owners)
    return {
        "owners": len(owners),
        "epsilon_min": float(finite.min()) if finite.size else None,
        "epsilon_median": float(np.median(finite)) if finite.size else None,
        "epsilon_max": float(finite.max()) if finite.size else None,
        "over_budget": len(over),
        "over_budget_owners": over[:WORST_OWNERS],
    }


def worst(owners: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``WORST_OWNERS`` entries of the largest ε (largest first; ties in owner order)."""
    eps = np.array([-np.inf if o.get("epsilon") is None else o["epsilon"] for o in owners])
    order = np.argsort(-eps, kind="stable")[:WORST_OWNERS]
    return [owners[i] for i in order.tolist()]


def privacy_json(privacy: dict[str, Any], out: Path) -> dict[str, Any]:
    """What privacy.json holds for ``privacy`` (its in-memory content): itself up to
    ``MAX_JSON_OWNERS`` owners; past them every owner's entry is written to ``out`` /
    ``OWNERS_FILE`` and privacy.json keeps ``owners_summary``, ``owners`` (the worst entries),
    ``owners_shown`` and ``owners_file``."""
    owners = privacy.get("owners") or []
    if len(owners) <= MAX_JSON_OWNERS:
        return privacy
    np.savez_compressed(out / OWNERS_FILE, **owner_columns(owners))  # type: ignore[arg-type]
    return {
        **privacy,
        "owners_summary": owners_summary(owners),
        "owners_shown": f"the {WORST_OWNERS} of the largest epsilon; every owner: {OWNERS_FILE}",
        "owners_file": OWNERS_FILE,
        "owners": worst(owners),
    }
