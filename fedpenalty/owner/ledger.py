"""The owners' authoritative privacy ledger and replay cache, in one SQLite file.

One transaction per request (WAL journal): the charge and the answers released are committed
together *before* the owners reply, so a crash never leaves an answer released but not charged,
and a restarted owner replays stored answers instead of drawing new noise (docs/design.md §3,
invariants 2 and 3).

One file may hold the ledgers of several owners hosted by one process. To keep the cost of a
request independent of how many owners a host serves, rows are per *group* of owners (the
owners that answered together) and hold one value per owner:

* ``answer_blocks`` — one row per charge and group (the owners that answered the same keys;
  usually one row per request): its keys, their query digests, every member's answers and
  the sums of the keys' steps (count, Σ, Σ², max) on its spend line (``ledger_rows``).
  Iterations grow with the rowid, so commits append.
* ``spend_lines`` — one row per (session, group, μ slope, μ offset), written once: μ is
  affine in the step, so the step sums of a line's blocks give every member's answers, Σμ² and
  max μ exactly (``ledger_rows``). A charge writes one row however many owners answered. An
  owner's spend is the sum over the lines of the groups it belongs to (in one session, or in
  all); a writer also keeps each owner's totals in memory.
* ``answers``, ``spend`` — the same per key and per (session, group) arrays, as earlier ledgers
  wrote them: still read (replays, spend), never written.
* ``sampled`` — per (session, owner, q, σ): the number of Poisson-subsampled Gaussian answers
  (gradients), accounted with dp-accounting rather than as GDP.
* ``sessions`` — per owner: algorithm, plan, open/close times, sampling rate. An open sgmcmc
  session reserves what its plan may still give (``PlanView.reserved``).
* ``limits`` — per owner: the μ² its Gaussian answers may reach with every gradient answer
  given or reserved (written when a plan is admitted, read by every charge).
* ``mechanisms`` — per owner: whether it ever opened a session as a lattice owner (then all
  of its answers are accounted by Rényi DP, which bounds float Gaussian answers too).
* ``sessions.client`` — the client identity (allow-list entry) that opened a session: no
  other client may re-open it, also after the owner restarts.
* ``secure_sessions`` — per (owner, session) with secure aggregation (docs/design.md §2.6): the
  K, t and s the owner counted and assumed and the transcript hash of the peers' keys; a
  resumed session must show the same. Answers of these sessions are stored masked (uint64
  lattice words, the check word last), so a replay releases exactly what was released.
* ``agreement`` — per owner: the secret its secure-session X25519 keys derive from (drawn from
  OS entropy once), so a restarted owner continues its sessions. The ledger file must
  therefore be kept as private as the owner's data.

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
import secrets
import sqlite3
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import numpy as np

from ..common import SGMCMC, SecureTerms
from ..errors import (
    BudgetExhausted,
    InvalidRequest,
    LedgerInUse,
    NotPermitted,
    ReplayConflict,
    StorageUnavailable,
    UnknownSession,
)
from ..models.base import Neighbour
from ..privacy import GaussianSpend
from ..privacy.owner_epsilon import owner_epsilon
from ..privacy.subsampled import SubsampledGaussian
from .ledger_rows import (
    AffineMus,
    Index,
    PendingLine,
    StepSums,
    block_fields,
    gdp_add,
    key_groups,
    line_spend,
    read_block,
    span,
)

_LEGACY_TOTALS = 0  # session id of the all-session rows older ledgers kept (ids start at 1)

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
CREATE TABLE IF NOT EXISTS answer_blocks (
    session_id INTEGER NOT NULL, first_iteration INTEGER NOT NULL,
    last_iteration INTEGER NOT NULL, group_id INTEGER NOT NULL, line_id INTEGER,
    answers INTEGER NOT NULL, steps REAL NOT NULL, steps_squared REAL NOT NULL,
    max_step REAL NOT NULL, keys BLOB NOT NULL, digests BLOB NOT NULL, payload BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS answer_blocks_by_iteration
    ON answer_blocks(session_id, last_iteration);
CREATE TABLE IF NOT EXISTS spend_lines (
    id INTEGER PRIMARY KEY, session_id INTEGER NOT NULL, group_id INTEGER NOT NULL,
    slope BLOB NOT NULL, offset BLOB NOT NULL, UNIQUE (session_id, group_id, slope, offset));
CREATE TABLE IF NOT EXISTS sampled (
    session_id INTEGER NOT NULL, owner_id INTEGER NOT NULL, sampling_rate REAL NOT NULL,
    noise_multiplier REAL NOT NULL, answers INTEGER NOT NULL,
    PRIMARY KEY (session_id, owner_id, sampling_rate, noise_multiplier));
CREATE TABLE IF NOT EXISTS limits (owner_id INTEGER PRIMARY KEY, max_mu_squared REAL NOT NULL);
CREATE TABLE IF NOT EXISTS mechanisms (owner_id INTEGER PRIMARY KEY, lattice INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS health (id INTEGER PRIMARY KEY, checked_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS secure_sessions (
    owner_id INTEGER NOT NULL, session_id INTEGER NOT NULL, owners INTEGER NOT NULL,
    colluders INTEGER NOT NULL, total_noise_sd REAL NOT NULL, transcript BLOB NOT NULL,
    PRIMARY KEY (owner_id, session_id));
CREATE TABLE IF NOT EXISTS agreement (owner_id INTEGER PRIMARY KEY, secret BLOB NOT NULL);
"""

#: Columns added after a table first shipped: (table, column, declaration) — added on open.
_ADDED_COLUMNS = (
    ("sessions", "client", "TEXT"),
    ("sessions", "max_step", "REAL"),
    ("sessions", "noise_multiplier", "REAL"),
)


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
    opened_at: float | None = None  # Unix time


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


