"""The penalty paper's own (ε, δ) bound, reported next to the exact accounting for comparison.

Each answer is treated as the classical Gaussian mechanism (Dwork & Roth 2014, Thm A.1:
σ ≥ Δ √(2 ln(1.25/δ₀)) / ε₀, valid only for ε₀ ≤ 1) and T answers are composed with the
Dwork–Rothblum–Vadhan advanced composition theorem:
ε = ε₀ √(2 T ln(1/δ′)) + T ε₀ (e^{ε₀} − 1), total δ = T δ₀ + δ′.
ε is in nats, δ a probability, μ = Δ/σ dimensionless.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import minimize_scalar

from .gaussian import check_count, check_delta, check_epsilon, check_mu

__all__ = ["advanced_composition_epsilon", "classical_gaussian_epsilon", "paper_bound_epsilon"]

_GRID_POINTS = 2001
_GRID_NATS = 60.0  # the grid spans δ′ ∈ [e^-60 · δ′_max, δ′_max]


def classical_gaussian_epsilon(mu: float, delta0: float) -> float:
    """ε₀ = μ √(2 ln(1.25/δ₀)) of one classical Gaussian answer with μ = Δ/σ at δ₀ ∈ (0, 1).

    The theorem only applies when the result is ≤ 1; the value is returned regardless.
    """
    mu = check_mu(mu)
    delta0 = check_delta(delta0, "delta0")
    return mu * math.sqrt(2.0 * math.log(1.25 / delta0))


def advanced_composition_epsilon(eps0: float, queries: int, delta_prime: float) -> float:
    """ε of ``queries`` adaptive (ε₀, δ₀)-DP answers by advanced composition (DRV 2010):
    ε₀ √(2 T ln(1/δ′)) + T ε₀ (e^{ε₀} − 1); the total δ is T δ₀ + δ′ (δ₀ not needed here)."""
    eps0 = check_epsilon(eps0, "eps0")
    queries = check_count("queries", queries)
    delta_prime = check_delta(delta_prime, "delta_prime")
    spread = eps0 * math.sqrt(2.0 * queries * math.log(1.0 / delta_prime))
    return spread + queries * eps0 * math.expm1(eps0)


def _bound(mu: float, queries: int, delta: float, log_dp: np.ndarray) -> np.ndarray:
    """Vectorised ε of the paper bound at δ′ = exp(log_dp); inf where ε₀ > 1 or δ₀ ≤ 0."""
    dp = np.exp(log_dp)
    delta0 = (delta - dp) / queries
    with np.errstate(divide="ignore", invalid="ignore"):
        eps0 = mu * np.sqrt(2.0 * np.log(1.25 / delta0))
        eps = eps0 * np.sqrt(-2.0 * queries * log_dp) + queries * eps0 * np.expm1(eps0)
    return np.where((delta0 > 0) & (eps0 <= 1.0), eps, np.inf)


def paper_bound_epsilon(mu_per_answer: float, queries: int, delta: float) -> float:
    """The paper's ε (nats) for ``queries`` answers of μ = Δ/σ each at total ``delta``,
    minimised over the split δ′ ∈ (0, δ), δ₀ = (δ − δ′)/T, subject to ε₀ ≤ 1.

    When the answers of a run have different μ_t, pass the largest μ_t: the paper assumes one
    mechanism with the worst-case sensitivity at every iteration. Returns ``math.inf`` when no
    split gives ε₀ ≤ 1 (the classical Gaussian theorem does not apply).
    """
    mu = check_mu(mu_per_answer, "mu_per_answer")
    queries = check_count("queries", queries)
    delta = check_delta(delta)
    if mu == 0.0:
        return 0.0
    # ε₀ ≤ 1  ⇔  δ₀ ≥ 1.25 e^{−1/(2μ²)}  ⇔  δ′ ≤ δ − 1.25 T e^{−1/(2μ²)} =: δ′_max.
    dp_max = delta - 1.25 * queries * math.exp(-0.5 / (mu * mu))
    if dp_max <= 0.0:
        return math.inf
    hi = math.log(dp_max)
    grid = np.linspace(hi - _GRID_NATS, hi, _GRID_POINTS)
    values = _bound(mu, queries, delta, grid)
    i = int(np.argmin(values))
    best = float(values[i])
    if not math.isfinite(best):
        return math.inf
    lo_x, hi_x = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    res = minimize_scalar(
        lambda x: float(_bound(mu, queries, delta, np.array([x]))[0]),
        bounds=(lo_x, hi_x),
        method="bounded",
        options={"xatol": 1e-12},
    )
    return min(best, float(res.fun)) if math.isfinite(res.fun) else best
