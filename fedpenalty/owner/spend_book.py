"""The ledger's spend book: charges and their admission against each owner's cap (docs/design.md
§3, invariants 1, 2 and 12; §4, "A charge is one row" and "The ledger's parts").

A charge of Gaussian answers is admitted by μ-GDP composition of spend-line events
(``GaussianSpend``; the pending bound of ``ledger_rows.PendingLine`` makes the usual charge O(1),
and ``SpendBook.charge_drawn`` takes it without the general transaction's bookkeeping), a
charge of gradient answers or pure-ε statistics by the session's admitted plan
(``CountedReleases``). The book keeps each owner's totals and caps in memory (a writer is its
file's only writer), updated only once a transaction has committed and dropped on a rollback
(``LedgerStore.on_forget``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from ..errors import BudgetExhausted, ReplayConflict
from ..models.base import Neighbour
from ..privacy import GaussianSpend
from ..privacy.owner_epsilon import owner_epsilon
from .ledger_records import Charge
from .ledger_rows import (
    EVERY,
    AffineMus,
    Index,
    PendingLine,
    StepSums,
    block_fields,
    gdp_add,
    key_groups,
    span,
)
from .ledger_store import LedgerStore
from .spend_totals import SpendTotals


class SpendBook:
    """Charges of the owners of one ledger ``store``; ``totals`` reads their spend."""

    def __init__(self, store: LedgerStore, totals: SpendTotals):
        self.store = store
        self.totals = totals
        self.lines = SpendLines(store)
        self.counted = CountedReleases(store, totals)
        store.on_forget(self._forget)
        self._forget()

    def _forget(self) -> None:
        """Drop the caches (reloaded from the file on demand)."""
        self._slots: dict[int, int] = {}  # owner id → row of _totals / _caps
        self._slots_of: dict[bytes, np.ndarray] = {}  # owner-id array bytes → their rows
        self._totals = np.zeros((0, 3))  # per owner, all sessions: answers, Σμ², max μ
        self._caps = np.zeros(0)  # per owner: recorded μ² cap (inf: none)
        self._caps_version = 0  # counts changes of _caps
        self._pending: PendingLine | None = None  # charges not yet in _totals
        self._session_ids: dict[str, int] = {}  # sessions charged: their ids

    def unanswered_from(self, session: str, first: int, substep: int) -> bool:
        """True when this writer knows from memory that nothing of ``session`` at ``substep``
        has been answered at or past iteration ``first`` — so no key from ``first`` on has a
        stored answer, as ``LedgerStore.read_stored`` would find — without the lock or the
        file; False: it may have been (ask ``Ledger.stored_ids_at``)."""
        session_id = self._session_ids.get(session)
        if session_id is None:
            return False
        highest = self.store.frontier.get((session_id, substep))
        return highest is not None and first > highest

    def caps_recorded(self, ids: list[int], caps: list[float | None]) -> None:
        """The caps ``caps`` of owner ids ``ids`` were committed (None: unchanged)."""
        for i, cap in zip(ids, caps):
            if cap is not None and i in self._slots:
                self._caps[self._slots[i]] = cap
                self._caps_version += 1

    def plans_changed(self, session: str) -> None:
        """A session opened or closed: its admitted plans are read again."""
        self.counted.plans_changed(session)

    def _slots_for(self, owner_ids: np.ndarray) -> np.ndarray:
        """Rows of the cached totals and caps for ``owner_ids`` ``(K,)``; owners seen for the
        first time are loaded from the file (call under the lock; writers only)."""
        key = owner_ids.tobytes()
        slots = self._slots_of.get(key)
        if slots is None:
            new = list(dict.fromkeys(i for i in owner_ids.tolist() if i not in self._slots))
            if new:
                answers, mu2, max_mu = self.totals.spend(np.array(new, dtype=np.int64))
                caps = dict(self.store.db.execute("SELECT owner_id, max_mu_squared FROM limits"))
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
        # a batched simulated ledger commits Gaussian charges in groups (``LedgerStore``)
        batched = self.store.batched and c.sampled is None
        with self.store.buffering() if batched else self.store.writing():
            owner_ids = (
                c.owner_ids
                if c.owner_ids is not None
                else np.array([self.store.id(o) for o in c.owners], dtype=np.int64)
            )
            session_id = self._session_ids[c.session] = self.store.id(c.session)
            if c.sampled is not None:
                self.counted.sampled(c, owner_ids, session_id, c.new.sum(axis=1))
            if c.pure is not None:
                self.counted.pure(c, owner_ids, session_id, c.new.sum(axis=1))
            slots = self._slots_for(owner_ids)
            self._check_unanswered(c, owner_ids, session_id, every)
            groups: list[tuple[int, Index, Index]]
            if every:
                groups = [(self.lines.every_group(owner_ids), EVERY, EVERY)]
            else:
                groups = [
                    (self.store.group(owner_ids[m]), m, keys) for m, keys in key_groups(c.new)
                ]
            lines = [self.lines.of_charge(c, session_id, *group) for group in groups]
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
            self._answered(session_id, c.substep, answered)

    def charge_drawn(self, c: Charge, draw: Callable[[], np.ndarray]) -> np.ndarray:
        """``charging`` with the answers ``draw()`` ``(K, M, w)`` drawn once every check has
        passed: they are stored and returned. The usual charge of a batched store (every owner
        and key new, past the session's answered iterations, on the pending line within its
        bound: ``_usual``) is admitted, buffered and recorded by the very steps ``charging``
        takes for it, without its other cases' bookkeeping (docs/design.md §4, "The usual
        charge"); any other charge goes through ``charging``."""
        usual = None
        if self.store.batched and c.sampled is None and c.pure is None:
            with self.store.buffering():
                usual = self._usual(c)
                if usual is not None:
                    session_id, group, line, used = usual
                    out = draw()
                    self._store_answers(c, session_id, [(group, EVERY, EVERY)], [line], out)
        if usual is None:
            with self.charging(c) as store:
                out = draw()
                store(out)
            return out
        pending = self._pending
        assert pending is not None  # _usual found it
        pending.add(line[1], used)  # committed: the caches follow
        self._answered(session_id, c.substep, span(c.iterations)[1])
        return out

    def _usual(self, c: Charge) -> tuple[int, int, tuple[int | None, StepSums], float] | None:
        """For ``charge_drawn``: the (session id, group, (line, step sums), pending bound
        after it) of a Gaussian charge of every owner and key that ``charging`` would
        admit on the pending line (``_on_pending``) with every key past the session's highest
        answered iteration (``_check_unanswered``'s free case); None for any other charge
        (call under the lock)."""
        session_id = self._session_ids.get(c.session)
        highest = None if session_id is None else self.store.frontier.get((session_id, c.substep))
        if session_id is None or highest is None or c.mus is None or c.owner_ids is None:
            return None
        # every answer new (c.new.all(), without a ufunc reduction) and past the answered ones
        if np.count_nonzero(c.new) != c.new.size or span(c.iterations)[0] <= highest:
            return None
        group = self.lines.every_group(c.owner_ids)
        line = self.lines.of_charge(c, session_id, group, EVERY, EVERY)
        used = self._on_pending(c, line)
        if used is None:
            return None
        return session_id, group, line, used

    def _answered(self, session_id: int, substep: int, answered: int) -> None:
        """The session's highest answered iteration at ``substep`` is at least ``answered``
        (a charge committed)."""
        frontier = (session_id, substep)
        self.store.frontier[frontier] = max(self.store.frontier[frontier], answered)

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
        line = None if every is None else every[0]
        used = None if every is None else self._on_pending(c, every)
        if used is not None and p is not None:
            sums = every[1]  # type: ignore[index]
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

    def _on_pending(self, c: Charge, every: tuple[int | None, StepSums]) -> float | None:
        """The pending bound once a charge of every owner and key on spend line ``every``
        (line, step sums) is added, when that charge is on the pending line, for the caps it
        was built for, and keeps the bound within 1 (``PendingLine``); None otherwise."""
        p = self._pending
        line, sums = every
        if (
            line is None
            or p is None
            or p.line != line
            or p.limits is not c.max_mu_squared
            or p.caps_version != self._caps_version
        ):
            return None
        used = p.used + p.cost(sums)
        return used if used <= 1.0 else None

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
        if first > self.store.highest_iteration(session_id, c.substep):
            return
        stored = self.store.read_stored(owner_ids, session_id, first, last, c.substep)
        position = {owner_id: k for k, owner_id in enumerate(owner_ids.tolist())}
        keys = {key: j for j, key in enumerate(zip(c.chains.tolist(), c.iterations.tolist()))}
        for owner_id, chain, iteration in stored:
            j = keys.get((chain, iteration))
            if j is not None and c.new[position[owner_id], j]:
                at = f", sub-step {c.substep}" if c.substep else ""
                raise ReplayConflict(
                    f"(session, chain {chain}, iteration {iteration}{at}) was answered before: "
                    "its stored answer is replayed, never a second one",
                    c.owners[position[owner_id]],
                )

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
        order). A simulated ledger stores float answers as nothing (their keys and digests
        only)."""
        rows = []
        for (gid, members, keys), (line, sums) in zip(groups, lines):
            digests = (
                c.digests[keys]
                if isinstance(keys, slice)
                else [c.digests[j] for j in keys.tolist()]
            )
            if self.store.simulated and answers.dtype == np.float64:
                payloads = answers[:0, :0]  # simulated: recomputed on replay, not stored
            else:
                payloads = answers[members][:, keys]
            first, last, *blobs = block_fields(
                c.chains[keys], c.iterations[keys], digests, payloads
            )
            counts = (sums.count, sums.total, sums.squares, sums.largest)
            rows.append((session_id, first, last, gid, line, *counts, *blobs, c.substep))
        self.store.store_blocks(rows)

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


class CountedReleases:
    """The answers a ledger counts rather than composes as μ-GDP — Poisson-subsampled gradient
    answers (``sampled``) and pure-ε statistics (``pure_releases``) — each refused past the
    owner's session plan as the ledger admitted it (docs/design.md §3, invariant 12)."""

    def __init__(self, store: LedgerStore, totals: SpendTotals):
        self.store = store
        self.totals = totals
        store.on_forget(self._forget)
        self._forget()

    def _forget(self) -> None:
        self._plans: dict[str, dict[str, int]] = {}  # open session → owner → admitted plan

    def plans_changed(self, session: str) -> None:
        """A session opened or closed: its admitted plans are read again."""
        self._plans.pop(session, None)

    def sampled(self, c: Charge, owner_ids: np.ndarray, session_id: int, add: np.ndarray) -> None:
        """Count subsampled-Gaussian answers, refusing past any owner's session plan as the
        ledger admitted it against the budget (docs/design.md §3, invariant 12)."""
        sampled = c.sampled
        assert sampled is not None
        q = float(sampled.q)
        self._within_plan(c, owner_ids, session_id, add, "sampled", sampled.neighbour)
        self.store.db.executemany(
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

    def pure(self, c: Charge, owner_ids: np.ndarray, session_id: int, add: np.ndarray) -> None:
        """Count pure-ε answers (the Laplace statistics, docs/design.md §2.10) at each owner's ε
        ``c.pure``, refusing past any owner's session plan as the ledger admitted it."""
        pure = c.pure
        assert pure is not None
        # ε adds whatever the relation: any valid one will do for the refusal's figure
        self._within_plan(c, owner_ids, session_id, add, "pure_releases", ["add_remove"] * len(add))
        self.store.db.executemany(
            "INSERT INTO pure_releases(session_id, owner_id, epsilon, answers) VALUES (?,?,?,?) "
            "ON CONFLICT(session_id, owner_id, epsilon) DO UPDATE SET "
            "answers=answers+excluded.answers",
            [
                (session_id, int(i), float(e), int(a))
                for i, e, a in zip(owner_ids, pure, add)
                if a > 0
            ],
        )

    def _within_plan(
        self,
        c: Charge,
        owner_ids: np.ndarray,
        session_id: int,
        add: np.ndarray,
        table: str,
        neighbour: list[Neighbour],
    ) -> None:
        """Refuse (``BudgetExhausted``) when some owner's answers counted in ``table``
        ("sampled" or "pure_releases") in the session, with ``add`` ``(K,)`` more, would pass
        its plan as the ledger admitted it (docs/design.md §3, invariant 12)."""
        counts = dict(
            self.store.db.execute(
                f"SELECT owner_id, SUM(answers) FROM {table} WHERE session_id=? GROUP BY owner_id",
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
                self.totals.spend_of(c.owners[k]),
                self.totals.sampled_of(c.owners[k]),
                float(c.delta[k]),
                neighbour[k],
                c.lattice,
            )
            left = max(float(c.budget_epsilon[k]) - spent, 0.0)
            what = "gradient" if table == "sampled" else "pure-ε statistic"
            raise BudgetExhausted(
                f"privacy budget: this session's plan of {int(plan[k])} {what} answers "
                f"(the most the "
                f"owner's budget was checked for when the session opened) is used up "
                f"({int(used[k])} answered; "
                f"ε {left:.4g} left of the budget for a new session)",
                c.owners[k],
                epsilon_left=left,
            )

    def _open_plans(self, session: str) -> dict[str, int]:
        """Each owner's admitted plan in ``session`` while it is open (an owner without an open
        session has none: 0 answers). A writer reads them once per session and keeps them until
        a session opens or closes (call under the lock)."""
        plans = self._plans.get(session)
        if plans is None:
            plans = self._plans[session] = dict(
                self.store.db.execute(
                    "SELECT owner, planned_answers FROM sessions WHERE session=? "
                    "AND closed_at IS NULL",
                    (session,),
                ).fetchall()
            )
        return plans


class SpendLines:
    """Ids of a ledger's owner groups and spend lines (session, group, μ slope and offset),
    recorded on first use and kept in memory until the store forgets its caches."""

    def __init__(self, store: LedgerStore):
        self.store = store
        store.on_forget(self._forget)
        self._forget()

    def _forget(self) -> None:
        self._lines: dict[tuple[int, int, bytes, bytes], int] = {}  # spend line ids
        # the usual charge's group (by its owner count) and line (by session and group), kept
        # with the very arrays they were found for (``every_group``, ``_of_every``)
        self._groups_of: dict[int, tuple[np.ndarray, int]] = {}
        self._lines_of: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, int]] = {}

    def every_group(self, owner_ids: np.ndarray) -> int:
        """``LedgerStore.group`` of every owner ``owner_ids`` of a charge, kept by the array's
        identity (a host passes the same array with every request)."""
        kept = self._groups_of.get(len(owner_ids))
        if kept is None or kept[0] is not owner_ids:
            kept = self._groups_of[len(owner_ids)] = (owner_ids, self.store.group(owner_ids))
        return kept[1]

    def of_charge(
        self, c: Charge, session_id: int, group_id: int, members: Index, keys: Index
    ) -> tuple[int | None, StepSums]:
        """The spend line of a group's answers to ``keys`` and their step sums (None and no
        steps for gradient answers, which are counted in ``sampled``)."""
        if c.mus is None:
            return None, StepSums(0, 0.0, 0.0, 0.0)
        if members is EVERY:
            return self._of_every(session_id, group_id, c.mus), StepSums.of(c.mus.steps)
        line = self.line(session_id, group_id, c.mus.slope[members], c.mus.offset[members])
        return line, StepSums.of(c.mus.steps[keys])

    def _of_every(self, session_id: int, group_id: int, mus: AffineMus) -> int:
        """``line`` of every owner's ``mus``, kept by the identity of its slope and offset (a
        kind's path passes the same arrays while the session's mechanism stays)."""
        key = (session_id, group_id)
        kept = self._lines_of.get(key)
        if kept is None or kept[0] is not mus.slope or kept[1] is not mus.offset:
            line = self.line(session_id, group_id, mus.slope, mus.offset)
            kept = self._lines_of[key] = (mus.slope, mus.offset, line)
        return kept[2]

    def line(self, session_id: int, group_id: int, slope: np.ndarray, offset: np.ndarray) -> int:
        """Id of the spend line (session, group, slope, offset), recorded on first use."""
        key = (
            session_id,
            group_id,
            np.ascontiguousarray(slope, dtype="<f8").tobytes(),
            np.ascontiguousarray(offset, dtype="<f8").tobytes(),
        )
        if key not in self._lines:
            self.store.db.execute(
                "INSERT OR IGNORE INTO spend_lines(session_id, group_id, slope, offset) "
                "VALUES (?,?,?,?)",
                key,
            )
            self._lines[key] = self.store.db.execute(
                "SELECT id FROM spend_lines WHERE session_id=? AND group_id=? AND slope=? "
                "AND offset=?",
                key,
            ).fetchone()[0]
        return self._lines[key]
