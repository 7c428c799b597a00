"""The owner node: one data owner's record — its policy, prepared records, noise source,
sessions and ledger — behind no transport.

A node does not answer queries itself: ``OwnerHost`` (``host.py``) is the one answer path
(validate → replay check → compute → charge → reply) for one or many nodes. The node decides
what its policy admits (sessions and plans against its budget) and computes its sensitivities
itself, never trusting the coordinator's accounting (docs/design.md §3).
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from ..common import (
    LOG_RATIO,
    PEERS_AUTHENTICATED,
    PEERS_OWN_NOISE,
    PEERS_SIMULATED,
    OwnerDescription,
    OwnNoise,
    Policy,
    PrivacyReport,
    SecureTerms,
    SpendReport,
)
from ..errors import BudgetExhausted, InvalidRequest, UnknownSession
from ..kinds import KINDS, KindTerms, QueryKind, query_kind
from ..kinds.base import Event
from ..models import ExpFamModel, Model, model_digest
from ..privacy import GaussianSpend
from ..privacy.owner_epsilon import Row, max_gdp_mu_squared, owner_epsilon
from ..privacy.subsampled import SubsampledGaussian
from ..schema import Neighbour
from .aggregation import (
    PeerKey,
    SecureOpen,
    agree,
    public_bytes,
    session_private_key,
    transcript,
)
from .ledger import (
    Ledger,
    Opening,
    PlanView,
    Report,
    SecureRecord,
    SecureSpend,
    SessionPart,
)
from .ledger_records import PART_SEPARATOR, part_name
from .mask_graph import accounting_delta, secure_delta
from .noise.lattice import LATTICE_BITS, lattice_gradient_multiplier
from .noise.seeded import seed_material
from .noise.sources import NoiseKey
from .session_request import SessionRequest


@dataclass(frozen=True)
class _OpenSession:
    """An open session as the owner validated it: its query ``kind``; ``max_step`` is the
    largest ‖θ′ − θ‖ its requests may ask (log ratios: the declared one, else the policy's;
    None for other kinds); ``secure``: the terms of a session with secure aggregation
    (docs/design.md §2.6) and ``record``, what its ledger keeps of them."""

    kind: QueryKind
    planned_answers: int
    sampling_rate: float | None
    max_step: float | None = None
    secure: SecureTerms | None = None
    record: SecureRecord | None = None
    #: the ledger session its answers are keyed and charged in: the session, or in a session of
    #: several kinds this kind's part (``ledger_records.part_name``)
    ledger_session: str = ""

    @property
    def algorithm(self) -> str:
        """The kind's ledger name (what the ledger records and the noise streams mix in)."""
        return self.kind.ledger_name


@dataclass
class SimulationDiagnostics:
    """Simulation-only counters. They depend on the data, so a deployed owner never keeps them."""

    clip_binds: int = 0
    log_ratio_terms: int = 0
    #: per query kind (ledger name): [records whose clip bound was hit, record evaluations]
    by_kind: dict[str, list[int]] = field(default_factory=dict)

    def count(self, kind: str, hits: int, evaluations: int) -> None:
        """Add one request's clip-bound hits and record evaluations of ``kind``; the log-ratio
        kind's also to ``clip_binds``/``log_ratio_terms`` (what diagnostics.json reported first)."""
        counts = self.by_kind.setdefault(kind, [0, 0])
        counts[0] += hits
        counts[1] += evaluations
        if kind == LOG_RATIO:
            self.clip_binds += hits
            self.log_ratio_terms += evaluations


