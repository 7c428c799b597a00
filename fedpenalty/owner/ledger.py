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
* ``sessions`` — per owner: algorithm, plan, open/close times, sampling rate; a session of
  several kinds has one row per kind, its *part* (``ledger_records.part_name``). An open
  sgmcmc session reserves what its plan may still give (``PlanView.reserved``).
* ``answer_blocks.substep`` — the sub-step of a block's keys (0 in earlier ledgers): part of
  the answer key.
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
* ``graph_reveals`` — per (owner, session) whose share of a sparse masking graph's seed it
  revealed: the digest of the peers' commitments it revealed for; it never reveals for other
  commitments in that session (docs/design.md §2.6, "Commit, then reveal").
* ``agreement`` — per owner: the secret its secure-session X25519 keys derive from (drawn from
  OS entropy once), so a restarted owner continues its sessions. The ledger file must
  therefore be kept as private as the owner's data.

One ledger, one writer (invariant 8): a writable ``Ledger`` holds an exclusive ``flock`` on
``<ledger>.lock`` beside the database for its whole life (``ledger_store``); a second ``Ledger``
on the same file is refused (``LedgerInUse``). ``Ledger(path, read_only=True)`` takes no lock
and reads the file while a server writes it (offline reports).

``Ledger`` is a facade over its parts (docs/design.md §4, "The ledger's parts"): the store
(``ledger_store.LedgerStore``: SQLite, the lock, transactions, migrations, stored answers for
replay), the spend book (``spend_book.SpendBook``: charges and their admission), the session
book (``session_book.SessionBook``: sessions, plan views, reservations and caps), the spend
totals (``spend_totals.SpendTotals``: spend and reports, read back as privacy events) and the
key store (``key_store.KeyStore``: secure-session records and agreement secrets).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path

import numpy as np

from ..privacy import GaussianSpend
from ..privacy.owner_epsilon import Row
from .key_store import KeyStore
from .ledger_records import (
    Admit,
    Charge,
    Opening,
    PlanView,
    Report,
    SampledCharge,
    SecureRecord,
    SecureSpend,
    Session,
    SessionPart,
)
from .ledger_store import LedgerStore
from .session_book import SessionBook
from .spend_book import SpendBook
from .spend_totals import SpendTotals

__all__ = [
    "Admit",
    "Charge",
    "Ledger",
    "Opening",
    "PlanView",
    "Report",
    "SampledCharge",
    "SecureRecord",
    "SecureSpend",
    "Session",
    "SessionPart",
]


