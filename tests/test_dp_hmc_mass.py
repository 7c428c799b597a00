"""DP-HMC's mass matrix adapted in warmup, diagonal and dense (docs/design.md §2.9, "Mass
matrix").

The targets are an anisotropic Gaussian (posterior sds 1 and 0.01 along the two axes) and a
correlated one (sds 1 and 0.05, correlation −0.97) whose "owners" answer the exact
log-likelihood gradient and ratio plus Gaussian noise with known variance, so the chain's
target is that Gaussian exactly and the penalty correction applies.
The exactness standard is tests/test_samplers.py's: each coordinate's mean and sd within
Z = 4.5 MCSE (arviz-stats, autocorrelation accounted for) of the closed form; fixed seeds.
"""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest
from arviz_stats.base import array_stats
from test_dp_hmc import crash_and_resume, small_run
from test_samplers import Z, z_scores

from fedpenalty.config import load_scenario
from fedpenalty.coordinator import dp_hmc
from fedpenalty.coordinator.adapt import MassAdaptation, StepAdaptation, mass_windows
from fedpenalty.coordinator.driver import sample
from fedpenalty.errors import ConfigError
from fedpenalty.models import build_model

#: a flat-ish prior (sd 100) and a box far from the mass: the likelihood sets the posterior
WIDE = build_model(
    {"name": "gaussian_mean", "dim": 2, "data_bound": 1.0, "theta_bound": 50.0, "prior_sd": 100.0}
)
LIK_MEAN, LIK_SD = np.array([0.5, -0.2]), np.array([1.0, 0.01])
GRAD_SD, RATIO_SD = 1.0, 0.5  # nats per unit θ; nats (s² = 0.25)


def posterior() -> SimpleNamespace:
    """The closed form: N(LIK_MEAN, LIK_SD²) times the prior N(0, 100²), per coordinate."""
    precision = 1 / LIK_SD**2 + 1 / 100.0**2
    return SimpleNamespace(mean=LIK_MEAN / LIK_SD**2 / precision, sd=1 / np.sqrt(precision))


def noisy_sums(seed: int):
    """(grad, ratio) of the Gaussian likelihood with noise of the declared variances."""
    noise = np.random.default_rng(seed)

    def log_lik(theta):
        return -0.5 * np.sum(((theta - LIK_MEAN) / LIK_SD) ** 2, axis=1)

    def grad(iteration, substep, chains, theta):
        g = -(theta - LIK_MEAN) / LIK_SD**2
        return g + GRAD_SD * noise.standard_normal(theta.shape), np.full(len(chains), GRAD_SD**2)

    def ratio(iteration, chains, theta, theta_prop):
        lam = log_lik(theta_prop) - log_lik(theta) + RATIO_SD * noise.standard_normal(len(chains))
        return lam, np.full(len(chains), RATIO_SD**2)

    return grad, ratio


def adapted_run(
    sums, ref, adapt_mass: bool | str, seed: int, warmup: int, iterations: int, steps: int
):
    """4 chains of DP-HMC on the answers ``sums`` (full jitter, step adapted to 0.65,
    ``steps`` leapfrog steps) from over-dispersed starts around ``ref``, M adapted in Stan's
    windows over the whole warmup when ``adapt_mass`` (its ``sampler.adapt_mass`` values)."""
    grad, ratio = sums
    algo = dp_hmc.kernel(
        WIDE,
        grad,
        ratio,
        StepAdaptation.start(1.0, 0.65),
        leapfrog_steps=steps,
        step_jitter=1.0,
        adapt=True,
        windows=mass_windows(0, warmup) if adapt_mass else (),
        mass=dp_hmc.MASS_SHAPES.get(adapt_mass, "diag"),
    )
    rng = np.random.default_rng(seed)
    theta0 = ref.mean + 2.0 * ref.sd * rng.standard_normal((4, 2))  # over-dispersed starts
    return sample(algo, rng, theta0, iterations=iterations, warmup=warmup, progress=False), ref


def run(adapt_mass: bool | str, seed: int = 0, warmup: int = 400, iterations: int = 1000):
    """The anisotropic Gaussian, L = 5."""
    return adapted_run(noisy_sums(seed + 1), posterior(), adapt_mass, seed, warmup, iterations, 5)


def rhat(draws: np.ndarray) -> np.ndarray:
    return np.atleast_1d(array_stats.rhat(draws, chain_axis=0, draw_axis=1))