class OwnerNode:
    """One data owner.

    records: ``(n, p)`` raw records; they are validated and clipped into the model's domain.
    rng: seeded randomness for a *simulated* owner: float Gaussian noise and Poisson sampling
        reproducible from a run's seed (whoever knows the seed knows the noise); its
        secure-aggregation keys derive from the seed too.
    noise_key: the owner's secret key of exact lattice noise (docs/design.md §2.7): log-ratio
        and statistic answers are rounded to a lattice and noised with the discrete Gaussian
        from a ChaCha20 stream addressed by (session, chain, iteration). The default when no
        ``rng`` is given is a fresh key from OS entropy (every deployed owner).
    simulation: keep data-dependent diagnostics (clip counts). Off for deployed owners.
    fresh_attempts: draw every request's noise and Poisson samples under fresh OS entropy as
        well as the key (``HostNoise.label``), so that the noise of a key that was never
        released cannot be recomputed on demand (docs/design.md §3, invariant 11). Default: on
        for the deployed owner (no ``rng``, no ``noise_key``: a key from OS entropy); off when
        a key or seed is given, whose noise is then reproducible (tests, audits, simulation).
    seeded_streams: SIMULATION ONLY — lattice noise from seeded Philox streams and secure-
        aggregation masks from a SplitMix64 mixer instead of ChaCha20 (``OwnerNode.simulated``).
    answered_on_lattice: whether ``ledger`` holds lattice answers of this owner, when the
        builder of many owners asked the ledger once for all (``Ledger.answered_on_lattice_of``;
        docs/design.md §4 "Many owners"). None: the owner asks its ledger.
    simulated_peers: SIMULATION ONLY — its secure sessions' peers are the simulation's own
        owners, so K is real and it is charged at s without peer authentication
        (``OwnerNode.simulated``). A deployed owner counts other owners' noise only when its
        server authenticated them (``SecureOpen.authenticated``; docs/design.md §2.6).
    per_record: evaluate log-ratios (and the clipped kinds' gradients and ratios) record by
    record with the per-record clip. By default exponential-family models use the identity
    Σ_x ℓ(x,θ') − ℓ(x,θ) = Δηᵀ Σ S(x) − n ΔA, which is O(1) per answer and equal to the clipped
    sum: records are clipped into the data domain when loaded and L bounds the gradient there,
    so the per-record clip cannot bind; the clipped kinds do the same for the chains where the
    model certifies that no record's clip can bind (``compute/clip_free.py``).
    """

    def __init__(
        self,
        name: str,
        model: Model,
        records: np.ndarray,
        policy: Policy,
        ledger: Ledger,
        rng: np.random.Generator | None = None,
        simulation: bool = False,
        per_record: bool | None = None,
        noise_key: NoiseKey | None = None,
        seeded_streams: bool = False,
        fresh_attempts: bool | None = None,
        simulated_peers: bool = False,
        answered_on_lattice: bool | None = None,
    ):
        self.name = name
        self.model = model
        self.policy = policy
        self.records = model.prepare_records(records)
        self.ledger = ledger
        self.rng = rng if rng is not None else np.random.default_rng()
        #: a simulated owner: its randomness (and its agreement secret) derive from a seed
        self.seeded = rng is not None
        #: simulation only: seeded Philox noise and SplitMix64 masks instead of ChaCha20
        self.seeded_streams = seeded_streams
        #: simulation only: its secure sessions' peers are the simulation's own owners
        self.simulated_peers = simulated_peers
        deployed = rng is None and noise_key is None
        self.noise_key = NoiseKey.from_os() if deployed else noise_key
        self.fresh_attempts = deployed if fresh_attempts is None else fresh_attempts
        #: account by Rényi DP: this owner gives lattice answers, or its ledger holds some
        if answered_on_lattice is None:
            answered_on_lattice = ledger.answered_on_lattice(name)
        self.renyi_accounting = self.lattice or answered_on_lattice
        self.max_mu_squared = _initial_cap(
            policy.budget_epsilon, policy.delta, policy.neighbour, self.renyi_accounting
        )
        self.stat_sum = (
            model.suff_stat(self.records).sum(axis=0) if isinstance(model, ExpFamModel) else None
        )
        self.diagnostics = SimulationDiagnostics() if simulation else None
        self.per_record = (
            per_record if per_record is not None else not isinstance(model, ExpFamModel)
        )
        self._sessions: dict[str, tuple[_OpenSession, ...]] = {}  # session → its kinds
        self._session_keys: dict[str, X25519PrivateKey] = {}

    @classmethod
    def simulated(
        cls,
        name: str,
        model: Model,
        records: np.ndarray,
        policy: Policy,
        ledger: Ledger,
        seed: np.random.SeedSequence,
        simulation: bool = True,
        answered_on_lattice: bool | None = None,
    ) -> OwnerNode:
        """SIMULATION ONLY: an owner whose noise is seeded from ``seed`` — float Gaussian noise,
        or, when its policy allows secure aggregation (``total_noise_sd``), lattice noise under
        a key derived from the seed (docs/design.md §2.6, §2.7). Whoever knows the seed knows
        the noise. ``simulation``: keep the simulation-only diagnostics. ``answered_on_lattice``:
        as ``OwnerNode`` takes it."""
        rng = np.random.default_rng(seed)
        key = None
        if policy.total_noise_sd is not None:
            key = NoiseKey.derive(seed_material(rng), name)
        return cls(
            name,
            model,
            records,
            policy,
            ledger,
            rng,
            simulation,
            noise_key=key,
            seeded_streams=True,
            simulated_peers=True,
            answered_on_lattice=answered_on_lattice,
        )

    @functools.cached_property
    def agreement_secret(self) -> bytes:
        """The 32 bytes this owner derives its X25519 key of each secure session from: drawn
        from OS entropy once and kept in its ledger, so a restarted owner continues a session
        with the same key; derived from the seed for a simulated owner (SIMULATION ONLY)."""
        if self.seeded:
            return NoiseKey.derive(seed_material(self.rng), self.name + "/agreement").secret
        return self.ledger.agreement_secret(self.name)

    def session_private_key(self, session: str) -> X25519PrivateKey:
        """This owner's X25519 key for ``session`` (docs/design.md §2.6); never released."""
        if session not in self._session_keys:
            self._check_session_id(session)
            self._session_keys[session] = session_private_key(self.agreement_secret, session)
        return self._session_keys[session]

    def session_key(self, session: str) -> PeerKey:
        """This owner's public key for ``session``, for the coordinator to relay to its peers."""
        return PeerKey(self.name, public_bytes(self.session_private_key(session)))

    @property
    def lattice(self) -> bool:
        """This owner's log-ratio and statistic answers are exact lattice answers."""
        return self.noise_key is not None

    @property
    def gradient_noise_multiplier(self) -> float:
        """The noise multiplier its gradient answers are accounted at: σ, or with lattice noise
        σ lowered by the most rounding can add (``lattice_gradient_multiplier``)."""
        return self.gradient_multiplier()

    def gradient_multiplier(self, secure: SecureTerms | None = None) -> float:
        """The noise multiplier gradient answers are accounted at: the gradient kind's level σ
        (``Policy.noise_for``; or, in a secure session, s — the honest owners' sum protects
        each of them), lowered with lattice noise by the most rounding can add
        (``lattice_gradient_multiplier``)."""
        gradient = KINDS["gradient"].ledger_name
        sigma = self.policy.noise_for(gradient) if secure is None else secure.total_noise_sd
        return lattice_gradient_multiplier(sigma, self.model.dim) if self.lattice else sigma

    def reservation_multiplier(self) -> float:
        """The multiplier other open sgmcmc sessions are reserved at when the ledger did not
        record theirs (earlier ledgers; it records each session's): the smaller of the plain
        and the secure ones (the larger privacy loss), since either kind may be open."""
        secure = self.policy.total_noise_sd
        plain = self.gradient_multiplier()
        if secure is None:
            return plain
        return min(plain, self.gradient_multiplier(SecureTerms(1, 0, secure)))

    # --- public facts ------------------------------------------------------------------------
    @property
    def public_n(self) -> int | None:
        """The record count this owner discloses: under ``replace_one`` neighbours n is the
        same for both datasets (public); under ``add_remove`` it differs by one, so it is
        private and never released (None)."""
        return len(self.records) if self.policy.neighbour == "replace_one" else None

    def describe(self) -> OwnerDescription:
        m = self.model
        facts = (m.name, m.params(), m.dim, self.public_n, self.policy, model_digest(m))
        return OwnerDescription(self.name, *facts)

    def worst_case_mu(
        self, algorithm: str, max_step: float | None = None, secure: SecureTerms | None = None
    ) -> float:
        """μ of the most expensive single answer the policy allows for ``algorithm`` (a kind's
        v2 or ledger name; its ``worst_sensitivity``: log-ratios at ``max_step``, default the
        policy's); with lattice noise, plus the most rounding can add (√w·2^−LATTICE_BITS,
        whatever host: γ lies 2²⁰ below the noise sd, which a secure session's s exceeds).
        ``secure``: divided by s instead of the kind's level σ (``Policy.noise_for``)."""
        kind = query_kind(algorithm, self.name)
        policy = self.policy
        sd = policy.noise_for(kind.ledger_name) if secure is None else secure.total_noise_sd
        delta = kind.worst_sensitivity(self.model, policy, max_step)
        width = kind.width(self.model)
        rounding = math.sqrt(width) * 2.0**-LATTICE_BITS if self.lattice else 0.0
        return delta / sd + rounding

    # --- sessions ------------------------------------------------------------------------------
    def open_session(
        self,
        session: str,
        algorithm: str,
        planned_answers: int,
        sampling_rate: float | None = None,
        client: str | None = None,
        max_step: float | None = None,
        secure: SecureOpen | None = None,
    ) -> None:
        """Open (or resume) a session of one kind (``SessionRequest.of``'s fields); refuse a
        plan whose worst case the budget cannot cover (``open_sessions`` for this owner alone)."""
        request = SessionRequest.of(
            session, algorithm, planned_answers, sampling_rate, client, max_step, secure
        )
        open_sessions([self], request)

    def _admit_parts(self, views: list[PlanView], opened: Sequence[_OpenSession]) -> float | None:
        """Refuse the plans of a session's kinds (``views``: one per kind) unless they fit
        together (``_check_plan``); the μ² Gaussian answers may still spend with every gradient
        answer given or planned, when some Gaussian session is open and gradient answers are
        given or planned (else None: the cap stands)."""
        committed = self._check_plan(views, opened)
        # a gradient session's own planned event is always among ``committed``
        if any(v.gaussian_open for v in views) and committed:
            return max_gdp_mu_squared(
                self.policy.budget_epsilon,
                accounting_delta(self.policy.delta, views[0].graph_failure),
                self.policy.neighbour,
                committed,
                lattice=self.renyi_accounting,
            )
        return None

    def _check_session_request(self, request: SessionRequest) -> tuple[_OpenSession, ...]:
        """``InvalidRequest`` for a malformed session request; else its kinds to record."""
        session = request.session
        self._check_session_id(session)
        kinds = tuple(self._check_session_terms(t) for t in request.kinds(self.name))
        several = len(kinds) > 1
        opened = tuple(
            replace(o, ledger_session=part_name(session, o.algorithm) if several else session)
            for o in kinds
        )
        return opened if request.secure is None else _secure_kinds(self, request, opened)

    def _check_session_id(self, session: str) -> None:
        if not isinstance(session, str) or not session or len(session) > 128:
            raise InvalidRequest(
                "session id must be a non-empty string of at most 128 characters", self.name
            )
        if PART_SEPARATOR in session:  # it names the parts of sessions of several kinds
            raise InvalidRequest("session id may not contain the character U+001F", self.name)

    def _check_session_terms(self, terms: KindTerms) -> _OpenSession:
        """The kind, plan, sampling rate and largest step of a session request, checked by
        the kind against this owner's model and policy."""
        kind = query_kind(terms.kind, self.name)
        kind.check_model(self.model, self.public_n, self.name)
        checked = kind.check_terms(terms, self.policy, self.name)
        return _OpenSession(kind, checked.planned_answers, checked.sampling_rate, checked.max_step)

    def _planned(self, view: PlanView, opened: _OpenSession) -> Event:
        """The worst-case event of what one kind's plan may still answer (at its max step)."""
        existing = view.existing
        already = existing.spend.answers + sum(e.count for e in existing.sampled) if existing else 0
        remaining = max(opened.planned_answers - already, 0)
        unit = opened.kind.answer_unit(self, opened.max_step, opened.secure)
        return opened.kind.event(remaining, unit, opened.sampling_rate)

    def _check_plan(self, views: list[PlanView], opened: Sequence[_OpenSession]) -> list[Row]:
        """``BudgetExhausted`` unless the plans' worst cases (each kind at its max step) fit the
        budget together with everything spent and reserved (``views``, one per kind: the
        accountant composes the planned events with ``PlanView.committed``); returns the
        gradient answers given, held by other sessions and (sgmcmc) planned by this one."""
        policy, view = self.policy, views[0]
        planned = [self._planned(v, o) for v, o in zip(views, opened)]
        committed = [*view.sampled, *view.reserved]
        committed += [e for e in planned if not isinstance(e, GaussianSpend)]
        admitted = view.committed(policy.neighbour, self.renyi_accounting).compose(*planned)
        delta = accounting_delta(policy.delta, view.graph_failure)  # §2.6, the masking graph
        worst = admitted.epsilon(delta)
        if worst > policy.budget_epsilon:
            now, _ = owner_epsilon(
                view.total, view.sampled, delta, policy.neighbour, self.renyi_accounting
            )
            raise BudgetExhausted(
                f"refusing a plan of {self._plan_words(opened)}: in the worst "
                f"case {self._worst_case_words(opened)} it would take ε from {now:.4g} to "
                f"{worst:.4g} at δ={policy.delta:g}, past the budget ε={policy.budget_epsilon:g}",
                self.name,
                epsilon_left=max(policy.budget_epsilon - now, 0.0),
            )
        return committed

    @staticmethod
    def _plan_words(opened: Sequence[_OpenSession]) -> str:
        """``N kind answers`` for each kind of a plan, joined."""
        return " and ".join(f"{o.planned_answers} {o.kind.ledger_name} answers" for o in opened)

    def _worst_case_words(self, opened: Sequence[_OpenSession]) -> str:
        steps = [o.max_step for o in opened if o.max_step is not None]
        if steps:
            return f"(every step at max_step {steps[0]:g})"
        return "its policy allows"

    def close_session(self, session: str) -> None:
        close_sessions([self], session)

    def require_session(self, session: str, algorithm: str | None) -> _OpenSession:
        """The open ``session``'s kind ``algorithm`` (None: its first kind), or raise. A
        restarted owner knows a session again once the coordinator re-opens (resumes) it."""
        kinds = self._sessions.get(session) if isinstance(session, str) else None
        if kinds is None:
            raise UnknownSession(f"unknown or closed session {session!r}", self.name)
        if algorithm is None:
            return kinds[0]
        asked = query_kind(algorithm, self.name)
        for opened in kinds:
            if opened.kind is asked:
                return opened
        names = " and ".join(repr(o.algorithm) for o in kinds)
        raise InvalidRequest(
            f"session {session!r} is a {names} session, not {algorithm!r}", self.name
        )

    # --- privacy -------------------------------------------------------------------------------
    def privacy_report(self, session: str | None = None) -> PrivacyReport:
        return privacy_reports([self], session)[0]

    def _report(self, record: Report, session: str | None) -> PrivacyReport:
        """This owner's report from ``record``, ε at δ less its graphs' failures (§2.6)."""
        delta, neighbour = secure_delta(self.policy.delta, record.secure), self.policy.neighbour
        session_report = None
        if session is not None:
            if record.session is None:
                raise UnknownSession(f"unknown session {session!r}", self.name)
            spend, sampled = record.session
            session_report = SpendReport.of(spend, sampled, delta, neighbour, self.renyi_accounting)
        total = SpendReport.of(
            record.total, record.sampled, delta, neighbour, self.renyi_accounting
        )
        return PrivacyReport(
            self.name,
            self.public_n,
            self.policy.delta,
            self.policy.budget_epsilon,
            neighbour,
            total,
            session_report,
            self._own_noise(record, session),
        )

    def _own_noise(self, record: Report, session: str | None) -> OwnNoise | None:
        """The spend of ``record`` as if only this owner's own noise (sd s/√(K − t))
        protected it in its secure sessions (None: it never opened one)."""
        if not record.secure:
            return None
        delta, neighbour = self.policy.delta, self.policy.neighbour
        dim = self.model.dim
        total, sampled = own_noise_spend(record.total, record.sampled, record.secure, dim)
        # the session's secure records: itself, or one per part of a session of several kinds
        mine = [r for r in record.secure if r.session.partition(PART_SEPARATOR)[0] == session]
        session_report = terms = None
        peers = ""
        if mine and record.session is not None:
            spend, events = own_noise_spend(*record.session, mine, dim)
            session_report = SpendReport.of(spend, events, delta, neighbour, True)
            terms = mine[0].terms
            peers = self.peers_basis(terms)
        return OwnNoise(
            SpendReport.of(total, sampled, delta, neighbour, True), session_report, terms, peers
        )

    def peers_basis(self, terms: SecureTerms) -> str:
        """What this owner's ε in a secure session with recorded ``terms`` rests on: the
        simulation's own peers, its own noise alone (charged at t = K − 1), or peers its server
        authenticated (the only other way a deployed owner is charged at s)."""
        if self.simulated_peers:
            return PEERS_SIMULATED
        return PEERS_OWN_NOISE if terms.own_noise_charged else PEERS_AUTHENTICATED

    def simulation_diagnostics(self) -> SimulationDiagnostics:
        """Clip counts (simulation only): raises for a deployed owner."""
        if self.diagnostics is None:
            raise InvalidRequest("simulation diagnostics are off for this owner", self.name)
        return self.diagnostics


