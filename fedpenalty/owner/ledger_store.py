"""The ledger's store: the SQLite file, its lock, transactions, schema migrations, names and
groups, and the answers it holds for replay (docs/design.md §3, invariants 2, 3 and 8; §4,
"The ledger's parts").

One ledger, one writer: a writable store holds an exclusive ``flock`` on ``<ledger>.lock``
beside the database for its whole life; a second store on the same file, in this process or
another, is refused (``LedgerInUse``). The lock is on a separate file, not on the database,
because opening and closing another descriptor of the database would drop the POSIX locks
SQLite holds on it in this process. A read-only store takes no lock. A storage failure (disk
full, read-only file, I/O error) rolls the transaction back and raises ``StorageUnavailable``;
every in-memory cache (the store's and those of the parts that registered with ``on_forget``)
is then dropped and reloaded from the file on demand.

A *batched* store (simulated owners only, ``Ledger.simulation(batched=True)``) commits its
Gaussian charges' answer blocks in groups instead of one transaction each: they are kept in
memory and written in one transaction at ``flush`` — which the transport calls before the run
records a checkpoint (``Oracle.persist``) — before any other read or write of the file, on
close, and every ``FLUSH_ROWS`` blocks (docs/design.md §4, "The ledger's parts").
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import numpy as np

from ..errors import LedgerInUse, StorageUnavailable
from .ledger_records import PART_SEPARATOR
from .ledger_rows import read_block

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
CREATE TABLE IF NOT EXISTS pure_releases (
    session_id INTEGER NOT NULL, owner_id INTEGER NOT NULL, epsilon REAL NOT NULL,
    answers INTEGER NOT NULL, PRIMARY KEY (session_id, owner_id, epsilon));
CREATE TABLE IF NOT EXISTS limits (owner_id INTEGER PRIMARY KEY, max_mu_squared REAL NOT NULL);
CREATE TABLE IF NOT EXISTS mechanisms (owner_id INTEGER PRIMARY KEY, lattice INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS health (id INTEGER PRIMARY KEY, checked_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS secure_sessions (
    owner_id INTEGER NOT NULL, session_id INTEGER NOT NULL, owners INTEGER NOT NULL,
    colluders INTEGER NOT NULL, total_noise_sd REAL NOT NULL, transcript BLOB NOT NULL,
    PRIMARY KEY (owner_id, session_id));
CREATE TABLE IF NOT EXISTS agreement (owner_id INTEGER PRIMARY KEY, secret BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS graph_reveals (
    owner_id INTEGER NOT NULL, session_id INTEGER NOT NULL, commitments BLOB NOT NULL,
    PRIMARY KEY (owner_id, session_id));
"""

#: a batched store writes its pending answer blocks once it holds this many
FLUSH_ROWS = 512

_INSERT_BLOCKS = (
    "INSERT INTO answer_blocks(session_id, first_iteration, last_iteration, group_id, "
    "line_id, answers, steps, steps_squared, max_step, keys, digests, payload, substep) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)"
)

#: Columns added after a table first shipped: (table, column, declaration) — added on open.
_ADDED_COLUMNS = (
    ("sessions", "client", "TEXT"),
    ("sessions", "max_step", "REAL"),
    ("sessions", "noise_multiplier", "REAL"),
    # the sub-step of a block's keys (docs/design.md §4, "Sessions of several kinds")
    ("answer_blocks", "substep", "INTEGER NOT NULL DEFAULT 0"),
)


