"""Tests of DP-SGFS (fedpenalty.coordinator.sgfs, docs/design.md §2.11): on a Gaussian model
the chain is linear, so its stationary law is known in closed form (a discrete Lyapunov
equation), and the tests check the two regimes the paper describes — at small η the posterior,
at large η the normal approximation with the variance the gradient noise leaves. All seeds are
fixed."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import linalg, stats

from fedpenalty.coordinator import sgfs
from fedpenalty.coordinator import sgmcmc as sg
from fedpenalty.models import build_model

DIM, N_RECORDS, Q, F = 2, 200, 0.5, 1.0
CHAINS = 4000


def _setup(seed: int = 3):
    """gaussian_mean (d = 2, noise sd 1, prior N(0, 3²)), 200 records around (0.3, −0.2)."""
    model = build_model({"name": "gaussian_mean", "dim": DIM, "prior_sd": 3.0})
    rng = np.random.default_rng(seed)
    records = rng.normal([0.3, -0.2], 1.0, size=(N_RECORDS, DIM))
    precision = (N_RECORDS + 1.0 / 9.0) * np.eye(DIM)
    mean = records.sum(axis=0) / (N_RECORDS + 1.0 / 9.0)
    return model, records, precision, mean


def _exact_sums(model, records, s2: float, rng: np.random.Generator) -> sgfs.FisherFn:
    """Owners stand-in: the full-data gradient sum plus N(0, s²) per coordinate (declared), and
    the exact Σ ∇ℓ ∇ℓᵀ. With a Gaussian gradient noise of known variance the chain is a linear
    Gaussian recursion; Poisson subsampling would make the noise depend on θ."""

    total, scatter = records.sum(axis=0), records.T @ records
    n = len(records)
    theta0 = np.zeros((1, DIM))  # the closed form below is gaussian_mean's gradient (sd 1)
    assert np.allclose(model.grad_log_lik(records, theta0).sum(axis=1), total)

    def fn(iteration, chains, theta):  # Σ(x − θ) and Σ(x − θ)(x − θ)ᵀ in O(d²) per chain
        lik = total - n * theta + np.sqrt(s2) * rng.standard_normal(theta.shape)
        cross = np.einsum("ci,j->cij", theta, total)
        outer = (
            scatter - cross - np.swapaxes(cross, 1, 2) + n * np.einsum("ci,cj->cij", theta, theta)
        )
        return lik, outer, np.full(len(chains), s2), np.zeros(len(chains))

    return fn


def _stationary(precision, fisher, eta: float, s2: float):
    """Stationary covariance of θ − μ ← A(θ − μ) + Bξ: A = I − 2M⁻¹P, B = 2M⁻¹,
    ξ ~ N(0, max(4f²/η, s²) I), M = (1 + 1/q)Ĵ + 4f²/η I."""
    design = 4 * F**2 / eta
    m = (1 + 1 / Q) * fisher + design * np.eye(DIM)
    b = 2 * np.linalg.inv(m)
    a = np.eye(DIM) - b @ precision
    return linalg.solve_discrete_lyapunov(a, max(design, s2) * b @ b.T)


def _run(eta: float, s2: float, steps: int, seed: int = 7, sabotage=None):
    model, records, precision, mean = _setup()
    rng = np.random.default_rng(seed)
    start = rng.multivariate_normal(mean, np.linalg.inv(precision), size=CHAINS)
    config = sgfs.SGFSConfig(sg.StepSchedule.constant(eta), F, Q, N_RECORDS)
    fn = _exact_sums(model, records, s2, np.random.default_rng(seed + 1))
    if sabotage is not None:
        fn = sabotage(fn)
    state = sgfs.init(start, model)
    for _ in range(steps):
        state, info = sgfs.step(rng, state, model, config, fn)
    return state, info, precision, mean


def _law_ok(draws, mean, cov, alpha=1e-4) -> tuple[bool, str]:
    """Mean: Hotelling-style χ²₂ test of the average against ``mean`` with covariance cov/n;
    covariance: each coordinate's sample variance in its χ² band, and the correlation's
    Fisher z within 4 standard errors. False-alarm rate ~1e-4 per check."""
    n = len(draws)
    diff = draws.mean(axis=0) - mean
    t2 = float(diff @ np.linalg.solve(cov / n, diff))
    ok = t2 < stats.chi2.isf(alpha, DIM)
    ratios = np.var(draws, axis=0, ddof=1) / np.diag(cov)
    lo, hi = stats.chi2.ppf(alpha, n - 1) / (n - 1), stats.chi2.isf(alpha, n - 1) / (n - 1)
    ok &= bool(np.all((lo <= ratios) & (ratios <= hi)))
    rho = np.corrcoef(draws.T)[0, 1]
    rho0 = cov[0, 1] / np.sqrt(cov[0, 0] * cov[1, 1])
    ok &= abs(np.arctanh(rho) - np.arctanh(rho0)) * np.sqrt(n - 3) < 4
    return bool(ok), f"T²={t2:.2f} variance ratios={ratios} ρ={rho:.3f} vs {rho0:.3f}"


# Small η: 4f²/η = 40,000 against (1 + 1/q)Ĵ ≈ 600, so M ≈ 4f²/η and the step is Langevin with
# step η/(4f²)·2 — its stationary law is the posterior up to O(η): the closed form differs
# from P⁻¹ by < 1.5% here, inside the χ² band (about ±6% at 4,000 draws). The owners' noise s² is
# half the design noise: forgetting to subtract it (injecting the full 4f²/η) makes the
# variance 1.5× the posterior's, far outside the band (the sabotage case below).
SMALL_ETA, SMALL_S2 = 1e-4, 2e4


def test_small_step_samples_the_posterior():
    state, info, precision, mean = _run(SMALL_ETA, SMALL_S2, 400)
    ok, why = _law_ok(state.theta, mean, np.linalg.inv(precision))
    assert ok, why
    np.testing.assert_allclose(info.injected_var, 4 * F**2 / SMALL_ETA - SMALL_S2)
    assert not info.excess_noise_ratio.any()


def test_small_step_detects_uncounted_owner_noise():
    """Sabotage: owners that add s² but declare 0 (so the kernel injects the full design
    noise on top): the variance is 1.5× the posterior's and the test above fails."""

    def undeclared(fn):
        def wrapped(iteration, chains, theta):
            lik, outer, s2, sf = fn(iteration, chains, theta)
            return lik, outer, np.zeros_like(s2), sf

        return wrapped

    state, _, precision, mean = _run(SMALL_ETA, SMALL_S2, 400, sabotage=undeclared)
    ok, why = _law_ok(state.theta, mean, np.linalg.inv(precision))
    assert not ok, why


