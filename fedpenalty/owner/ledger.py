"""The owners' authoritative privacy ledger and replay cache, in one SQLite file.

One transaction per request (WAL journal): the charge and the answers released are committed
together *before* the owners reply, so a crash never leaves an answer released but not charged,
and a restarted owner replays stored answers instead of drawing new noise (docs/design.md §3,
invariants 2 and 3).

One file may hold the ledgers of several owners hosted by one process. To keep the cost of a
request independent of how many owners a host serves, rows are per *group* of owners (the
owners that answered together) and hold one value per owner:

* ``answers`` — one row per (session, iteration, chain, group): the query digest and every
  group member's answer (float64, group order). Keys are iteration-major, so commits append.
* ``spend`` — one row per (session, group), and one per group for all sessions together
  (session id 0): per-member arrays of answers, Σμ² and max μ. An owner's spend is the sum
  over the rows of the groups it belongs to.
* ``sampled`` — per (session, owner, q, σ): the number of Poisson-subsampled Gaussian answers
  (gradients), accounted with dp-accounting rather than as GDP.
* ``sessions`` — per owner: algorithm, plan, open/close times, sampling rate. An open sgmcmc
  session reserves what its plan may still give (``PlanView.reserved``).
* ``limits`` — per owner: the μ² its Gaussian answers may reach with every gradient answer
  given or reserved (written when a plan is admitted, read by every charge).

One ledger, one writer (invariant 8): a writable ``Ledger`` holds an exclusive ``flock`` on
``<ledger>.lock`` beside the database for its whole life. A second ``Ledger`` on the same file,
in this process or another, is refused (``LedgerInUse``). The lock is on a separate file, not
on the database, because opening and closing another descriptor of the database would drop
the POSIX locks SQLite holds on it in this process. ``Ledger(path, read_only=True)`` takes no
lock and reads the file while a server writes it (offline reports). A storage failure (disk
full, read-only file, I/O error) rolls the transaction back and raises ``StorageUnavailable``.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import numpy as np

from ..common import SGMCMC
from ..errors import (
    BudgetExhausted,
    InvalidRequest,
    LedgerInUse,
    StorageUnavailable,
    UnknownSession,
)
from ..models.base import Neighbour
from ..privacy import GaussianSpend
from ..privacy.owner_epsilon import owner_epsilon
from ..privacy.subsampled import SubsampledGaussian

_ALL_SESSIONS = 0  # the spend rows that total every session (name ids start at 1)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS names (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS groups (id INTEGER PRIMARY KEY, members BLOB NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS sessions (
    owner TEXT NOT NULL, session TEXT NOT NULL, algorithm TEXT NOT NULL,
    planned_answers INTEGER NOT NULL, opened_at REAL NOT NULL, closed_at REAL, sampling_rate REAL,
    PRIMARY KEY (owner, session));
CREATE TABLE IF NOT EXISTS answers (
    session_id INTEGER NOT NULL, iteration INTEGER NOT NULL, chain INTEGER NOT NULL,
    group_id INTEGER NOT NULL, digest BLOB NOT NULL, payload BLOB NOT NULL,
    PRIMARY KEY (session_id, iteration, chain, group_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS spend (
    session_id INTEGER NOT NULL, group_id INTEGER NOT NULL,
    answers BLOB NOT NULL, mu_squared BLOB NOT NULL, max_mu BLOB NOT NULL,
    PRIMARY KEY (session_id, group_id));
CREATE TABLE IF NOT EXISTS sampled (
    session_id INTEGER NOT NULL, owner_id INTEGER NOT NULL, sampling_rate REAL NOT NULL,
    noise_multiplier REAL NOT NULL, answers INTEGER NOT NULL,
    PRIMARY KEY (session_id, owner_id, sampling_rate, noise_multiplier));
CREATE TABLE IF NOT EXISTS limits (owner_id INTEGER PRIMARY KEY, max_mu_squared REAL NOT NULL);
"""


@dataclass(frozen=True)
class Session:
    """A session as the ledger records it for one owner."""

    session: str
    algorithm: str
    planned_answers: int
    closed: bool
    spend: GaussianSpend
    sampled: list[SubsampledGaussian]
    sampling_rate: float | None


