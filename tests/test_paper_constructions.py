"""The papers' constructions the scenarios need (scenarios/README.md): the expected acceptance
of the penalty test (Yıldırım's Proposition 1) and Foulds et al.'s Laplace pseudo-counts.

Monte Carlo checks use fixed seeds and a tolerance of 5 standard errors (a false alarm about
once in 1.7 million under a correct formula); each would fail on the bug named beside it.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import special, stats

from fedpenalty.coordinator import baselines
from fedpenalty.coordinator.mh import expected_acceptance
from fedpenalty.models import build_model

Z = 5.0


@pytest.mark.parametrize("lam", [-3.0, -0.5, 0.0, 0.7, 4.0])
@pytest.mark.parametrize("s2", [0.25, 1.0, 4.0, 9.0])
def test_expected_acceptance_matches_monte_carlo(lam, s2):
    """E[min{1, exp(λ + sξ − s²/2)}] by simulation (a wrong sign of s²/2, or a missing e^λ
    factor, is off by far more than 5 SE)."""
    xi = np.random.default_rng(7).standard_normal(1_000_000)
    alpha = np.minimum(1.0, np.exp(lam + np.sqrt(s2) * xi - 0.5 * s2))
    se = alpha.std() / np.sqrt(alpha.size)
    assert abs(float(expected_acceptance(lam, s2)) - alpha.mean()) < Z * se + 1e-12


def test_expected_acceptance_without_noise_is_metropolis():
    lam = np.array([-5.0, -1.0, 0.0, 2.0])
    np.testing.assert_allclose(expected_acceptance(lam, 0.0), np.minimum(1.0, np.exp(lam)))


def test_expected_acceptance_falls_as_noise_grows():
    """Proposition 1 pointwise: for every λ, acceptance decreases in s² (and tends to the
    noiseless value as s² → 0)."""
    lam = np.linspace(-10.0, 10.0, 201)[:, None]
    s2 = np.linspace(0.0, 20.0, 401)[None, :]
    values = np.column_stack([expected_acceptance(lam[:, 0], v) for v in s2[0]])
    assert np.all(np.diff(values, axis=1) <= 1e-12)
    np.testing.assert_allclose(expected_acceptance(lam[:, 0], 1e-12), values[:, 0], atol=1e-5)


def test_expected_acceptance_is_finite_for_extreme_ratios():
    values = expected_acceptance(np.array([-800.0, 800.0]), 4.0)
    assert np.all(np.isfinite(values))
    assert values[0] < 1e-300 and values[1] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="noise_var"):
        expected_acceptance(0.0, -1.0)


def _records(ones: int, zeros: int) -> np.ndarray:
    return np.concatenate([np.ones(ones), np.zeros(zeros)])[:, None]


@pytest.mark.parametrize(("neighbour", "sensitivity"), [("replace_one", 2.0), ("add_remove", 1.0)])
def test_pseudo_counts_noise_has_the_laplace_scale(neighbour, sensitivity):
    """Both counts get Laplace(Δ₁/ε) noise (Δ₁ = 2 replace-one, 1 add/remove): mean 0 and
    E|noise| = b. Counts of 500 with b ≤ 4 are never clamped in 800 releases."""
    model = build_model({"name": "bernoulli"})
    rng = np.random.default_rng(3)
    records = _records(500, 500)
    noise = np.array(
        [
            baselines.laplace_pseudo_counts(
                rng, model, records, 0.5, neighbour=neighbour, draws=1
            ).released
            - 500.0
            for _ in range(800)
        ]
    )
    b = sensitivity / 0.5
    se_mean = np.sqrt(2.0) * b / np.sqrt(len(noise))  # Laplace sd √2 b
    assert np.all(np.abs(noise.mean(axis=0)) < Z * se_mean)
    se_abs = b / np.sqrt(len(noise))  # sd of |X| is b
    assert np.all(np.abs(np.abs(noise).mean(axis=0) - b) < Z * se_abs)
    # the two counts are noised independently (one shared draw would correlate them fully)
    assert abs(np.corrcoef(noise.T)[0, 1]) < Z / np.sqrt(len(noise))


def test_pseudo_counts_are_clamped_and_draws_follow_the_beta_posterior():
    model = build_model({"name": "bernoulli", "theta_bound": 10.0})
    rng = np.random.default_rng(4)
    clamped = [
        baselines.laplace_pseudo_counts(
            rng, model, _records(0, 3), 0.1, neighbour="replace_one", draws=1
        ).released
        for _ in range(200)
    ]
    assert np.min(clamped) == 0.0 and np.mean(np.array(clamped)[:, 0] == 0.0) > 0.3
    # with ε huge the noise vanishes: draws are Beta(1 + 30, 1 + 70)
    result = baselines.laplace_pseudo_counts(
        rng, model, _records(30, 70), 1e9, neighbour="replace_one", draws=20_000
    )
    p = special.expit(result.theta[:, 0])
    exact = stats.beta(31, 71)
    assert abs(p.mean() - exact.mean()) < Z * exact.std() / np.sqrt(p.size)
    assert stats.kstest(p, exact.cdf).pvalue > 1e-4


def test_pseudo_counts_refuse_bad_arguments():
    model = build_model({"name": "bernoulli"})
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="neighbour"):
        baselines.laplace_pseudo_counts(rng, model, _records(1, 1), 1.0, neighbour="x", draws=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="epsilon"):
        baselines.laplace_pseudo_counts(
            rng, model, _records(1, 1), 0.0, neighbour="replace_one", draws=1
        )