# Large η: 4f²/η = 0.4 against (1 + 1/q)Ĵ ≈ 600: the chain samples the normal approximation
# centred at the mode with covariance given by M and the gradient noise. With gradient noise
# s² = (1/q − 1)·n per coordinate (what Poisson subsampling at rate q gives on this model),
# the stationary variance is ≈ (1 − q)/n — half the posterior's here; the owners' privacy noise
# on top makes it larger ("a normal approximation with larger variance").
LARGE_ETA = 10.0


@pytest.mark.parametrize("s2", [(1 / Q - 1) * N_RECORDS, 4 * N_RECORDS])
def test_large_step_samples_the_normal_approximation(s2):
    state, info, precision, mean = _run(LARGE_ETA, s2, 60)
    cov = _stationary(precision, state.fisher[0], LARGE_ETA, s2)
    ok, why = _law_ok(state.theta, mean, cov)
    assert ok, why
    assert info.excess_noise_ratio.min() > 0  # the owners' noise exceeds the design noise
    # and it is not the posterior: the variance ratio is far from 1
    ratio = np.diag(cov) * np.diag(precision)
    assert np.all(np.abs(ratio - 1) > 0.3), ratio
    posterior_ok, _ = _law_ok(state.theta, mean, np.linalg.inv(precision))
    assert not posterior_ok


def test_fisher_estimate_is_the_running_average_of_projected_v():
    """κ_t = 1/(t + 1) makes Ĵ_t the plain average of V_0 … V_t; V is S − GGᵀ/N projected on
    the PSD cone (a negative eigenvalue of the noisy S − GGᵀ/N is set to 0)."""
    model, _, _, _ = _setup()
    config = sgfs.SGFSConfig(sg.StepSchedule.constant(1e-3), F, Q, 10)
    outers = [np.diag([4.0, -1.0]), np.array([[2.0, 1.0], [1.0, 2.0]]), np.diag([1.0, 1.0])]
    state = sgfs.init(np.zeros((1, DIM)), model)
    projected = []
    for t, outer in enumerate(outers):

        def fn(iteration, chains, theta, outer=outer):
            return np.zeros((1, DIM)), outer[None], np.zeros(1), np.zeros(1)

        state, _ = sgfs.step(np.random.default_rng(t), state, model, config, fn)
        values, vectors = np.linalg.eigh(outer)
        projected.append(vectors @ np.diag(np.maximum(values, 0)) @ vectors.T)
    np.testing.assert_allclose(state.fisher[0], np.mean(projected, axis=0), atol=1e-12)
    assert np.allclose(projected[0], np.diag([4.0, 0.0]))


def test_bad_settings_raise():
    with pytest.raises(ValueError, match="sampling rate"):
        sgfs.SGFSConfig(sg.StepSchedule.constant(1.0), 1.0, 0.0, 10)
    with pytest.raises(ValueError, match="fisher_decay"):
        sgfs.SGFSConfig(sg.StepSchedule.constant(1.0), 1.0, 0.5, 10, kappa_decay=2.0)
