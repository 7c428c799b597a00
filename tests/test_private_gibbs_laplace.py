"""The Laplace release of private Gibbs' statistics (docs/design.md §2.10, "The Laplace
release"): the exact discrete Laplace sampler on the lattice, the released values, the pure ε
with its rounding term, and the L1 sensitivity of linear regression's statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from fedpenalty.models import build_model
from fedpenalty.owner.noise.laplace import (
    discrete_laplace,
    laplace_lattice_release,
    laplace_release_epsilon,
)
from fedpenalty.owner.noise.sources import NoiseKey, word_source
from fedpenalty.privacy import events
from fedpenalty.privacy.accountant import OwnerAccountant

GAMMA = 2.0**-20


def _source(simulation: bool = False):
    """ChaCha20 (deployed) or Philox (simulation) words under two fixed keys."""
    keys = [NoiseKey.derive(7, "owner-a"), NoiseKey.derive(7, "owner-b")]
    return word_source(keys, simulation=simulation)


def _samples(scale_over_gamma: float, count: int, simulation: bool = False) -> np.ndarray:
    return discrete_laplace(
        _source(simulation),
        "session",
        "penalty_expfam",
        scale_over_gamma,
        owner=0,
        chain=0,
        iteration=0,
        component=np.arange(count),
    )


@pytest.mark.parametrize("simulation", [False, True])
def test_noise_variance_is_two_b_squared(simulation):
    """b/γ = 2²⁰ (the lattice's usual ratio): Var = 2b² and E|n| = b up to O(γ). With 20,000
    samples the sample variance of a Laplace has relative sd √(20/4)/√N = 1.6 % and E|n|
    0.7 %; tolerances 8 % and 4 % (5 sd). A sampler at half the scale (b/2) gives a quarter of
    the variance and fails both (checked on the same words below)."""
    t = 2.0**20
    n = _samples(t, 20_000, simulation).astype(float)
    assert abs(n.var() / (2 * t * t) - 1) < 0.08
    assert abs(np.abs(n).mean() / t - 1) < 0.04
    assert abs(n.mean()) < 5 * math.sqrt(2) * t / math.sqrt(len(n))
    half = _samples(t / 2, 20_000, simulation).astype(float)
    assert not abs(half.var() / (2 * t * t) - 1) < 0.08


def _pmf(t: float, y: np.ndarray) -> np.ndarray:
    """P(y) = (1 − e^{−1/t})/(1 + e^{−1/t}) · e^{−|y|/t} on ℤ."""
    r = math.exp(-1.0 / t)
    return (1 - r) / (1 + r) * r ** np.abs(y)


def _chi2_p(n: np.ndarray, t: float) -> float:
    """Chi-square p-value of the samples ``n`` against the discrete Laplace of scale t (cells
    −8 … 8 and the two tails)."""
    cells = np.arange(-8, 9)
    inner = _pmf(t, cells)
    tail = (1 - inner.sum()) / 2
    expected = np.concatenate([[tail], inner, [tail]]) * len(n)
    observed = np.concatenate([[np.sum(n < -8)], [np.sum(n == c) for c in cells], [np.sum(n > 8)]])
    return float(stats.chisquare(observed, expected).pvalue)


def test_small_scale_matches_the_exact_pmf():
    """At t = 1.5 lattice units the samples follow the exact discrete Laplace pmf (chi-square
    p > 1e-3 on 20,000 samples, fixed words) — and clearly not the pmf at t = 1.5/2 or 2·1.5
    (p < 1e-12), so a sampler at the wrong scale fails."""
    n = _samples(1.5, 20_000)
    assert _chi2_p(n, 1.5) > 1e-3
    assert _chi2_p(n, 0.75) < 1e-12
    assert _chi2_p(n, 3.0) < 1e-12


def test_a_sample_depends_only_on_its_own_address():
    """Component 17 drawn alone equals component 17 drawn in a batch (counter-addressed)."""
    batch = _samples(2.0**20, 40)
    alone = discrete_laplace(
        _source(), "session", "penalty_expfam", 2.0**20, owner=0, chain=0, iteration=0, component=17
    )
    assert int(alone) == int(batch[17])


def test_release_is_the_rounded_sum_plus_lattice_noise():
    """Every released value is a multiple of γ; release − round(value) is the noise drawn at the
    same addresses; values beyond ±2⁵²γ are clipped first; owners draw different noise."""
    values = np.array([[0.1234567, -3.5, 2.0**40], [0.1234567, -3.5, 0.0]])
    scale = np.array([0.5, 0.5])
    out = laplace_lattice_release(_source(), "s", "penalty_expfam", values, scale, GAMMA)
    assert np.all(out / GAMMA == np.round(out / GAMMA))
    noise = discrete_laplace(
        _source(),
        "s",
        "penalty_expfam",
        0.5 / GAMMA,
        owner=np.arange(2)[:, None],
        chain=0,
        iteration=0,
        component=np.arange(3)[None, :],
    )
    rounded = np.rint(np.clip(values, -(2.0**52) * GAMMA, 2.0**52 * GAMMA) / GAMMA)
    assert np.array_equal(out / GAMMA - rounded, noise)
    assert out[0, 2] <= 2.0**52 * GAMMA + 40 * 0.5
    assert not np.array_equal(out[0, :2] - values[0, :2], out[1, :2] - values[1, :2])


def test_pure_epsilon_includes_the_rounding_term():
    """ε = (Δ₁ + γw)/b for b/γ exactly representable (b = 0.5: b/γ = 2¹⁹), computed here
    independently in exact arithmetic; for another b it lies within (1 + 2⁻⁴⁰) below the
    same formula (the sampler's scale is rounded up, never down); without the rounding term,
    or at b/2, the figure differs."""
    delta1, w = 7.5, 6
    eps = laplace_release_epsilon(delta1, 0.5, GAMMA, w)
    assert eps == pytest.approx((delta1 + GAMMA * w) / 0.5, rel=1e-15)
    assert eps > delta1 / 0.5
    other = laplace_release_epsilon(delta1, 0.3, GAMMA, w)
    bound = (delta1 + GAMMA * w) / 0.3
    assert bound * (1 - 2.0**-39) <= other <= bound * (1 + 1e-15)


def test_worst_neighbours_stay_within_the_pure_epsilon():
    """Independent check of the rounding term: neighbouring sums a, a' with ‖a − a'‖₁ = Δ₁,
    placed so that rounding widens their distance as much as it can, released at t lattice
    units: the largest log ratio of the two output pmfs (Σ|m_i|/t over the shift m between
    the rounded points) is at most ε, and more than Δ₁/b (the term is needed)."""
    gamma, b, w = 1.0 / 8, 1.0, 4
    delta1 = 1.0
    a = np.full(w, gamma / 2 - 1e-9)  # rounds down to 0
    a2 = a + delta1 / w  # 0.25 + γ/2 − 1e-9 rounds up to 3γ
    m = np.rint(a2 / gamma) - np.rint(a / gamma)
    y = np.arange(-200, 201)[:, None]
    t = b / gamma
    log_ratio = np.log(_pmf(t, y - 0) / _pmf(t, y - m)).sum(axis=1)
    eps = laplace_release_epsilon(delta1, b, gamma, w)
    assert log_ratio.max() <= eps + 1e-12
    assert log_ratio.max() > delta1 / b


def test_the_release_is_charged_as_pure_epsilon():
    """The release's event, (ε, 0), composed into an owner's accountant gives exactly ε at any
    δ; two such releases 2ε (basic composition of pure ε)."""
    eps = laplace_release_epsilon(3.0, 2.0, GAMMA, 5)
    acc = OwnerAccountant("replace_one").compose(events.EpsilonDelta(eps, 0.0))
    assert acc.epsilon(1e-5) == pytest.approx(eps, rel=1e-12)
    assert acc.compose(events.EpsilonDelta(eps, 0.0)).epsilon(1e-5) == pytest.approx(2 * eps)


@pytest.mark.parametrize("known", [1, 0])
def test_regression_l1_sensitivity_is_attained_and_bounds_every_record(known):
    """sup‖S(x)‖₁ over the clipped domain is attained at x = R/√d·(1, …, 1), |y| = Y (so the
    bound is not loose for add/remove), and no clipped record exceeds it; replace-one is twice
    it (an upper bound: ‖S(x) − S(x′)‖₁ ≤ ‖S(x)‖₁ + ‖S(x′)‖₁)."""
    model = build_model(
        {"name": "linear_regression", "dim": 3, "known_variance": known, "data_bound": 1.5}
    )
    d, r, yb = 3, model.data_bound, model.y_bound
    worst = np.array([[*(np.full(d, r / math.sqrt(d))), yb]])
    bound = model.stat_l1_sensitivity("add_remove")
    assert np.abs(model.suff_stat(worst)).sum() == pytest.approx(bound, rel=1e-12)
    rng = np.random.default_rng(5)
    records = model.prepare_records(rng.normal(scale=3.0, size=(5000, d + 1)))
    assert np.abs(model.suff_stat(records)).sum(axis=1).max() <= bound * (1 + 1e-12)
    assert model.stat_l1_sensitivity("replace_one") == pytest.approx(2 * bound)