def _secure_kinds(
    node: OwnerNode, request: SessionRequest, opened: tuple[_OpenSession, ...]
) -> tuple[_OpenSession, ...]:
    """``opened`` (the session's checked kinds) with the secure terms ``node`` agrees to
    (``aggregation.agree``, once for the session) and each kind's record: the terms charged
    and the transcript of the peers and terms under that kind's name — a session of several
    kinds keeps one secure record per part (docs/design.md §4, "Sessions of several kinds")."""
    secure = request.secure
    assert secure is not None  # a secure request
    if not node.lattice:
        raise InvalidRequest(
            "secure aggregation needs lattice answers; this owner gives float answers", node.name
        )
    public = node.session_key(request.session).public_key
    agreed = agree(node.name, node.policy, public, secure, node.simulated_peers)
    # the ledger keeps the terms charged (with unauthenticated peers: t = K − 1 at its own
    # noise sd), so its plans, budget and own-noise report use them; the transcript binds
    # the terms every owner counted
    return tuple(
        replace(
            o,
            secure=agreed.charged,
            record=SecureRecord(
                agreed.charged, transcript(request.session, o.algorithm, agreed.terms, secure.peers)
            ),
        )
        for o in opened
    )


@functools.lru_cache(maxsize=64)
def _initial_cap(budget: float, delta: float, neighbour: Neighbour, lattice: bool) -> float:
    """The μ² cap of an owner with nothing spent (``max_gdp_mu_squared`` of no events): one
    accountant solve per distinct policy, not one per owner (docs/design.md §4, "Many owners")."""
    return max_gdp_mu_squared(budget, delta, neighbour, [], lattice=lattice)


