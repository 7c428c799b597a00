"""Tests of fedpenalty.coordinator.sgmcmc: the owners' noise counted as injected noise, the
reported excess, reflection into Θ, the owner's gradient answer, and convergence of SGLD, SGHMC
and SGNHT towards the reference posterior as the step shrinks. All seeds are fixed."""

from __future__ import annotations

import math

import numpy as np
import pytest
from owners import SimulatedOwner, owner_gradient, owner_noise_variance, simulated_gradient
from scipy import stats

from fedpenalty.coordinator import sghmc, sgld, sgnht
from fedpenalty.coordinator import sgmcmc as sg
from fedpenalty.coordinator.reference import exact_mh_draws
from fedpenalty.models import Reference, build_model

# ------------------------------------------------------------------ noise bookkeeping
#
# A zero-gradient setting: gaussian_mean with prior mean 0, all records at x = 0, and every
# chain at θ = 0, so ∇log p = 0 and every per-record gradient (x − θ)/σ² is 0. Each owner then
# returns exactly its N(0, (σ C)² I) noise, and the one-step displacement (SGLD) or new
# momentum (SGHMC/SGNHT, from zero momentum) is pure noise: owners' part + injected part.
# With N = 20 000 chains × d = 3 coordinates of iid Gaussian draws, (N d − 1) S²/v ~ χ² under
# the claimed total variance v. We accept when S²/v lies between the 1e-6 and 1 − 1e-6
# quantiles (false-alarm rate 2e-6 per check, a relative band of about ±2.8%). Dropping the
# subtraction (injecting the full design variance) moves the variance by the owners' share,
# which is 40-60% here, far outside the band. The sabotage test below checks that.

N_CHAINS = 20_000
DIM = 3


def _chi2_ok(sample: np.ndarray, variance: float, alpha: float = 1e-6) -> bool:
    df = sample.size - 1
    ratio = np.var(sample, ddof=1) / variance
    lo, hi = stats.chi2.ppf(alpha, df) / df, stats.chi2.isf(alpha, df) / df
    return bool(lo <= ratio <= hi)


def _zero_gradient_setup(
    sigma: float, q: float = 0.5, clip: float = 2.0, declared_factor: float = 1.0
):
    model = build_model({"name": "gaussian_mean", "dim": DIM, "prior_mean": 0.0})
    owners = [SimulatedOwner(np.zeros((n, DIM)), q, clip, sigma) for n in (30, 50)]
    grad = simulated_gradient(model, owners, np.random.default_rng(11))
    s2 = owner_noise_variance(owners)

    def declared(iteration, chains, theta):  # owners that add s² but declare declared_factor·s²
        g, v = grad(iteration, chains, theta)
        return g, v * declared_factor

    return model, declared, s2, np.zeros((N_CHAINS, DIM))


def _one_step(kernel: str, eta: float, friction: float, sigma: float, declared_factor: float = 1.0):
    """(displacement or new momentum (N, d), info, design variance)."""
    model, grad, s2, theta = _zero_gradient_setup(sigma, declared_factor=declared_factor)
    rng = np.random.default_rng(5)
    sch = sg.StepSchedule.constant(eta)
    h = math.sqrt(eta)
    if kernel == "sgld":
        state, info = sgld.step(rng, sgld.init(theta, model), model, sch, grad)
        return state.theta - theta, info, eta, s2
    if kernel == "sghmc":
        start = sghmc.SGHMCState(theta, np.zeros_like(theta))
        state, info = sghmc.step(rng, start, model, sch, grad, friction)
        return state.momentum, info, 2 * friction * h, s2
    start = sgnht.SGNHTState(theta, np.zeros_like(theta), np.full(N_CHAINS, friction))
    state, info = sgnht.step(rng, start, model, sch, grad, friction)
    return state.momentum, info, 2 * friction * h, s2


# owners: 2 × (σ·2/0.5)² = 32σ². SGLD owner share (η/2)²·s²/η = 8ησ²; SGHMC/SGNHT share
# h²s²/(2Ch) = 16 hσ²/C. Each case below has an owner share of 40-60%.
FITS = [("sgld", 0.01, None, 2.5), ("sghmc", 0.01, 2.0, 0.75), ("sgnht", 0.01, 2.0, 0.75)]


@pytest.mark.parametrize("kernel, eta, friction, sigma", FITS)
def test_total_noise_equals_design_variance_when_owner_noise_fits(kernel, eta, friction, sigma):
    moved, info, design, s2 = _one_step(kernel, eta, friction, sigma)
    owner = ((eta / 2) ** 2 if kernel == "sgld" else eta) * s2
    assert 0.4 < owner / design < 0.6
    np.testing.assert_allclose(info.owner_noise_var, s2)
    np.testing.assert_allclose(info.owner_var, owner)
    np.testing.assert_allclose(info.injected_var, design - owner)
    assert np.all(info.excess_noise_ratio == 0.0)
    assert not info.reflected.any()
    assert _chi2_ok(moved, design)
    # mean zero: |mean| within 5 standard errors
    assert abs(moved.mean()) < 5 * math.sqrt(design / moved.size)