def test_an_adapted_mass_matrix_samples_an_anisotropic_gaussian_that_mass_i_does_not():
    """With M = I the step must fit the 0.01-sd axis, so in 1,000 iterations the 1-sd axis
    does not mix (R-hat > 1.1 asserted, measured 2.7); with the adapted M the same run meets
    the Z-MCSE standard, R-hat < 1.01 and M⁻¹ matches the posterior variances (normalised, the
    smaller 1): the wide axis's ratio 1e4 within a factor 1.5, the estimate's spread from
    4 chains × 200 autocorrelated window draws plus the 1e-3 × 5/(n + 5) shrink (+6% on the
    narrow variance)."""
    plain, ref = run(adapt_mass=False)
    assert rhat(plain.theta).max() > 1.1, rhat(plain.theta)
    adapted, _ = run(adapt_mass=True)
    z = z_scores(adapted.theta, ref)
    assert z.max() < Z, z
    assert rhat(adapted.theta).max() < 1.01, rhat(adapted.theta)
    inv_mass = adapted.state.metric.inv_mass
    expected = ref.sd**2 / (ref.sd**2).min()
    assert inv_mass[1] == 1.0
    assert 1 / 1.5 < inv_mass[0] / expected[0] < 1.5, (inv_mass, expected)


def exact_sums():
    """(grad, ratio) of the Gaussian likelihood with no noise (s_g² = s² = 0)."""

    def log_lik(theta):
        return -0.5 * np.sum(((theta - LIK_MEAN) / LIK_SD) ** 2, axis=1)

    def grad(iteration, substep, chains, theta):
        return -(theta - LIK_MEAN) / LIK_SD**2, np.zeros(len(chains))

    def ratio(iteration, chains, theta, theta_prop):
        return log_lik(theta_prop) - log_lik(theta), np.zeros(len(chains))

    return grad, ratio


def accept_probs() -> np.ndarray:
    """One noise-free iteration of 16 chains at M⁻¹ = the posterior variances (smallest 1):
    every axis then has period 2π/100, and 30 steps of 0.0005 are a quarter of it."""
    grad, ratio = exact_sums()
    ref = posterior()
    inv_mass = ref.sd**2 / (ref.sd**2).min()
    rng = np.random.default_rng(3)
    state = dp_hmc.init(ref.mean + ref.sd * rng.standard_normal((16, 2)), WIDE, grad)
    metric = MassAdaptation(inv_mass, 0, np.zeros(2), np.zeros(2))
    state = dataclasses.replace(state, metric=metric)
    _, info = dp_hmc.step(rng, state, WIDE, grad, ratio, 0.0005, 30, 0.0)
    return info.accept_prob


def test_the_accept_ratio_uses_the_inverse_mass_in_the_kinetic_energy(monkeypatch):
    """The leapfrog conserves H = U + ½pᵀM⁻¹p to O(ε²): with no noise every trajectory is
    accepted with probability > 0.99 (measured ≥ 0.997). A kinetic energy with M instead of
    M⁻¹, or with I, misses the wide axis's kinetic change (up to nats: p there has sd 0.01
    and M⁻¹ = 1e4), by a sign that varies: some of the 16 trajectories are then mostly
    rejected (smallest acceptance < 0.5 asserted; measured 0.019, mean 0.79)."""
    assert accept_probs().min() > 0.99, accept_probs()
    for wrong in (
        lambda p, inv: 0.5 * np.sum(p**2 / inv, axis=1),
        lambda p, inv: 0.5 * np.sum(p**2, axis=1),
    ):
        monkeypatch.setattr(dp_hmc, "kinetic_energy", wrong)
        assert accept_probs().min() < 0.5, accept_probs()


def test_stans_windows_double_and_the_last_stretches_to_the_final_buffer():
    assert mass_windows(50, 500) == ((125, 150), (150, 200), (200, 450))
    assert mass_windows(0, 100) == ((15, 90),)  # 15% / 75% / 10% below 150 iterations
    assert mass_windows(10, 29) == ()


@pytest.mark.parametrize(
    ("sets", "names"),
    [
        (["sampler.adapt_mass='yes'"], "sampler.adapt_mass"),
        (["sampler.adapt_mass='Dense'"], "sampler.adapt_mass must be true, false, 'diag' or"),
        (["sampler.adapt_mass=1"], "sampler.adapt_mass"),
        (["sampler.adapt_mass=true", "sampler.warmup=25"], "sampler.warmup"),
        (["sampler.adapt_mass='dense'", "sampler.warmup=25"], "sampler.warmup"),
    ],
)
def test_bad_adapt_mass_settings_are_refused_naming_the_key(sets, names):
    with pytest.raises(ConfigError, match=names):
        load_scenario(None, ["sampler.algorithm='dp_hmc'", *sets])