@dataclass(frozen=True)
class PlanView:
    """What one owner has spent and holds, read inside the transaction that admits a plan.

    ``existing``: the session being re-opened (None when new); ``total``: its Gaussian spend;
    ``sampled``: the gradient answers it gave (all sessions); ``reserved``: what its *other* open
    sgmcmc sessions may still give, at the noise multiplier the owner named; ``gaussian_open``:
    some non-sgmcmc session of the owner is open (counting the one being opened).
    """

    existing: Session | None
    total: GaussianSpend
    sampled: list[SubsampledGaussian]
    reserved: list[SubsampledGaussian]
    gaussian_open: bool


#: decides a plan from a ``PlanView``: raises to refuse, returns the owner's new Gaussian μ² cap
#: (or None to keep it). It runs inside the ledger's transaction and must not call the ledger.
Admit = Callable[[PlanView], float | None]


@dataclass(frozen=True)
class Charge:
    """New answers of K owners (one ledger) to one request of M keys.

    Keys (``chains[j]``, ``iterations[j]``) with query ``digests[j]``; ``payloads`` ``(K, M, w)``
    float64; ``mus`` ``(K, M)``; ``new`` ``(K, M)`` marks the answers to store and charge.
    ``max_mu_squared``, ``budget_epsilon``, ``delta``: ``(K,)`` each owner's limit; the ledger
    enforces the lower of ``max_mu_squared`` and the cap it recorded for the owner's plans.

    Gradient answers (``sampled`` set) are Poisson-subsampled Gaussian releases at
    (q, ``sampled.noise_multiplier[k]``) instead of GDP answers: ``mus`` is ignored and each
    owner's count in the session may not pass ``sampled.plan[k]`` (its budget was checked for
    the whole plan when the session opened).
    """

    session: str
    owners: list[str]
    chains: np.ndarray
    iterations: np.ndarray
    digests: list[bytes]
    payloads: np.ndarray
    mus: np.ndarray
    new: np.ndarray
    max_mu_squared: np.ndarray
    budget_epsilon: np.ndarray
    delta: np.ndarray
    sampled: SampledCharge | None = None
    lattice: bool = False


@dataclass(frozen=True)
class SampledCharge:
    """Subsampled-Gaussian charge parameters: rate ``q``, per-owner noise multipliers, plans and
    neighbour relations."""

    q: float
    noise_multiplier: np.ndarray
    plan: np.ndarray
    neighbour: list[Neighbour]


