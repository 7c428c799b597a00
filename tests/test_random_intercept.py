"""The random_intercept hierarchical model (docs/design.md §6, "Hierarchical models (design)"):
its prior, box and local model, and its deterministic reference posterior."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from fedpenalty.errors import ConfigError
from fedpenalty.models.random_intercept import RandomIntercept

COUNTS = (30, 60, 120, 240)


def _owners(model: RandomIntercept, seed: int = 0, counts=COUNTS):
    """z_true (μ = 0.5, τ = 0.7) and each owner's records."""
    rng = np.random.default_rng(seed)
    z = model.simulate_blocks(rng, np.array([0.5, math.log(0.7)]), len(counts))
    return z, [model.simulate_owner_records(rng, z, k, n) for k, n in enumerate(counts)]


def test_prior_gradient_and_box():
    model, k = RandomIntercept(), 3
    rng = np.random.default_rng(1)
    z = np.column_stack(
        [rng.uniform(-2, 2, 5), rng.uniform(-2, 0.5, 5), rng.uniform(-1, 1, (5, k))]
    )
    h = 1e-6
    for j in range(z.shape[1]):
        e = np.zeros_like(z)
        e[:, j] = h
        num = (model.log_prior(z + e, k) - model.log_prior(z - e, k)) / (2 * h)
        np.testing.assert_allclose(model.grad_log_prior(z, k)[:, j], num, rtol=1e-6, atol=1e-6)
    # the prior of log τ is the half-normal density of τ times its Jacobian τ
    t = z[:, 1]
    expected = (
        stats.halfnorm.logpdf(np.exp(t)) + t - k * t - 0.5 * (z[:, 2:] ** 2).sum(1) / np.exp(2 * t)
    )
    mu = -0.5 * (z[:, 0] / 10.0) ** 2
    diff = model.log_prior(z, k) - (expected + mu)
    np.testing.assert_allclose(diff, diff[0])  # equal up to a constant
    assert model.in_theta_space(z, k).all()
    outside = z.copy()
    outside[0, 1] = math.log(2.5)  # τ above tau_max
    outside[1, 2] = 12.5  # a block beyond b_bound
    outside[2, 0] = np.nan
    assert model.in_theta_space(outside, k).tolist() == [False, False, False, True, True]


def test_local_model_is_what_each_owner_reads():
    model = RandomIntercept()
    z, records = _owners(model)
    phi = model.local_params(z[None, :], len(COUNTS))
    assert phi.shape == (len(COUNTS), 1, 1)
    np.testing.assert_allclose(phi[:, 0, 0], z[0] + z[2:])
    local = model.local_model()
    assert local.name == "gaussian_mean" and local.dim == 1
    assert local.theta_bound == model.mu_bound + model.b_bound
    corner = np.array([[model.mu_bound, model.log_tau_box[1], *[model.b_bound] * 4]])
    assert local.in_theta_space(model.local_params(corner, 4)[:, 0]).all()
    # owner k's log-likelihood at φ_k is the model's: Σ_i log N(y_ki; μ + b_k, σ²)
    for k, rec in enumerate(records):
        direct = stats.norm.logpdf(rec[:, 0], z[0] + z[2 + k], 1.0).sum()
        assert local.log_lik(rec, phi[k]).sum() == pytest.approx(direct, rel=1e-12)


def test_bad_boxes_are_refused_naming_the_key():
    with pytest.raises(ConfigError, match="b_bound"):
        RandomIntercept(b_bound=5.0)  # < 6·tau_max = 12
    with pytest.raises(ConfigError, match="tau_min"):
        RandomIntercept(tau_min=3.0)
    with pytest.raises(ConfigError, match="unknown key 'dim'"):
        RandomIntercept(dim=2)
    _, records = _owners(RandomIntercept())
    with pytest.raises(ValueError, match=r"model\.mu_bound"):
        RandomIntercept(mu_bound=0.6).reference_posterior(records)


def _gibbs(model: RandomIntercept, records, chains: int, iters: int, seed: int) -> np.ndarray:
    """Exact Metropolis-within-Gibbs on z given the records (no privacy, no owners): μ and each
    b_k from their Gaussian conditionals, log τ by random-walk MH on its box. ``(chains, iters,
    2 + K)`` after a burn-in of iters/5."""
    rng = np.random.default_rng(seed)
    n = np.array([len(r) for r in records], dtype=float)
    ysum = np.array([r.sum() for r in records])
    k = len(records)
    lo, hi = model.log_tau_box
    mu, lt, b = np.zeros(chains), np.full(chains, -0.5), np.zeros((chains, k))

    def log_target_tau(t):
        tau2 = np.exp(2 * t)
        return -0.5 * tau2 + t - k * t - 0.5 * (b * b).sum(1) / tau2

    out = np.empty((chains, iters, 2 + k))
    for i in range(iters + iters // 5):
        prec = 1 / 100.0 + n.sum()
        mean = (ysum - n * b).sum(1) / prec
        mu = mean + rng.standard_normal(chains) / math.sqrt(prec)
        tau2 = np.exp(2 * lt)[:, None]
        bprec = n + 1 / tau2
        b = (ysum - n * mu[:, None]) / bprec + rng.standard_normal((chains, k)) / np.sqrt(bprec)
        prop = lt + 0.5 * rng.standard_normal(chains)
        inside = (prop >= lo) & (prop <= hi)
        acc = inside & (np.log(rng.random(chains)) < log_target_tau(prop) - log_target_tau(lt))
        lt = np.where(acc, prop, lt)
        if i >= iters // 5:
            out[:, i - iters // 5] = np.column_stack([mu, lt, b])
    return out


def test_reference_matches_an_exact_gibbs_sampler():
    """The quadrature reference against an independent exact sampler (conditionals, not the
    marginal of τ): 400 chains × 1500 draws; each coordinate's |z| = |mean − ref| / MCSE < 4.5
    (MCSE from the spread of the 400 chain means, which are independent), and the sd within
    3% (its MCSE is ~1% with ≥ 10,000 effective draws). A wrong conditional variance or a
    missing Jacobian moves log τ's mean by several tenths."""
    model = RandomIntercept()
    _, records = _owners(model)
    ref = model.reference_posterior(records)
    assert ref.source == "closed_form" and ref.mean.shape == (6,)
    draws = _gibbs(model, records, chains=400, iters=1500, seed=3)
    chain_means = draws.mean(axis=1)
    mcse = chain_means.std(axis=0, ddof=1) / math.sqrt(len(chain_means))
    z = (chain_means.mean(axis=0) - ref.mean) / mcse
    assert np.all(np.abs(z) < 4.5), (z, ref.mean)
    sd = draws.reshape(-1, 6).std(axis=0)
    np.testing.assert_allclose(sd, ref.sd, rtol=0.03)


def test_reference_is_deterministic_and_pools_as_the_records_say():
    model = RandomIntercept()
    _, records = _owners(model)
    a, b = model.reference_posterior(records), model.reference_posterior(records)
    np.testing.assert_array_equal(a.mean, b.mean)
    # many records per owner: b_k's posterior concentrates on ȳ_k − μ
    _, big = _owners(model, seed=2, counts=(20000, 20000, 20000))
    ref = model.reference_posterior(big)
    ybar = np.array([r.mean() for r in big])
    np.testing.assert_allclose(ref.mean[0] + ref.mean[2:], ybar, atol=1e-3)