def test_a_resumed_chain_with_an_adapting_mass_matrix_equals_the_uninterrupted_one(tmp_path):
    """The mass matrix and its window's sums survive a checkpoint taken inside the window
    (iteration 30 of the window [10, 37)): the resumed chain gives the same draws."""

    def run(oracle, **kwargs):
        return small_run(oracle, warmup=40, iterations=20, adapt_mass=True, **kwargs)

    reference, _, saved, resumed, _ = crash_and_resume(tmp_path, run)
    assert not np.allclose(reference.state.metric.inv_mass, 1.0)  # a mass was estimated
    assert saved.done == 30 and saved.state.metric.count == 2 * 20, saved.state.metric
    np.testing.assert_array_equal(resumed.theta, reference.theta)
    np.testing.assert_array_equal(resumed.state.metric.inv_mass, reference.state.metric.inv_mass)


def test_a_checkpoint_older_than_the_mass_matrix_resumes_with_mass_i(tmp_path):
    """A DP-HMC checkpoint written before states carried ``metric`` (its ``state.metric.*``
    entries removed) still loads — the field takes its default, the identity the run had — and
    resumes to the uninterrupted run's draws; without the default it would fail to load."""
    from fedpenalty.coordinator import checkpoint

    def run(oracle, **kwargs):
        return small_run(oracle, **kwargs)

    holder = {}

    def resumed_from_old(oracle, resume=None, **kwargs):
        if resume is None:
            return run(oracle, **kwargs)
        old = tmp_path / "old.npz"
        checkpoint.save(old, resume)
        with np.load(old) as f:
            meta = json.loads(str(f["meta"]))
            arrays = {k: f[k] for k in f.files if k != "meta" and not k.startswith("state.metric")}
        meta["state_scalars"] = {
            k: v for k, v in meta["state_scalars"].items() if not k.startswith("state.metric")
        }
        assert any(k.startswith("state.metric") for k in np.load(old).files)  # it was written
        np.savez(old, meta=np.array(json.dumps(meta)), **arrays)
        holder["loaded"] = checkpoint.load(old)
        return run(oracle, resume=holder["loaded"], **kwargs)

    reference, _, _, resumed, _ = crash_and_resume(tmp_path, resumed_from_old)
    np.testing.assert_array_equal(holder["loaded"].state.metric.inverse(2), np.ones(2))
    np.testing.assert_array_equal(resumed.theta, reference.theta)


def test_diag_is_true_and_both_keep_the_chains_of_before_the_dense_option():
    """``adapt_mass`` false and true give the draws main gave before the dense option existed
    (Σθ, Σθ² and M⁻¹ of 200 warmup + 100 kept iterations of ``run``, recorded from commit
    465114e, where the chains were also compared bit for bit; a relative 1e-9 leaves room for
    another CPU's last-bit rounding, while any change to the diagonal path's arithmetic moves
    an accept decision and these sums by far more), and "diag" is true exactly."""
    pins = {
        False: (510.43224948562164, 1424.7262375123955, [1.0, 1.0]),
        True: (159.38361409764786, 545.6875081872363, [10224.776654415817, 1.0]),
    }
    for adapt_mass, (total, squares, inv_mass) in pins.items():
        result, _ = run(adapt_mass, warmup=200, iterations=100)
        theta = result.theta
        np.testing.assert_allclose([theta.sum(), (theta**2).sum()], [total, squares], rtol=1e-9)
        np.testing.assert_allclose(result.state.metric.inverse(2), inv_mass, rtol=1e-9)
    diag, _ = run("diag", warmup=200, iterations=100)
    np.testing.assert_array_equal(diag.theta, run(True, warmup=200, iterations=100)[0].theta)


# ------------------------------------------------------------- dense mass matrix (dense_e)

#: The correlated likelihood: N(CORR_MEAN, CORR_COV), sds 1 and 0.05, correlation −0.97.
RHO, CORR_MEAN, CORR_SD = -0.97, np.array([0.5, -0.2]), np.array([1.0, 0.05])
CORR_COV = np.outer(CORR_SD, CORR_SD) * np.array([[1.0, RHO], [RHO, 1.0]])


def correlated() -> SimpleNamespace:
    """The closed-form posterior: the likelihood's precision plus the prior's 1/100²."""
    cov = np.linalg.inv(np.linalg.inv(CORR_COV) + np.eye(2) / 100.0**2)
    mean = cov @ np.linalg.solve(CORR_COV, CORR_MEAN)
    return SimpleNamespace(mean=mean, sd=np.sqrt(np.diag(cov)), cov=cov)