@pytest.mark.parametrize("kernel, eta, friction, sigma", FITS)
def test_bookkeeping_check_catches_misdeclared_noise(kernel, eta, friction, sigma):
    # Owners that add s² but declare s²/10: the kernel injects nearly the full design variance
    # on top of the owners' noise, and the same χ² check must reject it.
    moved, _, design, _ = _one_step(kernel, eta, friction, sigma, declared_factor=0.1)
    assert not _chi2_ok(moved, design)


@pytest.mark.parametrize(
    "kernel, eta, friction, sigma",
    [("sgld", 0.01, None, 6.0), ("sghmc", 0.01, 0.5, 0.7), ("sgnht", 0.01, 0.5, 0.7)],
)
def test_excess_is_reported_and_nothing_injected(kernel, eta, friction, sigma):
    moved, info, design, s2 = _one_step(kernel, eta, friction, sigma)
    owner = ((eta / 2) ** 2 if kernel == "sgld" else eta) * s2
    assert owner > design
    np.testing.assert_allclose(info.injected_var, 0.0)
    np.testing.assert_allclose(info.excess_noise_ratio, owner / design - 1.0)
    assert _chi2_ok(moved, owner)  # all the noise is the owners'


# ------------------------------------------------------------------ schedule, reflection


def test_step_schedule():
    assert sg.StepSchedule.constant(0.3)(0) == sg.StepSchedule.constant(0.3)(10**6) == 0.3
    sch = sg.StepSchedule(a=2.0, b=10.0, gamma=0.55)
    for t in (0, 1, 99):
        assert sch(t) == pytest.approx(2.0 * (10.0 + t) ** -0.55)
    for bad in [
        dict(a=0.0),
        dict(a=1.0, gamma=-1.0),
        dict(a=1.0, b=0.0, gamma=0.5),
        dict(a=float("inf")),
    ]:
        with pytest.raises(ValueError):
            sg.StepSchedule(**bad)


def test_reflect_folds_into_the_box():
    theta = np.array([[0.3, 4.5, -4.25], [4.0, 13.0, -12.5]])
    folded, k = sg.reflect(theta, 4.0)
    # 4.5 → 3.5 (one fold); −4.25 → −3.75; 13 → 13 − 16 = −3 (two folds: 4 → −4 → −3)
    # −12.5 → −12.5 + 16 = 3.5 (two folds)
    np.testing.assert_allclose(folded, [[0.3, 3.5, -3.75], [4.0, -3.0, 3.5]])
    assert np.all(np.abs(folded) <= 4.0)
    np.testing.assert_array_equal(np.abs(k), [[0, 1, 1], [1, 2, 2]])


def test_sghmc_bounces_off_the_boundary():
    model = build_model({"name": "gaussian_mean", "dim": 1, "theta_bound": 1.0})
    zero = lambda it, ch, th: (np.zeros_like(th), np.zeros(len(th)))  # noqa: E731
    state = sghmc.SGHMCState(np.array([[0.95]]), np.array([[1.0]]))
    new, info = sghmc.step(
        np.random.default_rng(0), state, model, sg.StepSchedule.constant(0.01), zero, 1e-6
    )
    # h = 0.1: θ + h r = 0.95 + ~0.1 → reflected to ~0.95, momentum reversed
    assert new.theta[0, 0] == pytest.approx(0.95, abs=2e-3)
    assert new.momentum[0, 0] < 0 and info.reflected[0]


def test_friction_limits_and_bad_gradients():
    model = build_model({"name": "gaussian_mean", "dim": 1})
    zero = lambda it, ch, th: (np.zeros_like(th), np.zeros(len(th)))  # noqa: E731
    rng = np.random.default_rng(0)
    sch = sg.StepSchedule.constant(0.04)  # h = 0.2
    hmc = sghmc.init(rng, np.zeros((2, 1)), model)
    with pytest.raises(ValueError, match="per-step friction"):
        sghmc.step(rng, hmc, model, sch, zero, 6.0)  # hC = 1.2
    nht = sgnht.init(rng, np.zeros((2, 1)), model, 3.0)
    with pytest.raises(ValueError, match="per-step friction"):
        sgnht.step(rng, nht, model, sch, zero, 3.0)  # hA = 0.6
    bad = lambda it, ch, th: (np.full_like(th, np.nan), np.zeros(len(th)))  # noqa: E731
    with pytest.raises(ValueError, match="finite"):
        sgld.step(rng, sgld.init(np.zeros((2, 1)), model), model, sch, bad)
    with pytest.raises(ValueError, match="inside"):
        sgld.init(np.full((1, 1), 99.0), model)