class LedgerStore:
    """The SQLite file of one ledger. ``synchronous="FULL"`` survives power loss; ``"NORMAL"``
    survives a process crash (``kill -9``) but may lose the last commits on power loss.
    ``read_only``: no lock and no writes (reports read while a server writes the file)."""

    def __init__(self, path: str | Path, synchronous: str = "FULL", read_only: bool = False):
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError("synchronous must be 'FULL' or 'NORMAL'")
        self.path = str(path)
        self.read_only = read_only
        #: float answers are recomputed on replay, not stored (``Ledger.simulation``)
        self.simulated = False
        #: answer blocks are committed in groups (``buffering``; simulated owners only)
        self.batched = False
        self._pending: list[tuple] = []  # a batched store's blocks not yet in the file
        #: False after a storage failure, True again after the next successful write
        self.writable = True
        self.lock = threading.Lock()
        self._on_forget: list[Callable[[], None]] = []
        self._lock_fd = None if read_only or self.path == ":memory:" else self._take_file_lock()
        try:
            self.db = self._connect(synchronous)
        except sqlite3.OperationalError as exc:
            self._release_file_lock()
            raise self.unavailable(exc) from exc
        #: the file has answer blocks and spend lines (a reader of an earlier ledger: not)
        self.blocks = self.has_table("answer_blocks")
        #: its answer blocks have a sub-step (a reader of an earlier ledger: not, all are 0)
        self.substeps = self.blocks and "substep" in self.columns("answer_blocks")
        #: the file has pure-ε release rows (a reader of an earlier ledger: not)
        self.pure = self.has_table("pure_releases")
        self.forget()

    def on_forget(self, drop: Callable[[], None]) -> None:
        """Call ``drop`` whenever the caches are dropped (a part's own caches)."""
        self._on_forget.append(drop)

    def forget(self) -> None:
        """Drop every in-memory cache (they are reloaded from the file on demand): after a
        rolled-back transaction, whose ids and rows never reached the file."""
        self._ids: dict[str, int] = {}
        self._names_loaded = False
        self._groups: dict[bytes, int] = {}
        self._members: dict[int, np.ndarray] = {}
        # (session id, sub-step) → highest iteration answered
        self.frontier: dict[tuple[int, int], int] = {}
        for drop in self._on_forget:
            drop()

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
            if column not in self.columns(table, db):
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
        db.execute("COMMIT")
        return db

    def close(self) -> None:
        with self.lock:
            self._flush()
            self.db.close()
            self._release_file_lock()

    def unavailable(self, exc: sqlite3.Error, what: str = "cannot be written") -> Exception:
        """The ``StorageUnavailable`` of a failed SQLite call."""
        return StorageUnavailable(
            f"ledger {self.path} {what} ({exc}); nothing was answered or charged"
        )

    @contextmanager
    def writing(self) -> Iterator[None]:
        """One write transaction under the lock (``BEGIN IMMEDIATE … COMMIT``). Any exception
        rolls it back; a storage failure becomes ``StorageUnavailable`` and clears
        ``writable`` until a later write commits. A batched store's pending blocks are
        committed first, in a transaction of their own."""
        with self.lock:
            self._flush()
            try:
                self.db.execute("BEGIN IMMEDIATE")
                try:
                    yield
                    self.db.execute("COMMIT")
                except BaseException:
                    if self.db.in_transaction:  # SQLite may have rolled back already
                        self.db.execute("ROLLBACK")
                    self.forget()
                    raise
            except sqlite3.OperationalError as exc:
                self.writable = False
                raise self.unavailable(exc) from exc
            self.writable = True

    def probe(self) -> bool:
        """Try one small write (``writable`` follows the result): how a server finds out that a
        ledger it reported unwritable can be written again, without waiting for a request."""
        try:
            with self.writing():
                self.db.execute(
                    "INSERT OR REPLACE INTO health(id, checked_at) VALUES (1, ?)", (time.time(),)
                )
        except StorageUnavailable:
            return False
        return True

    def store_blocks(self, rows: list[tuple]) -> None:
        """Write answer-block ``rows`` (``_INSERT_BLOCKS``'s columns) in the transaction under
        way; a batched store keeps them for its next ``flush`` instead (call under the lock)."""
        if self.batched:
            self._pending.extend(rows)
        else:
            self.db.executemany(_INSERT_BLOCKS, rows)

    def buffering(self) -> Buffering:
        """A batched store's charge, under the lock with no transaction of its own: its blocks
        (``store_blocks``) join the pending ones, flushed once there are ``FLUSH_ROWS``. Any
        exception drops this charge's blocks, commits the earlier ones and drops the caches
        (as a rolled-back ``writing``)."""
        return Buffering(self)

    def flush(self) -> None:
        """Commit a batched store's pending answer blocks (nothing else has any)."""
        with self.lock:
            self._flush()

    def _flush(self) -> None:
        """``flush`` under the lock: one transaction; a storage failure keeps the blocks pending
        and raises ``StorageUnavailable``."""
        if not self._pending:
            return
        try:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                self.db.executemany(_INSERT_BLOCKS, self._pending)
                self.db.execute("COMMIT")
            except BaseException:
                if self.db.in_transaction:
                    self.db.execute("ROLLBACK")
                raise
        except sqlite3.OperationalError as exc:
            self.writable = False
            raise self.unavailable(exc) from exc
        self._pending = []

    @contextmanager
    def reading(self, flush: bool = True) -> Iterator[None]:
        """Reads under the lock (a batched store's pending blocks committed first, unless
        ``flush`` is false: a read that commits them only if it reads the file); a storage
        failure becomes ``StorageUnavailable``."""
        with self.lock:
            if flush:
                self._flush()
            try:
                yield
            except sqlite3.OperationalError as exc:
                raise self.unavailable(exc, "cannot be read") from exc

    # --- ids and groups (call under the lock) -----------------------------------------------
    def id(self, name: str) -> int:
        """Integer id of an owner or session name, created on first use (read-only: -1, which
        matches no row, for a name never recorded)."""
        if name not in self._ids:
            self.load_names()
            if name in self._ids:
                return self._ids[name]
            if not self.read_only:
                self.db.execute("INSERT OR IGNORE INTO names(name) VALUES (?)", (name,))
            row = self.db.execute("SELECT id FROM names WHERE name=?", (name,)).fetchone()
            if row is None:
                return -1
            self._ids[name] = row[0]
        return self._ids[name]

    def load_names(self) -> None:
        """A writer reads the names table once (one statement, however many owners)."""
        if not self._names_loaded and not self.read_only:
            self._ids.update({n: i for i, n in self.db.execute("SELECT id, name FROM names")})
            self._names_loaded = True

    def columns(self, table: str, db: sqlite3.Connection | None = None) -> set[str]:
        """The column names of ``table``."""
        return {row[1] for row in (db or self.db).execute(f"PRAGMA table_info({table})")}

    def parts(self, session: str) -> list[str]:
        """The ledger sessions recorded for ``session``: itself (one kind) or its kinds' parts
        (``ledger_records.part_name``), or none (call under the lock)."""
        prefix = session + PART_SEPARATOR
        return [
            name
            for (name,) in self.db.execute(
                "SELECT DISTINCT session FROM sessions WHERE session=? OR substr(session, 1, ?)=? "
                "ORDER BY session",
                (session, len(prefix), prefix),
            )
        ]

    def has_table(self, table: str) -> bool:
        return (
            self.db.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (table,)
            ).fetchone()
            is not None
        )

    def known_id(self, name: str) -> int:
        """The id of ``name`` among the names read so far (-1: none; call after ``load_names``)."""
        return self._ids.get(name, -1)

    def ids(self, names: list[str]) -> np.ndarray:
        """Integer ids of ``names`` ``(K,)``, creating the missing ones in one transaction."""
        with self.reading():
            self.load_names()
            missing = [n for n in names if n not in self._ids]
        if missing and not self.read_only:
            with self.writing():
                self.db.executemany(
                    "INSERT OR IGNORE INTO names(name) VALUES (?)", [(n,) for n in missing]
                )
                self._names_loaded = False
                self.load_names()
        with self.reading():
            return np.array([self.id(n) for n in names], dtype=np.int64)

    def group(self, owner_ids: np.ndarray) -> int:
        """Id of the group with these member owner ids (in this order), created on first use."""
        blob = key = np.ascontiguousarray(owner_ids, dtype="<i8").tobytes()
        if key not in self._groups:
            self.db.execute("INSERT OR IGNORE INTO groups(members) VALUES (?)", (blob,))
            self._groups[key] = self.db.execute(
                "SELECT id FROM groups WHERE members=?", (blob,)
            ).fetchone()[0]
        return self._groups[key]

    def group_members(self, group_id: int) -> np.ndarray:
        if group_id not in self._members:
            blob = self.db.execute("SELECT members FROM groups WHERE id=?", (group_id,)).fetchone()[
                0
            ]
            self._members[group_id] = np.frombuffer(blob, dtype="<i8")
        return self._members[group_id]

    # --- answers ----------------------------------------------------------------------------
    def stored(
        self, owners: list[str], session: str, first: int, last: int, substep: int = 0
    ) -> dict[tuple[str, int, int], tuple[bytes, bytes]]:
        """Stored answers of ``owners`` in ``session`` at ``substep`` with iteration in
        [first, last]: (owner, chain, iteration) → (digest, payload bytes of that owner). One
        query."""
        with self.reading():
            by_id = {self.id(o): o for o in owners}
        ids = np.array(list(by_id), dtype=np.int64)
        found = self.stored_ids(ids, session, first, last, substep)
        return {(by_id[i], chain, it): row for (i, chain, it), row in found.items()}

    def stored_ids(
        self, owner_ids: np.ndarray, session: str, first: int, last: int, substep: int = 0
    ) -> dict[tuple[int, int, int], tuple[bytes, bytes]]:
        """``stored`` by owner id: (owner id, chain, iteration) → (digest, payload bytes). A
        writer skips the query when ``first`` lies past every answered iteration."""
        with self.reading(flush=False):  # read_stored flushes when it reads the file
            return self.read_stored(owner_ids, self.id(session), first, last, substep)

    def read_stored(
        self, owner_ids: np.ndarray, session_id: int, first: int, last: int, substep: int = 0
    ) -> dict[tuple[int, int, int], tuple[bytes, bytes]]:
        """``stored_ids`` under the lock, from answer blocks and earlier ledgers' key rows
        (sub-step 0: earlier ledgers have no other)."""
        found: dict[tuple[int, int, int], tuple[bytes, bytes]] = {}
        if not self.read_only and first > self.highest_iteration(session_id, substep):
            return found
        self._flush()  # a batched charge's check reads the blocks it has not written yet
        wanted = set(owner_ids.tolist())
        for gid, keys, digests, payload in self._blocks(session_id, first, last, substep):
            for owner_id, chain, it, digest, part in read_block(
                self.group_members(gid), keys, digests, payload
            ):
                if owner_id in wanted and first <= it <= last:
                    found[(owner_id, chain, it)] = (digest, part)
        if substep == 0:
            self._read_key_rows(wanted, session_id, first, last, found)
        return found

    def _blocks(self, session_id: int, first: int, last: int, substep: int) -> list[tuple]:
        """The answer blocks of the session at ``substep`` that may hold iterations in
        [first, last]: (group id, keys, digests, payload)."""
        if not self.blocks or (substep != 0 and not self.substeps):
            return []
        where = " AND substep=?" if self.substeps else ""
        args = (session_id, first, last, substep) if self.substeps else (session_id, first, last)
        return self.db.execute(
            "SELECT group_id, keys, digests, payload FROM answer_blocks "
            f"WHERE session_id=? AND last_iteration >= ? AND first_iteration <= ?{where}",
            args,
        ).fetchall()

    def _read_key_rows(
        self,
        wanted: set[int],
        session_id: int,
        first: int,
        last: int,
        found: dict[tuple[int, int, int], tuple[bytes, bytes]],
    ) -> None:
        """Add the answers of owner ids ``wanted`` that earlier ledgers kept per key."""
        for it, chain, gid, digest, payload in self.db.execute(
            "SELECT iteration, chain, group_id, digest, payload FROM answers "
            "WHERE session_id=? AND iteration BETWEEN ? AND ?",
            (session_id, first, last),
        ).fetchall():
            members = self.group_members(gid)
            width = len(payload) // len(members)
            for j, owner_id in enumerate(members.tolist()):
                if owner_id in wanted:
                    found[(owner_id, chain, it)] = (digest, payload[width * j : width * (j + 1)])

    def highest_iteration(self, session_id: int, substep: int = 0) -> int:
        """The highest iteration answered in the session at ``substep`` (−1: none), read once,
        then kept (a writer's: its file has the sub-step column)."""
        key = (session_id, substep)
        if key not in self.frontier:
            row = self.db.execute(
                "SELECT MAX(i) FROM (SELECT MAX(last_iteration) AS i FROM answer_blocks "
                "WHERE session_id=?1 AND substep=?2 UNION ALL SELECT MAX(iteration) FROM answers "
                "WHERE session_id=?1 AND ?2=0)",
                key,
            ).fetchone()
            self.frontier[key] = -1 if row[0] is None else int(row[0])
        return self.frontier[key]


class Buffering:
    """``LedgerStore.buffering``'s context: a class rather than a generator, as every
    in-process simulated charge enters one (about 0.7 µs less; docs/design.md §4, "The usual
    charge")."""

    __slots__ = ("mark", "store")

    def __init__(self, store: LedgerStore):
        self.store = store
        self.mark = 0

    def __enter__(self) -> None:
        self.store.lock.acquire()
        self.mark = len(self.store._pending)

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        store = self.store
        try:
            if kind is not None:
                del store._pending[self.mark :]
                store._flush()
                store.forget()
            elif len(store._pending) >= FLUSH_ROWS:
                store._flush()
        finally:
            store.lock.release()