class Ledger:
    """SQLite ledger. ``synchronous="FULL"`` survives power loss; ``"NORMAL"`` survives a
    process crash (``kill -9``) but may lose the last commits on power loss. ``read_only``:
    no lock and no writes (reports read while a server writes the file)."""

    def __init__(self, path: str | Path, synchronous: str = "FULL", read_only: bool = False):
        self.store = LedgerStore(path, synchronous, read_only)
        self.keys = KeyStore(self.store)
        self.totals = SpendTotals(self.store, self.keys)
        self.book = SpendBook(self.store, self.totals)
        self.sessions_book = SessionBook(self.store, self.totals, self.keys, self.book)

    @classmethod
    def simulation(
        cls, path: str | Path, synchronous: str = "NORMAL", batched: bool = False
    ) -> Ledger:
        """SIMULATION ONLY: the ledger of simulated owners (``OwnerNode.simulated``, whose float
        noise is a pure function of their seed and the answer's address). It keeps every
        charge, key and digest in one transaction per charge, but not the float answers
        themselves, which a replay recomputes (docs/design.md §4, "The ledger's parts").
        Deployed owners' ledgers store them. ``batched``: Gaussian charges are committed in
        groups, at ``flush`` at the latest (``LedgerStore``), for a transport that flushes
        before every checkpoint (``Oracle.persist``)."""
        ledger = cls(path, synchronous)
        ledger.store.simulated = True
        ledger.store.batched = batched
        return ledger

    def flush(self) -> None:
        """Commit the charges a batched ledger holds in memory (none otherwise)."""
        self.store.flush()

    # --- the store ----------------------------------------------------------------------------
    @property
    def path(self) -> str:
        return self.store.path

    @property
    def read_only(self) -> bool:
        return self.store.read_only

    @property
    def writable(self) -> bool:
        """False after a storage failure, True again after the next successful write."""
        return self.store.writable

    @property
    def _db(self) -> sqlite3.Connection:
        """The store's connection (tests reach it to simulate storage failures)."""
        return self.store.db

    def _id(self, name: str) -> int:
        return self.store.id(name)

    def close(self) -> None:
        self.store.close()

    def probe(self) -> bool:
        """One small write: whether the ledger can be written again (``writable`` follows)."""
        return self.store.probe()

    def ids(self, names: list[str]) -> np.ndarray:
        """Integer ids of ``names`` ``(K,)``, creating the missing ones in one transaction."""
        return self.store.ids(names)

    def stored(
        self, owners: list[str], session: str, first: int, last: int
    ) -> dict[tuple[str, int, int], tuple[bytes, bytes]]:
        """Stored answers: (owner, chain, iteration) → (digest, payload bytes)."""
        return self.store.stored(owners, session, first, last)

    def stored_ids(
        self, owner_ids: np.ndarray, session: str, first: int, last: int
    ) -> dict[tuple[int, int, int], tuple[bytes, bytes]]:
        """Stored answers by owner id: (owner id, chain, iteration) → (digest, payload)."""
        return self.store.stored_ids(owner_ids, session, first, last)

    def stored_at(
        self, owners: list[str], session: str, first: int, last: int, substep: int
    ) -> dict[tuple[str, int, int], tuple[bytes, bytes]]:
        """``stored`` at ``substep``."""
        return self.store.stored(owners, session, first, last, substep)

    def stored_ids_at(
        self, owner_ids: np.ndarray, session: str, first: int, last: int, substep: int
    ) -> dict[tuple[int, int, int], tuple[bytes, bytes]]:
        """``stored_ids`` at ``substep`` (the sub-step of a session's iteration)."""
        return self.store.stored_ids(owner_ids, session, first, last, substep)

    # --- sessions -----------------------------------------------------------------------------
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
        return self.sessions_book.open_session(
            owner, session, algorithm, planned_answers, sampling_rate, noise_multiplier, admit,
            client, lattice,
        )  # fmt: skip

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
        """Record or resume ``session`` for every owner (``SessionBook.open_sessions``)."""
        return self.sessions_book.open_sessions(
            owners, session, algorithm, planned_answers, sampling_rate, client, max_step
        )

    def open_parts(
        self, owners: list[Opening], session: str, parts: list[SessionPart], client: str | None
    ) -> list[float | None]:
        """Record or resume ``session`` of several kinds, one ledger session per part, with one
        joint plan check per owner (``SessionBook.open_parts``)."""
        return self.sessions_book.open_parts(owners, session, parts, client)

    def session_opener(self, owners: list[str], session: str) -> str | None:
        """The client that opened ``session`` for some of ``owners`` (None: not recorded)."""
        return self.sessions_book.session_opener(owners, session)

    def close_session(self, owner: str, session: str) -> None:
        """Close the session: its plan no longer holds budget."""
        self.sessions_book.close_sessions([owner], session)

    def close_sessions(self, owners: list[str], session: str) -> None:
        """Close the session of every owner of ``owners`` (one transaction)."""
        self.sessions_book.close_sessions(owners, session)

    def answered_on_lattice(self, owner: str) -> bool:
        """Whether the owner ever answered with lattice noise."""
        return self.sessions_book.answered_on_lattice(owner)

    def answered_on_lattice_of(self, owners: Sequence[str]) -> list[bool]:
        """Whether each owner of ``owners`` ever answered with lattice noise, asked at once."""
        return self.sessions_book.answered_on_lattice_of(owners)

    def agreement_secret(self, owner: str) -> bytes:
        """The owner's 32-byte agreement secret (``KeyStore.agreement_secret``)."""
        return self.keys.agreement_secret(owner)

    # --- spend --------------------------------------------------------------------------------
    def reports(self, owners: list[str], session: str | None) -> list[Report]:
        """Every owner's spend, in all sessions and in ``session`` (None: not asked)."""
        return self.totals.reports(owners, session)

    def kind_spend(
        self, owners: list[str], session: str
    ) -> list[dict[str, tuple[GaussianSpend, list[Row]]]]:
        """Each owner's spend in ``session`` per kind (ledger name): Gaussian spend and
        gradient answers (``SpendTotals.kind_spend``)."""
        return self.totals.kind_spend(owners, session)

    def session(self, owner: str, session: str) -> Session | None:
        return self.totals.session(owner, session)

    def sessions(self, owner: str) -> list[Session]:
        """Every session the owner has opened, oldest first, each with its own spend."""
        return self.totals.sessions(owner)

    def sampled(self, owner: str) -> list[Row]:
        """The owner's subsampled-Gaussian answers across all sessions, one per (q, σ), and
        its pure-ε releases, one per ε."""
        return self.totals.sampled(owner)

    def total(self, owner: str) -> GaussianSpend:
        """Everything the owner has ever been charged, across sessions."""
        return self.totals.total(owner)

    def charge(self, c: Charge) -> None:
        """Charge and store the new answers ``c.payloads`` in one transaction."""
        self.book.charge(c)

    def charging(self, c: Charge) -> AbstractContextManager[Callable[[np.ndarray], None]]:
        """One charging transaction: every check first, then the answers
        (``SpendBook.charging``)."""
        return self.book.charging(c)
