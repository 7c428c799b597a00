"""The owner's authoritative privacy ledger and replay cache, in one SQLite file.

One transaction per charge (WAL journal): the charge, the per-session totals and the
answers released are committed together *before* the owner replies, so a crash can never
leave an answer released but not charged, and a restarted owner replays stored answers
instead of drawing new noise (DESIGN §3, invariants 2 and 3).

Rows are keyed by owner name, so one file can hold the ledgers of several owners hosted by
one process. Stored answers are keyed by small integer ids (table ``names``) in iteration-major
order, so each commit appends to the end of the index.
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
CREATE TABLE IF NOT EXISTS names (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS answers (
    session_id INTEGER NOT NULL, iteration INTEGER NOT NULL, chain INTEGER NOT NULL, owner_id INTEGER NOT NULL,
    digest BLOB NOT NULL, payload BLOB NOT NULL,
    PRIMARY KEY (session_id, iteration, chain, owner_id)) WITHOUT ROWID;
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
class Charge:
    """One owner's new answers in one request: keys (``chains``, ``iterations``) ``(m,)``, query
    ``digests``, ``payloads`` ``(m, width)`` float64, ``mus`` ``(m,)``; and its policy's limit."""

    owner: str
    session: str
    chains: np.ndarray
    iterations: np.ndarray
    digests: list[bytes]
    payloads: np.ndarray
    mus: np.ndarray
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
        self._ids: dict[str, int] = {}

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
    def _id(self, name: str) -> int:
        """Integer id of an owner or session name (created on first use; call under the lock)."""
        if name not in self._ids:
            self._db.execute("INSERT OR IGNORE INTO names(name) VALUES (?)", (name,))
            self._ids[name] = self._db.execute("SELECT id FROM names WHERE name=?", (name,)).fetchone()[0]
        return self._ids[name]

    def stored(self, owners: list[str], session: str, first: int, last: int) -> dict[tuple[str, int, int], tuple[bytes, bytes]]:
        """Stored answers of ``owners`` in ``session`` with iteration in [first, last]:
        (owner, chain, iteration) → (digest, payload). One query for a whole host."""
        with self._lock:
            by_id = {self._id(o): o for o in owners}
            rows = self._db.execute(
                "SELECT owner_id, chain, iteration, digest, payload FROM answers "
                "WHERE session_id=? AND iteration BETWEEN ? AND ?", (self._id(session), first, last)).fetchall()
        return {(by_id[r[0]], r[1], r[2]): (r[3], r[4]) for r in rows if r[0] in by_id}

    def charge(self, charges: list[Charge]) -> None:
        """Charge and store every owner's new answers in one transaction (four statements,
        however many owners).

        Refuses (``BudgetExhausted``, nothing written for anyone) when some owner's total μ²
        would exceed its ``max_mu_squared`` (the μ² at which ε(δ) reaches its budget).
        """
        owners = [c.owner for c in charges]
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                marks = ",".join("?" * len(owners))
                totals = {r[0]: r[1:] for r in self._db.execute(
                    f"SELECT owner, answers, mu_squared, max_mu FROM totals WHERE owner IN ({marks})", owners)}
                new_totals, session_rows, answer_rows = [], [], []
                for c in charges:
                    answers, mu2, max_mu = totals.get(c.owner, (0, 0.0, 0.0))
                    add_mu2, add_max = float(np.dot(c.mus, c.mus)), float(c.mus.max())
                    if mu2 + add_mu2 > c.max_mu_squared:
                        self._refuse(c, GaussianSpend(answers, mu2, max_mu))
                    new_totals.append((c.owner, answers + len(c.mus), mu2 + add_mu2, max(max_mu, add_max)))
                    session_rows.append((len(c.mus), add_mu2, add_max, c.owner, c.session))
                    payloads = np.ascontiguousarray(c.payloads, dtype="<f8")
                    m = len(c.mus)
                    answer_rows.extend(zip([self._id(c.session)] * m, c.iterations.tolist(), c.chains.tolist(),
                                           [self._id(c.owner)] * m, c.digests, map(bytes, payloads)))
                self._db.executemany(
                    "INSERT INTO answers(session_id, iteration, chain, owner_id, digest, payload) VALUES (?,?,?,?,?,?)",
                    answer_rows)
                self._db.executemany(
                    "UPDATE sessions SET answers=answers+?, mu_squared=mu_squared+?, max_mu=MAX(max_mu, ?) "
                    "WHERE owner=? AND session=?", session_rows)
                self._db.executemany(
                    "INSERT INTO totals(owner, answers, mu_squared, max_mu) VALUES (?,?,?,?) ON CONFLICT(owner) "
                    "DO UPDATE SET answers=excluded.answers, mu_squared=excluded.mu_squared, max_mu=excluded.max_mu",
                    new_totals)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    @staticmethod
    def _refuse(c: Charge, before: GaussianSpend) -> None:
        after = before.add(c.mus)
        eps_before = before.epsilon(c.delta)
        left = max(c.budget_epsilon - eps_before, 0.0)
        raise BudgetExhausted(
            f"privacy budget exhausted: {len(c.mus)} more answers would take ε from {eps_before:.4g} to "
            f"{after.epsilon(c.delta):.4g} at δ={c.delta:g}, past the budget ε={c.budget_epsilon:g} ({left:.4g} left)",
            c.owner,
            epsilon_left=left,
        )