# --- many owners at once: one ledger transaction (or query set) per ledger ----------------------
#: Bumped whenever any owner opens or closes a session: hosts re-validate their cached sessions
#: only when it moved (docs/design.md §4, the host's hot path).
SESSION_EVENTS = [0]


def _by_ledger(nodes: Sequence[OwnerNode]) -> list[list[OwnerNode]]:
    groups: dict[int, list[OwnerNode]] = {}
    for node in nodes:
        groups.setdefault(id(node.ledger), []).append(node)
    return list(groups.values())


def own_noise_spend(
    spend: GaussianSpend,
    sampled: list[Row],
    rows: Sequence[SecureSpend],
    dim: int,
) -> tuple[GaussianSpend, list[Row]]:
    """``spend`` and ``sampled`` (which include the secure sessions ``rows``) with each secure
    session's answers accounted at the owner's own noise sd s/√(K − t) instead of s: its μ_t
    grow by √(K − t) and its gradient answers (lattice answers of a model of dimension
    ``dim``) take the smaller multiplier. Pure-ε releases (never secure) are kept as they are."""
    counts: dict[tuple[float, float], int] = defaultdict(int)
    kept: list[Row] = [e for e in sampled if not isinstance(e, SubsampledGaussian)]
    for event in sampled:
        if isinstance(event, SubsampledGaussian):
            counts[(event.sampling_rate, event.noise_multiplier)] += event.count
    for row in rows:
        factor = row.terms.owners - row.terms.colluders
        spend = GaussianSpend(
            spend.answers,
            spend.mu_squared + (factor - 1) * row.spend.mu_squared,
            max(spend.max_mu, row.spend.max_mu * math.sqrt(factor)),
        )
        own = lattice_gradient_multiplier(row.terms.owner_noise_sd, dim)
        for event in row.sampled:
            if isinstance(event, SubsampledGaussian):
                counts[(event.sampling_rate, event.noise_multiplier)] -= event.count
                counts[(event.sampling_rate, own)] += event.count
    events = kept + [SubsampledGaussian(q, m, c) for (q, m), c in counts.items() if c > 0]
    return spend, events