# ------------------------------------------------------------------ the owner's answer


def test_owner_gradient_full_sample_no_noise_is_exact_sum():
    model = build_model({"name": "logistic", "dim": 2})
    rng = np.random.default_rng(1)
    records = model.simulate_records(rng, np.array([1.0, -1.0]), 40)
    theta = np.array([[0.5, 0.2], [-1.0, 2.0]])
    got = owner_gradient(model, records, theta, rng, 1.0, 10.0, 0.0)
    np.testing.assert_allclose(got, model.grad_log_lik(records, theta).sum(axis=1))


def test_owner_gradient_clips_each_record():
    model = build_model({"name": "gaussian_mean", "dim": 2})
    records = np.array([[3.0, 0.0], [0.0, 0.5], [-2.0, -2.0]])
    theta = np.zeros((1, 2))
    got = owner_gradient(model, records, theta, np.random.default_rng(0), 1.0, 1.0, 0.0)
    # per-record gradients x − θ: norms 3, 0.5, 2.83 → clipped to norm ≤ 1
    expected = np.array([1.0, 0.0]) + np.array([0.0, 0.5]) + np.array([-1.0, -1.0]) / math.sqrt(2)
    np.testing.assert_allclose(got[0], expected)


def test_owner_gradient_poisson_sum_is_unbiased():
    # E[answer / q] = Σ clipped gradients. 20 000 independent answers (one per chain row);
    # the mean must be within 5 standard errors of the exact sum in each coordinate.
    model = build_model({"name": "gaussian_mean", "dim": 2})
    records = model.simulate_records(np.random.default_rng(2), np.array([1.0, -0.5]), 25)
    theta = np.tile([0.2, 0.1], (20_000, 1))
    q, sigma, clip = 0.3, 1.0, 10.0
    answers = owner_gradient(model, records, theta, np.random.default_rng(3), q, clip, sigma) / q
    exact = model.grad_log_lik(records, theta[:1]).sum(axis=1)[0]
    se = answers.std(axis=0, ddof=1) / math.sqrt(len(answers))
    assert np.all(np.abs(answers.mean(axis=0) - exact) < 5 * se)


def test_owner_gradient_validates():
    model = build_model({"name": "gaussian_mean", "dim": 1})
    rng = np.random.default_rng(0)
    for q, clip, sigma in [(0.0, 1.0, 1.0), (1.5, 1.0, 1.0), (0.5, 0.0, 1.0), (0.5, 1.0, -1.0)]:
        with pytest.raises(ValueError):
            owner_gradient(model, np.zeros((3, 1)), np.zeros((1, 1)), rng, q, clip, sigma)


# ------------------------------------------------------------------ convergence as the step shrinks
#
# Error of a run: max over coordinates of |mean − ref mean|/ref sd + |sd/ref sd − 1|. Each
# kernel runs at a step η and at η/4 with the same seeds, 64 chains started at the reference
# mean, 500 warm-up + 2500 kept iterations, on in-process owners (Poisson rate 0.8, clip,
# σ = 1; the owners' noise fits under the design noise in every run).
#
# Required: err(η/4) < err(η), and err(η/4) below a tolerance. The tolerance is about the
# predicted discretisation bias at η/4 plus 3-4 Monte Carlo standard errors (MCSE ≈ 1% of the
# sd for the means and less for the sds; for logistic the exact-MH reference adds ≤ 0.7%).
# Predicted biases (for logistic, take the curvature k ≈ 1/sd²):
# - SGLD: the Gaussian target's AR(1) stationary variance is τ²/(1 − ηk/4), plus the
#   Poisson-subsampling noise, both O(η): about +3% in sd at η/4.
# - SGHMC: O(η) likewise, about +5% in sd at η/4 on gaussian_mean.
# - SGNHT: O(hA) = O(√η), because the thermostat's kinetic target leaves a variance
#   τ²(1 − hA/2): about −2% in sd at η/4 on gaussian_mean.
# Observed, with these seeds (big step → small step): gaussian_mean SGLD 0.151 → 0.049,
# SGHMC 0.144 → 0.056, SGNHT 0.064 → 0.022; logistic SGLD 0.196 → 0.043, SGHMC 0.203 → 0.067,
# SGNHT 0.112 → 0.037. Wrong drift scaling (η instead of η/2: half the temperature) or a sign
# error gives O(1) errors at both steps.


