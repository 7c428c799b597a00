"""The ledger's session book: sessions opened and closed, the plan views their admission reads,
and the reservations and caps it records (docs/design.md §3, invariants 8 and 12; §4, "The
ledger's parts"). A plan is admitted inside the transaction that records it, from each owner's
spend (Gaussian spend line and gradient rows, as privacy events) and the reservations of its
other open sgmcmc sessions."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from ..errors import InvalidRequest, NotPermitted, UnknownSession
from ..kinds import query_kind
from ..privacy import GaussianSpend
from ..privacy.subsampled import SubsampledGaussian
from .key_store import KeyStore
from .ledger_records import (
    PART_SEPARATOR,
    Admit,
    Opening,
    PlanView,
    Session,
    SessionPart,
    events_of,
)
from .ledger_store import LedgerStore
from .mask_graph import sessions_failure
from .spend_book import SpendBook
from .spend_totals import SpendTotals


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


def _spend(totals: tuple) -> GaussianSpend:
    """The Gaussian spend line of ``totals`` (answers, Σ μ², max μ)."""
    return GaussianSpend(int(totals[0]), float(totals[1]), float(totals[2]))


class SessionBook:
    """The sessions of the owners of one ledger ``store``: ``totals`` reads their spend, ``keys``
    records their secure sessions, ``book`` is told of the caps and plans that change."""

    def __init__(self, store: LedgerStore, totals: SpendTotals, keys: KeyStore, book: SpendBook):
        self.store, self.totals, self.keys, self.book = store, totals, keys, book
        store.on_forget(self._forget)
        self._forget()

    def _forget(self) -> None:
        self._lattice_ids: set[int] | None = None  # owners recorded in ``mechanisms``

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
        """Record a session of one kind for every owner of ``owners``, or resume an open one
        with the same algorithm and sampling rate; each owner's recorded cap (or None)
        (``open_parts`` with the one part ``session``)."""
        part = SessionPart(session, algorithm, planned_answers, sampling_rate, max_step)
        return self.open_parts(owners, session, [part], client)

    def open_parts(
        self, owners: list[Opening], session: str, parts: list[SessionPart], client: str | None
    ) -> list[float | None]:
        """Record ``session`` — one ledger session per part (kind) — for every owner of
        ``owners``, or resume it with the same parts and terms; each owner's recorded cap.

        Each owner's ``admit`` (several parts: ``admit_parts``, once with every part's view)
        sees its spend and the reservations of its other open sgmcmc sessions (at its noise
        multiplier) and may refuse; its cap is recorded. The checks and the inserts are one
        ``BEGIN IMMEDIATE`` transaction with a constant number of statements per part however
        many owners, so two concurrent plans never both fit what only one of them fits, and a
        refusal by any owner records nothing. ``client``: the identity opening it (None
        without an allow-list); a session recorded for another identity is refused
        (``NotPermitted``). An owner's ``lattice`` is recorded in ``mechanisms``. A part's
        ``max_step``: the step it declared (a resume must declare the same).
        """
        names = [o.owner for o in owners]
        with self.store.writing():
            recorded = self._check_parts(names, session, parts, client)
            for j, part in enumerate(parts):  # each part keeps its own secure record
                self.keys.check_reopen([o.part(j) for o in owners], part.name, recorded[j])
            ids = [self.store.id(name) for name in names]
            views = [self._plan_views(owners, ids, p, parts) for p in parts]
            caps = [self._admit(o, [v[k] for v in views]) for k, o in enumerate(owners)]
            for j, part in enumerate(parts):
                self._record_sessions(owners, part, client, set(recorded[j]), j)
            self._record_owners(ids, owners, caps, parts)
        for part in parts:
            self.book.plans_changed(part.name)
        self.book.caps_recorded(ids, caps)  # committed: the caches follow
        if self._lattice_ids is not None:
            self._lattice_ids.update(i for i, o in zip(ids, owners) if o.lattice)
        return caps

    @staticmethod
    def _admit(opening: Opening, views: list[PlanView]) -> float | None:
        """The owner's plan check of its views (one per part): its new cap, or None."""
        if opening.admit_parts is not None:
            return opening.admit_parts(views)
        return None if opening.admit is None else opening.admit(views[0])

    def _check_parts(
        self, names: list[str], session: str, parts: list[SessionPart], client: str | None
    ) -> list[dict[str, tuple]]:
        """Each part's recorded rows by owner (algorithm, closed_at, sampling_rate, client,
        max_step), refusing a resume by another client, with other terms, once closed, or with
        other kinds than the session recorded (call inside the transaction)."""
        asked = [p.name for p in parts]
        if (found := self.store.parts(session)) and found != sorted(asked):
            raise InvalidRequest(
                f"session {session!r} was opened with other query kinds; a resumed session "
                "keeps its kinds",
                names[0] if len(names) == 1 else None,
            )
        out = []
        for part in parts:
            recorded = {
                row[0]: row[1:]
                for row in self.store.db.execute(
                    "SELECT owner, algorithm, closed_at, sampling_rate, client, max_step "
                    "FROM sessions WHERE session=?",
                    (part.name,),
                )
            }
            terms = (part.algorithm, part.sampling_rate, part.max_step)
            for name in names:
                _check_reopen(name, recorded.get(name), session, terms, client)
            out.append(recorded)
        return out

    def _record_sessions(
        self,
        owners: list[Opening],
        part: SessionPart,
        client: str | None,
        recorded: set[str],
        j: int,
    ) -> None:
        """Insert ``part`` (the ``j``-th of its session) for each owner not ``recorded``; give
        each resumed one its new plan — admitted in full by the caller (``admit`` saw the other
        sessions' reservations and this one's answers) — so later admissions reserve it and its
        charges are held to it (invariant 12). Each records the multiplier its gradient answers
        are charged at (call inside the transaction)."""
        now = time.time()
        multipliers = [
            o.part_multipliers[j] if o.part_multipliers else o.session_multiplier for o in owners
        ]
        self.store.db.executemany(
            "INSERT INTO sessions(owner, session, algorithm, planned_answers, opened_at, "
            "sampling_rate, client, max_step, noise_multiplier) VALUES (?,?,?,?,?,?,?,?,?)",
            [
                (o.owner, part.name, part.algorithm, part.planned_answers, now,
                 part.sampling_rate, client, part.max_step, m)
                for o, m in zip(owners, multipliers)
                if o.owner not in recorded
            ],
        )  # fmt: skip
        self.store.db.executemany(
            "UPDATE sessions SET planned_answers=?, noise_multiplier=? WHERE owner=? AND session=?",
            [
                (part.planned_answers, m, o.owner, part.name)
                for o, m in zip(owners, multipliers)
                if o.owner in recorded
            ],
        )

    def _record_owners(
        self,
        ids: list[int],
        owners: list[Opening],
        caps: list[float | None],
        parts: list[SessionPart],
    ) -> None:
        """Write each opening owner's cap, lattice mechanism and secure-session record of each
        part (call inside the transaction)."""
        self.store.db.executemany(
            "INSERT OR REPLACE INTO limits(owner_id, max_mu_squared) VALUES (?,?)",
            [(i, cap) for i, cap in zip(ids, caps) if cap is not None],
        )
        self.store.db.executemany(
            "INSERT OR REPLACE INTO mechanisms(owner_id, lattice) VALUES (?, 1)",
            [(i,) for i, o in zip(ids, owners) if o.lattice],
        )
        for j, part in enumerate(parts):
            self.keys.record(ids, [o.part(j) for o in owners], part.name)

    def _plan_views(
        self, owners: list[Opening], ids: list[int], part: SessionPart, parts: list[SessionPart]
    ) -> list[PlanView]:
        """Each owner's spend and reservations for ``part`` of the session of ``parts`` (whose
        other parts are not reservations of other sessions), owners of ledger ``ids``, in a
        constant number of statements (call inside the transaction). Owners with nothing
        recorded but their spend line share one view per distinct (spend, masking-graph
        terms): the view is a pure function of these (docs/design.md §4 "Many owners")."""
        session, siblings = part.name, {p.name for p in parts}
        session_id = self.store.id(session)
        open_rows: dict[str, list[tuple]] = defaultdict(list)
        for owner, *rest in self.store.db.execute(
            "SELECT owner, session, algorithm, planned_answers, sampling_rate, noise_multiplier "
            "FROM sessions WHERE closed_at IS NULL"
        ):
            open_rows[owner].append(tuple(rest))
        sampled = self.totals.sampled_rows()
        id_array = np.array(ids, dtype=np.int64)
        totals = [column.tolist() for column in self.totals.spend(id_array)]
        in_session = self.totals.spend(id_array, session_id)
        existing = {
            row[0]: row[1:]
            for row in self.store.db.execute(
                "SELECT owner, algorithm, planned_answers, closed_at, sampling_rate FROM sessions "
                "WHERE session=?",
                (session,),
            )
        }
        graphs = self._graph_rows(owners, ids, session.partition(PART_SEPARATOR)[0])
        parts_gaussian = any(not query_kind(p.algorithm).takes_rate for p in parts)
        alike: dict[tuple, PlanView] = {}
        views = []
        for k, (opening, owner_id) in enumerate(zip(owners, ids)):
            spent = (totals[0][k], totals[1][k], totals[2][k])
            rows, mine = sampled.get(owner_id, []), open_rows.get(opening.owner, [])
            record = existing.get(opening.owner)
            if not rows and not mine and record is None:
                key = (spent, graphs[k])
                view = alike.get(key)
                if view is None:
                    view = alike[key] = PlanView(
                        None, _spend(spent), [], [], parts_gaussian, sessions_failure(graphs[k])
                    )
                views.append(view)
                continue
            in_this = (in_session[0][k], in_session[1][k], in_session[2][k])
            views.append(
                self._own_view(
                    opening, session, siblings, spent, in_this, rows, mine, record, parts_gaussian,
                    sessions_failure(graphs[k]),
                )
            )  # fmt: skip
        return views

    def _own_view(
        self,
        opening: Opening,
        session: str,
        siblings: set[str],
        spent: tuple,
        in_this: tuple,
        rows: list,
        mine: list[tuple],
        record: tuple | None,
        parts_gaussian: bool,
        graph_failure: float,
    ) -> PlanView:
        """One owner's ``PlanView`` (``_plan_views``) from its spend ``spent`` (all sessions)
        and ``in_this`` (this one), sampled ``rows``, open sessions ``mine`` and ``session``'s
        ``record`` (None: never opened by it)."""
        session_id = self.store.id(session)
        total = _spend(spent)
        reserved = []
        for name, kind, planned, rate, recorded_multiplier in mine:
            if query_kind(kind).takes_rate and name not in siblings:
                used = sum(c for sid, _, _, c in rows if sid == self.store.id(name))
                multiplier = recorded_multiplier or opening.noise_multiplier
                reserved.append(SubsampledGaussian(rate, multiplier, max(planned - used, 0)))
        current = None
        if record is not None:
            events = events_of([r for r in rows if r[0] == session_id])
            current = Session(
                session, record[0], record[1], record[2] is not None, _spend(in_this), events,
                record[3],
            )  # fmt: skip
        gaussian_open = parts_gaussian or any(
            not query_kind(kind).takes_rate for _, kind, *_ in mine
        )
        return PlanView(current, total, events_of(rows), reserved, gaussian_open, graph_failure)

    def _graph_rows(
        self, owners: list[Opening], ids: list[int], base: str
    ) -> list[tuple[tuple[str, int, int], ...]]:
        """Each owner's secure sessions (name, K, t) other than ``base`` (the session being
        opened) and, when secure, ``base`` at the terms it is opened with: what its
        masking-graph failure bound counts (docs/design.md §2.6; call inside the
        transaction)."""
        recorded: dict[int, list[tuple[str, int, int]]] = defaultdict(list)
        for kept in self.keys.secure_sessions(set(ids)).values():
            for owner_id, name, terms in kept:
                if name.partition(PART_SEPARATOR)[0] != base:
                    recorded[owner_id].append((name, terms.owners, terms.colluders))
        out = []
        for opening, owner_id in zip(owners, ids):
            rows = recorded.get(owner_id, [])
            if opening.secure is not None:
                rows = [*rows, (base, opening.secure.terms.owners, opening.secure.terms.colluders)]
            out.append(tuple(rows))
        return out

    def session_opener(self, owners: list[str], session: str) -> str | None:
        """The client that opened ``session`` (or, with several kinds, its parts) for some of
        ``owners`` (None: not recorded, or opened without a client identity)."""
        prefix = session + PART_SEPARATOR
        with self.store.reading():
            for owner, client in self.store.db.execute(
                "SELECT owner, client FROM sessions WHERE (session=? OR substr(session, 1, ?)=?) "
                "AND client IS NOT NULL",
                (session, len(prefix), prefix),
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
        with self.store.writing():
            self.store.db.executemany(
                "UPDATE sessions SET closed_at=? WHERE owner=? AND session=? AND closed_at IS NULL",
                [(now, owner, session) for owner in owners],
            )
        self.book.plans_changed(session)

    def answered_on_lattice_of(self, owners: Sequence[str]) -> list[bool]:
        """``answered_on_lattice`` of every owner of ``owners``: a writer asks the table once
        and then looks each owner up under one lock (a builder of many owners;
        docs/design.md §4 "Many owners"); a reader asks owner by owner."""
        if not owners or self.store.read_only:
            return [self.answered_on_lattice(owner) for owner in owners]
        self.answered_on_lattice(owners[0])  # reads the table and the names once
        with self.store.lock:
            lattice = self._lattice_ids if self._lattice_ids is not None else set()
            return [self.store.known_id(owner) in lattice for owner in owners]

    def answered_on_lattice(self, owner: str) -> bool:
        """Whether the owner ever answered with lattice noise (table ``mechanisms``). A writer
        reads the table and the names once and answers every owner after from memory (kept
        current by ``open_parts``; docs/design.md §4 "Many owners"), without the batched
        store's flush: what it answers is never in the pending blocks."""
        with self.store.lock:
            if self._lattice_ids is not None and not self.store.read_only:
                return self.store.known_id(owner) in self._lattice_ids
        with self.store.reading():
            if self.store.read_only:
                row = self.store.db.execute(
                    "SELECT lattice FROM mechanisms WHERE owner_id=?", (self.store.id(owner),)
                ).fetchone()
                return bool(row and row[0])
            if self._lattice_ids is None:
                self._lattice_ids = {
                    i
                    for (i,) in self.store.db.execute(
                        "SELECT owner_id FROM mechanisms WHERE lattice"
                    )
                }
            self.store.load_names()
            return self.store.known_id(owner) in self._lattice_ids