def own_noise_report(ledger: Ledger, owner: str, dim: int, policy: Policy) -> SpendReport | None:
    """``owner``'s spend across its ledger as if its own noise alone protected it in its secure
    sessions (None: it never opened one) — for the offline ``owner report``."""
    record = ledger.reports([owner], None)[0]
    if not record.secure:
        return None
    spend, sampled = own_noise_spend(record.total, record.sampled, record.secure, dim)
    return SpendReport.of(spend, sampled, policy.delta, policy.neighbour, True)


def open_sessions(nodes: Sequence[OwnerNode], request: SessionRequest) -> None:
    """Open (or resume) ``request.session`` at every node; refuse a plan whose worst case some
    node's budget cannot cover.

    Gradient sessions name their Poisson ``sampling_rate`` and may then give at most
    ``planned_answers`` gradient answers (the plan is what the budget is checked for).
    Log-ratio sessions may declare ``max_step`` (≤ each owner's): the plan is checked at that
    step and every request held to it. The checks read spend and reservations from each ledger
    in the one transaction that records the sessions of its owners (docs/design.md §3,
    invariant 8); a refusal by any owner of a ledger records nothing in it. ``client``: who
    opens it (bound to the session in the ledger). ``secure``: open it with secure aggregation
    (docs/design.md §2.6): each owner checks the peer keys and terms against its policy
    (``aggregation.agree``), and its ledger keeps them; a resumed session must show the same.
    """
    requests = _SessionChecks(request).each(nodes)
    SESSION_EVENTS[0] += 1
    positions = {id(n): i for i, n in enumerate(nodes)}
    for group in _by_ledger(nodes):
        opened = [requests[positions[id(n)]] for n in group]
        caps = _open_in_ledger(group, opened, request)
        for node, o, cap in zip(group, opened, caps):
            node._sessions[request.session] = o
            if cap is not None:
                node.max_mu_squared = cap