def correlated_sums(seed: int | None, grad_sd: float = GRAD_SD, ratio_sd: float = RATIO_SD):
    """(grad, ratio) of the correlated likelihood with noise of the declared variances (none
    when ``seed`` is None)."""
    noise = np.random.default_rng(seed)
    precision = np.linalg.inv(CORR_COV)
    g_sd, r_sd = (0.0, 0.0) if seed is None else (grad_sd, ratio_sd)

    def log_lik(theta):
        dev = theta - CORR_MEAN
        return -0.5 * np.sum((dev @ precision) * dev, axis=1)

    def grad(iteration, substep, chains, theta):
        g = -(theta - CORR_MEAN) @ precision + g_sd * noise.standard_normal(theta.shape)
        return g, np.full(len(chains), g_sd**2)

    def ratio(iteration, chains, theta, theta_prop):
        lam = log_lik(theta_prop) - log_lik(theta) + r_sd * noise.standard_normal(len(chains))
        return lam, np.full(len(chains), r_sd**2)

    return grad, ratio


def correlated_run(mass: str, seed: int = 0, warmup: int = 300, iterations: int = 300):
    """The correlated Gaussian, L = 3, M of shape ``mass``."""
    sums = correlated_sums(seed + 1)
    return adapted_run(sums, correlated(), mass, seed, warmup, iterations, 3)


def preconditioned_condition(inv_mass: np.ndarray, cov: np.ndarray) -> float:
    """The condition number of the posterior covariance in the metric, L⁻¹ Σ L⁻ᵀ with
    M⁻¹ = LLᵀ (1: M⁻¹ ∝ Σ; the leapfrog's step is set by the narrowest direction of this)."""
    chol = np.linalg.cholesky(np.diag(inv_mass) if inv_mass.ndim == 1 else inv_mass)
    whitened = np.linalg.solve(chol, np.linalg.solve(chol, cov).T)
    return float(np.linalg.cond(whitened))


def test_a_dense_mass_matrix_samples_a_correlated_gaussian_that_a_diagonal_one_does_not():
    """ρ = −0.97, sds 1 and 0.05: a diagonal M leaves condition number (1 + 0.97)/0.03 = 66 in
    the metric, so in 300 kept iterations of L = 3 the chains have not mixed (seed 2: R-hat
    > 1.1 asserted, measured 1.21; bulk ESS < 50, measured 15; seeds 0–3 gave R-hat 1.08–1.78,
    ESS 6–50); the dense M whitens it (condition < 2 asserted, measured 1.1) and the same run
    meets the Z-MCSE standard, R-hat < 1.02 (measured 1.012; seeds 0–3 1.004–1.015), bulk ESS
    > 300 (measured 587; seeds 0–3 385–622) and both sds within 10% of the closed form (3
    standard errors at ESS 400; measured ≤ 1.7%). M⁻¹ is Σ̂ scaled to smallest eigenvalue 1:
    its implied correlation is within 0.02 of the posterior's −0.970 (measured −0.9696; seeds
    0–3 −0.960 to −0.980, 4 chains × 200 autocorrelated window draws) and its variance ratio
    within a factor 1.25 of the posterior's 400 (measured 409; seeds 0–3 387–423)."""
    diag, ref = correlated_run("diag", seed=2)
    assert rhat(diag.theta).max() > 1.1, rhat(diag.theta)
    assert ess(diag.theta).min() < 50, ess(diag.theta)
    assert preconditioned_condition(diag.state.metric.inv_mass, ref.cov) > 30
    dense, _ = correlated_run("dense", seed=2)
    z = z_scores(dense.theta, ref)
    assert z.max() < Z, z
    assert rhat(dense.theta).max() < 1.02, rhat(dense.theta)
    assert ess(dense.theta).min() > 300, ess(dense.theta)
    sd_ratio = dense.theta.std(axis=(0, 1), ddof=1) / ref.sd
    assert np.all(np.abs(sd_ratio - 1) < 0.1), sd_ratio
    inv_mass = dense.state.metric.inv_mass
    assert inv_mass.shape == (2, 2) and np.allclose(inv_mass, inv_mass.T)
    assert np.isclose(np.linalg.eigvalsh(inv_mass)[0], 1.0)
    assert preconditioned_condition(inv_mass, ref.cov) < 2, inv_mass
    implied = inv_mass[0, 1] / np.sqrt(inv_mass[0, 0] * inv_mass[1, 1])
    posterior_rho = ref.cov[0, 1] / (ref.sd[0] * ref.sd[1])
    assert abs(implied - posterior_rho) < 0.02, (implied, posterior_rho)
    ratio, expected = inv_mass[0, 0] / inv_mass[1, 1], ref.sd[0] ** 2 / ref.sd[1] ** 2
    assert 1 / 1.25 < ratio / expected < 1.25, (ratio, expected)