def _run(
    kernel: str,
    model,
    owners,
    theta0,
    eta: float,
    friction: float | None,
    seed: int,
    warmup: int = 500,
    iterations: int = 2500,
) -> np.ndarray:
    rng = np.random.default_rng(seed)
    grad = simulated_gradient(model, owners, np.random.default_rng(seed + 1))
    sch = sg.StepSchedule.constant(eta)
    if kernel == "sgld":
        state = sgld.init(theta0, model)
        step = lambda s: sgld.step(rng, s, model, sch, grad)  # noqa: E731
    elif kernel == "sghmc":
        state = sghmc.init(rng, theta0, model)
        step = lambda s: sghmc.step(rng, s, model, sch, grad, friction)  # noqa: E731
    else:
        state = sgnht.init(rng, theta0, model, friction)
        step = lambda s: sgnht.step(rng, s, model, sch, grad, friction)  # noqa: E731
    draws = np.empty((len(theta0), iterations, model.dim))
    for t in range(warmup + iterations):
        state, info = step(state)
        assert np.all(info.excess_noise_ratio == 0.0)
        if t >= warmup:
            draws[:, t - warmup] = state.theta
    return draws


def _error(draws: np.ndarray, ref: Reference) -> float:
    mean = draws.mean(axis=(0, 1))
    sd = draws.std(axis=(0, 1), ddof=1)
    return float(np.max(np.abs(mean - ref.mean) / ref.sd + np.abs(sd / ref.sd - 1.0)))


@pytest.fixture(scope="module")
def gaussian_problem():
    model = build_model({"name": "gaussian_mean", "dim": 2})
    rng = np.random.default_rng(1)
    records = [model.simulate_records(rng, np.array([0.5, -0.3]), n) for n in (60, 40)]
    ref = model.reference_posterior(np.concatenate(records))
    owners = [SimulatedOwner(r, 0.8, 4.0, 1.0) for r in records]
    return model, owners, ref


@pytest.fixture(scope="module")
def logistic_problem():
    # reference: exact MH on the pooled records, 8 chains × 20 000 draws (MCSE of the mean
    # and sd below 0.7% of the sd)
    model = build_model({"name": "logistic", "dim": 2})
    rng = np.random.default_rng(3)
    records = [model.simulate_records(rng, np.array([1.5, -1.0]), n) for n in (50, 30)]
    draws = exact_mh_draws(model, np.concatenate(records), np.random.default_rng(5), 8, 20_000)
    ref = Reference(draws.mean(axis=(0, 1)), draws.std(axis=(0, 1), ddof=1), "exact_mh")
    owners = [SimulatedOwner(r, 0.8, 1.0, 1.0) for r in records]
    return model, owners, ref


# kernel, big step, friction, tolerance at the small step
GAUSSIAN = [("sgld", 0.008, None, 0.08), ("sghmc", 0.004, 5.0, 0.09), ("sgnht", 0.004, 2.0, 0.05)]
LOGISTIC = [("sgld", 0.2, None, 0.08), ("sghmc", 0.1, 1.0, 0.11), ("sgnht", 0.05, 1.0, 0.08)]


@pytest.mark.parametrize("kernel, eta, friction, tol", GAUSSIAN)
def test_gaussian_mean_approaches_posterior_as_step_shrinks(
    gaussian_problem, kernel, eta, friction, tol
):
    model, owners, ref = gaussian_problem
    theta0 = np.tile(ref.mean, (64, 1))
    big = _error(_run(kernel, model, owners, theta0, eta, friction, 7), ref)
    small = _error(_run(kernel, model, owners, theta0, eta / 4, friction, 7), ref)
    assert small < big
    assert small < tol


@pytest.mark.parametrize("kernel, eta, friction, tol", LOGISTIC)
def test_logistic_approaches_posterior_as_step_shrinks(
    logistic_problem, kernel, eta, friction, tol
):
    model, owners, ref = logistic_problem
    theta0 = np.tile(ref.mean, (64, 1))
    big = _error(_run(kernel, model, owners, theta0, eta, friction, 7), ref)
    small = _error(_run(kernel, model, owners, theta0, eta / 4, friction, 7), ref)
    assert small < big
    assert small < tol


def test_decaying_schedule_runs_and_reports_step():
    model = build_model({"name": "bernoulli"})
    records = model.simulate_records(np.random.default_rng(0), np.array([0.5]), 200)
    grad = simulated_gradient(
        model, [SimulatedOwner(records, 0.5, 1.0, 1.0)], np.random.default_rng(1)
    )
    sch = sg.StepSchedule(a=0.05, b=10.0, gamma=0.6)
    rng = np.random.default_rng(2)
    state = sgnht.init(rng, np.zeros((4, 1)), model, 1.0)
    for t in range(50):
        state, info = sgnht.step(rng, state, model, sch, grad, 1.0)
        assert info.step == pytest.approx(0.05 * (10.0 + t) ** -0.6)
    assert state.iteration == 50 and np.all(np.abs(state.theta) <= model.theta_bound)