class Ledger:
    """SQLite ledger. ``synchronous="FULL"`` survives power loss; ``"NORMAL"`` survives a
    process crash (``kill -9``) but may lose the last commits on power loss. ``read_only``:
    no lock and no writes (reports read while a server writes the file)."""

    def __init__(self, path: str | Path, synchronous: str = "FULL", read_only: bool = False):
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError("synchronous must be 'FULL' or 'NORMAL'")
        self.path = str(path)
        self.read_only = read_only
        #: False after a storage failure, True again after the next successful write
        self.writable = True
        self._lock = threading.Lock()
        self._lock_fd = None if read_only or self.path == ":memory:" else self._take_file_lock()
        try:
            self._db = self._connect(synchronous)
        except sqlite3.OperationalError as exc:
            self._release_file_lock()
            raise self._unavailable(exc) from exc
        self._ids: dict[str, int] = {}
        self._groups: dict[tuple[int, ...], int] = {}
        self._members: dict[int, np.ndarray] = {}

    def _take_file_lock(self) -> int:
        """An exclusive ``flock`` on ``<ledger>.lock`` (the descriptor), or ``LedgerInUse``."""
        database = Path(self.path).resolve()
        database.parent.mkdir(parents=True, exist_ok=True)
        lock = f"{database}.lock"
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StorageUnavailable(
                f"ledger {database} cannot be locked: {exc.strerror} ({lock})"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LedgerInUse(
                f"ledger {database} is in use: another process serves it (it holds {lock}); "
                "an owner's ledger has one writer"
            ) from None
        return fd

    def _release_file_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def _connect(self, synchronous: str) -> sqlite3.Connection:
        if self.read_only:
            uri = f"file:{quote(str(Path(self.path).resolve()))}?mode=ro"
            return sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={synchronous}")
        db.execute("BEGIN IMMEDIATE")  # fails at once on a file that cannot be written
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                db.execute(statement)
        db.execute("COMMIT")
        return db

    def close(self) -> None:
        with self._lock:
            self._db.close()
            self._release_file_lock()

    def _unavailable(self, exc: sqlite3.Error, what: str = "cannot be written") -> Exception:
        """The ``StorageUnavailable`` of a failed SQLite call."""
        return StorageUnavailable(
            f"ledger {self.path} {what} ({exc}); nothing was answered or charged"
        )

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """One write transaction under the lock (``BEGIN IMMEDIATE … COMMIT``). Any exception
        rolls it back; a storage failure becomes ``StorageUnavailable`` and clears
        ``writable`` until a later write commits."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield
                    self._db.execute("COMMIT")
                except BaseException:
                    if self._db.in_transaction:  # SQLite may have rolled back already
                        self._db.execute("ROLLBACK")
                    raise
            except sqlite3.OperationalError as exc:
                self.writable = False
                raise self._unavailable(exc) from exc
            self.writable = True

    @contextmanager
    def _reading(self) -> Iterator[None]:
        """Reads under the lock; a storage failure becomes ``StorageUnavailable``."""
        with self._lock:
            try:
                yield
            except sqlite3.OperationalError as exc:
                raise self._unavailable(exc, "cannot be read") from exc

    # --- ids and groups (call under the lock) -----------------------------------------------
    def _id(self, name: str) -> int:
        """Integer id of an owner or session name, created on first use (read-only: -1, which
        matches no row, for a name never recorded)."""
        if name not in self._ids:
            if not self.read_only:
                self._db.execute("INSERT OR IGNORE INTO names(name) VALUES (?)", (name,))
            row = self._db.execute("SELECT id FROM names WHERE name=?", (name,)).fetchone()
            if row is None:
                return -1
            self._ids[name] = row[0]
        return self._ids[name]

    def _group(self, owner_ids: np.ndarray) -> int:
        """Id of the group with these member owner ids (in this order), created on first use."""
        key = tuple(int(i) for i in owner_ids)
        if key not in self._groups:
            blob = np.asarray(key, dtype="<i8").tobytes()
            self._db.execute("INSERT OR IGNORE INTO groups(members) VALUES (?)", (blob,))
            self._groups[key] = self._db.execute(
                "SELECT id FROM groups WHERE members=?", (blob,)
            ).fetchone()[0]
        return self._groups[key]

    def _group_members(self, group_id: int) -> np.ndarray:
        if group_id not in self._members:
            blob = self._db.execute(
                "SELECT members FROM groups WHERE id=?", (group_id,)
            ).fetchone()[0]
            self._members[group_id] = np.frombuffer(blob, dtype="<i8")
        return self._members[group_id]

    def _spend(
        self, owner_ids: np.ndarray, session_id: int = _ALL_SESSIONS
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Spend of each owner id in ``session_id`` (default: all sessions), summed over the
        groups it belongs to: answers ``(K,)``, Σμ² ``(K,)``, max μ ``(K,)``."""
        k = len(owner_ids)
        answers, mu2, max_mu = np.zeros(k, dtype=np.int64), np.zeros(k), np.zeros(k)
        position = {int(i): j for j, i in enumerate(owner_ids)}
        for gid, a, m2, mx in self._db.execute(
            "SELECT group_id, answers, mu_squared, max_mu FROM spend WHERE session_id=?",
            (session_id,),
        ):
            members = self._group_members(gid)
            where = np.array([position.get(i, -1) for i in members.tolist()])
            hit = where >= 0
            if hit.any():
                at = where[hit]
                answers[at] += np.frombuffer(a, "<i8")[hit]
                mu2[at] += np.frombuffer(m2, "<f8")[hit]
                max_mu[at] = np.maximum(max_mu[at], np.frombuffer(mx, "<f8")[hit])
        return answers, mu2, max_mu

    def _spend_of(self, owner: str, session_id: int = _ALL_SESSIONS) -> GaussianSpend:
        answers, mu2, max_mu = self._spend(np.array([self._id(owner)]), session_id)
        return GaussianSpend(int(answers[0]), float(mu2[0]), float(max_mu[0]))

    # --- sessions ---------------------------------------------------------------------------
    def open_session(
        self,
        owner: str,
        session: str,
        algorithm: str,
        planned_answers: int,
        sampling_rate: float | None = None,
        noise_multiplier: float = 1.0,
        admit: Admit | None = None,
    ) -> float | None:
        """Record a session, or resume an open one with the same algorithm and sampling rate.

        ``admit`` sees the owner's spend and the reservations of its other open sgmcmc sessions
        (at ``noise_multiplier``) and may refuse; its cap is recorded (and returned). The check
        and the insert are one ``BEGIN IMMEDIATE`` transaction, so two concurrent plans never
        both fit what only one of them fits.
        """
        with self._writing():
            row = self._db.execute(
                "SELECT algorithm, closed_at, sampling_rate FROM sessions WHERE owner=? AND "
                "session=?",
                (owner, session),
            ).fetchone()
            if row is not None and (row[0] != algorithm or row[2] != sampling_rate):
                raise InvalidRequest(
                    f"session {session!r} was opened for {row[0]!r} at sampling rate {row[2]}, not "
                    f"{algorithm!r} at {sampling_rate}",
                    owner,
                )
            if row is not None and row[1] is not None:
                raise UnknownSession(f"session {session!r} is closed", owner)
            cap = (
                None
                if admit is None
                else admit(self._plan_view(owner, session, algorithm, noise_multiplier))
            )
            if row is None:
                self._db.execute(
                    "INSERT INTO sessions(owner, session, algorithm, planned_answers, opened_at, "
                    "sampling_rate) VALUES (?,?,?,?,?,?)",
                    (owner, session, algorithm, planned_answers, time.time(), sampling_rate),
                )
            if cap is not None:
                self._db.execute(
                    "INSERT OR REPLACE INTO limits(owner_id, max_mu_squared) VALUES (?,?)",
                    (self._id(owner), cap),
                )
        return cap

    def _plan_view(
        self, owner: str, session: str, algorithm: str, noise_multiplier: float
    ) -> PlanView:
        """The owner's spend and reservations (call inside the transaction)."""
        open_rows = self._db.execute(
            "SELECT session, algorithm, planned_answers, sampling_rate FROM sessions "
            "WHERE owner=? AND closed_at IS NULL",
            (owner,),
        ).fetchall()
        reserved = []
        for name, kind, planned, rate in open_rows:
            if kind == SGMCMC and name != session:
                used = sum(e.count for e in self._sampled(owner, self._id(name)))
                reserved.append(SubsampledGaussian(rate, noise_multiplier, max(planned - used, 0)))
        return PlanView(
            self._session(owner, session),
            self._spend_of(owner),
            self._sampled(owner),
            reserved,
            algorithm != SGMCMC or any(kind != SGMCMC for _, kind, _, _ in open_rows),
        )

    def close_session(self, owner: str, session: str) -> None:
        """Close the session: its plan no longer holds budget."""
        with self._writing():
            self._db.execute(
                "UPDATE sessions SET closed_at=? WHERE owner=? AND session=? AND closed_at IS NULL",
                (time.time(), owner, session),
            )

    def session(self, owner: str, session: str) -> Session | None:
        with self._reading():
            return self._session(owner, session)

    def _session(self, owner: str, session: str) -> Session | None:
        row = self._db.execute(
            "SELECT algorithm, planned_answers, closed_at, sampling_rate FROM sessions "
            "WHERE owner=? AND session=?",
            (owner, session),
        ).fetchone()
        if row is None:
            return None
        spend = self._spend_of(owner, self._id(session))
        sampled = self._sampled(owner, self._id(session))
        return Session(session, row[0], row[1], row[2] is not None, spend, sampled, row[3])

    def sampled(self, owner: str) -> list[SubsampledGaussian]:
        """The owner's subsampled-Gaussian answers across all sessions, one event per (q, σ)."""
        with self._reading():
            return self._sampled(owner)

    def _sampled(self, owner: str, session_id: int | None = None) -> list[SubsampledGaussian]:
        where, args = "WHERE owner_id=?", [self._id(owner)]
        if session_id is not None:
            where, args = where + " AND session_id=?", [*args, session_id]
        rows = self._db.execute(
            f"SELECT sampling_rate, noise_multiplier, SUM(answers) FROM sampled {where} "
            "GROUP BY sampling_rate, noise_multiplier",
            args,
        ).fetchall()
        return [SubsampledGaussian(q, sigma, int(count)) for q, sigma, count in rows]

    def total(self, owner: str) -> GaussianSpend:
        """Everything the owner has ever been charged, across sessions."""
        with self._reading():
            return self._spend_of(owner)

    def _limits(self, owner_ids: np.ndarray) -> list[float | None]:
        """The recorded μ² cap of each owner id (None: not recorded)."""
        rows = dict(self._db.execute("SELECT owner_id, max_mu_squared FROM limits").fetchall())
        return [rows.get(int(i)) for i in owner_ids]

    # --- answers ----------------------------------------------------------------------------
    def stored(
        self, owners: list[str], session: str, first: int, last: int
    ) -> dict[tuple[str, int, int], tuple[bytes, bytes]]:
        """Stored answers of ``owners`` in ``session`` with iteration in [first, last]:
        (owner, chain, iteration) → (digest, payload bytes of that owner). One query."""
        found: dict[tuple[str, int, int], tuple[bytes, bytes]] = {}
        with self._reading():
            by_id = {self._id(o): o for o in owners}
            rows = self._db.execute(
                "SELECT iteration, chain, group_id, digest, payload FROM answers "
                "WHERE session_id=? AND iteration BETWEEN ? AND ?",
                (self._id(session), first, last),
            ).fetchall()
            for iteration, chain, gid, digest, payload in rows:
                members = self._group_members(gid)
                width = len(payload) // (8 * len(members))
                for j, owner_id in enumerate(members.tolist()):
                    if owner_id in by_id:
                        found[(by_id[owner_id], chain, iteration)] = (
                            digest,
                            payload[8 * width * j : 8 * width * (j + 1)],
                        )
        return found

    def charge(self, c: Charge) -> None:
        """Charge and store the new answers in one transaction: a constant number of statements
        however many owners. Refuses (``BudgetExhausted``, nothing written for anyone) when some
        owner's total μ² would exceed its ``max_mu_squared`` (the μ² where ε(δ) meets its budget).
        """
        mus = np.where(c.new, c.mus, 0.0)
        add_answers = c.new.sum(axis=1).astype(np.int64)
        add_mu2 = np.einsum("km,km->k", mus, mus)
        add_max = mus.max(axis=1)
        with self._writing():
            owner_ids = np.array([self._id(o) for o in c.owners], dtype=np.int64)
            session_id = self._id(c.session)
            if c.sampled is not None:
                self._charge_sampled(c, owner_ids, session_id, add_answers)
                add_answers, add_mu2, add_max = 0 * add_answers, 0 * add_mu2, 0 * add_max
            self._check_gdp_limit(c, owner_ids, add_mu2)
            full_group = self._group(owner_ids)
            self._store_answers(c, owner_ids, session_id, full_group)
            if c.sampled is None:
                for sid in (session_id, _ALL_SESSIONS):
                    self._add_spend(sid, full_group, add_answers, add_mu2, add_max)

    def _check_gdp_limit(self, c: Charge, owner_ids: np.ndarray, add_mu2: np.ndarray) -> None:
        """Refuse (``BudgetExhausted``) when some owner's μ² would pass its cap: the lower of
        ``max_mu_squared`` and the cap recorded when its plans were admitted."""
        recorded = self._limits(owner_ids)
        cap = np.array(
            [
                c.max_mu_squared[k] if r is None else min(c.max_mu_squared[k], r)
                for k, r in enumerate(recorded)
            ]
        )
        answers_before, mu2_before, max_before = self._spend(owner_ids)
        over = mu2_before + add_mu2 > cap
        if over.any():
            k = int(np.argmax(over))
            before = GaussianSpend(
                int(answers_before[k]), float(mu2_before[k]), float(max_before[k])
            )
            self._refuse(
                c.owners[k],
                before,
                c.mus[k][c.new[k]],
                float(c.budget_epsilon[k]),
                float(c.delta[k]),
                c.lattice,
            )

    def _store_answers(
        self, c: Charge, owner_ids: np.ndarray, session_id: int, full_group: int
    ) -> None:
        """One row per answered key: the owners that answered it (a group) and their answers."""
        rows = []
        for j in np.flatnonzero(c.new.any(axis=0)).tolist():
            members = c.new[:, j]
            gid = full_group if members.all() else self._group(owner_ids[members])
            payload = np.ascontiguousarray(c.payloads[members, j], dtype="<f8").tobytes()
            rows.append(
                (session_id, int(c.iterations[j]), int(c.chains[j]), gid, c.digests[j], payload)
            )
        self._db.executemany(
            "INSERT INTO answers(session_id, iteration, chain, group_id, digest, payload) "
            "VALUES (?,?,?,?,?,?)",
            rows,
        )

    def _charge_sampled(
        self, c: Charge, owner_ids: np.ndarray, session_id: int, add: np.ndarray
    ) -> None:
        """Count subsampled-Gaussian answers, refusing past any owner's session plan."""
        sampled = c.sampled
        assert sampled is not None
        q = float(sampled.q)
        counts = dict(
            self._db.execute(
                "SELECT owner_id, SUM(answers) FROM sampled WHERE session_id=? GROUP BY owner_id",
                (session_id,),
            ).fetchall()
        )
        used = np.array([counts.get(int(i), 0) for i in owner_ids])
        over = used + add > sampled.plan
        if over.any():
            k = int(np.argmax(over))
            spent, _ = owner_epsilon(
                self._spend_of(c.owners[k]),
                self._sampled(c.owners[k]),
                float(c.delta[k]),
                sampled.neighbour[k],
                c.lattice,
            )
            left = max(float(c.budget_epsilon[k]) - spent, 0.0)
            raise BudgetExhausted(
                f"privacy budget: this session's plan of {int(sampled.plan[k])} gradient answers "
                f"(the most the "
                f"owner's budget was checked for when the session opened) is used up "
                f"({int(used[k])} answered; "
                f"ε {left:.4g} left of the budget for a new session)",
                c.owners[k],
                epsilon_left=left,
            )
        self._db.executemany(
            "INSERT INTO sampled(session_id, owner_id, sampling_rate, noise_multiplier, answers) "
            "VALUES (?,?,?,?,?) "
            "ON CONFLICT(session_id, owner_id, sampling_rate, noise_multiplier) DO UPDATE SET "
            "answers=answers+excluded.answers",
            [
                (session_id, int(i), q, float(sigma), int(a))
                for i, sigma, a in zip(owner_ids, sampled.noise_multiplier, add)
                if a > 0
            ],
        )

    def _add_spend(
        self,
        session_id: int,
        group_id: int,
        answers: np.ndarray,
        mu2: np.ndarray,
        max_mu: np.ndarray,
    ) -> None:
        row = self._db.execute(
            "SELECT answers, mu_squared, max_mu FROM spend WHERE session_id=? AND group_id=?",
            (session_id, group_id),
        ).fetchone()
        if row is not None:
            answers = answers + np.frombuffer(row[0], "<i8")
            mu2 = mu2 + np.frombuffer(row[1], "<f8")
            max_mu = np.maximum(max_mu, np.frombuffer(row[2], "<f8"))
        self._db.execute(
            "INSERT OR REPLACE INTO spend(session_id, group_id, answers, mu_squared, max_mu) "
            "VALUES (?,?,?,?,?)",
            (
                session_id,
                group_id,
                answers.astype("<i8").tobytes(),
                mu2.astype("<f8").tobytes(),
                max_mu.astype("<f8").tobytes(),
            ),
        )

    @staticmethod
    def _refuse(
        owner: str,
        before: GaussianSpend,
        mus: np.ndarray,
        budget_epsilon: float,
        delta: float,
        lattice: bool,
    ) -> None:
        # the μ_t already hold the neighbour factor: without gradient answers the relation
        # does not change ε, so any valid one will do
        eps_before, _ = owner_epsilon(before, [], delta, "add_remove", lattice)
        eps_after, _ = owner_epsilon(before.add(mus), [], delta, "add_remove", lattice)
        left = max(budget_epsilon - eps_before, 0.0)
        raise BudgetExhausted(
            f"privacy budget exhausted: {len(mus)} more answers would take ε from "
            f"{eps_before:.4g} to {eps_after:.4g} at δ={delta:g}, past the budget "
            f"ε={budget_epsilon:g} ({left:.4g} left)",
            owner,
            epsilon_left=left,
        )
