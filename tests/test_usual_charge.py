"""The usual charge of a batched simulated ledger (``SpendBook.charge_drawn``: every owner and
key new, past the session's answered iterations, on the pending spend line within its bound)
skips the general charging transaction's bookkeeping (docs/design.md §4, "The usual charge").
It must change nothing: the same answers, ledger rows, refusals and ε as the general path
(``SpendBook.charging``) over the same requests — a refused step mid-run, a resume with
replayed keys, and a run to the budget's refusal — and the comparison must notice an altered
charge or noise in it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedpenalty.common import Policy
from fedpenalty.coordinator.inprocess import InProcessOracle
from fedpenalty.errors import BudgetExhausted, FedPenaltyError, InvalidRequest
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerNode
from fedpenalty.owner.ledger_rows import StepSums
from fedpenalty.owner.spend_book import SpendBook

MODEL = build_model({"name": "gaussian_mean"})
RECORDS = [MODEL.simulate_records(np.random.default_rng(k), np.array([0.2]), 300) for k in range(4)]
CHAINS = np.arange(3)
THETA = np.array([[0.0], [0.1], [-0.2]])
#: ε budget that admits a plan of 30 answers at σ = 40 (about 50 iterations of the steps below)
BUDGET = 1.75

Alter = Callable[[SpendBook], None]


def owners(path: Path, alter: Alter | None, usual: list[int]) -> tuple[InProcessOracle, Ledger]:
    """Four simulated owners of fixed seeds on one batched simulated ledger at ``path``, in
    session "s"; ``alter`` patches the ledger's spend book (None: as it is). ``usual`` counts
    the charges found usual."""
    ledger = Ledger.simulation(path, batched=True)
    if alter is not None:
        alter(ledger.book)
    found = ledger.book._usual

    def counted(c):
        kept = found(c)
        usual[0] += kept is not None
        return kept

    ledger.book._usual = counted  # type: ignore[method-assign]
    seeds = np.random.SeedSequence(11).spawn(len(RECORDS))
    policy = Policy(sigma=40.0, max_step=0.2, budget_epsilon=BUDGET)
    nodes = [
        OwnerNode.simulated(f"o{k}", MODEL, r, policy, ledger, s)
        for k, (r, s) in enumerate(zip(RECORDS, seeds))
    ]
    oracle = InProcessOracle(nodes)
    oracle.open_session("penalty", 30, session="s")
    return oracle, ledger


def general(book: SpendBook) -> None:
    """Every charge through ``SpendBook.charging`` (the usual one never found)."""
    book._usual = lambda c: None  # type: ignore[method-assign]


def run(path: Path, alter: Alter | None = None) -> dict[str, Any]:
    """The same requests at ``path``: 14 iterations, one step too long (refused), 6 more; a
    resume that re-asks 4 answered iterations and goes on until the budget refuses. Every
    answer's bytes, every refusal, the owners' reports and the ledger's rows."""
    seen: dict[str, Any] = {"answers": [], "refusals": [], "usual": [0]}

    def ask(oracle: InProcessOracle, t: int, shift: float = 0.0) -> None:
        step = 0.02 * (t % 7 + 1) + shift
        try:
            seen["answers"].append((t, oracle.log_ratio(t, CHAINS, THETA, THETA + step).values))
        except FedPenaltyError as exc:
            seen["refusals"].append((t, type(exc).__name__, str(exc)))

    oracle, ledger = owners(path, alter, seen["usual"])
    for t in range(14):
        ask(oracle, t)
    ask(oracle, 14, shift=0.5)  # past max_step: refused, nothing recorded
    for t in range(14, 20):
        ask(oracle, t)
    oracle.persist()  # a checkpoint
    oracle.disconnect()
    ledger.close()
    oracle, ledger = owners(path, alter, seen["usual"])  # the resumed run
    for t in range(16, 90):
        ask(oracle, t)
    seen["reports"] = [repr(r) for r in oracle.privacy_reports()]
    oracle.disconnect()
    ledger.close()
    with sqlite3.connect(path) as db:
        seen["blocks"] = db.execute("SELECT * FROM answer_blocks ORDER BY rowid").fetchall()
        seen["lines"] = db.execute("SELECT * FROM spend_lines ORDER BY rowid").fetchall()
    return seen


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Byte-identical answers, the same refusals, reports and ledger rows."""
    answers = len(a["answers"]) == len(b["answers"]) and all(
        s == t and x.tobytes() == y.tobytes() for (s, x), (t, y) in zip(a["answers"], b["answers"])
    )
    return answers and all(a[k] == b[k] for k in ("refusals", "reports", "blocks", "lines"))


def test_the_usual_charge_changes_nothing(tmp_path):
    """The usual charge answers, refuses, records and reports exactly as the general path;
    the run does refuse a step, replay after the resume and reach the budget's refusal."""
    usual = run(tmp_path / "usual.sqlite")
    plain = run(tmp_path / "general.sqlite", general)
    assert same(usual, plain)
    assert plain["usual"] == [0] and usual["usual"][0] > 40  # most charges were usual ones
    kinds = [kind for _, kind, _ in usual["refusals"]]
    assert kinds[0] == InvalidRequest.__name__ and usual["refusals"][0][0] == 14
    assert BudgetExhausted.__name__ in kinds  # the budget ran out mid-run
    refused_at = next(t for t, kind, _ in usual["refusals"] if kind == BudgetExhausted.__name__)
    assert 30 < refused_at < 89  # charged on the pending line for many iterations first
    replayed = [x for t, x in usual["answers"] if t in (16, 17, 18, 19)]
    assert len(replayed) == 8  # asked before and after the resume: the same answers
    assert all(x.tobytes() == y.tobytes() for x, y in zip(replayed[:4], replayed[4:]))


def _half_bound(book: SpendBook) -> None:
    """The usual charge's pending bound understated by half (admits past an owner's cap)."""
    usual = book._usual

    def altered(c):
        found = usual(c)
        return None if found is None else (*found[:3], 0.5 * found[3])

    book._usual = altered  # type: ignore[method-assign]


def _one_more_answer(book: SpendBook) -> None:
    """The usual charge's step sums count one answer more than it gave."""
    usual = book._usual

    def altered(c):
        found = usual(c)
        if found is None:
            return None
        session, group, (line, sums), used = found
        more = StepSums(sums.count + 1, sums.total, sums.squares, sums.largest)
        return session, group, (line, more), used

    book._usual = altered  # type: ignore[method-assign]


def _noise_nudged(book: SpendBook) -> None:
    """The answers drawn in a charge off by one part in 10¹²."""
    charge_drawn = book.charge_drawn
    book.charge_drawn = lambda c, draw: charge_drawn(c, lambda: draw() * (1 + 1e-12))  # type: ignore[method-assign]


@pytest.mark.parametrize("alter", [_half_bound, _one_more_answer, _noise_nudged])
def test_an_altered_usual_charge_is_noticed(tmp_path, alter):
    """The comparison above fails for a usual charge whose bound, spend or noise is altered."""
    assert not same(run(tmp_path / "altered.sqlite", alter), run(tmp_path / "general.sqlite"))
