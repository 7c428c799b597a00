"""The owner node: one data owner's records, policy, noise and ledger, behind no transport.

Every answer goes through the same path (``OwnerHost``, of which a lone node is the one-owner
case): validate → replay check → compute → charge (ledger transaction) → reply. The owner computes each answer's sensitivity itself from the request and
never trusts the coordinator's accounting (DESIGN §3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import BudgetExhausted, InvalidRequest, UnknownSession
from ..models import ExpFamModel, Model
from ..privacy import GaussianSpend, mu_for_epsilon
from ..privacy.owner_epsilon import max_gdp_mu_squared, owner_epsilon
from ..privacy.subsampled import SubsampledGaussian
from .host import OwnerHost
from .ledger import Ledger
from .policy import ALGORITHMS, LOG_RATIO, SGMCMC, SUFF_STATS, Policy


@dataclass(frozen=True)
class OwnerDescription:
    """What an owner tells anyone who asks: public facts only."""

    name: str
    model: str
    model_params: dict[str, Any]
    dim: int
    n: int
    policy: Policy


@dataclass(frozen=True)
class SpendReport:
    """A spend in the units people read: answers (all kinds), μ of the Gaussian answers, ε at the
    owner's δ of everything (``accountant`` "gdp": exact; "pld": dp-accounting, once gradient
    answers are included) and the penalty paper's bound (inf when it does not apply)."""

    answers: int
    mu: float
    epsilon: float
    epsilon_paper_bound: float
    accountant: str = "gdp"

    @staticmethod
    def of(spend: GaussianSpend, sampled: list[SubsampledGaussian], delta: float, neighbour: str) -> "SpendReport":
        epsilon, accountant = owner_epsilon(spend, sampled, delta, neighbour)
        paper = spend.epsilon_paper_bound(delta) if accountant == "gdp" else math.inf
        return SpendReport(spend.answers + sum(e.count for e in sampled), spend.mu, epsilon, paper, accountant)


