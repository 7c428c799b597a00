"""The owner node: one data owner's record — its policy, prepared records, noise source,
sessions and ledger — behind no transport.

A node does not answer queries itself: ``OwnerHost`` (``host.py``) is the one answer path
(validate → replay check → compute → charge → reply) for one or many nodes. The node decides
what its policy admits (sessions and plans against its budget) and computes its sensitivities
itself, never trusting the coordinator's accounting (docs/design.md §3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..common import (
    LOG_RATIO,
    QUERY_KINDS,
    SGMCMC,
    SUFF_STATS,
    OwnerDescription,
    Policy,
    PrivacyReport,
    SpendReport,
)
from ..errors import BudgetExhausted, InvalidRequest, UnknownSession
from ..models import ExpFamModel, Model
from ..privacy import GaussianSpend
from ..privacy.owner_epsilon import max_gdp_mu_squared, owner_epsilon
from ..privacy.subsampled import SubsampledGaussian
from .ledger import Ledger, PlanView
from .noise import LATTICE_BITS, NoiseKey


@dataclass(frozen=True)
class _OpenSession:
    algorithm: str
    planned_answers: int
    sampling_rate: float | None


@dataclass
class SimulationDiagnostics:
    """Simulation-only counters. They depend on the data, so a deployed owner never keeps them."""

    clip_binds: int = 0
    log_ratio_terms: int = 0


class OwnerNode:
    """One data owner.

    records: ``(n, p)`` raw records; they are validated and clipped into the model's domain.
    rng: seeded randomness for a *simulated* owner: float Gaussian noise and Poisson sampling
        reproducible from a run's seed (whoever knows the seed knows the noise).
    noise_key: the owner's secret key of exact lattice noise (docs/design.md §2.7): log-ratio
        and statistic answers are rounded to a lattice and noised with the discrete Gaussian
        from a ChaCha20 stream addressed by (session, chain, iteration). The default when no
        ``rng`` is given is a fresh key from OS entropy (every deployed owner).
    simulation: keep data-dependent diagnostics (clip counts). Off for deployed owners.
    per_record: evaluate log-ratios record by record with the per-record clip. By default
    exponential-family models use the identity Σ_x ℓ(x,θ') − ℓ(x,θ) = Δηᵀ Σ S(x) − n ΔA, which is
    O(1) per answer and equal to the clipped sum: records are clipped into the data domain
    when loaded and L bounds the gradient there, so the per-record clip cannot bind.
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
    ):
        self.name = name
        self.model = model
        self.policy = policy
        self.records = model.prepare_records(records)
        self.ledger = ledger
        self.rng = rng if rng is not None else np.random.default_rng()
        self.noise_key = NoiseKey.from_os() if rng is None and noise_key is None else noise_key
        self.max_mu_squared = max_gdp_mu_squared(
            policy.budget_epsilon, policy.delta, policy.neighbour, [], lattice=self.lattice
        )
        self.stat_sum = (
            model.suff_stat(self.records).sum(axis=0) if isinstance(model, ExpFamModel) else None
        )
        self.diagnostics = SimulationDiagnostics() if simulation else None
        self.per_record = (
            per_record if per_record is not None else not isinstance(model, ExpFamModel)
        )
        self._sessions: dict[str, _OpenSession] = {}

    @property
    def lattice(self) -> bool:
        """This owner's log-ratio and statistic answers are exact lattice answers."""
        return self.noise_key is not None

    # --- public facts ------------------------------------------------------------------------
    @property
    def public_n(self) -> int | None:
        """The record count this owner discloses: under ``replace_one`` neighbours n is the
        same for both datasets (public); under ``add_remove`` it differs by one, so it is
        private and never released (None)."""
        return len(self.records) if self.policy.neighbour == "replace_one" else None

    def describe(self) -> OwnerDescription:
        return OwnerDescription(
            self.name,
            self.model.name,
            self.model.params(),
            self.model.dim,
            self.public_n,
            self.policy,
        )

    def worst_case_mu(self, algorithm: str) -> float:
        """μ of the most expensive single answer the policy allows for ``algorithm``; with
        lattice noise, plus the most rounding can add (√w·2^−LATTICE_BITS, whatever host)."""
        policy = self.policy
        if algorithm == LOG_RATIO:
            width = 1
            delta = float(self.model.log_ratio_sensitivity(policy.max_step, policy.neighbour))
        else:
            assert isinstance(self.model, ExpFamModel)
            width = self.model.stat_dim
            delta = self.model.stat_sensitivity(policy.neighbour)
        rounding = math.sqrt(width) * 2.0**-LATTICE_BITS if self.lattice else 0.0
        return delta / policy.sigma + rounding

    # --- sessions ------------------------------------------------------------------------------
    def open_session(
        self, session: str, algorithm: str, planned_answers: int, sampling_rate: float | None = None
    ) -> None:
        """Open (or resume) a session; refuse a plan whose worst case the budget cannot cover.

        ``sgmcmc`` sessions name their Poisson ``sampling_rate`` and may then give at most
        ``planned_answers`` gradient answers (the plan is what the budget is checked for). The
        check reads spend and reservations from the ledger in the transaction that records the
        session (docs/design.md §3, invariant 8).
        """
        rate = self._check_session_request(session, algorithm, planned_answers, sampling_rate)
        planned = int(planned_answers)
        cap = self.ledger.open_session(
            self.name,
            session,
            algorithm,
            planned,
            rate,
            self.policy.sigma,
            lambda view: self._admit(view, algorithm, planned, rate),
        )
        self._sessions[session] = _OpenSession(algorithm, planned, rate)
        if cap is not None:
            self.max_mu_squared = cap

    def _admit(
        self, view: PlanView, algorithm: str, planned_answers: int, rate: float | None
    ) -> float | None:
        """Refuse the plan unless it fits (``_check_plan``); the μ² Gaussian answers may still
        spend with every gradient answer given or planned, when some Gaussian session is open
        and gradient answers are given or planned (else None: the cap stands)."""
        committed = self._check_plan(view, algorithm, planned_answers, rate)
        if view.gaussian_open and (algorithm == SGMCMC or committed):
            return max_gdp_mu_squared(
                self.policy.budget_epsilon,
                self.policy.delta,
                self.policy.neighbour,
                committed,
                lattice=self.lattice,
            )
        return None

    def _check_session_request(
        self, session: str, algorithm: str, planned_answers: int, sampling_rate: float | None
    ) -> float | None:
        """``InvalidRequest`` for a malformed session request; the session's sampling rate."""
        if not isinstance(session, str) or not session or len(session) > 128:
            raise InvalidRequest(
                "session id must be a non-empty string of at most 128 characters", self.name
            )
        if algorithm not in QUERY_KINDS:
            raise InvalidRequest(
                f"unknown algorithm {algorithm!r}; this owner answers {', '.join(QUERY_KINDS)}",
                self.name,
            )
        if algorithm == SUFF_STATS and not isinstance(self.model, ExpFamModel):
            raise InvalidRequest(
                f"model {self.model.name!r} has no sufficient statistics", self.name
            )
        if algorithm == SUFF_STATS and self.public_n is None:
            raise InvalidRequest(
                "penalty_expfam needs each owner's record count n, which this owner keeps "
                "private under add_remove neighbours; use the penalty algorithm",
                self.name,
            )
        planned_ok = isinstance(planned_answers, (int, np.integer)) and planned_answers >= 0
        if isinstance(planned_answers, bool) or not planned_ok:
            raise InvalidRequest(
                f"planned_answers must be a non-negative integer, got {planned_answers!r}",
                self.name,
            )
        if algorithm != SGMCMC:
            if sampling_rate is not None:
                raise InvalidRequest(
                    f"only sgmcmc sessions take a sampling_rate, not {algorithm!r}", self.name
                )
            return None
        q, limit = sampling_rate, self.policy.max_sampling_rate
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 < q <= limit:
            raise InvalidRequest(
                f"sgmcmc sessions need a sampling_rate in (0, {limit:g}] (this owner's "
                f"max_sampling_rate), got {q!r}",
                self.name,
            )
        return float(q)

    def _check_plan(
        self, view: PlanView, algorithm: str, planned_answers: int, rate: float | None
    ) -> list[SubsampledGaussian]:
        """``BudgetExhausted`` unless the plan's worst case fits the budget with everything
        spent and reserved (``view``); returns the gradient answers given, held by other
        sessions and (sgmcmc) planned by this one."""
        existing = view.existing
        already = existing.spend.answers + sum(e.count for e in existing.sampled) if existing else 0
        remaining = max(planned_answers - already, 0)
        total, committed = view.total, view.sampled + view.reserved
        if rate is not None:
            committed = [*committed, SubsampledGaussian(rate, self.policy.sigma, remaining)]
            worst_spend = total
        else:
            worst_mu = self.worst_case_mu(algorithm)
            worst_spend = GaussianSpend(
                total.answers + remaining,
                total.mu_squared + remaining * worst_mu**2,
                max(total.max_mu, worst_mu),
            )
        policy = self.policy
        worst, _ = owner_epsilon(
            worst_spend, committed, policy.delta, policy.neighbour, self.lattice
        )
        if worst > policy.budget_epsilon:
            now, _ = owner_epsilon(
                total, view.sampled, policy.delta, policy.neighbour, self.lattice
            )
            raise BudgetExhausted(
                f"refusing a plan of {planned_answers} {algorithm} answers: in the worst case its "
                f"policy allows it would take ε from {now:.4g} to {worst:.4g} at "
                f"δ={policy.delta:g}, past the budget ε={policy.budget_epsilon:g}",
                self.name,
                epsilon_left=max(policy.budget_epsilon - now, 0.0),
            )
        return committed

    def close_session(self, session: str) -> None:
        self.require_session(session, None)
        self.ledger.close_session(self.name, session)
        del self._sessions[session]

    def open_session_record(self, session: str) -> _OpenSession | None:
        return self._sessions.get(session)

    def require_session(self, session: str, algorithm: str | None) -> _OpenSession:
        """The open ``session`` (for ``algorithm``, when given), or raise. A restarted owner
        knows a session again once the coordinator re-opens (resumes) it."""
        opened = self._sessions.get(session) if isinstance(session, str) else None
        if opened is None:
            raise UnknownSession(f"unknown or closed session {session!r}", self.name)
        if algorithm is not None and opened.algorithm != algorithm:
            raise InvalidRequest(
                f"session {session!r} is a {opened.algorithm!r} session, not {algorithm!r}",
                self.name,
            )
        return opened

    # --- what only this owner's records can compute (never released as is) -------------------
    def clipped_log_ratio_sum(
        self, theta: np.ndarray, theta_prop: np.ndarray, step: np.ndarray
    ) -> np.ndarray:
        """Σ_x clip(ℓ(x,θ') − ℓ(x,θ), ±L‖θ'−θ‖) record by record, per chain ``(m,)``; no noise,
        never released. (Hosts of exponential-family owners use the O(1) identity instead.)"""
        bound = self.model.lipschitz * step
        diffs = self.model.log_lik_diff(self.records, theta, theta_prop)
        clipped = np.clip(diffs, -bound[:, None], bound[:, None])
        if self.diagnostics is not None:
            binds = diffs != clipped
            self.diagnostics.clip_binds += int(binds.sum())
            self.diagnostics.log_ratio_terms += diffs.size
        return clipped.sum(axis=1)

    # --- privacy -------------------------------------------------------------------------------
    def privacy_report(self, session: str | None = None) -> PrivacyReport:
        delta = self.policy.delta
        session_report = None
        if session is not None:
            record = self.ledger.session(self.name, session)
            if record is None:
                raise UnknownSession(f"unknown session {session!r}", self.name)
            session_report = SpendReport.of(
                record.spend, record.sampled, delta, self.policy.neighbour, self.lattice
            )
        total = SpendReport.of(
            self.ledger.total(self.name),
            self.ledger.sampled(self.name),
            delta,
            self.policy.neighbour,
            self.lattice,
        )
        return PrivacyReport(
            self.name,
            self.public_n,
            delta,
            self.policy.budget_epsilon,
            self.policy.neighbour,
            total,
            session_report,
        )

    def simulation_diagnostics(self) -> SimulationDiagnostics:
        """Clip counts (simulation only): raises for a deployed owner."""
        if self.diagnostics is None:
            raise InvalidRequest("simulation diagnostics are off for this owner", self.name)
        return self.diagnostics
