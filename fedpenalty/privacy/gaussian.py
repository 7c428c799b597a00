"""Exact accounting of Gaussian answers as μ-GDP (Dong, Roth & Su, 2019/2022).

An answer with L2 sensitivity Δ and noise standard deviation σ (same units as the answer) is
μ-GDP with μ = Δ/σ (dimensionless). Any number of such answers, even adaptively chosen,
compose to μ-GDP with μ² = Σ_t μ_t². A μ-GDP mechanism is (ε, δ(ε))-DP for every ε ≥ 0 with
the exact analytic-Gaussian curve

    δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2).

ε is in nats (the usual e^ε convention); δ is a probability.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

from scipy.optimize import brentq
from scipy.special import log_ndtr, ndtri

__all__ = [
    "delta_for_epsilon",
    "epsilon_for_delta",
    "mu_for_epsilon",
    "calibrate_sigma",
    "max_queries",
]

# Relative slack on δ when deciding whether T answers fit a budget (max_queries): absorbs
# the float error of a calibrate_sigma -> max_queries round trip; privacy-wise negligible.
_DELTA_RTOL = 1e-9


# ---------------------------------------------------------------- argument checks
def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


def check_mu(mu: object, name: str = "mu") -> float:
    """Return ``mu`` as a float; raise ValueError unless finite and ≥ 0."""
    mu = _real(name, mu)
    if mu < 0:
        raise ValueError(f"{name} must be >= 0, got {mu!r}")
    return mu


def check_epsilon(epsilon: object, name: str = "epsilon") -> float:
    """Return ``epsilon`` as a float; raise ValueError unless finite and ≥ 0."""
    epsilon = _real(name, epsilon)
    if epsilon < 0:
        raise ValueError(f"{name} must be >= 0, got {epsilon!r}")
    return epsilon


def check_delta(delta: object, name: str = "delta") -> float:
    """Return ``delta`` as a float; raise ValueError unless 0 < delta < 1."""
    delta = _real(name, delta)
    if not 0.0 < delta < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {delta!r}")
    return delta


def check_positive(name: str, value: object) -> float:
    """Return ``value`` as a float; raise ValueError unless finite and > 0."""
    value = _real(name, value)
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return value


def check_queries(queries: object) -> int:
    """Return ``queries`` as an int; raise ValueError unless an integer ≥ 1."""
    if isinstance(queries, bool) or not isinstance(queries, Integral) or queries < 1:
        raise ValueError(f"queries must be an integer >= 1, got {queries!r}")
    return int(queries)


# ---------------------------------------------------------------- the δ(ε) curve
def _log_delta(mu: float, epsilon: float) -> float:
    """log δ(ε) for μ > 0, written as log Φ(a) + log(1 − e^{ε + log Φ(b) − log Φ(a)}).

    Factoring out Φ(a) keeps full relative accuracy when both terms are tiny.
    """
    a = -epsilon / mu + mu / 2.0
    b = -epsilon / mu - mu / 2.0
    log_a = float(log_ndtr(a))
    r = epsilon + float(log_ndtr(b)) - log_a  # log of the ratio of the two terms, < 0
    if r >= 0.0:  # only reachable through rounding when δ is at the float floor
        return -math.inf
    return log_a + math.log(-math.expm1(r))


def delta_for_epsilon(mu: float, epsilon: float) -> float:
    """δ (probability) at which a μ-GDP mechanism is (ε, δ)-DP; ε in nats, μ = Δ/σ ≥ 0."""
    mu = check_mu(mu)
    epsilon = check_epsilon(epsilon)
    if mu == 0.0:
        return 0.0
    return math.exp(_log_delta(mu, epsilon))


def _increasing_root(f, lo: float, hi: float, *, positive_lo: bool) -> float:
    """Root of an increasing ``f``: widen [lo, hi] (halving lo or doubling hi), then brentq."""
    while f(hi) < 0.0:
        lo, hi = hi, 2.0 * hi
        if hi > 1e12:
            raise ValueError("root bracket diverged")
    while positive_lo and f(lo) > 0.0:
        hi, lo = lo, 0.5 * lo
        if lo < 1e-300:
            raise ValueError("root bracket diverged")
    return brentq(f, lo, hi, xtol=1e-300, rtol=4 * 2.220446049250313e-16, maxiter=500)


def epsilon_for_delta(mu: float, delta: float) -> float:
    """Smallest ε ≥ 0 (nats) such that a μ-GDP mechanism is (ε, delta)-DP; μ = 0 gives 0."""
    mu = check_mu(mu)
    delta = check_delta(delta)
    if mu == 0.0:
        return 0.0
    log_target = math.log(delta)
    if _log_delta(mu, 0.0) <= log_target:
        return 0.0
    # δ(ε) decreases in ε, so −(log δ(ε) − log delta) increases; the root is > 0.
    f = lambda eps: log_target - _log_delta(mu, eps)  # noqa: E731
    return float(_increasing_root(f, 0.0, max(1.0, mu * mu), positive_lo=False))


def mu_for_epsilon(epsilon: float, delta: float) -> float:
    """Largest μ (= Δ/σ, total over all answers) whose ε at ``delta`` is ``epsilon`` (nats)."""
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)
    if epsilon == 0.0:  # δ(0) = 2Φ(μ/2) − 1 has a closed-form inverse
        return 2.0 * float(ndtri((1.0 + delta) / 2.0))
    # δ(ε) increases in μ, so log δ − log delta is increasing in μ.
    log_target = math.log(delta)
    f = lambda mu: _log_delta(mu, epsilon) - log_target  # noqa: E731
    return float(_increasing_root(f, 1.0, 1.0, positive_lo=True))


# ---------------------------------------------------------------- calibration
def calibrate_sigma(
    epsilon: float, delta: float, queries: int = 1, sensitivity: float = 1.0
) -> float:
    """Noise sd σ (units of the answer) such that ``queries`` answers, each of L2 sensitivity
    ``sensitivity`` (> 0, same units), compose to exactly (epsilon, delta)-DP:
    σ = Δ √T / μ*, with μ* = mu_for_epsilon(epsilon, delta)."""
    queries = check_queries(queries)
    sensitivity = check_positive("sensitivity", sensitivity)
    return sensitivity * math.sqrt(queries) / mu_for_epsilon(epsilon, delta)


def max_queries(sigma: float, sensitivity: float, epsilon: float, delta: float) -> int:
    """Largest number T ≥ 0 of answers with noise sd ``sigma`` and L2 sensitivity
    ``sensitivity`` (> 0, same units) whose composition is (epsilon, delta)-DP.

    T = floor((μ* σ/Δ)²), then corrected by direct checks of δ_T(epsilon) ≤ delta (with a
    1e-9 relative slack on δ against float error at the boundary).
    """
    sigma = check_positive("sigma", sigma)
    sensitivity = check_positive("sensitivity", sensitivity)
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)
    mu1 = sensitivity / sigma
    log_limit = math.log(delta) + math.log1p(_DELTA_RTOL)

    def fits(t: int) -> bool:
        return t == 0 or _log_delta(mu1 * math.sqrt(t), epsilon) <= log_limit

    t = int(math.floor((mu_for_epsilon(epsilon, delta) / mu1) ** 2))
    while t > 0 and not fits(t):
        t -= 1
    while fits(t + 1):
        t += 1
    return t
