"""The ledger's spend, read back as privacy events (docs/design.md §4, "The ledger's parts"):
each owner's Gaussian spend (``GaussianSpend``, summed from its groups' spend lines and the spend
rows of earlier ledgers) and its gradient answers (``SubsampledGaussian`` rows), in all sessions
or in one, and the reports built from them. Reads only; the store's lock is taken by the public
methods, the others run under it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

import numpy as np

from ..privacy import GaussianSpend
from ..privacy.owner_epsilon import Row
from ..privacy.subsampled import SubsampledGaussian
from .key_store import KeyStore
from .ledger_records import PART_SEPARATOR, Report, SecureSpend, Session, events_of, pure_event
from .ledger_rows import StepSums, line_spend
from .ledger_store import LedgerStore

_LEGACY_TOTALS = 0  # session id of the all-session rows older ledgers kept (ids start at 1)


class SpendTotals:
    """Spend and reports of the owners of one ledger ``store``; ``keys``: its secure sessions."""

    def __init__(self, store: LedgerStore, keys: KeyStore):
        self.store = store
        self.keys = keys

    def sampled_rows(self) -> dict[int, list[tuple]]:
        """Every owner id's gradient rows (session id, q, σ, count) and pure-ε rows (session
        id, None, ε, count), one statement (``ledger_records.events_of`` reads both)."""
        pure = (
            " UNION ALL SELECT owner_id, session_id, NULL, epsilon, SUM(answers) "
            "FROM pure_releases GROUP BY owner_id, session_id, epsilon"
            if self.store.pure
            else ""
        )
        sampled: dict[int, list[tuple]] = defaultdict(list)
        for owner_id, sid, q, sigma, count in self.store.db.execute(
            "SELECT owner_id, session_id, sampling_rate, noise_multiplier, SUM(answers) "
            "FROM sampled GROUP BY owner_id, session_id, sampling_rate, noise_multiplier" + pure
        ):
            sampled[owner_id].append((sid, q, sigma, int(count)))
        return sampled

    def spend(
        self, owner_ids: np.ndarray, session_id: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Spend of each owner id in ``session_id`` (None: all sessions), summed over the
        groups it belongs to: answers ``(K,)``, Σμ² ``(K,)``, max μ ``(K,)``."""
        k = len(owner_ids)
        answers, mu2, max_mu = np.zeros(k, dtype=np.int64), np.zeros(k), np.zeros(k)
        order = np.argsort(owner_ids)
        ordered = owner_ids[order]
        for gid, (a, m2, mx) in self.group_spends(session_id):
            members = self.store.group_members(gid)
            pos = np.minimum(np.searchsorted(ordered, members), max(k - 1, 0))
            hit = ordered[pos] == members if k else np.zeros(len(members), bool)
            if hit.any():
                at = order[pos[hit]]
                answers[at] += a[hit]
                mu2[at] += m2[hit]
                max_mu[at] = np.maximum(max_mu[at], mx[hit])
        return answers, mu2, max_mu

    def group_spends(
        self, session_id: int | None
    ) -> Iterator[tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]]]:
        """(group id, its members' answers, Σμ², max μ) of every spend line, and of every spend
        row of earlier ledgers, in ``session_id`` (None: all sessions)."""
        where, args = ("session_id=?", (session_id,)) if session_id is not None else ("1", ())
        lines = (
            self.store.db.execute(
                "SELECT l.group_id, l.slope, l.offset, b.* FROM spend_lines l JOIN ("
                "SELECT line_id, SUM(answers), SUM(steps), SUM(steps_squared), MAX(max_step) "
                f"FROM answer_blocks WHERE line_id IS NOT NULL AND {where} GROUP BY line_id"
                ") b ON b.line_id = l.id",
                args,
            )
            if self.store.blocks
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
        for gid, a, m2, mx in self.store.db.execute(
            f"SELECT group_id, answers, mu_squared, max_mu FROM spend WHERE {where}", args
        ):
            spend = np.frombuffer(a, "<i8"), np.frombuffer(m2, "<f8"), np.frombuffer(mx, "<f8")
            yield gid, spend

    def spend_of(self, owner: str, session_id: int | None = None) -> GaussianSpend:
        answers, mu2, max_mu = self.spend(np.array([self.store.id(owner)]), session_id)
        return GaussianSpend(int(answers[0]), float(mu2[0]), float(max_mu[0]))

    def reports(self, owners: list[str], session: str | None) -> list[Report]:
        """Every owner's spend, in all sessions and in ``session`` (None: not asked; a session
        of several kinds: the sum of its parts), in a constant number of statements per part:
        what ``PrivacyReport`` needs."""
        with self.store.reading():
            ids = np.array([self.store.id(o) for o in owners], dtype=np.int64)
            sampled = self.sampled_rows()
            totals = self.spend(ids)
            parts = [] if session is None else self.store.parts(session)
            part_ids = {self.store.id(name) for name in parts}
            in_session = self._summed(ids, part_ids)
            known = {
                row[0]
                for name in parts
                for row in self.store.db.execute(
                    "SELECT owner FROM sessions WHERE session=?", (name,)
                )
            }
            secure = self.secure_spends(ids, sampled)
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
                    events_of([r for r in rows if r[0] in part_ids]),
                )
            out.append(
                Report(total, events_of(rows), owner in known, current, secure.get(owner_id, []))
            )
        return out

    def _summed(
        self, ids: np.ndarray, session_ids: set[int]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``spend`` of ``ids`` summed over ``session_ids`` (the parts of one session)."""
        k = len(ids)
        answers, mu2, max_mu = np.zeros(k, dtype=np.int64), np.zeros(k), np.zeros(k)
        for session_id in sorted(session_ids):
            a, m2, mx = self.spend(ids, session_id)
            answers, mu2, max_mu = answers + a, mu2 + m2, np.maximum(max_mu, mx)
        return answers, mu2, max_mu

    def kind_spend(
        self, owners: list[str], session: str
    ) -> list[dict[str, tuple[GaussianSpend, list[Row]]]]:
        """Each owner's spend in ``session`` per kind (ledger name), from each part's rows."""
        with self.store.reading():
            out: list[dict[str, tuple[GaussianSpend, list[Row]]]] = [{} for _ in owners]
            for name in self.store.parts(session):
                for k, owner in enumerate(owners):
                    recorded = self.read_session(owner, name)
                    if recorded is not None:
                        out[k][recorded.algorithm] = (recorded.spend, recorded.sampled)
        return out

    def secure_spends(
        self, ids: np.ndarray, sampled: dict[int, list[tuple]]
    ) -> dict[int, list[SecureSpend]]:
        """Each owner id's secure sessions with its spend in each (``sampled``: its gradient
        rows by session, as ``reports`` reads them); one spend query per secure session."""
        by_session = self.keys.secure_sessions(set(ids.tolist()))
        out: dict[int, list[SecureSpend]] = defaultdict(list)
        for session_id, rows in by_session.items():
            answers, mu2, max_mu = self.spend(np.array([r[0] for r in rows]), session_id)
            for j, (owner_id, name, terms) in enumerate(rows):
                spend = GaussianSpend(int(answers[j]), float(mu2[j]), float(max_mu[j]))
                events = events_of([r for r in sampled.get(owner_id, []) if r[0] == session_id])
                out[owner_id].append(SecureSpend(name, terms, spend, events))
        return out

    def session(self, owner: str, session: str) -> Session | None:
        with self.store.reading():
            return self.read_session(owner, session)

    def read_session(self, owner: str, session: str) -> Session | None:
        row = self.store.db.execute(
            "SELECT algorithm, planned_answers, closed_at, sampling_rate, opened_at FROM sessions "
            "WHERE owner=? AND session=?",
            (owner, session),
        ).fetchone()
        if row is None:
            return None
        spend = self.spend_of(owner, self.store.id(session))
        sampled = self.sampled_of(owner, self.store.id(session))
        name = session.partition(PART_SEPARATOR)[0]  # a part is shown as its session
        return Session(name, row[0], row[1], row[2] is not None, spend, sampled, row[3], row[4])

    def sessions(self, owner: str) -> list[Session]:
        """Every session the owner has opened, oldest first, each with its own spend (what
        ``fedpenalty owner report`` breaks the total down by)."""
        with self.store.reading():
            names = [
                name
                for (name,) in self.store.db.execute(
                    "SELECT session FROM sessions WHERE owner=? ORDER BY opened_at, session",
                    (owner,),
                )
            ]
            found = [self.read_session(owner, name) for name in names]
        return [s for s in found if s is not None]

    def sampled(self, owner: str) -> list[Row]:
        """The owner's subsampled-Gaussian answers across all sessions, one event per (q, σ),
        and its pure-ε releases, one per ε."""
        with self.store.reading():
            return self.sampled_of(owner)

    def sampled_of(self, owner: str, session_id: int | None = None) -> list[Row]:
        """The owner's gradient rows, one per (q, σ), and its pure-ε releases, one per ε, in
        ``session_id`` (None: all sessions)."""
        where, args = "WHERE owner_id=?", [self.store.id(owner)]
        if session_id is not None:
            where, args = where + " AND session_id=?", [*args, session_id]
        rows = self.store.db.execute(
            f"SELECT sampling_rate, noise_multiplier, SUM(answers) FROM sampled {where} "
            "GROUP BY sampling_rate, noise_multiplier",
            args,
        ).fetchall()
        out: list[Row] = [SubsampledGaussian(q, sigma, int(count)) for q, sigma, count in rows]
        if self.store.pure:
            pure = self.store.db.execute(
                f"SELECT epsilon, SUM(answers) FROM pure_releases {where} GROUP BY epsilon", args
            ).fetchall()
            out += [pure_event(eps, int(count)) for eps, count in pure]
        return out

    def total(self, owner: str) -> GaussianSpend:
        """Everything the owner has ever been charged, across sessions."""
        with self.store.reading():
            return self.spend_of(owner)