def _open_in_ledger(
    group: list[OwnerNode], opened: list[tuple[_OpenSession, ...]], request: SessionRequest
) -> list[float | None]:
    """Record ``request`` for the owners ``group`` of one ledger (``opened``: each one's
    checked kinds): a session of one kind as before, one of several as one part per kind
    with one joint plan check per owner (``Ledger.open_parts``); each owner's new cap."""
    ledger, first = group[0].ledger, opened[0]
    checks = _PlanChecks()
    if len(first) == 1:
        openings = [
            Opening(
                n.name,
                *checks.multipliers(n, o)[:2],
                functools.partial(checks.admit, n, opened=o),
                o[0].record,
                checks.multipliers(n, o)[2][0],
            )
            for n, o in zip(group, opened)
        ]
        o = first[0]
        return ledger.open_sessions(
            openings, request.session, o.algorithm, o.planned_answers, o.sampling_rate,
            request.client, request.terms[0].max_step,
        )  # fmt: skip
    openings = [
        Opening(
            n.name,
            *checks.multipliers(n, o)[:2],
            admit_parts=functools.partial(checks.admit_parts, n, opened=o),
            part_multipliers=checks.multipliers(n, o)[2],
            part_secure=tuple(k.record for k in o),
        )
        for n, o in zip(group, opened)
    ]
    # the ledger records the step each kind declared (None: none), as a session of one kind
    parts = [
        SessionPart(o.ledger_session, o.algorithm, o.planned_answers, o.sampling_rate, t.max_step)
        for o, t in zip(first, request.terms)
    ]
    return ledger.open_parts(openings, request.session, parts, request.client)


