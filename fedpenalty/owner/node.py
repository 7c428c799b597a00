"""The owner node: one data owner's records, policy, noise and ledger, behind no transport.

Every answer goes through the same path: validate → replay check → compute → charge (ledger
transaction) → reply. The owner computes each answer's sensitivity itself from the request and
never trusts the coordinator's accounting (DESIGN §3).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import BudgetExhausted, InvalidRequest, ReplayConflict, UnknownSession
from ..models import ExpFamModel, Model
from ..privacy import GaussianSpend, mu_for_epsilon
from .ledger import Charge, Ledger, NewAnswer
from .policy import Policy

LOG_RATIO = "penalty"
SUFF_STATS = "penalty_expfam"
ALGORITHMS = (LOG_RATIO, SUFF_STATS)


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
    """A spend in the units people read: answers, μ (GDP), ε at the owner's δ (exact and the
    penalty paper's bound)."""

    answers: int
    mu: float
    epsilon: float
    epsilon_paper_bound: float

    @staticmethod
    def of(spend: GaussianSpend, delta: float) -> "SpendReport":
        return SpendReport(spend.answers, spend.mu, spend.epsilon(delta), spend.epsilon_paper_bound(delta))


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


@dataclass
class SimulationDiagnostics:
    """Simulation-only counters. They depend on the data, so a deployed owner never keeps them."""

    clip_binds: int = 0
    clipped_terms: int = 0
    log_ratio_terms: int = 0


@dataclass(frozen=True)
class Pending:
    """A computed but not yet released reply: ``out`` is returned only after ``charge`` (if
    any) commits."""

    out: np.ndarray
    charge: Charge | None


def release(ledger: Ledger, pending: list[Pending]) -> list[np.ndarray]:
    """Charge every pending reply in one ledger transaction, then hand out the answers."""
    charges = [p.charge for p in pending if p.charge is not None]
    if charges:
        ledger.charge(charges)
    return [p.out for p in pending]


def _digest(kind: str, *arrays: np.ndarray) -> bytes:
    h = hashlib.sha256(kind.encode())
    for a in arrays:
        h.update(np.ascontiguousarray(a, dtype="<f8").tobytes())
    return h.digest()