def _events(rows: list[tuple]) -> list[SubsampledGaussian]:
    """One event per (q, σ) of sampled rows (session id, q, σ, count)."""
    counts: dict[tuple[float, float], int] = defaultdict(int)
    for _, q, sigma, count in rows:
        counts[(q, sigma)] += count
    return [SubsampledGaussian(q, sigma, c) for (q, sigma), c in counts.items()]


def _terms_row(terms: SecureTerms) -> tuple[int, int, float]:
    return (terms.owners, terms.colluders, terms.total_noise_sd)


def _secure_words(kept: tuple[SecureTerms, bytes] | None) -> str:
    if kept is None:
        return "no secure aggregation"
    terms, digest = kept
    return (
        f"secure aggregation over {terms.owners} owners (colluders {terms.colluders}, "
        f"total_noise_sd {terms.total_noise_sd:g}, peer keys {digest.hex()[:12]}…)"
    )


def _check_reopen(
    owner: str, row: tuple | None, session: str, asked: tuple, client: str | None
) -> None:
    """Refuse re-opening a recorded session (``row``: algorithm, closed_at, sampling_rate,
    client, max_step) by another client, with other terms (``asked``: algorithm, sampling
    rate, max step), or once closed."""
    if row is None:
        return
    if None not in (row[3], client) and row[3] != client:
        raise NotPermitted(
            f"session {session!r} was opened by another client, not {client!r}", owner
        )
    recorded = (row[0], row[2], row[4])
    if recorded != asked:
        terms = "algorithm {!r}, sampling rate {}, max_step {}"
        raise InvalidRequest(
            f"session {session!r} was opened with {terms.format(*recorded)}, not "
            f"{terms.format(*asked)}; a resumed session keeps its terms",
            owner,
        )
    if row[1] is not None:
        raise UnknownSession(f"session {session!r} is closed", owner)


#: decides a plan from a ``PlanView``: raises to refuse, returns the owner's new Gaussian μ² cap
#: (or None to keep it). It runs inside the ledger's transaction and must not call the ledger.
Admit = Callable[[PlanView], float | None]


@dataclass(frozen=True)
class SecureRecord:
    """What the ledger keeps of an owner's secure session: the ``terms`` it counted and assumed
    and the ``transcript`` hash of the session's peers and terms (docs/design.md §2.6)."""

    terms: SecureTerms
    transcript: bytes


@dataclass(frozen=True)
class SecureSpend:
    """One secure session of an owner with its spend there (Gaussian and gradient answers)."""

    session: str
    terms: SecureTerms
    spend: GaussianSpend
    sampled: list[SubsampledGaussian]


@dataclass(frozen=True)
class Report:
    """One owner's spend as ``Ledger.reports`` reads it: in all sessions (``total``,
    ``sampled``); whether the asked session is recorded for it, and then its spend there
    (``session``: Gaussian spend and gradient answers); ``secure``: each of its secure
    sessions with its spend."""

    total: GaussianSpend
    sampled: list[SubsampledGaussian]
    in_session: bool
    session: tuple[GaussianSpend, list[SubsampledGaussian]] | None
    secure: list[SecureSpend] = field(default_factory=list)


@dataclass(frozen=True)
class Opening:
    """One owner opening a session: its name, the noise multiplier its other open sgmcmc
    sessions are reserved at when the ledger did not record theirs (sessions of earlier
    ledgers), whether it answers with lattice noise, its plan check, the record of a secure
    session (None: plain), and ``session_multiplier``: the multiplier this session's gradient
    answers are charged at (sgmcmc sessions; recorded, so that later admissions reserve what the
    session may still give at that multiplier, also after a restart)."""

    owner: str
    noise_multiplier: float = 1.0
    lattice: bool = False
    admit: Admit | None = None
    secure: SecureRecord | None = None
    session_multiplier: float | None = None


@dataclass(frozen=True)
class Charge:
    """New answers of K owners (one ledger) to one request of M keys.

    Keys (``chains[j]``, ``iterations[j]``) with query ``digests[j]`` (SHA-256); ``payloads``
    ``(K, M, w)`` float64 (uint64 masked words in secure sessions; stored as they are); ``mus``:
    every answer's μ (None for gradient answers); ``new`` ``(K, M)`` marks the answers to store
    and charge.
    ``max_mu_squared``, ``budget_epsilon``, ``delta``: ``(K,)`` each owner's limit; the ledger
    enforces the lower of ``max_mu_squared`` and the cap it recorded for the owner's plans.
    ``owner_ids``: the owners' ledger ids (``Ledger.ids``), when the caller has them.

    Gradient answers (``sampled`` set) are Poisson-subsampled Gaussian releases at
    (q, ``sampled.noise_multiplier[k]``) instead of GDP answers: ``mus`` is None and each
    owner's count in the session may not pass the plan the ledger admitted against its budget
    (``sessions.planned_answers``, read in the charging transaction — never a plan held in
    memory). ``payloads`` may be None for ``Ledger.charging``, which takes them once every
    check has passed.
    """

    session: str
    owners: list[str]
    chains: np.ndarray
    iterations: np.ndarray
    digests: list[bytes]
    payloads: np.ndarray | None
    mus: AffineMus | None
    new: np.ndarray
    max_mu_squared: np.ndarray
    budget_epsilon: np.ndarray
    delta: np.ndarray
    sampled: SampledCharge | None = None
    lattice: bool = False
    owner_ids: np.ndarray | None = None