class _SessionChecks:
    """``OwnerNode._check_session_request`` of one plain request for many owners, checked once
    per group of owners alike in all it reads — model, policy, public record count — and the
    result shared (docs/design.md §4, "Many owners"). A refusal is never shared: each owner
    whose check fails raises its own error, naming itself. Secure requests (each owner's own
    keys and agreement) are checked owner by owner."""

    def __init__(self, request: SessionRequest):
        self.request = request
        self._checked: dict[tuple, tuple[_OpenSession, ...]] = {}

    def each(self, nodes: Sequence[OwnerNode]) -> list[tuple[_OpenSession, ...]]:
        """Every node's checked kinds, in node order."""
        if self.request.secure is not None:
            return [n._check_session_request(self.request) for n in nodes]
        return [self._one(n) for n in nodes]

    def _one(self, node: OwnerNode) -> tuple[_OpenSession, ...]:
        key = (id(node.model), id(node.policy), node.public_n)
        found = self._checked.get(key)
        if found is None:
            found = self._checked[key] = node._check_session_request(self.request)
        return found


class _PlanChecks:
    """One plan check (``OwnerNode._admit_parts``) per group of owners alike in everything it
    reads — model, policy, accounting, lattice, the kinds opened and the ledger's view of their
    spend — reused for the group: the check is a pure function of these, so the cap is the one
    each owner's own check gives (docs/design.md §4, "Many owners"). Refusals are not kept:
    an owner whose plan does not fit raises its own ``BudgetExhausted``."""

    def __init__(self) -> None:
        self._caps: dict[tuple, float | None] = {}
        self._multipliers: dict[tuple, tuple[float, bool, tuple[float | None, ...]]] = {}

    def multipliers(
        self, node: OwnerNode, opened: tuple[_OpenSession, ...]
    ) -> tuple[float, bool, tuple[float | None, ...]]:
        """(``reservation_multiplier``, ``lattice``, each kind's ``session_multiplier``) of
        ``node`` for ``opened``: pure functions of its model, policy and lattice, computed once
        per group."""
        key = (id(node.model), id(node.policy), node.lattice, opened)
        found = self._multipliers.get(key)
        if found is None:
            parts = tuple(k.kind.session_multiplier(node, k.secure) for k in opened)
            found = self._multipliers[key] = (node.reservation_multiplier(), node.lattice, parts)
        return found

    def admit(
        self, node: OwnerNode, view: PlanView, opened: tuple[_OpenSession, ...]
    ) -> float | None:
        """The plan check of a session of one kind (``admit_parts`` of its one view)."""
        return self.admit_parts(node, [view], opened)

    def admit_parts(
        self, node: OwnerNode, views: list[PlanView], opened: tuple[_OpenSession, ...]
    ) -> float | None:
        """``OwnerNode._admit_parts``, shared within its group."""
        key = (
            id(node.model),
            id(node.policy),
            node.renyi_accounting,
            node.lattice,
            opened,
            tuple(_view_key(v) for v in views),
        )
        try:
            return self._caps[key]
        except KeyError:
            cap = self._caps[key] = node._admit_parts(views, opened)
            return cap
        except TypeError:  # something unhashable in the view: checked alone
            return node._admit_parts(views, opened)