def ess(draws: np.ndarray) -> np.ndarray:
    return np.atleast_1d(array_stats.ess(draws, chain_axis=0, draw_axis=1))


def dense_accept_probs() -> np.ndarray:
    """One noise-free iteration of 16 chains at M⁻¹ = Σ/λ_min (the posterior covariance, its
    smallest eigenvalue λ_min scaled to 1): every direction then has period 2π·sd_min = 0.076,
    and 30 steps of 0.0006 are a quarter of it."""
    grad, ratio = correlated_sums(None)
    ref = correlated()
    inv_mass = ref.cov / np.linalg.eigvalsh(ref.cov)[0]
    rng = np.random.default_rng(3)
    chol = np.linalg.cholesky(ref.cov)
    state = dp_hmc.init(ref.mean + rng.standard_normal((16, 2)) @ chol.T, WIDE, grad)
    metric = MassAdaptation(inv_mass, 0, np.zeros(2), np.zeros((2, 2)))
    state = dataclasses.replace(state, metric=metric)
    _, info = dp_hmc.step(rng, state, WIDE, grad, ratio, 0.0006, 30, 0.0)
    return info.accept_prob


def test_the_dense_accept_ratio_uses_the_inverse_mass_in_the_kinetic_energy(monkeypatch):
    """With no noise the leapfrog under the dense M conserves H to O(ε²): every trajectory is
    accepted with probability > 0.99 (measured ≥ 0.997). A kinetic energy with M instead of
    M⁻¹, or with I, misses the kinetic change along the wide direction (p there has sd
    ~0.01 and M⁻¹'s eigenvalue there ~6,800), so some of the 16 trajectories are mostly
    rejected (smallest acceptance < 0.5 asserted; measured 0.019 with either)."""
    assert dense_accept_probs().min() > 0.99, dense_accept_probs()
    for wrong in (
        lambda p, inv: 0.5 * np.sum(p * np.linalg.solve(inv, p.T).T, axis=1),
        lambda p, inv: 0.5 * np.sum(p**2, axis=1),
    ):
        monkeypatch.setattr(dp_hmc, "kinetic_energy", wrong)
        assert dense_accept_probs().min() < 0.5, dense_accept_probs()


def test_dense_momenta_have_covariance_m():
    """p = L⁻ᵀz with M⁻¹ = LLᵀ has Cov p = M: 200,000 draws at a correlated M⁻¹ give
    M⁻¹·Cov(p) = I within 0.02 per entry (the sampling error of a covariance entry from
    2e5 draws is ~0.3%·√2; a p drawn as Lz, Cov M⁻¹, would give M⁻² entries far from I)."""
    inv_mass = np.array([[4.0, -1.9], [-1.9, 1.0]])
    z = np.random.default_rng(7).standard_normal((200_000, 2))
    p = dp_hmc.momentum(z, inv_mass)
    np.testing.assert_allclose(inv_mass @ np.cov(p.T), np.eye(2), atol=0.02)


def test_a_resumed_chain_with_an_adapting_dense_mass_matrix_equals_the_uninterrupted_one(
    tmp_path,
):
    """The dense M⁻¹ and the window's sum of outer products survive a checkpoint taken inside
    the window (iteration 30 of [10, 37)): the resumed chain gives the same draws and M⁻¹."""

    def run(oracle, **kwargs):
        return small_run(oracle, warmup=40, iterations=20, adapt_mass="dense", **kwargs)

    reference, _, saved, resumed, _ = crash_and_resume(tmp_path, run)
    assert reference.state.metric.inv_mass.shape == (2, 2)
    assert not np.allclose(reference.state.metric.inv_mass, np.eye(2))  # a mass was estimated
    assert saved.done == 30 and saved.state.metric.count == 2 * 20, saved.state.metric
    assert saved.state.metric.m2.shape == (2, 2) and saved.state.metric.m2[0, 1] != 0
    np.testing.assert_array_equal(resumed.theta, reference.theta)
    np.testing.assert_array_equal(resumed.state.metric.inv_mass, reference.state.metric.inv_mass)
