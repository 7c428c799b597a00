"""``fedpenalty owner report``: a deployed owner's spend read offline from its own ledger, in
total and session by session, and how many of its records are clipped into the model's data
domain when loaded. It runs on the owner's machine and sends nothing anywhere: the clip count
is data-dependent and is the owner's alone (docs/design.md §3, invariant 4).

Every ε is the ledger's spend put through the accountants the serving owner uses
(``SpendReport.of``: exact GDP, Rényi DP once it gave lattice answers, dp-accounting for
gradient answers).
"""

from __future__ import annotations

import math
import time
from typing import Any

from ..common import SpendReport
from ..data import read_records
from ..errors import DataError
from .ledger import Ledger, Session
from .ledger_records import PART_SEPARATOR, SecureSpend
from .mask_graph import secure_delta
from .node import own_noise_report
from .owner_config import OwnerConfig, clipped_line


def owner_report(config: OwnerConfig) -> dict[str, Any]:
    """The report of the owner of ``config`` (its ledger must exist): its total spend, one row
    per session (``sessions``: session, kind, opened, closed, answers, mu, epsilon, accountant)
    and its records (``records``, ``records_clipped``; None with ``records_error`` when
    ``data.path`` cannot be read now)."""
    policy = config.policy
    ledger = Ledger(config.ledger, read_only=True)  # no lock: works while a server runs
    try:
        lattice = ledger.answered_on_lattice(config.name)
        secure = ledger.reports([config.name], None)[0].secure
        spend = SpendReport.of(
            ledger.total(config.name),
            ledger.sampled(config.name),
            secure_delta(policy.delta, secure),
            policy.neighbour,
            lattice=lattice,
        )
        sessions = [_session_row(s, config, lattice, secure) for s in ledger.sessions(config.name)]
        own = own_noise_report(ledger, config.name, config.model.dim, policy)
    finally:
        ledger.close()
    return {
        "owner": config.name,
        "answers": spend.answers,
        "mu": spend.mu,
        "epsilon": spend.epsilon,
        "accountant": spend.accountant,
        "epsilon_paper_bound": _finite(spend.epsilon_paper_bound),
        "delta": policy.delta,
        "budget_epsilon": policy.budget_epsilon,
        "budget_left": max(policy.budget_epsilon - spend.epsilon, 0.0),
        "ledger": str(config.ledger),
        "epsilon_own_noise_only": None if own is None else own.epsilon,
        "sessions": sessions,
        **_records(config),
    }


def _session_row(
    session: Session, config: OwnerConfig, lattice: bool, secure: list[SecureSpend]
) -> dict[str, Any]:
    """One session's own spend: ε of its answers alone, at the owner's δ less the session's
    masking-graph failure bound (``secure``: the owner's secure sessions; docs/design.md §2.6)."""
    policy = config.policy
    mine = [r for r in secure if r.session.partition(PART_SEPARATOR)[0] == session.session]
    delta = secure_delta(policy.delta, mine)
    spend = SpendReport.of(session.spend, session.sampled, delta, policy.neighbour, lattice=lattice)
    opened = session.opened_at
    return {
        "session": session.session,
        "kind": session.algorithm,
        "opened": None if opened is None else time.strftime("%Y-%m-%d %H:%M", time.gmtime(opened)),
        "closed": session.closed,
        "answers": spend.answers,
        "mu": spend.mu if session.spend.answers else None,
        "epsilon": spend.epsilon,
        "accountant": spend.accountant,
    }


def _records(config: OwnerConfig) -> dict[str, Any]:
    """How many records ``data.path`` holds now and how many are clipped when loaded."""
    try:
        loaded = read_records(config.data_path, config.model)
    except DataError as exc:
        return {"records": None, "records_clipped": None, "records_error": str(exc)}
    return {"records": len(loaded.records), "records_clipped": loaded.clipped}


def report_text(report: dict[str, Any], config: OwnerConfig) -> str:
    """``report`` (``owner_report``) for a person: the total, a table of the sessions, and the
    records line."""
    own = report["epsilon_own_noise_only"]
    lines = [
        f"owner {report['owner']!r} (ledger {report['ledger']}): {report['answers']} answers, "
        f"μ = {report['mu']:.6g}, ε = {report['epsilon']:.6g} at δ = {report['delta']:g} "
        f"(paper's bound: {_fmt(report['epsilon_paper_bound'])}); budget ε = "
        f"{report['budget_epsilon']:g}, {report['budget_left']:.6g} left"
        + ("" if own is None else f"; its own noise alone: ε = {own:.6g}")
    ]
    rows = [
        [
            s["session"],
            s["kind"],
            s["opened"] or "",
            "closed" if s["closed"] else "open",
            str(s["answers"]),
            _fmt(s["mu"]),
            f"{s['epsilon']:.4g}",
            s["accountant"],
        ]
        for s in report["sessions"]
    ]
    rows.append(
        [
            "total",
            "",
            "",
            "",
            str(report["answers"]),
            _fmt(report["mu"]),
            f"{report['epsilon']:.4g}",
            report["accountant"],
        ]
    )
    headers = ["session", "kind", "opened (UTC)", "state", "answers", "mu", "epsilon", "by"]
    lines += ["", f"spend by session (ε of each session alone, at δ = {report['delta']:g}):"]
    lines += [table(headers, rows), ""]
    if report["records"] is None:
        lines.append(f"records: {report['records_error']}")
    else:
        lines.append(
            clipped_line(
                report["owner"],
                config.data_path,
                config.model.name,
                report["records"],
                report["records_clipped"],
            )
        )
    return "\n".join(lines)


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain aligned text table (first column left-aligned)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        return "  ".join([first, *(c.rjust(w) for c, w in zip(cells[1:], widths[1:]))])

    return "\n".join([line(headers), "  ".join("-" * w for w in widths), *map(line, rows)])


def _fmt(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.4g}"


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