class OwnerNode:
    """One data owner.

    records: ``(n, p)`` raw records; they are validated and clipped into the model's domain.
    rng: the owner's private noise source (default: fresh OS entropy).
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
        self._rng = rng if rng is not None else np.random.default_rng()
        self._max_mu_squared = mu_for_epsilon(policy.budget_epsilon, policy.delta) ** 2
        self._stat_sum = model.suff_stat(self.records).sum(axis=0) if isinstance(model, ExpFamModel) else None
        self.diagnostics = SimulationDiagnostics() if simulation else None
        self.per_record = per_record if per_record is not None else not isinstance(model, ExpFamModel)
        self.ledger = ledger

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
    def open_session(self, session: str, algorithm: str, planned_answers: int) -> None:
        """Open (or resume) a session; refuse a plan whose worst case the budget cannot cover."""
        if not isinstance(session, str) or not session or len(session) > 128:
            raise InvalidRequest("session id must be a non-empty string of at most 128 characters", self.name)
        if algorithm not in ALGORITHMS:
            raise InvalidRequest(f"unknown algorithm {algorithm!r}; this owner answers {', '.join(ALGORITHMS)}", self.name)
        if algorithm == SUFF_STATS and not isinstance(self.model, ExpFamModel):
            raise InvalidRequest(f"model {self.model.name!r} has no sufficient statistics", self.name)
        if isinstance(planned_answers, bool) or not isinstance(planned_answers, (int, np.integer)) or planned_answers < 0:
            raise InvalidRequest(f"planned_answers must be a non-negative integer, got {planned_answers!r}", self.name)
        existing = self.ledger.session(self.name, session)
        already = existing.spend.answers if existing is not None else 0
        remaining_plan = max(int(planned_answers) - already, 0)
        total = self.ledger.total(self.name)
        worst = total.add(np.full(remaining_plan, self.worst_case_mu(algorithm)))
        if worst.mu_squared > self._max_mu_squared:
            eps_now = total.epsilon(self.policy.delta)
            raise BudgetExhausted(
                f"refusing a plan of {planned_answers} {algorithm} answers: in the worst case its policy allows it "
                f"would take ε from {eps_now:.4g} to {worst.epsilon(self.policy.delta):.4g} at δ={self.policy.delta:g}, "
                f"past the budget ε={self.policy.budget_epsilon:g}",
                self.name,
                epsilon_left=max(self.policy.budget_epsilon - eps_now, 0.0),
            )
        self.ledger.open_session(self.name, session, algorithm, int(planned_answers))

    def close_session(self, session: str) -> None:
        self._session(session, None)
        self.ledger.close_session(self.name, session)

    def _session(self, session: str, algorithm: str | None) -> None:
        record = self.ledger.session(self.name, session) if isinstance(session, str) else None
        if record is None or record.closed:
            raise UnknownSession(f"unknown or closed session {session!r}", self.name)
        if algorithm is not None and record.algorithm != algorithm:
            raise InvalidRequest(f"session {session!r} is a {record.algorithm!r} session, not {algorithm!r}", self.name)

    # --- queries -------------------------------------------------------------------------------
    def log_ratio(self, session: str, iteration: int, chains: np.ndarray, theta: np.ndarray,
                  theta_prop: np.ndarray) -> np.ndarray:
        """Noisy clipped log-likelihood ratios ``(C,)``; see ``prepare_log_ratio``."""
        return release(self.ledger, [self.prepare_log_ratio(session, iteration, chains, theta, theta_prop)])[0]

    def suff_stats(self, session: str, chains: np.ndarray, start: int, block: int) -> np.ndarray:
        """Noisy statistic copies ``(C, block, s)``; see ``prepare_suff_stats``."""
        return release(self.ledger, [self.prepare_suff_stats(session, chains, start, block)])[0]

    def prepare_log_ratio(self, session: str, iteration: int, chains: np.ndarray, theta: np.ndarray,
                          theta_prop: np.ndarray) -> Pending:
        """Noisy clipped log-likelihood ratios, one per chain: ``(C,)``.

        chains ``(C,)`` distinct non-negative ints; theta, theta_prop ``(C, d)`` inside Θ with
        ‖θ' − θ‖ ≤ ``max_step``. Answer c is Σ_x clip(ℓ(x,θ'_c) − ℓ(x,θ_c), ±L‖θ'_c − θ_c‖)
        + N(0, σ²), charged μ_c = Δ_c/σ with Δ_c from ``log_ratio_sensitivity``.
        """
        self._session(session, LOG_RATIO)
        iteration = self._check_index("iteration", iteration)
        chains = self._check_chains(chains)
        theta = self._check_theta("theta", theta, len(chains))
        theta_prop = self._check_theta("theta_prop", theta_prop, len(chains))
        step = np.linalg.norm(theta_prop - theta, axis=1)
        if np.any(step > self.policy.max_step * (1 + 1e-12)):
            raise InvalidRequest(
                f"step ‖θ'−θ‖ = {step.max():.6g} exceeds this owner's max_step {self.policy.max_step:g}", self.name)
        keys = [(int(c), iteration) for c in chains]
        digests = [_digest(LOG_RATIO, theta[i], theta_prop[i]) for i in range(len(chains))]

        def compute(todo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            exact = self._clipped_log_ratio_sum(theta[todo], theta_prop[todo], step[todo])
            values = exact + self.policy.sigma * self._rng.standard_normal(len(todo))
            mus = self.model.log_ratio_sensitivity(step[todo], self.policy.neighbour) / self.policy.sigma
            return values[:, None], mus

        pending = self._prepare(session, keys, digests, compute, width=1)
        return Pending(pending.out[:, 0], pending.charge)

    def _clipped_log_ratio_sum(self, theta: np.ndarray, theta_prop: np.ndarray, step: np.ndarray) -> np.ndarray:
        """Σ_x clip(ℓ(x,θ') − ℓ(x,θ), ±L‖θ'−θ‖) per chain ``(m,)`` (no noise)."""
        bound = self.model.lipschitz * step
        if not self.per_record:
            m = self.model
            d_eta = m.natural_param(theta_prop) - m.natural_param(theta)
            total = d_eta @ self._stat_sum - len(self.records) * (m.log_partition(theta_prop) - m.log_partition(theta))
            return np.clip(total, -len(self.records) * bound, len(self.records) * bound)
        diffs = self.model.log_lik_diff(self.records, theta, theta_prop)
        clipped = np.clip(diffs, -bound[:, None], bound[:, None])
        if self.diagnostics is not None:
            binds = diffs != clipped
            self.diagnostics.clip_binds += int(binds.sum())
            self.diagnostics.clipped_terms += int(np.any(binds, axis=1).sum())
            self.diagnostics.log_ratio_terms += diffs.size
        return clipped.sum(axis=1)

    def prepare_suff_stats(self, session: str, chains: np.ndarray, start: int, block: int) -> Pending:
        """``block`` fresh noisy copies of Σ S(x) for each chain: ``(C, block, s)``.

        Copy j of chain c is keyed (c, start + j); each copy is N(Σ S(x), σ² I) and is charged
        μ = Δ_S/σ.
        """
        self._session(session, SUFF_STATS)
        assert isinstance(self.model, ExpFamModel)
        start = self._check_index("start", start)
        block = self._check_index("block", block)
        if block < 1:
            raise InvalidRequest("block must be at least 1", self.name)
        chains = self._check_chains(chains, per_chain=block)
        keys = [(int(c), start + j) for c in chains for j in range(block)]
        digests = [_digest(SUFF_STATS)] * len(keys)
        mu = self.model.stat_sensitivity(self.policy.neighbour) / self.policy.sigma
        s = self.model.stat_dim

        def compute(todo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            noise = self.policy.sigma * self._rng.standard_normal((len(todo), s))
            return self._stat_sum[None, :] + noise, np.full(len(todo), mu)

        pending = self._prepare(session, keys, digests, compute, width=s)
        return Pending(pending.out.reshape(len(chains), block, s), pending.charge)

    def _prepare(self, session: str, keys: list[tuple[int, int]], digests: list[bytes], compute,
                 width: int) -> Pending:
        """Replay what was answered and compute the rest: all ``(len(keys), width)`` values and
        the charge for the new ones (not yet committed)."""
        iterations = [k[1] for k in keys]
        stored = self.ledger.stored([self.name], session, min(iterations), max(iterations))
        out = np.empty((len(keys), width))
        todo = []
        for i, (key, digest) in enumerate(zip(keys, digests)):
            row = stored.get((self.name, *key))
            if row is not None:
                if row[0] != digest:
                    raise ReplayConflict(
                        f"(session {session!r}, chain {key[0]}, iteration {key[1]}) was already answered for a "
                        "different query; an owner never gives two independent noisy answers to one query", self.name)
                out[i] = np.frombuffer(row[1], dtype="<f8")
            else:
                todo.append(i)
        if not todo:
            return Pending(out, None)
        todo_idx = np.asarray(todo)
        values, mus = compute(todo_idx)
        out[todo_idx] = values
        new = [NewAnswer(keys[i][0], keys[i][1], digests[i], values[j], float(mus[j])) for j, i in enumerate(todo)]
        return Pending(out, Charge(self.name, session, new, self._max_mu_squared, self.policy.budget_epsilon,
                                   self.policy.delta))

    # --- privacy -------------------------------------------------------------------------------
    def privacy_report(self, session: str | None = None) -> PrivacyReport:
        delta = self.policy.delta
        session_report = None
        if session is not None:
            record = self.ledger.session(self.name, session)
            if record is None:
                raise UnknownSession(f"unknown session {session!r}", self.name)
            session_report = SpendReport.of(record.spend, delta)
        return PrivacyReport(self.name, len(self.records), delta, self.policy.budget_epsilon, self.policy.neighbour,
                             SpendReport.of(self.ledger.total(self.name), delta), session_report)

    # --- validation ------------------------------------------------------------------------------
    def _check_index(self, what: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0 or value >= 2**62:
            raise InvalidRequest(f"{what} must be a non-negative integer, got {value!r}", self.name)
        return int(value)

    def _check_chains(self, chains: Any, per_chain: int = 1) -> np.ndarray:
        arr = np.asarray(chains)
        if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
            raise InvalidRequest("chains must be a non-empty 1-D array of integers", self.name)
        if np.any(arr < 0) or len(np.unique(arr)) != len(arr):
            raise InvalidRequest("chains must be distinct non-negative integers", self.name)
        if arr.size * per_chain > self.policy.max_answers_per_request:
            raise InvalidRequest(
                f"request asks for {arr.size * per_chain} answers; this owner answers at most "
                f"{self.policy.max_answers_per_request} per request", self.name)
        return arr.astype(np.int64)

    def _check_theta(self, what: str, theta: Any, chains: int) -> np.ndarray:
        try:
            arr = np.asarray(theta, dtype=float)
        except (TypeError, ValueError):
            arr = None
        if arr is None or arr.shape != (chains, self.model.dim):
            shape = None if arr is None else arr.shape
            raise InvalidRequest(f"{what} must have shape ({chains}, {self.model.dim}), got {shape}", self.name)
        if not np.all(np.isfinite(arr)):
            raise InvalidRequest(f"{what} contains NaN or inf", self.name)
        if not np.all(self.model.in_theta_space(arr)):
            raise InvalidRequest(f"{what} lies outside Θ = [-{self.model.theta_bound:g}, {self.model.theta_bound:g}]^"
                                 f"{self.model.dim}", self.name)
        return arr

    def simulation_diagnostics(self) -> SimulationDiagnostics:
        """Clip counts (simulation only): raises for a deployed owner."""
        if self.diagnostics is None:
            raise InvalidRequest("simulation diagnostics are off for this owner", self.name)
        return self.diagnostics