@dataclass(frozen=True)
class PrivacyReport:
    """An owner's privacy report: ``session`` for one session (None when not asked), ``total``
    across every session the ledger has seen."""

    owner: str
    n: int
    delta: float
    budget_epsilon: float
    neighbour: str
    total: SpendReport
    session: SpendReport | None = None

    @property
    def budget_left(self) -> float:
        return max(self.budget_epsilon - self.total.epsilon, 0.0)


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
    rng: the owner's private randomness — noise and Poisson sampling (default: OS entropy).
    simulation: keep data-dependent diagnostics (clip counts). Off for deployed owners.
    per_record: evaluate log-ratios record by record with the per-record clip. By default
    exponential-family models use the identity Σ_x ℓ(x,θ') − ℓ(x,θ) = Δηᵀ Σ S(x) − n ΔA, which is
    O(1) per answer and equal to the clipped sum: records are clipped into the data domain
    when loaded and L bounds the gradient there, so the per-record clip cannot bind.
    """

    def __init__(self, name: str, model: Model, records: np.ndarray, policy: Policy, ledger: Ledger,
                 rng: np.random.Generator | None = None, simulation: bool = False, per_record: bool | None = None):
        self.name = name
        self.model = model
        self.policy = policy
        self.records = model.prepare_records(records)
        self.ledger = ledger
        self.rng = rng if rng is not None else np.random.default_rng()
        self.max_mu_squared = mu_for_epsilon(policy.budget_epsilon, policy.delta) ** 2
        self.stat_sum = model.suff_stat(self.records).sum(axis=0) if isinstance(model, ExpFamModel) else None
        self.diagnostics = SimulationDiagnostics() if simulation else None
        self.per_record = per_record if per_record is not None else not isinstance(model, ExpFamModel)
        self._sessions: dict[str, _OpenSession] = {}
        self._solo = OwnerHost([self])

    # --- public facts ------------------------------------------------------------------------
    def describe(self) -> OwnerDescription:
        return OwnerDescription(self.name, self.model.name, self.model.params(), self.model.dim,
                                len(self.records), self.policy)

    def worst_case_mu(self, algorithm: str) -> float:
        """μ of the most expensive single answer the policy allows for ``algorithm``."""
        if algorithm == LOG_RATIO:
            return float(self.model.log_ratio_sensitivity(self.policy.max_step, self.policy.neighbour)) / self.policy.sigma
        assert isinstance(self.model, ExpFamModel)
        return self.model.stat_sensitivity(self.policy.neighbour) / self.policy.sigma

    # --- sessions ------------------------------------------------------------------------------
    def open_session(self, session: str, algorithm: str, planned_answers: int,
                     sampling_rate: float | None = None) -> None:
        """Open (or resume) a session; refuse a plan whose worst case the budget cannot cover.

        ``sgmcmc`` sessions name their Poisson ``sampling_rate`` and may then give at most
        ``planned_answers`` gradient answers (the plan is what the budget is checked for).
        """
        if not isinstance(session, str) or not session or len(session) > 128:
            raise InvalidRequest("session id must be a non-empty string of at most 128 characters", self.name)
        if algorithm not in ALGORITHMS:
            raise InvalidRequest(f"unknown algorithm {algorithm!r}; this owner answers {', '.join(ALGORITHMS)}", self.name)
        if algorithm == SUFF_STATS and not isinstance(self.model, ExpFamModel):
            raise InvalidRequest(f"model {self.model.name!r} has no sufficient statistics", self.name)
        if isinstance(planned_answers, bool) or not isinstance(planned_answers, (int, np.integer)) or planned_answers < 0:
            raise InvalidRequest(f"planned_answers must be a non-negative integer, got {planned_answers!r}", self.name)
        if algorithm == SGMCMC:
            q = sampling_rate
            if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 < q <= self.policy.max_sampling_rate:
                raise InvalidRequest(f"sgmcmc sessions need a sampling_rate in (0, {self.policy.max_sampling_rate:g}] "
                                     f"(this owner's max_sampling_rate), got {q!r}", self.name)
            sampling_rate = float(q)
        elif sampling_rate is not None:
            raise InvalidRequest(f"only sgmcmc sessions take a sampling_rate, not {algorithm!r}", self.name)
        existing = self.ledger.session(self.name, session)
        already = existing.spend.answers + sum(e.count for e in existing.sampled) if existing is not None else 0
        remaining = max(int(planned_answers) - already, 0)
        total = self.ledger.total(self.name)
        committed = self.ledger.sampled(self.name) + self._reserved(exclude=session)
        if algorithm == SGMCMC:
            plan = SubsampledGaussian(sampling_rate, self.policy.sigma, remaining)
            worst_spend, worst_sampled = total, committed + [plan]
        else:
            worst_mu = self.worst_case_mu(algorithm)
            worst_spend = GaussianSpend(total.answers + remaining, total.mu_squared + remaining * worst_mu**2,
                                        max(total.max_mu, worst_mu))
            worst_sampled = committed
        worst_epsilon, _ = owner_epsilon(worst_spend, worst_sampled, self.policy.delta, self.policy.neighbour)
        if worst_epsilon > self.policy.budget_epsilon:
            eps_now, _ = owner_epsilon(total, self.ledger.sampled(self.name), self.policy.delta, self.policy.neighbour)
            raise BudgetExhausted(
                f"refusing a plan of {planned_answers} {algorithm} answers: in the worst case its policy allows it "
                f"would take ε from {eps_now:.4g} to {worst_epsilon:.4g} at δ={self.policy.delta:g}, "
                f"past the budget ε={self.policy.budget_epsilon:g}",
                self.name,
                epsilon_left=max(self.policy.budget_epsilon - eps_now, 0.0),
            )
        self.ledger.open_session(self.name, session, algorithm, int(planned_answers), sampling_rate)
        self._sessions[session] = _OpenSession(algorithm, int(planned_answers), sampling_rate)
        answers_gaussian = any(o.algorithm != SGMCMC for o in self._sessions.values())
        if answers_gaussian and (algorithm == SGMCMC or committed):
            # what Gaussian answers may still spend, with every gradient answer given or planned
            self.max_mu_squared = max_gdp_mu_squared(self.policy.budget_epsilon, self.policy.delta,
                                                     self.policy.neighbour, committed + self._reserved())

    def _reserved(self, exclude: str | None = None) -> list[SubsampledGaussian]:
        """Gradient answers that open sgmcmc sessions may still give (held against the budget)."""
        held = []
        for name, open_session in self._sessions.items():
            if open_session.algorithm == SGMCMC and name != exclude:
                used = sum(e.count for e in self.ledger.session(self.name, name).sampled)
                held.append(SubsampledGaussian(open_session.sampling_rate, self.policy.sigma,
                                               max(open_session.planned_answers - used, 0)))
        return held

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
            raise InvalidRequest(f"session {session!r} is a {opened.algorithm!r} session, not {algorithm!r}", self.name)
        return opened

    # --- queries (a node is a host of one owner) -----------------------------------------------
    def log_ratio(self, session: str, iteration: int, chains: np.ndarray, theta: np.ndarray,
                  theta_prop: np.ndarray) -> np.ndarray:
        """Noisy clipped log-likelihood ratios ``(C,)``; see ``OwnerHost.log_ratio``."""
        return self._solo.log_ratio(session, iteration, chains, theta, theta_prop)[0]

    def suff_stats(self, session: str, chains: np.ndarray, start: int, block: int) -> np.ndarray:
        """Noisy statistic copies ``(C, block, s)``; see ``OwnerHost.suff_stats``."""
        return self._solo.suff_stats(session, chains, start, block)[0]

    def gradient(self, session: str, iteration: int, chains: np.ndarray, theta: np.ndarray, clip: float) -> np.ndarray:
        """Noisy clipped gradient sums ``(C, d)``; see ``OwnerHost.gradient``."""
        return self._solo.gradient(session, iteration, chains, theta, clip)[0]

    def clipped_log_ratio_sum(self, theta: np.ndarray, theta_prop: np.ndarray, step: np.ndarray) -> np.ndarray:
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
            session_report = SpendReport.of(record.spend, record.sampled, delta, self.policy.neighbour)
        total = SpendReport.of(self.ledger.total(self.name), self.ledger.sampled(self.name), delta, self.policy.neighbour)
        return PrivacyReport(self.name, len(self.records), delta, self.policy.budget_epsilon, self.policy.neighbour,
                             total, session_report)

    def simulation_diagnostics(self) -> SimulationDiagnostics:
        """Clip counts (simulation only): raises for a deployed owner."""
        if self.diagnostics is None:
            raise InvalidRequest("simulation diagnostics are off for this owner", self.name)
        return self.diagnostics
