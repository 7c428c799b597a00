"""The coordinator's free update of prior-only coordinates (fedpenalty/coordinator/prior_gibbs.py,
docs/design.md §2.9 "Prior-only coordinates")."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from fedpenalty.coordinator import dp_hmc, prior_gibbs

#: the toy prior's precision matrix (θ₀, θ₁) and the box |θ₁| ≤ BOX that truncates θ₁
PRECISION, BOX = np.array([[1.0, -0.8], [-0.8, 4.0]]), 0.6


class CorrelatedPrior:
    """Only what ``prior_gibbs`` uses of a model: a correlated Gaussian log prior, and Θ =
    {|θ₁| ≤ 0.6}, so θ₁ | θ₀ ~ N(0.2 θ₀, 0.5²) truncated to [−0.6, 0.6]."""

    def log_prior(self, theta: np.ndarray) -> np.ndarray:
        return -0.5 * np.einsum("ci,ij,cj->c", theta, PRECISION, theta)

    def in_theta_space(self, theta: np.ndarray) -> np.ndarray:
        return np.abs(theta[:, 1]) <= BOX


def test_slice_draws_follow_the_truncated_prior_conditional():
    """3,000 chains at each of θ₀ = −2, 0, 2 (the conditional mean 0.2θ₀ moves against the box),
    20 sweeps from θ₁ = 0: the chains' θ₁ pass a KS test against the exact truncated normal at
    p > 1e-3 (each group independent draws; the false alarm is 1e-3 a group), θ₀ is untouched
    and the returned log prior is the model's at the new point. Ignoring the box fails it
    (draws outside), and so does a slice level of log p − 2·Exp(1) in place of log p − Exp(1),
    which samples p^½ (KS p ≈ 1e-25 when tried)."""
    model, rng = CorrelatedPrior(), np.random.default_rng(0)
    theta0 = np.repeat([-2.0, 0.0, 2.0], 3000)
    theta = np.column_stack([theta0, np.zeros_like(theta0)])
    log_prior = model.log_prior(theta)
    for _ in range(20):
        theta, log_prior = prior_gibbs.update(rng, theta, log_prior, model, (1,))
    assert np.array_equal(theta[:, 0], theta0)
    np.testing.assert_allclose(log_prior, model.log_prior(theta), rtol=0, atol=1e-12)
    assert np.all(np.abs(theta[:, 1]) <= BOX)
    for value in (-2.0, 0.0, 2.0):
        mean, sd = 0.2 * value, 0.5
        exact = stats.truncnorm((-BOX - mean) / sd, (BOX - mean) / sd, loc=mean, scale=sd)
        p = stats.kstest(theta[theta0 == value, 1], exact.cdf).pvalue
        assert p > 1e-3, (value, p)


def test_no_coordinates_changes_nothing_and_draws_no_numbers():
    model, rng = CorrelatedPrior(), np.random.default_rng(1)
    theta = np.array([[0.1, 0.2], [-0.3, 0.4]])
    new, log_prior = prior_gibbs.update(rng, theta, model.log_prior(theta), model, ())
    assert np.array_equal(new, theta) and np.array_equal(log_prior, model.log_prior(theta))
    assert rng.random() == np.random.default_rng(1).random()


def test_dp_hmc_refuses_a_model_whose_prior_only_coordinate_is_in_the_likelihood():
    """A wrong declaration would make the prior-only update sample the wrong posterior: the
    spot check on simulated records refuses it, naming the coordinate and what to change;
    indices outside θ are refused too."""
    from fedpenalty.errors import ConfigError
    from fedpenalty.models.gaussian_mean import GaussianMean

    class Declares(GaussianMean):
        def __init__(self, coords: tuple[int, ...]) -> None:
            super().__init__(dim=2)
            self._coords = coords

        @property
        def prior_only_coordinates(self) -> tuple[int, ...]:
            return self._coords

    with pytest.raises(ConfigError, match=r"coordinate\(s\) \[1\].*prior_only_coordinates"):
        dp_hmc.check_prior_only(Declares((1,)))
    with pytest.raises(ConfigError, match=r"distinct coordinates 0\.\.1"):
        dp_hmc.check_prior_only(Declares((2,)))
    dp_hmc.check_prior_only(Declares(()))  # nothing declared: nothing to check
