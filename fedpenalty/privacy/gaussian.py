"""Exact accounting of Gaussian answers as μ-GDP (Dong, Roth & Su, 2019/2022).

An answer with L2 sensitivity Δ and noise standard deviation σ (same units as the answer) is
μ-GDP with μ = Δ/σ (dimensionless). Any number of such answers, even adaptively chosen,
compose to μ-GDP with μ² = Σ_t μ_t². A μ-GDP mechanism is (ε, δ(ε))-DP for every ε ≥ 0 with
the exact analytic-Gaussian curve

    δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2).

The curve is evaluated in log space and inverted (in ε, or in μ) with scipy's Brent's method
on brackets that tail bounds of the privacy loss L ~ N(μ²/2, μ²) give in closed form, so no
bracket is searched for. ε is in nats (the usual e^ε convention); δ is a probability.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

from scipy.optimize import brentq
from scipy.special import log_ndtr, ndtri

__all__ = [
    "calibrate_sigma",
    "delta_for_epsilon",
    "epsilon_for_delta",
    "max_queries",
    "mu_for_epsilon",
]

# Relative slack on δ when deciding whether T answers fit a budget (max_queries): absorbs
# the float error of a calibrate_sigma -> max_queries round trip; privacy-wise negligible.
_DELTA_RTOL = 1e-9
# Above 2^53 answers, T and T + 1 are the same float: max_queries refuses to count that far.
_MAX_QUERIES = 2.0**53

# Brent's method to full double precision (brentq's smallest allowed rtol).
_BRENT = {"xtol": 1e-300, "rtol": 4 * 2.220446049250313e-16, "maxiter": 500}

# Relative widening of the closed-form brackets: far above their float error, far below
# anything that matters for the root.
_WIDEN = 1e-6


# ---------------------------------------------------------------- argument checks
def _real(name: str, value: object) -> float:
    """Return ``value`` as a float; raise ValueError unless a finite real number."""
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


def check_count(name: str, value: object) -> int:
    """Return ``value`` as an int; raise ValueError unless an integer ≥ 1."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def check_choice(name: str, value: object, allowed: tuple[str, ...]) -> str:
    """Return ``value``; raise ValueError unless it is one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return str(value)


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


def _positive_root(z: float, c: float) -> float:
    """The positive root μ of μ²/2 + z μ − c = 0 (c > 0), without cancellation."""
    s = math.sqrt(z * z + 2.0 * c)
    return 2.0 * c / (z + s) if z >= 0.0 else s - z


def epsilon_for_delta(mu: float, delta: float) -> float:
    """Smallest ε ≥ 0 (nats) such that a μ-GDP mechanism is (ε, delta)-DP; μ = 0 gives 0."""
    mu = check_mu(mu)
    delta = check_delta(delta)
    if mu == 0.0:
        return 0.0
    log_target = math.log(delta)
    if _log_delta(mu, 0.0) <= log_target:
        return 0.0
    # δ(ε) ≤ Φ(−ε/μ + μ/2) (the subtracted term is ≥ 0), which equals delta at
    # ε = μ²/2 − μ Φ⁻¹(delta): the root lies in [0, that ε]. log δ(ε) decreases in ε.
    hi = mu * (0.5 * mu - float(ndtri(delta))) * (1.0 + _WIDEN)
    if not math.isfinite(hi):
        raise ValueError(f"mu={mu!r} is too large: its ε overflows a float")
    return float(brentq(lambda eps: log_target - _log_delta(mu, eps), 0.0, hi, **_BRENT))


def mu_for_epsilon(epsilon: float, delta: float) -> float:
    """Largest μ (= Δ/σ, total over all answers) whose ε at ``delta`` is ``epsilon`` (nats)."""
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)
    if epsilon == 0.0:  # δ(0) = 2Φ(μ/2) − 1 has a closed-form inverse
        return 2.0 * float(ndtri((1.0 + delta) / 2.0))
    # With the privacy loss L ~ N(μ²/2, μ²), δ(ε) = E[(1 − e^{ε−L})₊], so for any c > 0
    #   (1 − e^{−c}) P(L ≥ ε + c) ≤ δ(ε) ≤ P(L > ε).
    # The upper bound equals delta at lo = the μ with (ε − μ²/2)/μ = −Φ⁻¹(delta); the lower
    # bound, with 1 − e^{−c} = (1 + delta)/2, reaches delta at hi. δ(ε) increases in μ.
    lo = _positive_root(-float(ndtri(delta)), epsilon) * (1.0 - _WIDEN)
    c = math.log(2.0 / (1.0 - delta))
    hi = _positive_root(-float(ndtri(2.0 * delta / (1.0 + delta))), epsilon + c) * (1.0 + _WIDEN)
    if not math.isfinite(hi):
        raise ValueError(f"epsilon={epsilon!r} is too large: its μ² overflows a float")
    log_target = math.log(delta)
    return float(brentq(lambda mu: _log_delta(mu, epsilon) - log_target, lo, hi, **_BRENT))


# ---------------------------------------------------------------- calibration
def calibrate_sigma(
    epsilon: float, delta: float, queries: int = 1, sensitivity: float = 1.0
) -> float:
    """Noise sd σ (units of the answer) such that ``queries`` answers, each of L2 sensitivity
    ``sensitivity`` (> 0, same units), compose to exactly (epsilon, delta)-DP:
    σ = Δ √T / μ*, with μ* = mu_for_epsilon(epsilon, delta)."""
    queries = check_count("queries", queries)
    sensitivity = check_positive("sensitivity", sensitivity)
    return sensitivity * math.sqrt(queries) / mu_for_epsilon(epsilon, delta)


def max_queries(sigma: float, sensitivity: float, epsilon: float, delta: float) -> int:
    """Largest number T ≥ 0 of answers with noise sd ``sigma`` and L2 sensitivity
    ``sensitivity`` (> 0, same units) whose composition is (epsilon, delta)-DP.

    T is the largest integer with δ_T(epsilon) ≤ delta (1 + 1e-9): the 1e-9 relative slack on
    δ absorbs float error at the boundary (a calibrate_sigma -> max_queries round trip). It is
    floor((μ σ/Δ)²) with μ = mu_for_epsilon at that δ, then confirmed by direct checks.
    """
    sigma = check_positive("sigma", sigma)
    sensitivity = check_positive("sensitivity", sensitivity)
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)
    mu1 = sensitivity / sigma
    log_limit = math.log(delta) + math.log1p(_DELTA_RTOL)

    def fits(t: int) -> bool:
        return t == 0 or _log_delta(mu1 * math.sqrt(t), epsilon) <= log_limit

    slack = min(math.exp(log_limit), math.nextafter(1.0, 0.0))
    ratio = mu_for_epsilon(epsilon, slack) * sigma / sensitivity  # √T at the boundary
    guess = ratio * ratio
    if not guess < _MAX_QUERIES:
        raise ValueError(
            f"more than {_MAX_QUERIES:.0f} answers of sigma={sigma!r}, sensitivity="
            f"{sensitivity!r} fit (epsilon={epsilon!r}, delta={delta!r})"
        )
    t = int(guess)
    while t > 0 and not fits(t):  # float error only: a step or two at most
        t -= 1
    while fits(t + 1):
        t += 1
    return t