def _view_key(view: PlanView) -> tuple:
    """``view`` as a hashable tuple of everything it holds (its lists as tuples)."""
    e = view.existing
    existing = e and (
        e.session, e.algorithm, e.planned_answers, e.closed, e.spend, tuple(e.sampled),
        e.sampling_rate, e.opened_at,
    )  # fmt: skip
    return (
        existing, view.total, tuple(view.sampled), tuple(view.reserved), view.gaussian_open,
        view.graph_failure,
    )  # fmt: skip


def close_sessions(nodes: Sequence[OwnerNode], session: str) -> None:
    """Close ``session`` at every node (each must have it open): plans no longer hold budget."""
    for node in nodes:
        node.require_session(session, None)
    SESSION_EVENTS[0] += 1
    for group in _by_ledger(nodes):
        for opened in group[0]._sessions[session]:
            group[0].ledger.close_sessions([n.name for n in group], opened.ledger_session)
        for node in group:
            del node._sessions[session]


def privacy_reports(nodes: Sequence[OwnerNode], session: str | None = None) -> list[PrivacyReport]:
    """Every node's privacy report (in node order), read from each ledger at once."""
    reports: dict[int, PrivacyReport] = {}
    for group in _by_ledger(nodes):
        records = group[0].ledger.reports([n.name for n in group], session)
        for node, record in zip(group, records):
            reports[id(node)] = node._report(record, session)
    return [reports[id(node)] for node in nodes]
