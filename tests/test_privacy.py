"""Tests of fedpenalty.privacy: exact μ-GDP accounting, calibration, and the paper's bound."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest

from fedpenalty.privacy import (
    GaussianSpend,
    advanced_composition_epsilon,
    calibrate_sigma,
    classical_gaussian_epsilon,
    delta_for_epsilon,
    epsilon_for_delta,
    max_queries,
    mu_for_epsilon,
    paper_bound_epsilon,
)

# ------------------------------------------------------------------ reference values


@pytest.mark.parametrize(
    "sigma, delta, expected",
    [
        (1.0, 1e-5, 4.3771780957),
        (2.0, 1e-5, 1.9930914044),
        (10.0, 1e-5, 0.3406693647),
        (5.0, 1e-6, 0.8341175486),
    ],
)
def test_reference_epsilon(sigma, delta, expected):
    assert epsilon_for_delta(1.0 / sigma, delta) == pytest.approx(expected, rel=1e-8)


def test_reference_calibrate_sigma():
    assert calibrate_sigma(1.0, 1e-5) == pytest.approx(3.73063163, rel=1e-7)
    # Sensitivity scales σ linearly and T answers need √T times the noise.
    assert calibrate_sigma(1.0, 1e-5, queries=4, sensitivity=3.0) == pytest.approx(
        6 * 3.73063163, rel=1e-7
    )


def test_spend_of_100_answers_matches_single_answer():
    spend = GaussianSpend()
    for _ in range(100):
        spend = spend.add(0.1)  # σ = 10, Δ = 1
    assert spend.answers == 100
    assert spend.mu == pytest.approx(1.0, rel=1e-12)
    assert spend.epsilon(1e-5) == pytest.approx(4.3771780957, rel=1e-8)
    # Same through a single array call.
    assert GaussianSpend().add(np.full(100, 0.1)).epsilon(1e-5) == pytest.approx(
        4.3771780957, rel=1e-8
    )


def test_delta_formula_at_a_point():
    # Direct (unstabilised) formula where it is well conditioned.
    from scipy.stats import norm

    mu, eps = 0.8, 0.7
    expected = norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)
    assert delta_for_epsilon(mu, eps) == pytest.approx(expected, rel=1e-12)
    assert delta_for_epsilon(0.0, 0.5) == 0.0
    # δ(0) = 2Φ(μ/2) − 1.
    assert delta_for_epsilon(mu, 0.0) == pytest.approx(2 * norm.cdf(mu / 2) - 1, rel=1e-12)


def test_delta_is_accurate_in_the_far_tail():
    # Both terms ~1e-200: a naive difference would be 0 or garbage; compare with mpmath-free
    # check: the stabilised value must be positive, decreasing and consistent with the root.
    mu = 1.0
    d1, d2 = delta_for_epsilon(mu, 20.0), delta_for_epsilon(mu, 21.0)
    assert 0.0 < d2 < d1 < 1e-80
    assert epsilon_for_delta(mu, d1) == pytest.approx(20.0, rel=1e-9)


# ------------------------------------------------------------------ round trips


@pytest.mark.parametrize("mu", [1e-3, 0.05, 0.3, 1.0, 3.0, 20.0])
@pytest.mark.parametrize("delta", [1e-12, 1e-5, 0.01])
def test_delta_epsilon_round_trip(mu, delta):
    eps = epsilon_for_delta(mu, delta)
    if eps == 0.0:
        assert delta_for_epsilon(mu, 0.0) <= delta
    else:
        assert delta_for_epsilon(mu, eps) == pytest.approx(delta, rel=1e-8)
        # Smallest such ε: slightly less ε needs more δ.
        assert delta_for_epsilon(mu, eps * (1 - 1e-6)) > delta


def test_epsilon_zero_when_delta_covers_it():
    mu = 0.01
    assert epsilon_for_delta(mu, 0.5) == 0.0
    assert epsilon_for_delta(0.0, 1e-5) == 0.0


@pytest.mark.parametrize("eps", [0.1, 1.0, 4.0, 30.0])
@pytest.mark.parametrize("delta", [1e-9, 1e-5])
def test_mu_for_epsilon_round_trip(eps, delta):
    mu = mu_for_epsilon(eps, delta)
    assert epsilon_for_delta(mu, delta) == pytest.approx(eps, rel=1e-9)


def test_mu_for_epsilon_zero():
    mu = mu_for_epsilon(0.0, 1e-3)
    assert delta_for_epsilon(mu, 0.0) == pytest.approx(1e-3, rel=1e-10)


@pytest.mark.parametrize(
    "eps, delta, T, sens", [(1.0, 1e-5, 1, 1.0), (2.0, 1e-6, 1000, 0.3), (8.0, 1e-5, 50_000, 2.0)]
)
def test_calibrate_and_max_queries_consistent(eps, delta, T, sens):
    sigma = calibrate_sigma(eps, delta, queries=T, sensitivity=sens)
    assert epsilon_for_delta(math.sqrt(T) * sens / sigma, delta) == pytest.approx(eps, rel=1e-9)
    assert max_queries(sigma, sens, eps, delta) == T
    # A hair less noise and the T-th answer no longer fits.
    assert max_queries(sigma * (1 - 1e-6), sens, eps, delta) == T - 1


@pytest.mark.parametrize(
    "sigma, sens, eps, delta",
    [(7.3, 1.0, 1.5, 1e-5), (40.0, 0.7, 3.0, 1e-6), (0.5, 1.0, 0.2, 1e-5)],
)
def test_max_queries_is_the_largest(sigma, sens, eps, delta):
    t = max_queries(sigma, sens, eps, delta)

    def eps_of(n):
        return epsilon_for_delta(math.sqrt(n) * sens / sigma, delta)

    if t > 0:
        assert eps_of(t) <= eps * (1 + 1e-9)
    assert eps_of(t + 1) > eps


def test_max_queries_zero_when_one_answer_is_too_much():
    assert max_queries(0.1, 1.0, 1.0, 1e-5) == 0


def test_monotonicity():
    delta = 1e-5
    sigmas = [0.5, 1.0, 2.0, 5.0, 20.0]
    eps_sigma = [epsilon_for_delta(1.0 / s, delta) for s in sigmas]
    assert all(a > b for a, b in zip(eps_sigma, eps_sigma[1:]))
    spends = [GaussianSpend().add(np.full(t, 0.05)) for t in [1, 10, 100, 1000]]
    eps_t = [s.epsilon(delta) for s in spends]
    assert all(a < b for a, b in zip(eps_t, eps_t[1:]))
    eps_d = [epsilon_for_delta(0.7, d) for d in [1e-10, 1e-7, 1e-5, 1e-3]]
    assert all(a > b for a, b in zip(eps_d, eps_d[1:]))
    sig_t = [calibrate_sigma(1.0, delta, queries=t) for t in [1, 10, 100]]
    assert all(a < b for a, b in zip(sig_t, sig_t[1:]))
    mq = [max_queries(s, 1.0, 2.0, delta) for s in [5.0, 10.0, 20.0]]
    assert all(a < b for a, b in zip(mq, mq[1:]))


# ------------------------------------------------------------------ against dp-accounting

# Google's PLD accountant discretises the privacy loss pessimistically, so its ε is an upper
# bound on the exact one: ours may exceed it only by float/root-finding error (1e-7 absolute
# slack). With value_discretization_interval = 1e-4 its pessimism is far below 1% (observed
# ~1e-8 relative), so we also require agreement to 1e-3 relative — a wrong composition rule
# (e.g. μ = Σ μ_t, or δ-curve typo) would be off by orders of magnitude more.
_PLD_REL_TOL = 1e-3


def _pld_epsilon(event, delta: float) -> float:
    accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    accountant.compose(event)
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize(
    "sigma, T, delta",
    [(1.0, 1, 1e-5), (10.0, 100, 1e-5), (30.0, 1000, 1e-6), (50.0, 20_000, 1e-5), (3.0, 5, 1e-3)],
)
def test_matches_dp_accounting_pld(sigma, T, delta):
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma), T)
    pld_eps = _pld_epsilon(event, delta)
    ours = GaussianSpend().add(np.full(T, 1.0 / sigma)).epsilon(delta)
    assert ours <= pld_eps + 1e-7
    assert ours == pytest.approx(pld_eps, rel=_PLD_REL_TOL)


def test_heterogeneous_answers_match_dp_accounting_pld():
    # Different σ per answer: PLD really composes discretised distributions here.
    sigmas = [2.0, 3.0, 5.0, 7.0, 7.0]
    event = dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(s) for s in sigmas])
    pld_eps = _pld_epsilon(event, 1e-5)
    ours = GaussianSpend().add(1.0 / np.array(sigmas)).epsilon(1e-5)
    assert ours <= pld_eps + 1e-7
    assert ours == pytest.approx(pld_eps, rel=_PLD_REL_TOL)


# ------------------------------------------------------------------ the paper's bound


def _paper_by_hand(mu: float, T: int, delta: float, delta_prime: float) -> float:
    delta0 = (delta - delta_prime) / T
    eps0 = mu * math.sqrt(2 * math.log(1.25 / delta0))
    if eps0 > 1:
        return math.inf
    return eps0 * math.sqrt(2 * T * math.log(1 / delta_prime)) + T * eps0 * (math.exp(eps0) - 1)


def test_paper_bound_hand_computed():
    mu, T, delta = 0.02, 1000, 1e-5
    fixed = _paper_by_hand(mu, T, delta, delta / 2)
    assert fixed == pytest.approx(35.905866295299084, rel=1e-12)  # computed by hand once
    # Helpers reproduce the same formula.
    eps0 = classical_gaussian_epsilon(mu, (delta / 2) / T)
    assert eps0 == pytest.approx(0.12437675498525122, rel=1e-12)
    assert advanced_composition_epsilon(eps0, T, delta / 2) == pytest.approx(fixed, rel=1e-12)
    # The optimiser beats the fixed split and agrees with an independent fine grid.
    best = paper_bound_epsilon(mu, T, delta)
    assert best <= fixed
    grid = np.exp(np.linspace(math.log(delta * 1e-20), math.log(delta * (1 - 1e-9)), 20_001))
    grid_min = min(_paper_by_hand(mu, T, delta, float(dp)) for dp in grid)
    assert grid_min * (1 - 1e-6) <= best <= grid_min * (1 + 1e-12)


@pytest.mark.parametrize(
    "sigma, sens, T, delta",
    [
        (1.0, 1.0, 1, 1e-5),
        (20.0, 1.0, 100, 1e-5),
        (50.0, 1.0, 10_000, 1e-5),
        (30.0, 0.5, 1000, 1e-6),
        (100.0, 1.0, 100_000, 1e-5),
    ],
)
def test_paper_bound_is_never_tighter_than_exact(sigma, sens, T, delta):
    spend = GaussianSpend().add(np.full(T, sens / sigma))
    assert spend.epsilon_paper_bound(delta) >= spend.epsilon(delta)


def test_paper_bound_inf_when_classical_theorem_does_not_apply():
    # ε₀ ≤ 1 needs δ₀ ≥ 1.25 e^{-1/(2μ²)}; for μ = 0.25 that is 4.2e-4 > δ.
    assert paper_bound_epsilon(0.25, 1, 1e-5) == math.inf
    assert paper_bound_epsilon(0.5, 10, 1e-5) == math.inf
    # μ = 0.2 needs δ₀ ≥ 4.7e-6 < 1e-5: the bound applies with the constraint active.
    assert math.isfinite(paper_bound_epsilon(0.2, 1, 1e-5))
    # Many answers eat the δ budget too: T · 4.7e-6 > 1e-5.
    assert paper_bound_epsilon(0.2, 3, 1e-5) == math.inf


def test_paper_bound_trivial_cases():
    assert paper_bound_epsilon(0.0, 10, 1e-5) == 0.0
    assert GaussianSpend().epsilon_paper_bound(1e-5) == 0.0
    assert GaussianSpend().epsilon(1e-5) == 0.0


# ------------------------------------------------------------------ GaussianSpend


def test_spend_add_and_combine():
    a = GaussianSpend().add(np.array([0.1, 0.3]))
    b = GaussianSpend().add(0.2).add([])
    assert (a.answers, a.max_mu) == (2, 0.3)
    assert a.mu_squared == pytest.approx(0.1, rel=1e-12)
    c = a.combine(b)
    assert c.answers == 3
    assert c.mu_squared == pytest.approx(0.14, rel=1e-12)
    assert c.max_mu == 0.3
    assert c == a.add(0.2)
    # Paper bound uses the worst-case μ for every answer.
    assert c.epsilon_paper_bound(1e-5) == paper_bound_epsilon(0.3, 3, 1e-5)
    # Immutable.
    with pytest.raises(AttributeError):
        a.answers = 5  # type: ignore[misc]
    assert a.answers == 2


@pytest.mark.parametrize("bad", [-0.1, math.nan, math.inf, [0.1, -1e-9]])
def test_spend_rejects_bad_mu(bad):
    with pytest.raises(ValueError, match="mus"):
        GaussianSpend().add(bad)


# ------------------------------------------------------------------ bad arguments


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: delta_for_epsilon(-1.0, 1.0), "mu"),
        (lambda: delta_for_epsilon(math.nan, 1.0), "mu"),
        (lambda: delta_for_epsilon(1.0, -0.1), "epsilon"),
        (lambda: epsilon_for_delta(1.0, 0.0), "delta"),
        (lambda: epsilon_for_delta(1.0, 1.0), "delta"),
        (lambda: epsilon_for_delta(math.inf, 1e-5), "mu"),
        (lambda: mu_for_epsilon(math.inf, 1e-5), "epsilon"),
        (lambda: mu_for_epsilon(1.0, -1e-5), "delta"),
        (lambda: calibrate_sigma(1.0, 1e-5, queries=0), "queries"),
        (lambda: calibrate_sigma(1.0, 1e-5, queries=2.5), "queries"),
        (lambda: calibrate_sigma(1.0, 1e-5, sensitivity=-1.0), "sensitivity"),
        (lambda: max_queries(0.0, 1.0, 1.0, 1e-5), "sigma"),
        (lambda: max_queries(math.inf, 1.0, 1.0, 1e-5), "sigma"),
        (lambda: max_queries(1.0, -1.0, 1.0, 1e-5), "sensitivity"),
        (lambda: max_queries(1.0, 1.0, 1.0, 2.0), "delta"),
        (lambda: paper_bound_epsilon(0.1, 0, 1e-5), "queries"),
        (lambda: paper_bound_epsilon(-0.1, 3, 1e-5), "mu_per_answer"),
        (lambda: paper_bound_epsilon(0.1, 3, 0.0), "delta"),
        (lambda: classical_gaussian_epsilon(0.1, 1.5), "delta0"),
        (lambda: advanced_composition_epsilon(-0.1, 3, 1e-5), "eps0"),
        (lambda: advanced_composition_epsilon(0.1, 3, 0.0), "delta_prime"),
        (lambda: GaussianSpend(answers=-1), "answers"),
        (lambda: GaussianSpend().epsilon(0.0), "delta"),
        (lambda: GaussianSpend().epsilon_paper_bound(1.0), "delta"),
    ],
)
def test_bad_arguments_raise(call, name):
    with pytest.raises(ValueError, match=name):
        call()


# ------------------------------------------------------------------ root-finding edges


@pytest.mark.parametrize("mu", [1e-3, 0.05, 1.0, 20.0])
@pytest.mark.parametrize("delta", [1e-300, 0.5, 0.9])
def test_epsilon_for_delta_round_trip_at_extreme_delta(mu, delta):
    eps = epsilon_for_delta(mu, delta)
    if eps == 0.0:
        assert delta_for_epsilon(mu, 0.0) <= delta
    else:
        assert delta_for_epsilon(mu, eps) == pytest.approx(delta, rel=1e-8)


@pytest.mark.parametrize("eps", [0.1, 1.0, 30.0])
@pytest.mark.parametrize("delta", [1e-300, 0.5, 0.9])
def test_mu_for_epsilon_round_trip_at_extreme_delta(eps, delta):
    assert epsilon_for_delta(mu_for_epsilon(eps, delta), delta) == pytest.approx(eps, rel=1e-9)


def test_absurd_arguments_raise_instead_of_searching():
    with pytest.raises(ValueError, match="mu"):
        epsilon_for_delta(1e300, 1e-5)  # ε ≈ μ²/2 overflows
    with pytest.raises(ValueError, match="epsilon"):
        mu_for_epsilon(1.7e308, 1e-5)
    with pytest.raises(ValueError, match="answers"):
        max_queries(1e9, 1.0, 1.0, 1e-5)  # more answers fit than a float can count
    t = max_queries(1e5, 1.0, 5.0, 1e-5)  # about 1.3e10: still counted exactly
    assert epsilon_for_delta(math.sqrt(t) / 1e5, 1e-5) <= 5.0 * (1 + 1e-9)
    assert epsilon_for_delta(math.sqrt(t + 1) / 1e5, 1e-5) > 5.0
