"""The owner's authoritative privacy ledger and replay cache, in one SQLite file.

One transaction per charge (WAL journal): the charge, the per-session totals and the
answers released are committed together *before* the owner replies, so a crash can never
leave an answer released but not charged, and a restarted owner replays stored answers
instead of drawing new noise (DESIGN §3, invariants 2 and 3).

Rows are keyed by owner name, so one file can hold the ledgers of several owners hosted by
one process.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import BudgetExhausted, InvalidRequest, UnknownSession
from ..privacy import GaussianSpend

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    owner TEXT NOT NULL, session TEXT NOT NULL, algorithm TEXT NOT NULL,
    planned_answers INTEGER NOT NULL, opened_at REAL NOT NULL, closed_at REAL,
    answers INTEGER NOT NULL DEFAULT 0, mu_squared REAL NOT NULL DEFAULT 0, max_mu REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (owner, session));
CREATE TABLE IF NOT EXISTS totals (
    owner TEXT PRIMARY KEY, answers INTEGER NOT NULL, mu_squared REAL NOT NULL, max_mu REAL NOT NULL);
CREATE TABLE IF NOT EXISTS answers (
    owner TEXT NOT NULL, session TEXT NOT NULL, chain INTEGER NOT NULL, iteration INTEGER NOT NULL,
    digest BLOB NOT NULL, payload BLOB NOT NULL,
    PRIMARY KEY (owner, session, iteration, chain));
"""


@dataclass(frozen=True)
class Session:
    """A session as the ledger records it."""

    session: str
    algorithm: str
    planned_answers: int
    closed: bool
    spend: GaussianSpend


@dataclass(frozen=True)
class NewAnswer:
    """One answer to be released: its key, the query digest and the payload (float64 values)."""

    chain: int
    iteration: int
    digest: bytes
    payload: np.ndarray
    mu: float


@dataclass(frozen=True)
class Charge:
    """One owner's new answers in one request, with the limit its policy sets."""

    owner: str
    session: str
    answers: list[NewAnswer]
    max_mu_squared: float
    budget_epsilon: float
    delta: float


class Ledger:
    """SQLite ledger. ``synchronous="FULL"`` survives power loss; ``"NORMAL"`` survives a
    process crash (``kill -9``) but may lose the last commits on power loss."""

    def __init__(self, path: str | Path, synchronous: str = "FULL"):
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError("synchronous must be 'FULL' or 'NORMAL'")
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={synchronous}")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # --- sessions --------------------------------------------------------------------------
    def open_session(self, owner: str, session: str, algorithm: str, planned_answers: int) -> None:
        """Record a session; re-opening an existing open session with the same algorithm is a
        no-op (a restarted coordinator resumes it)."""
        with self._lock:
            row = self._db.execute(
                "SELECT algorithm, closed_at FROM sessions WHERE owner=? AND session=?", (owner, session)
            ).fetchone()
            if row is None:
                self._db.execute(
                    "INSERT INTO sessions(owner, session, algorithm, planned_answers, opened_at) VALUES (?,?,?,?,?)",
                    (owner, session, algorithm, planned_answers, time.time()),
                )
            elif row[0] != algorithm:
                raise InvalidRequest(f"session {session!r} was opened for {row[0]!r}, not {algorithm!r}", owner)
            elif row[1] is not None:
                raise UnknownSession(f"session {session!r} is closed", owner)

    def close_session(self, owner: str, session: str) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE sessions SET closed_at=? WHERE owner=? AND session=? AND closed_at IS NULL",
                (time.time(), owner, session),
            )

    def session(self, owner: str, session: str) -> Session | None:
        with self._lock:
            row = self._db.execute(
                "SELECT algorithm, planned_answers, closed_at, answers, mu_squared, max_mu "
                "FROM sessions WHERE owner=? AND session=?",
                (owner, session),
            ).fetchone()
        if row is None:
            return None
        return Session(session, row[0], row[1], row[2] is not None, GaussianSpend(row[3], row[4], row[5]))

    # --- spend -----------------------------------------------------------------------------
    def total(self, owner: str) -> GaussianSpend:
        """Everything the owner has ever been charged, across sessions."""
        with self._lock:
            return self._total(owner)

    def _total(self, owner: str) -> GaussianSpend:
        row = self._db.execute("SELECT answers, mu_squared, max_mu FROM totals WHERE owner=?", (owner,)).fetchone()
        return GaussianSpend() if row is None else GaussianSpend(row[0], row[1], row[2])

    # --- answers ---------------------------------------------------------------------------
    def stored(self, owners: list[str], session: str, first: int, last: int) -> dict[tuple[str, int, int], tuple[bytes, bytes]]:
        """Stored answers of ``owners`` in ``session`` with iteration in [first, last]:
        (owner, chain, iteration) → (digest, payload). One query for a whole host."""
        marks = ",".join("?" * len(owners))
        with self._lock:
            rows = self._db.execute(
                f"SELECT owner, chain, iteration, digest, payload FROM answers WHERE owner IN ({marks}) "
                "AND session=? AND iteration BETWEEN ? AND ?",
                (*owners, session, first, last),
            ).fetchall()
        return {(r[0], r[1], r[2]): (r[3], r[4]) for r in rows}

    def charge(self, charges: list[Charge]) -> None:
        """Charge and store every owner's new answers in one transaction.

        Refuses (``BudgetExhausted``, nothing written for anyone) when some owner's total μ²
        would exceed its ``max_mu_squared`` (the μ² at which ε(δ) reaches its budget).
        """
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for c in charges:
                    self._charge_one(c)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def _charge_one(self, c: Charge) -> None:
        mus = np.array([a.mu for a in c.answers], dtype=float)
        before = self._total(c.owner)
        after = before.add(mus)
        if after.mu_squared > c.max_mu_squared:
            eps_before = before.epsilon(c.delta)
            left = max(c.budget_epsilon - eps_before, 0.0)
            raise BudgetExhausted(
                f"privacy budget exhausted: {len(mus)} more answers would take ε from {eps_before:.4g} to "
                f"{after.epsilon(c.delta):.4g} at δ={c.delta:g}, past the budget ε={c.budget_epsilon:g} "
                f"({left:.4g} left)",
                c.owner,
                epsilon_left=left,
            )
        self._db.executemany(
            "INSERT INTO answers(owner, session, chain, iteration, digest, payload) VALUES (?,?,?,?,?,?)",
            [(c.owner, c.session, a.chain, a.iteration, a.digest, np.asarray(a.payload, "<f8").tobytes())
             for a in c.answers],
        )
        self._db.execute(
            "UPDATE sessions SET answers=answers+?, mu_squared=mu_squared+?, max_mu=MAX(max_mu, ?) "
            "WHERE owner=? AND session=?",
            (len(mus), float(np.sum(mus**2)), float(mus.max(initial=0.0)), c.owner, c.session),
        )
        self._db.execute(
            "INSERT INTO totals(owner, answers, mu_squared, max_mu) VALUES (?,?,?,?) ON CONFLICT(owner) DO UPDATE "
            "SET answers=excluded.answers, mu_squared=excluded.mu_squared, max_mu=excluded.max_mu",
            (c.owner, after.answers, after.mu_squared, after.max_mu),
        )