@dataclass(frozen=True)
class SampledCharge:
    """Subsampled-Gaussian charge parameters: rate ``q``, per-owner noise multipliers and
    neighbour relations."""

    q: float
    noise_multiplier: np.ndarray
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
        #: the file has answer blocks and spend lines (a reader of an earlier ledger: not)
        self._blocks = self._has_table("answer_blocks")
        self._forget()

    def _forget(self) -> None:
        """Drop every in-memory cache (they are reloaded from the file on demand): after a
        rolled-back transaction, whose ids and rows never reached the file."""
        self._ids: dict[str, int] = {}
        self._names_loaded = False
        self._groups: dict[bytes, int] = {}
        self._members: dict[int, np.ndarray] = {}
        # a writer is the file's only writer (the lock), so these mirror what is committed:
        self._slots: dict[int, int] = {}  # owner id → row of _totals / _caps
        self._slots_of: dict[bytes, np.ndarray] = {}  # owner-id array bytes → their rows
        self._totals = np.zeros((0, 3))  # per owner, all sessions: answers, Σμ², max μ
        self._caps = np.zeros(0)  # per owner: recorded μ² cap (inf: none)
        self._caps_version = 0  # counts changes of _caps
        self._pending: PendingLine | None = None  # charges not yet in _totals
        self._lines: dict[tuple[int, int, bytes, bytes], int] = {}  # spend line ids
        self._frontier: dict[int, int] = {}  # session id → highest iteration answered
        self._plans: dict[str, dict[str, int]] = {}  # open session → owner → admitted plan
        self._lattice_ids: set[int] | None = None  # owners recorded in ``mechanisms``

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
        for table, column, declaration in _ADDED_COLUMNS:
            present = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
            if column not in present:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
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
                    self._forget()
                    raise
            except sqlite3.OperationalError as exc:
                self.writable = False
                raise self._unavailable(exc) from exc
            self.writable = True

    def probe(self) -> bool:
        """Try one small write (``writable`` follows the result): how a server finds out that a
        ledger it reported unwritable can be written again, without waiting for a request."""
        try:
            with self._writing():
                self._db.execute(
                    "INSERT OR REPLACE INTO health(id, checked_at) VALUES (1, ?)", (time.time(),)
                )
        except StorageUnavailable:
            return False
        return True

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
            self._load_names()
            if name in self._ids:
                return self._ids[name]
            if not self.read_only:
                self._db.execute("INSERT OR IGNORE INTO names(name) VALUES (?)", (name,))
            row = self._db.execute("SELECT id FROM names WHERE name=?", (name,)).fetchone()
            if row is None:
                return -1
            self._ids[name] = row[0]
        return self._ids[name]

    def _load_names(self) -> None:
        """A writer reads the names table once (one statement, however many owners)."""
        if not self._names_loaded and not self.read_only:
            self._ids.update({n: i for i, n in self._db.execute("SELECT id, name FROM names")})
            self._names_loaded = True

    def ids(self, names: list[str]) -> np.ndarray:
        """Integer ids of ``names`` ``(K,)``, creating the missing ones in one transaction."""
        with self._reading():
            self._load_names()
            missing = [n for n in names if n not in self._ids]
        if missing and not self.read_only:
            with self._writing():
                self._db.executemany(
                    "INSERT OR IGNORE INTO names(name) VALUES (?)", [(n,) for n in missing]
                )
                self._names_loaded = False
                self._load_names()
        with self._reading():
            return np.array([self._id(n) for n in names], dtype=np.int64)

    def _group(self, owner_ids: np.ndarray) -> int:
        """Id of the group with these member owner ids (in this order), created on first use."""
        blob = key = np.ascontiguousarray(owner_ids, dtype="<i8").tobytes()
        if key not in self._groups:
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
        self, owner_ids: np.ndarray, session_id: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Spend of each owner id in ``session_id`` (None: all sessions), summed over the
        groups it belongs to: answers ``(K,)``, Σμ² ``(K,)``, max μ ``(K,)``."""
        k = len(owner_ids)
        answers, mu2, max_mu = np.zeros(k, dtype=np.int64), np.zeros(k), np.zeros(k)
        order = np.argsort(owner_ids)
        ordered = owner_ids[order]
        for gid, (a, m2, mx) in self._group_spends(session_id):
            members = self._group_members(gid)
            pos = np.minimum(np.searchsorted(ordered, members), max(k - 1, 0))
            hit = ordered[pos] == members if k else np.zeros(len(members), bool)
            if hit.any():
                at = order[pos[hit]]
                answers[at] += a[hit]
                mu2[at] += m2[hit]
                max_mu[at] = np.maximum(max_mu[at], mx[hit])
        return answers, mu2, max_mu

    def _group_spends(
        self, session_id: int | None
    ) -> Iterator[tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]]]:
        """(group id, its members' answers, Σμ², max μ) of every spend line, and of every spend
        row of earlier ledgers, in ``session_id`` (None: all sessions)."""
        where, args = ("session_id=?", (session_id,)) if session_id is not None else ("1", ())
        lines = (
            self._db.execute(
                "SELECT l.group_id, l.slope, l.offset, b.* FROM spend_lines l JOIN ("
                "SELECT line_id, SUM(answers), SUM(steps), SUM(steps_squared), MAX(max_step) "
                f"FROM answer_blocks WHERE line_id IS NOT NULL AND {where} GROUP BY line_id"
                ") b ON b.line_id = l.id",
                args,
            )
            if self._blocks
            else []
        )
        for gid, slope, offset, *sums in lines:
            sums = sums[1:]  # after the line id
            a, b = np.frombuffer(slope, "<f8"), np.frombuffer(offset, "<f8")
            yield gid, line_spend(StepSums(*sums), a, b)
        # session id 0 held all-session totals in ledgers written before per-session rows: the
        # per-session rows sum to the same, so those rows are never read
        if session_id is None:
            where, args = "session_id != ?", (_LEGACY_TOTALS,)
        for gid, a, m2, mx in self._db.execute(
            f"SELECT group_id, answers, mu_squared, max_mu FROM spend WHERE {where}", args
        ):
            spend = np.frombuffer(a, "<i8"), np.frombuffer(m2, "<f8"), np.frombuffer(mx, "<f8")
            yield gid, spend

    def _spend_of(self, owner: str, session_id: int | None = None) -> GaussianSpend:
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
        client: str | None = None,
        lattice: bool = False,
    ) -> float | None:
        """``open_sessions`` for one owner: its recorded cap (or None)."""
        opening = Opening(owner, noise_multiplier, lattice, admit)
        return self.open_sessions(
            [opening], session, algorithm, planned_answers, sampling_rate, client
        )[0]

    def open_sessions(
        self,
        owners: list[Opening],
        session: str,
        algorithm: str,
        planned_answers: int,
        sampling_rate: float | None = None,
        client: str | None = None,
        max_step: float | None = None,
    ) -> list[float | None]:
        """Record a session for every owner of ``owners``, or resume an open one with the same
        algorithm and sampling rate; each owner's recorded cap (or None).

        Each owner's ``admit`` sees its spend and the reservations of its other open sgmcmc
        sessions (at its noise multiplier) and may refuse; its cap is recorded. The checks and
        the inserts are one ``BEGIN IMMEDIATE`` transaction with a constant number of
        statements however many owners, so two concurrent plans never both fit what only one
        of them fits, and a refusal by any owner records nothing. ``client``: the identity
        opening it (None without an allow-list); a session recorded for another identity is
        refused (``NotPermitted``). An owner's ``lattice`` is recorded in ``mechanisms``.
        ``max_step``: the step the session declared (a resume must declare the same).
        """
        names = [o.owner for o in owners]
        with self._writing():
            recorded = {
                row[0]: row[1:]
                for row in self._db.execute(
                    "SELECT owner, algorithm, closed_at, sampling_rate, client, max_step "
                    "FROM sessions WHERE session=?",
                    (session,),
                )
            }
            asked = (algorithm, sampling_rate, max_step)
            for name in names:
                _check_reopen(name, recorded.get(name), session, asked, client)
            self._check_secure_reopen(owners, session, recorded)
            views = self._plan_views(owners, session, algorithm)
            caps = [None if o.admit is None else o.admit(v) for o, v in zip(owners, views)]
            row = (algorithm, planned_answers, sampling_rate, client, max_step)
            self._record_sessions(owners, session, row, set(recorded))
            ids = [self._id(name) for name in names]
            self._record_owners(ids, owners, caps, session)
        self._plans.pop(session, None)
        for i, cap in zip(ids, caps):  # committed: the caches follow
            if cap is not None and i in self._slots:
                self._caps[self._slots[i]] = cap
                self._caps_version += 1
        if self._lattice_ids is not None:
            self._lattice_ids.update(i for i, o in zip(ids, owners) if o.lattice)
        return caps

    def _record_sessions(
        self, owners: list[Opening], session: str, row: tuple, recorded: set[str]
    ) -> None:
        """Insert the session of each owner not ``recorded`` (``row``: algorithm, plan,
        sampling rate, client, max step); give each resumed one its new plan — admitted in full
        by the caller (``admit`` saw the other sessions' reservations and this one's answers) —
        so later admissions reserve it and its charges are held to it (invariant 12). Each
        records the multiplier its gradient answers are charged at (call inside the
        transaction)."""
        algorithm, planned_answers, sampling_rate, client, max_step = row
        now = time.time()
        self._db.executemany(
            "INSERT INTO sessions(owner, session, algorithm, planned_answers, opened_at, "
            "sampling_rate, client, max_step, noise_multiplier) VALUES (?,?,?,?,?,?,?,?,?)",
            [
                (o.owner, session, algorithm, planned_answers, now, sampling_rate, client,
                 max_step, o.session_multiplier)
                for o in owners
                if o.owner not in recorded
            ],
        )  # fmt: skip
        self._db.executemany(
            "UPDATE sessions SET planned_answers=?, noise_multiplier=? WHERE owner=? AND session=?",
            [
                (planned_answers, o.session_multiplier, o.owner, session)
                for o in owners
                if o.owner in recorded
            ],
        )

    def _record_owners(
        self, ids: list[int], owners: list[Opening], caps: list[float | None], session: str
    ) -> None:
        """Write each opening owner's cap, lattice mechanism and secure-session record (call
        inside the transaction)."""
        self._db.executemany(
            "INSERT OR REPLACE INTO limits(owner_id, max_mu_squared) VALUES (?,?)",
            [(i, cap) for i, cap in zip(ids, caps) if cap is not None],
        )
        self._db.executemany(
            "INSERT OR REPLACE INTO mechanisms(owner_id, lattice) VALUES (?, 1)",
            [(i,) for i, o in zip(ids, owners) if o.lattice],
        )
        self._db.executemany(
            "INSERT OR IGNORE INTO secure_sessions(owner_id, session_id, owners, colluders, "
            "total_noise_sd, transcript) VALUES (?,?,?,?,?,?)",
            [
                (i, self._id(session), *_terms_row(o.secure.terms), o.secure.transcript)
                for i, o in zip(ids, owners)
                if o.secure is not None
            ],
        )

    def _check_secure_reopen(
        self, owners: list[Opening], session: str, recorded: dict[str, tuple]
    ) -> None:
        """Refuse re-opening a recorded session with other secure-aggregation peers or terms
        than it was opened with (or a plain one as secure, or the reverse): the masks of its
        answered keys would no longer cancel with the new ones (call inside the transaction)."""
        rows = {
            owner_id: (SecureTerms(*terms), transcript)
            for owner_id, *terms, transcript in self._db.execute(
                "SELECT owner_id, owners, colluders, total_noise_sd, transcript "
                "FROM secure_sessions WHERE session_id=?",
                (self._id(session),),
            )
        }
        for o in owners:
            if o.owner not in recorded:
                continue
            kept = rows.get(self._id(o.owner))
            asked = None if o.secure is None else (o.secure.terms, o.secure.transcript)
            if kept != asked:
                raise InvalidRequest(
                    f"session {session!r} was opened with "
                    f"{_secure_words(kept)}, not {_secure_words(asked)}; a resumed session "
                    "keeps its peers and terms",
                    o.owner,
                )

    def agreement_secret(self, owner: str) -> bytes:
        """The owner's 32-byte agreement secret (secure aggregation), drawn from OS entropy and
        recorded the first time it is asked for, read back ever after."""
        with self._writing():
            owner_id = self._id(owner)
            self._db.execute(
                "INSERT OR IGNORE INTO agreement(owner_id, secret) VALUES (?, ?)",
                (owner_id, secrets.token_bytes(32)),
            )
            row = self._db.execute(
                "SELECT secret FROM agreement WHERE owner_id=?", (owner_id,)
            ).fetchone()
        return bytes(row[0])

    def _plan_views(self, owners: list[Opening], session: str, algorithm: str) -> list[PlanView]:
        """Each owner's spend and reservations, in a constant number of statements (call inside
        the transaction)."""
        ids = np.array([self._id(o.owner) for o in owners], dtype=np.int64)
        session_id = self._id(session)
        open_rows: dict[str, list[tuple]] = defaultdict(list)
        for owner, *rest in self._db.execute(
            "SELECT owner, session, algorithm, planned_answers, sampling_rate, noise_multiplier "
            "FROM sessions WHERE closed_at IS NULL"
        ):
            open_rows[owner].append(tuple(rest))
        sampled: dict[int, list[tuple]] = defaultdict(list)
        for owner_id, sid, q, sigma, count in self._db.execute(
            "SELECT owner_id, session_id, sampling_rate, noise_multiplier, SUM(answers) "
            "FROM sampled GROUP BY owner_id, session_id, sampling_rate, noise_multiplier"
        ):
            sampled[owner_id].append((sid, q, sigma, int(count)))
        totals, in_session = self._spend(ids), self._spend(ids, session_id)
        existing = {
            row[0]: row[1:]
            for row in self._db.execute(
                "SELECT owner, algorithm, planned_answers, closed_at, sampling_rate FROM sessions "
                "WHERE session=?",
                (session,),
            )
        }
        views = []
        for k, (opening, owner_id) in enumerate(zip(owners, ids.tolist())):
            rows = sampled.get(owner_id, [])
            mine = open_rows.get(opening.owner, [])
            reserved = []
            for name, kind, planned, rate, recorded_multiplier in mine:
                if kind == SGMCMC and name != session:
                    used = sum(c for sid, _, _, c in rows if sid == self._id(name))
                    multiplier = recorded_multiplier or opening.noise_multiplier
                    reserved.append(SubsampledGaussian(rate, multiplier, max(planned - used, 0)))
            record = existing.get(opening.owner)
            current = None
            if record is not None:
                spend = GaussianSpend(
                    int(in_session[0][k]), float(in_session[1][k]), float(in_session[2][k])
                )
                events = _events([r for r in rows if r[0] == session_id])
                current = Session(
                    session, record[0], record[1], record[2] is not None, spend, events, record[3]
                )
            total = GaussianSpend(int(totals[0][k]), float(totals[1][k]), float(totals[2][k]))
            gaussian_open = algorithm != SGMCMC or any(kind != SGMCMC for _, kind, *_ in mine)
            views.append(PlanView(current, total, _events(rows), reserved, gaussian_open))
        return views

    def session_opener(self, owners: list[str], session: str) -> str | None:
        """The client that opened ``session`` for some of ``owners`` (None: not recorded, or
        opened without a client identity)."""
        with self._reading():
            for owner, client in self._db.execute(
                "SELECT owner, client FROM sessions WHERE session=? AND client IS NOT NULL",
                (session,),
            ):
                if owner in owners:
                    return client
        return None

    def close_session(self, owner: str, session: str) -> None:
        """Close the session: its plan no longer holds budget."""
        self.close_sessions([owner], session)

    def close_sessions(self, owners: list[str], session: str) -> None:
        """Close the session of every owner of ``owners`` (one transaction)."""
        now = time.time()
        with self._writing():
            self._db.executemany(
                "UPDATE sessions SET closed_at=? WHERE owner=? AND session=? AND closed_at IS NULL",
                [(now, owner, session) for owner in owners],
            )
        self._plans.pop(session, None)

    def reports(self, owners: list[str], session: str | None) -> list[Report]:
        """Every owner's spend, in all sessions and in ``session`` (None: not asked), in a
        constant number of statements: what ``PrivacyReport`` needs."""
        with self._reading():
            ids = np.array([self._id(o) for o in owners], dtype=np.int64)
            sampled: dict[int, list[tuple]] = defaultdict(list)
            for owner_id, sid, q, sigma, count in self._db.execute(
                "SELECT owner_id, session_id, sampling_rate, noise_multiplier, SUM(answers) "
                "FROM sampled GROUP BY owner_id, session_id, sampling_rate, noise_multiplier"
            ):
                sampled[owner_id].append((sid, q, sigma, int(count)))
            totals = self._spend(ids)
            known: set[str] = set()
            session_id = -1
            if session is not None:
                session_id = self._id(session)
                in_session = self._spend(ids, session_id)
                known = {
                    row[0]
                    for row in self._db.execute(
                        "SELECT owner FROM sessions WHERE session=?", (session,)
                    )
                }
            secure = self._secure_spends(ids, sampled)
        out = []
        for k, (owner, owner_id) in enumerate(zip(owners, ids.tolist())):
            rows = sampled.get(owner_id, [])
            total = GaussianSpend(int(totals[0][k]), float(totals[1][k]), float(totals[2][k]))
            current = None
            if owner in known:
                current = (
                    GaussianSpend(
                        int(in_session[0][k]), float(in_session[1][k]), float(in_session[2][k])
                    ),
                    _events([r for r in rows if r[0] == session_id]),
                )
            out.append(
                Report(total, _events(rows), owner in known, current, secure.get(owner_id, []))
            )
        return out

    def _secure_spends(
        self, ids: np.ndarray, sampled: dict[int, list[tuple]]
    ) -> dict[int, list[SecureSpend]]:
        """Each owner id's secure sessions with its spend in each (``sampled``: its gradient
        rows by session, as ``reports`` reads them); one spend query per secure session."""
        if not self._has_table("secure_sessions"):  # a reader of a ledger from before §2.6
            return {}
        wanted = set(ids.tolist())
        by_session: dict[int, list[tuple]] = defaultdict(list)
        for owner_id, session_id, name, *terms in self._db.execute(
            "SELECT s.owner_id, s.session_id, n.name, s.owners, s.colluders, s.total_noise_sd "
            "FROM secure_sessions s JOIN names n ON n.id = s.session_id"
        ):
            if owner_id in wanted:
                by_session[session_id].append((owner_id, name, SecureTerms(*terms)))
        out: dict[int, list[SecureSpend]] = defaultdict(list)
        for session_id, rows in by_session.items():
            answers, mu2, max_mu = self._spend(np.array([r[0] for r in rows]), session_id)
            for j, (owner_id, name, terms) in enumerate(rows):
                spend = GaussianSpend(int(answers[j]), float(mu2[j]), float(max_mu[j]))
                events = _events([r for r in sampled.get(owner_id, []) if r[0] == session_id])
                out[owner_id].append(SecureSpend(name, terms, spend, events))
        return out

    def _has_table(self, table: str) -> bool:
        return (
            self._db.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (table,)
            ).fetchone()
            is not None
        )

    def session(self, owner: str, session: str) -> Session | None:
        with self._reading():
            return self._session(owner, session)

    def _session(self, owner: str, session: str) -> Session | None:
        row = self._db.execute(
            "SELECT algorithm, planned_answers, closed_at, sampling_rate, opened_at FROM sessions "
            "WHERE owner=? AND session=?",
            (owner, session),
        ).fetchone()
        if row is None:
            return None
        spend = self._spend_of(owner, self._id(session))
        sampled = self._sampled(owner, self._id(session))
        return Session(session, row[0], row[1], row[2] is not None, spend, sampled, row[3], row[4])

    def sessions(self, owner: str) -> list[Session]:
        """Every session the owner has opened, oldest first, each with its own spend (what
        ``fedpenalty owner report`` breaks the total down by)."""
        with self._reading():
            names = [
                name
                for (name,) in self._db.execute(
                    "SELECT session FROM sessions WHERE owner=? ORDER BY opened_at, session",
                    (owner,),
                )
            ]
            found = [self._session(owner, name) for name in names]
        return [s for s in found if s is not None]

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

    def answered_on_lattice(self, owner: str) -> bool:
        """Whether the owner ever answered with lattice noise (table ``mechanisms``; a writer
        reads the table once)."""
        with self._reading():
            if self.read_only:
                row = self._db.execute(
                    "SELECT lattice FROM mechanisms WHERE owner_id=?", (self._id(owner),)
                ).fetchone()
                return bool(row and row[0])
            if self._lattice_ids is None:
                self._lattice_ids = {
                    i for (i,) in self._db.execute("SELECT owner_id FROM mechanisms WHERE lattice")
                }
            self._load_names()
            return self._ids.get(owner, -1) in self._lattice_ids

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
        with self._reading():
            by_id = {self._id(o): o for o in owners}
        found = self.stored_ids(np.array(list(by_id), dtype=np.int64), session, first, last)
        return {(by_id[i], chain, it): row for (i, chain, it), row in found.items()}

    def stored_ids(
        self, owner_ids: np.ndarray, session: str, first: int, last: int
    ) -> dict[tuple[int, int, int], tuple[bytes, bytes]]:
        """``stored`` by owner id: (owner id, chain, iteration) → (digest, payload bytes). A
        writer skips the query when ``first`` lies past every answered iteration."""
        with self._reading():
            return self._stored(owner_ids, self._id(session), first, last)

    def _stored(
        self, owner_ids: np.ndarray, session_id: int, first: int, last: int
    ) -> dict[tuple[int, int, int], tuple[bytes, bytes]]:
        """``stored_ids`` under the lock, from answer blocks and earlier ledgers' key rows."""
        found: dict[tuple[int, int, int], tuple[bytes, bytes]] = {}
        if not self.read_only and first > self._highest_iteration(session_id):
            return found
        wanted = set(owner_ids.tolist())
        blocks = (
            self._db.execute(
                "SELECT group_id, keys, digests, payload FROM answer_blocks "
                "WHERE session_id=? AND last_iteration >= ? AND first_iteration <= ?",
                (session_id, first, last),
            ).fetchall()
            if self._blocks
            else []
        )
        for gid, keys, digests, payload in blocks:
            for owner_id, chain, it, digest, part in read_block(
                self._group_members(gid), keys, digests, payload
            ):
                if owner_id in wanted and first <= it <= last:
                    found[(owner_id, chain, it)] = (digest, part)
        for it, chain, gid, digest, payload in self._db.execute(
            "SELECT iteration, chain, group_id, digest, payload FROM answers "
            "WHERE session_id=? AND iteration BETWEEN ? AND ?",
            (session_id, first, last),
        ).fetchall():
            members = self._group_members(gid)
            width = len(payload) // len(members)
            for j, owner_id in enumerate(members.tolist()):
                if owner_id in wanted:
                    found[(owner_id, chain, it)] = (digest, payload[width * j : width * (j + 1)])
        return found

    def _highest_iteration(self, session_id: int) -> int:
        """The highest iteration answered in the session (−1: none), read once, then kept."""
        if session_id not in self._frontier:
            row = self._db.execute(
                "SELECT MAX(i) FROM (SELECT MAX(last_iteration) AS i FROM answer_blocks "
                "WHERE session_id=?1 UNION ALL SELECT MAX(iteration) FROM answers "
                "WHERE session_id=?1)",
                (session_id,),
            ).fetchone()
            self._frontier[session_id] = -1 if row[0] is None else int(row[0])
        return self._frontier[session_id]

    def _slots_for(self, owner_ids: np.ndarray) -> np.ndarray:
        """Rows of the cached totals and caps for ``owner_ids`` ``(K,)``; owners seen for the
        first time are loaded from the file (call under the lock; writers only)."""
        key = owner_ids.tobytes()
        slots = self._slots_of.get(key)
        if slots is None:
            new = list(dict.fromkeys(i for i in owner_ids.tolist() if i not in self._slots))
            if new:
                answers, mu2, max_mu = self._spend(np.array(new, dtype=np.int64))
                caps = dict(self._db.execute("SELECT owner_id, max_mu_squared FROM limits"))
                start = len(self._caps)
                self._slots.update({i: start + j for j, i in enumerate(new)})
                loaded = np.column_stack([answers.astype(float), mu2, max_mu])
                self._totals = np.vstack([self._totals, loaded])
                self._caps = np.concatenate([self._caps, [caps.get(i, np.inf) for i in new]])
            slots = np.array([self._slots[i] for i in owner_ids.tolist()], dtype=np.int64)
            self._slots_of[key] = slots
        return slots

    def charge(self, c: Charge) -> None:
        """Charge and store the new answers ``c.payloads`` in one transaction (``charging``)."""
        assert c.payloads is not None
        with self.charging(c) as store:
            store(c.payloads)

    @contextmanager
    def charging(self, c: Charge) -> Iterator[Callable[[np.ndarray], None]]:
        """One charging transaction: every check first, then the answers.

        Refuses — before the caller has computed or drawn anything — when some owner's total
        μ² would exceed its ``max_mu_squared`` (the μ² where ε(δ) meets its budget) or the cap
        recorded for its plans (``BudgetExhausted``), when a gradient answer would pass the
        plan the ledger admitted (``BudgetExhausted``), and when some owner already answered a
        key (``ReplayConflict``); nothing is written for anyone then. Otherwise it yields
        ``store``, which the caller calls once with the answers ``(K, M, w)`` it then draws
        (docs/design.md §3, invariant 11: refuse before you draw); the transaction commits
        when the block ends, and rolls back if it raises. A constant number of statements
        however many owners. A writer keeps each owner's totals and caps in memory (it is the
        file's only writer) and updates them once the transaction has committed.
        """
        every = bool(c.new.all())
        stored = []
        with self._writing():
            owner_ids = (
                c.owner_ids
                if c.owner_ids is not None
                else np.array([self._id(o) for o in c.owners], dtype=np.int64)
            )
            session_id = self._id(c.session)
            if c.sampled is not None:
                self._charge_sampled(c, owner_ids, session_id, c.new.sum(axis=1))
            slots = self._slots_for(owner_ids)
            self._check_unanswered(c, owner_ids, session_id, every)
            groups = [(self._group(owner_ids[m]), m, keys) for m, keys in key_groups(c.new)]
            lines = [self._spend_line(c, session_id, *group) for group in groups]
            committed = None
            if c.mus is not None:  # checked before anything is stored
                committed = self._admit(c, slots, lines[0] if every else None)

            def store(payloads: np.ndarray) -> None:
                self._store_answers(c, session_id, groups, lines, payloads)
                stored.append(True)

            yield store
            if not stored:
                raise RuntimeError("a charge ended without its answers: nothing is recorded")
        if committed is not None:  # the caches follow what was committed
            committed()
        if groups:
            answered = max(span(c.iterations[keys])[1] for _, _, keys in groups)
            self._frontier[session_id] = max(self._frontier[session_id], answered)

    def _admit(
        self, c: Charge, slots: np.ndarray, every: tuple[int | None, StepSums] | None
    ) -> Callable[[], None]:
        """Refuse (``BudgetExhausted``) when some owner's μ² would pass its cap; otherwise what
        the in-memory totals do once the charge commits. ``every``: the (line, step sums) of
        a charge of every owner and key (None: some owners or keys only). Such a charge on the
        line already pending costs a few float operations while the pending bound holds
        (``PendingLine``); any other charge folds the pending line into the totals, is
        checked owner by owner, and then starts a pending line (call inside the transaction)."""
        mus = c.mus
        assert mus is not None  # gradient charges add no μ²
        p = self._pending
        line, sums = every if every is not None else (None, None)
        if (
            line is not None
            and sums is not None
            and p is not None
            and p.line == line
            and p.limits is c.max_mu_squared
            and p.caps_version == self._caps_version
        ):
            used = p.used + p.cost(sums)
            if used <= 1.0:
                return lambda: p.add(sums, used)
        self._fold()
        add = gdp_add(mus, c.new)
        cap = self._check_gdp_limit(c, slots, add[1])

        def record() -> None:
            self._add_totals(slots, *add)
            if line is not None:
                headroom = cap - self._totals[slots, 1]
                self._pending = PendingLine.start(
                    line, slots, mus, headroom, c.max_mu_squared, self._caps_version
                )

        return record

    def _fold(self) -> None:
        """Add the pending line's charges to its members' totals (they are exact after it)."""
        p, self._pending = self._pending, None
        if p is not None and p.sums.count:
            self._add_totals(p.slots, *p.spend())

    def _add_totals(
        self, slots: np.ndarray, answers: np.ndarray, mu2: np.ndarray, max_mu: np.ndarray
    ) -> None:
        """Add answers, Σμ² and max μ ``(K',)`` each to the cached totals of ``slots``."""
        totals = self._totals[slots]
        totals[:, 0] += answers
        totals[:, 1] += mu2
        totals[:, 2] = np.maximum(totals[:, 2], max_mu)
        self._totals[slots] = totals

    def _check_gdp_limit(self, c: Charge, slots: np.ndarray, add_mu2: np.ndarray) -> np.ndarray:
        """Refuse (``BudgetExhausted``) when some owner's μ² would pass its cap: the lower of
        ``max_mu_squared`` and the cap recorded when its plans were admitted. The caps."""
        assert c.mus is not None
        cap = np.minimum(c.max_mu_squared, self._caps[slots])
        before = self._totals[slots]
        over = before[:, 1] + add_mu2 > cap
        if over.any():
            k = int(np.argmax(over))
            spent = GaussianSpend(int(before[k, 0]), float(before[k, 1]), float(before[k, 2]))
            self._refuse(
                c.owners[k],
                spent,
                c.mus[k : k + 1].matrix()[0][c.new[k]],
                float(c.budget_epsilon[k]),
                float(c.delta[k]),
                c.lattice,
            )
        return cap

    def _check_unanswered(
        self, c: Charge, owner_ids: np.ndarray, session_id: int, every: bool
    ) -> None:
        """Refuse (``ReplayConflict``) to store a second answer to a key an owner answered
        before (its stored answer is what must be released): free when every new key lies past
        the session's highest answered iteration, as in an uninterrupted run; otherwise the
        stored keys of the asked iterations are compared (call inside the transaction)."""
        asked = c.iterations if every else c.iterations[c.new.any(axis=0)]
        if not asked.size:
            return
        first, last = span(asked)
        if first > self._highest_iteration(session_id):
            return
        stored = self._stored(owner_ids, session_id, first, last)
        position = {owner_id: k for k, owner_id in enumerate(owner_ids.tolist())}
        keys = {key: j for j, key in enumerate(zip(c.chains.tolist(), c.iterations.tolist()))}
        for owner_id, chain, iteration in stored:
            j = keys.get((chain, iteration))
            if j is not None and c.new[position[owner_id], j]:
                raise ReplayConflict(
                    f"(session, chain {chain}, iteration {iteration}) was answered before: its "
                    "stored answer is replayed, never a second one",
                    c.owners[position[owner_id]],
                )

    def _spend_line(
        self, c: Charge, session_id: int, group_id: int, members: Index, keys: Index
    ) -> tuple[int | None, StepSums]:
        """The spend line of a group's answers to ``keys`` and their step sums (None and no
        steps for gradient answers, which are counted in ``sampled``)."""
        if c.mus is None:
            return None, StepSums(0, 0.0, 0.0, 0.0)
        line = self._line(session_id, group_id, c.mus.slope[members], c.mus.offset[members])
        return line, StepSums.of(c.mus.steps[keys])

    def _store_answers(
        self,
        c: Charge,
        session_id: int,
        groups: list[tuple[int, Index, Index]],
        lines: list[tuple[int | None, StepSums]],
        answers: np.ndarray,
    ) -> None:
        """One answer block per (group id, owners, keys) of ``groups`` with their ``answers``
        ``(K, M, w)``, and its keys' step sums on its spend line (``lines``, in the same
        order)."""
        rows = []
        for (gid, members, keys), (line, sums) in zip(groups, lines):
            digests = (
                c.digests[keys]
                if isinstance(keys, slice)
                else [c.digests[j] for j in keys.tolist()]
            )
            payloads = answers[members][:, keys]
            first, last, *blobs = block_fields(
                c.chains[keys], c.iterations[keys], digests, payloads
            )
            counts = (sums.count, sums.total, sums.squares, sums.largest)
            rows.append((session_id, first, last, gid, line, *counts, *blobs))
        self._db.executemany(
            "INSERT INTO answer_blocks(session_id, first_iteration, last_iteration, group_id, "
            "line_id, answers, steps, steps_squared, max_step, keys, digests, payload) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            rows,
        )

    def _line(self, session_id: int, group_id: int, slope: np.ndarray, offset: np.ndarray) -> int:
        """Id of the spend line (session, group, slope, offset), recorded on first use."""
        key = (
            session_id,
            group_id,
            np.ascontiguousarray(slope, dtype="<f8").tobytes(),
            np.ascontiguousarray(offset, dtype="<f8").tobytes(),
        )
        if key not in self._lines:
            self._db.execute(
                "INSERT OR IGNORE INTO spend_lines(session_id, group_id, slope, offset) "
                "VALUES (?,?,?,?)",
                key,
            )
            self._lines[key] = self._db.execute(
                "SELECT id FROM spend_lines WHERE session_id=? AND group_id=? AND slope=? "
                "AND offset=?",
                key,
            ).fetchone()[0]
        return self._lines[key]

    def _charge_sampled(
        self, c: Charge, owner_ids: np.ndarray, session_id: int, add: np.ndarray
    ) -> None:
        """Count subsampled-Gaussian answers, refusing past any owner's session plan as the
        ledger admitted it against the budget (docs/design.md §3, invariant 12)."""
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
        plans = self._open_plans(c.session)
        plan = np.array([plans.get(o, 0) for o in c.owners])
        over = used + add > plan
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
                f"privacy budget: this session's plan of {int(plan[k])} gradient answers "
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

    def _open_plans(self, session: str) -> dict[str, int]:
        """Each owner's admitted plan in ``session`` while it is open (an owner without an open
        session has none: 0 answers). A writer reads them once per session and keeps them until
        a session opens or closes (call under the lock)."""
        plans = self._plans.get(session)
        if plans is None:
            plans = self._plans[session] = dict(
                self._db.execute(
                    "SELECT owner, planned_answers FROM sessions WHERE session=? "
                    "AND closed_at IS NULL",
                    (session,),
                ).fetchall()
            )
        return plans

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
