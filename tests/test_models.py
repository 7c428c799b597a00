"""Tests of fedpenalty.models: Lipschitz bounds, gradients, exponential-family identities,
sensitivities, reference posteriors, record preparation and ``build_model``."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import integrate, special, stats

from fedpenalty.errors import ConfigError, DataError
from fedpenalty.models import (
    MODELS,
    Bernoulli,
    ExpFamModel,
    GaussianMean,
    Logistic,
    Model,
    Poisson,
    Reference,
    build_model,
)

# Several parameter settings per model, including dim 3 and the Poisson regime where
# count_bound - e^-B (not e^B) is the binding term of L.
SETTINGS: list[dict] = [
    {"name": "gaussian_mean"},
    {
        "name": "gaussian_mean",
        "dim": 3,
        "noise_sd": 0.5,
        "data_bound": 2.0,
        "theta_bound": 3.0,
        "prior_mean": 0.5,
        "prior_sd": 2.0,
    },
    {"name": "gaussian_mean", "dim": 2, "noise_sd": 2.0, "data_bound": 1.0, "theta_bound": 0.5},
    {"name": "bernoulli"},
    {"name": "bernoulli", "theta_bound": 2.0, "prior_a": 2.0, "prior_b": 0.5},
    {"name": "poisson"},
    {
        "name": "poisson",
        "count_bound": 10,
        "theta_bound": 2.0,
        "prior_shape": 2.0,
        "prior_rate": 0.5,
    },
    {"name": "poisson", "count_bound": 3, "theta_bound": 0.5},
    {"name": "logistic"},
    {"name": "logistic", "dim": 3, "data_bound": 2.0, "theta_bound": 1.0, "prior_sd": 0.7},
    {"name": "logistic", "dim": 1, "data_bound": 3.0, "theta_bound": 2.0},
]
EXPFAM_SETTINGS = [s for s in SETTINGS if s["name"] != "logistic"]


def _id(s: dict) -> str:
    return "-".join(f"{v}" for v in s.values())


def sign_vectors(d: int) -> np.ndarray:
    """All 2^d vectors of ±1: ``(2^d, d)``."""
    return np.array(list(itertools.product([-1.0, 1.0], repeat=d)))


def ball_extremes(rng: np.random.Generator, d: int, radius: float) -> np.ndarray:
    """Points of the ball: ±radius·e_i, the scaled sign corners on the sphere, the origin,
    random points on the sphere and inside."""
    pts = [
        radius * np.eye(d),
        -radius * np.eye(d),
        radius * sign_vectors(d) / math.sqrt(d),
        np.zeros((1, d)),
    ]
    g = rng.standard_normal((20, d))
    pts.append(radius * g / np.linalg.norm(g, axis=1, keepdims=True))
    g = rng.standard_normal((20, d))
    pts.append(radius * rng.random((20, 1)) * g / np.linalg.norm(g, axis=1, keepdims=True))
    return np.vstack(pts)


def domain_records(m: Model, rng: np.random.Generator) -> np.ndarray:
    """Records of the data domain including its extremes (all on the boundary where it has one)."""
    if isinstance(m, GaussianMean):
        return ball_extremes(rng, m.dim, m.data_bound)
    if isinstance(m, Bernoulli):
        return np.array([[0.0], [1.0]])
    if isinstance(m, Poisson):
        k = m.count_bound
        return np.array(
            [[0.0], [1.0], [k - 1.0], [float(k)]] + [[float(v)] for v in rng.integers(0, k + 1, 10)]
        )
    if isinstance(m, Logistic):
        x = ball_extremes(rng, m.dim, m.data_bound)
        return np.vstack(
            [np.column_stack([x, np.zeros(len(x))]), np.column_stack([x, np.ones(len(x))])]
        )
    raise AssertionError(m)


def theta_points(m: Model, rng: np.random.Generator) -> np.ndarray:
    """Points of Θ: all corners, the origin, points on faces and random interior points."""
    b, d = m.theta_bound, m.dim
    corners = b * sign_vectors(d)
    face = rng.uniform(-b, b, (10, d))
    face[np.arange(10), rng.integers(0, d, 10)] = b * rng.choice([-1.0, 1.0], 10)
    return np.vstack([corners, np.zeros((1, d)), face, rng.uniform(-b, b, (20, d))])


def grid_moments(log_dens: np.ndarray, grid: np.ndarray) -> tuple[float, float]:
    """Mean and sd of a 1-D density given by its log on a fine grid (Simpson's rule)."""
    w = np.exp(log_dens - log_dens.max())
    z = integrate.simpson(w, x=grid)
    mean = integrate.simpson(grid * w, x=grid) / z
    var = integrate.simpson((grid - mean) ** 2 * w, x=grid) / z
    return float(mean), float(math.sqrt(var))


def log_h(m: ExpFamModel, records: np.ndarray) -> np.ndarray:
    """log h(x), computed independently of the model code."""
    if isinstance(m, GaussianMean):
        return -np.sum(records**2, axis=1) / (2 * m.noise_sd**2) - 0.5 * m.dim * math.log(
            2 * math.pi * m.noise_sd**2
        )
    if isinstance(m, Bernoulli):
        return np.zeros(len(records))
    if isinstance(m, Poisson):
        return -np.array([math.lgamma(v + 1.0) for v in records[:, 0]])
    raise AssertionError(m)


def scipy_log_lik(m: Model, records: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """ℓ(x, θ) from scipy.stats densities: ``(C, n)``."""
    if isinstance(m, GaussianMean):
        return stats.norm.logpdf(records[None, :, :], theta[:, None, :], m.noise_sd).sum(axis=2)
    if isinstance(m, Bernoulli):
        return stats.bernoulli.logpmf(records[None, :, 0], special.expit(theta[:, :1]))
    if isinstance(m, Poisson):
        return stats.poisson.logpmf(records[None, :, 0], np.exp(theta[:, :1]))
    if isinstance(m, Logistic):
        p = special.expit(theta @ records[:, :-1].T)
        return stats.bernoulli.logpmf(records[None, :, -1], p)
    raise AssertionError(m)


@pytest.fixture(params=SETTINGS, ids=_id)
def model(request) -> Model:
    return build_model(request.param)


@pytest.fixture(params=EXPFAM_SETTINGS, ids=_id)
def expfam(request) -> ExpFamModel:
    m = build_model(request.param)
    assert isinstance(m, ExpFamModel)
    return m


# --- Lipschitz bound -----------------------------------------------------------------------------


def test_lipschitz_bounds_log_lik_differences(model: Model) -> None:
    rng = np.random.default_rng(1)
    records = domain_records(model, rng)
    th = theta_points(model, rng)
    i, j = np.meshgrid(np.arange(len(th)), np.arange(len(th)), indexing="ij")
    theta, theta_prop = th[i.ravel()], th[j.ravel()]
    diff = model.log_lik_diff(records, theta, theta_prop)
    assert diff.shape == (len(theta), len(records))
    bound = model.lipschitz * np.linalg.norm(theta_prop - theta, axis=1)
    assert np.all(np.abs(diff) <= bound[:, None] + 1e-9)
    # log_lik_diff agrees with two evaluations of log_lik
    direct = model.log_lik(records, theta_prop) - model.log_lik(records, theta)
    np.testing.assert_allclose(diff, direct, rtol=1e-10, atol=1e-9)


def test_lipschitz_bounds_gradient_and_is_attained(model: Model) -> None:
    rng = np.random.default_rng(2)
    records = domain_records(model, rng)
    theta = theta_points(model, rng)
    g = model.grad_log_lik(records, theta)
    assert g.shape == (len(theta), len(records), model.dim)
    norms = np.linalg.norm(g, axis=2)
    L = model.lipschitz
    assert np.all(norms <= L * (1 + 1e-12) + 1e-12)
    # not loose: the worst-case corners attain L (the brief's floor is 0.5 L; these are tight)
    assert norms.max() >= 0.5 * L
    assert norms.max() >= L * (1 - 1e-9)


def test_lipschitz_values() -> None:
    assert GaussianMean(
        dim=3, noise_sd=0.5, data_bound=2.0, theta_bound=3.0
    ).lipschitz == pytest.approx((2.0 + 3.0 * math.sqrt(3)) / 0.25)
    assert Bernoulli(theta_bound=6.0).lipschitz == pytest.approx(1 / (1 + math.exp(-6.0)))
    assert Poisson(count_bound=50, theta_bound=5.0).lipschitz == pytest.approx(math.exp(5.0))
    assert Poisson(count_bound=3, theta_bound=0.5).lipschitz == pytest.approx(3 - math.exp(-0.5))
    assert Logistic(dim=2, data_bound=1.0, theta_bound=5.0).lipschitz == pytest.approx(
        special.expit(5 * math.sqrt(2))
    )


def test_log_ratio_sensitivity(model: Model) -> None:
    L = model.lipschitz
    np.testing.assert_allclose(
        model.log_ratio_sensitivity(np.array([0.1, 0.3]), "replace_one"), [0.2 * L, 0.6 * L]
    )
    assert float(model.log_ratio_sensitivity(0.3, "add_remove")) == pytest.approx(0.3 * L)


# --- likelihood values and gradients -------------------------------------------------------------


def test_log_lik_matches_scipy_density(model: Model) -> None:
    rng = np.random.default_rng(3)
    records = domain_records(model, rng)
    theta = theta_points(model, rng)
    ll = model.log_lik(records, theta)
    assert ll.shape == (len(theta), len(records))
    np.testing.assert_allclose(ll, scipy_log_lik(model, records, theta), rtol=1e-10, atol=1e-10)


def test_grad_log_lik_finite_differences(model: Model) -> None:
    rng = np.random.default_rng(4)
    records = model.prepare_records(domain_records(model, rng))
    b = model.theta_bound
    theta = rng.uniform(-0.9 * b, 0.9 * b, (6, model.dim))
    g = model.grad_log_lik(records, theta)
    h = 1e-5 * max(b, 1.0)
    for k in range(model.dim):
        e = np.zeros(model.dim)
        e[k] = h
        fd = (model.log_lik(records, theta + e) - model.log_lik(records, theta - e)) / (2 * h)
        np.testing.assert_allclose(g[:, :, k], fd, rtol=1e-6, atol=1e-6 * model.lipschitz)


def test_grad_log_prior_finite_differences(model: Model) -> None:
    rng = np.random.default_rng(5)
    b = model.theta_bound
    theta = np.vstack([rng.uniform(-b, b, (8, model.dim)), b * sign_vectors(model.dim)])
    lp = model.log_prior(theta)
    assert lp.shape == (len(theta),)
    g = model.grad_log_prior(theta)
    assert g.shape == theta.shape
    h = 1e-6 * max(b, 1.0)
    for k in range(model.dim):
        e = np.zeros(model.dim)
        e[k] = h
        fd = (model.log_prior(theta + e) - model.log_prior(theta - e)) / (2 * h)
        np.testing.assert_allclose(g[:, k], fd, rtol=1e-6, atol=1e-6)


def test_log_prior_is_the_stated_density(model: Model) -> None:
    """log_prior equals the stated prior (with the Jacobian of the reparameterisation) up to a
    constant."""
    rng = np.random.default_rng(6)
    b = model.theta_bound
    theta = rng.uniform(-b, b, (30, model.dim))
    if isinstance(model, GaussianMean):
        ref = stats.norm.logpdf(theta, model.prior_mean, model.prior_sd).sum(axis=1)
    elif isinstance(model, Logistic):
        ref = stats.norm.logpdf(theta, 0.0, model.prior_sd).sum(axis=1)
    elif isinstance(model, Bernoulli):
        p = special.expit(theta[:, 0])
        ref = stats.beta.logpdf(p, model.prior_a, model.prior_b) + np.log(p * (1 - p))
    else:
        lam = np.exp(theta[:, 0])
        ref = stats.gamma.logpdf(lam, model.prior_shape, scale=1 / model.prior_rate) + theta[:, 0]
    delta = model.log_prior(theta) - ref
    assert np.ptp(delta) < 1e-9


def test_theta_shape_is_checked(model: Model) -> None:
    records = model.prepare_records(domain_records(model, np.random.default_rng(0)))
    with pytest.raises(ValueError):
        model.log_lik(records, np.zeros(model.dim + 1))
    with pytest.raises(ValueError):
        model.grad_log_lik(records, np.zeros((2, model.dim + 1)))


def test_in_theta_space(model: Model) -> None:
    b = model.theta_bound
    theta = np.array(
        [[b] * model.dim, [b * 1.0001] + [0.0] * (model.dim - 1), [np.nan] * model.dim]
    )
    assert model.in_theta_space(theta).tolist() == [True, False, False]


def test_logistic_log_lik_is_stable_for_large_margins() -> None:
    m = Logistic(dim=1, data_bound=10.0, theta_bound=100.0)
    rec = np.array([[10.0, 1.0], [10.0, 0.0], [-10.0, 1.0], [-10.0, 0.0], [0.4, 1.0], [0.4, 0.0]])
    ll = m.log_lik(rec, np.array([[100.0]]))
    expected = [
        -0.0,
        -1000.0,
        -1000.0,
        -0.0,
        -math.log1p(math.exp(-40.0)),
        -40.0 - math.log1p(math.exp(-40.0)),
    ]
    np.testing.assert_allclose(ll[0], expected, rtol=1e-14, atol=0)
    g = m.grad_log_lik(rec, np.array([[100.0]]))
    assert np.all(np.isfinite(g)) and np.all(np.abs(g) <= m.lipschitz)


# --- exponential families -----------------------------------------------------------------------


def test_expfam_identity(expfam: ExpFamModel) -> None:
    rng = np.random.default_rng(7)
    records = np.vstack(
        [
            domain_records(expfam, rng),
            expfam.simulate_records(rng, np.full(expfam.dim, 0.3 * expfam.theta_bound), 30),
        ]
    )
    theta = theta_points(expfam, rng)
    S = expfam.suff_stat(records)
    eta = expfam.natural_param(theta)
    A = expfam.log_partition(theta)
    assert S.shape == (len(records), expfam.stat_dim)
    assert eta.shape == (len(theta), expfam.stat_dim)
    assert A.shape == (len(theta),)
    expected = eta @ S.T - A[:, None] + log_h(expfam, records)[None, :]
    np.testing.assert_allclose(expfam.log_lik(records, theta), expected, rtol=1e-13, atol=1e-12)
    np.testing.assert_allclose(
        expfam.log_base_measure(records), log_h(expfam, records), rtol=1e-13, atol=1e-13
    )
    # the pooled form used by the coordinator (Algorithm 3)
    theta_prop = theta[::-1]
    pooled = (expfam.natural_param(theta_prop) - eta) @ S.sum(axis=0) - len(records) * (
        expfam.log_partition(theta_prop) - A
    )
    np.testing.assert_allclose(
        expfam.log_lik_diff(records, theta, theta_prop).sum(axis=1), pooled, rtol=1e-10, atol=1e-8
    )


def test_expfam_natural_param_forms(expfam: ExpFamModel) -> None:
    theta = np.linspace(-expfam.theta_bound, expfam.theta_bound, 7 * expfam.dim).reshape(
        7, expfam.dim
    )
    if isinstance(expfam, GaussianMean):
        np.testing.assert_allclose(expfam.natural_param(theta), theta / expfam.noise_sd**2)
        np.testing.assert_allclose(
            expfam.log_partition(theta), (theta**2).sum(1) / (2 * expfam.noise_sd**2)
        )
    elif isinstance(expfam, Bernoulli):
        np.testing.assert_allclose(expfam.natural_param(theta), theta)
        np.testing.assert_allclose(expfam.log_partition(theta), np.log1p(np.exp(theta[:, 0])))
    else:
        np.testing.assert_allclose(expfam.natural_param(theta), theta)
        np.testing.assert_allclose(expfam.log_partition(theta), np.exp(theta[:, 0]))


def test_stat_sensitivity_is_the_sup_over_the_domain(expfam: ExpFamModel) -> None:
    rng = np.random.default_rng(8)
    S = expfam.suff_stat(expfam.prepare_records(domain_records(expfam, rng)))
    pair = S[:, None, :] - S[None, :, :]
    sups = {
        ("replace_one", 2): np.linalg.norm(pair, axis=2).max(),
        ("add_remove", 2): np.linalg.norm(S, axis=1).max(),
        ("replace_one", 1): np.abs(pair).sum(axis=2).max(),
        ("add_remove", 1): np.abs(S).sum(axis=1).max(),
    }
    for (neighbour, order), sup in sups.items():
        sens = (
            expfam.stat_sensitivity(neighbour)
            if order == 2
            else expfam.stat_l1_sensitivity(neighbour)
        )
        assert sens == pytest.approx(sup, rel=1e-12), (neighbour, order)
    # and random in-domain data never exceeds it
    sim = expfam.simulate_records(rng, np.zeros(expfam.dim), 500)
    assert np.linalg.norm(expfam.suff_stat(sim), axis=1).max() <= expfam.stat_sensitivity(
        "add_remove"
    ) * (1 + 1e-12)
    with pytest.raises(ValueError):
        expfam.stat_sensitivity("swap")  # type: ignore[arg-type]


def test_stat_sensitivity_values() -> None:
    g = GaussianMean(dim=4, data_bound=2.5)
    assert (g.stat_sensitivity("replace_one"), g.stat_sensitivity("add_remove")) == (5.0, 2.5)
    assert (g.stat_l1_sensitivity("replace_one"), g.stat_l1_sensitivity("add_remove")) == (
        10.0,
        5.0,
    )
    assert (
        Bernoulli().stat_sensitivity("replace_one")
        == Bernoulli().stat_l1_sensitivity("add_remove")
        == 1.0
    )
    p = Poisson(count_bound=17)
    assert p.stat_sensitivity("replace_one") == p.stat_l1_sensitivity("add_remove") == 17.0


# --- reference posteriors ------------------------------------------------------------------------


def _check_ref(ref: Reference | None, d: int) -> Reference:
    assert isinstance(ref, Reference)
    assert ref.mean.shape == (d,) and ref.sd.shape == (d,)
    assert ref.source == "closed_form"
    return ref


@pytest.mark.parametrize(
    "params, theta0, n",
    [
        ({}, 0.7, 20),  # interior, little truncation
        ({"theta_bound": 0.5, "noise_sd": 2.0}, 1.5, 10),  # posterior piled on the edge
        (
            {"theta_bound": 1.0, "prior_mean": 3.0, "prior_sd": 0.5},
            0.0,
            0,
        ),  # prior only, mean outside Θ
        ({"data_bound": 1.0, "theta_bound": 2.0, "noise_sd": 0.3}, -0.9, 200),
    ],
)
def test_gaussian_reference_against_grid_quadrature(params: dict, theta0: float, n: int) -> None:
    m = GaussianMean(dim=1, **params)
    rng = np.random.default_rng(9)
    records = m.simulate_records(rng, np.array([theta0]), n)
    ref = _check_ref(m.reference_posterior(records), 1)
    grid = np.linspace(-m.theta_bound, m.theta_bound, 40001)
    log_post = m.log_prior(grid[:, None]) + m.log_lik(records, grid[:, None]).sum(axis=1)
    mean, sd = grid_moments(log_post, grid)
    assert ref.mean[0] == pytest.approx(mean, abs=1e-8 * sd + 1e-12)
    assert ref.sd[0] == pytest.approx(sd, rel=1e-7)


def test_gaussian_reference_2d_grid_checks_factorisation() -> None:
    m = GaussianMean(dim=2, theta_bound=1.0, noise_sd=1.5, prior_mean=0.3, prior_sd=0.8)
    rng = np.random.default_rng(10)
    records = m.simulate_records(rng, np.array([0.9, -0.6]), 8)
    ref = _check_ref(m.reference_posterior(records), 2)
    g = np.linspace(-1.0, 1.0, 401)
    t1, t2 = np.meshgrid(g, g, indexing="ij")
    theta = np.column_stack([t1.ravel(), t2.ravel()])
    lp = (m.log_prior(theta) + m.log_lik(records, theta).sum(axis=1)).reshape(401, 401)
    w = np.exp(lp - lp.max())
    z = integrate.simpson(integrate.simpson(w, x=g), x=g)
    for k, t in enumerate((t1, t2)):
        mean = integrate.simpson(integrate.simpson(t * w, x=g), x=g) / z
        var = integrate.simpson(integrate.simpson((t - mean) ** 2 * w, x=g), x=g) / z
        assert ref.mean[k] == pytest.approx(mean, abs=1e-6)
        assert ref.sd[k] == pytest.approx(math.sqrt(var), rel=1e-5)


def test_gaussian_reference_wide_box_is_conjugate() -> None:
    m = GaussianMean(
        dim=3, noise_sd=0.7, data_bound=5.0, theta_bound=1e3, prior_mean=-0.4, prior_sd=1.3
    )
    rng = np.random.default_rng(11)
    records = m.simulate_records(rng, np.array([1.0, -2.0, 0.5]), 50)
    ref = _check_ref(m.reference_posterior(records), 3)
    prec = 1 / 1.3**2 + 50 / 0.7**2
    mean = (-0.4 / 1.3**2 + records.sum(axis=0) / 0.7**2) / prec
    np.testing.assert_allclose(ref.mean, mean, rtol=1e-12)
    np.testing.assert_allclose(ref.sd, np.full(3, prec**-0.5), rtol=1e-12)


def _bernoulli_records(n: int, ones: int) -> np.ndarray:
    return np.r_[np.ones(ones), np.zeros(n - ones)][:, None]


@pytest.mark.parametrize(
    "params, n, ones",
    [
        ({}, 30, 11),
        ({}, 50, 0),  # all zeros
        ({"theta_bound": 2.0, "prior_a": 0.5}, 100, 100),  # mode outside Θ, clipped to the edge
        ({"theta_bound": 6.0, "prior_a": 3.0, "prior_b": 0.2}, 0, 0),  # prior only
        ({"theta_bound": 1.0}, 2000, 700),  # narrow posterior
    ],
)
def test_bernoulli_reference_against_grid(params: dict, n: int, ones: int) -> None:
    m = Bernoulli(**params)
    records = _bernoulli_records(n, ones)
    ref = _check_ref(m.reference_posterior(records), 1)
    grid = np.linspace(-m.theta_bound, m.theta_bound, 200001)
    log_post = m.log_prior(grid[:, None]) + ones * grid - n * np.logaddexp(0, grid)
    if n <= 100:  # tie the density to log_lik itself
        log_post2 = m.log_prior(grid[:, None]) + m.log_lik(records, grid[:, None]).sum(axis=1)
        np.testing.assert_allclose(
            log_post2 - log_post2.max(), log_post - log_post.max(), atol=1e-9
        )
    mean, sd = grid_moments(log_post, grid)
    assert ref.mean[0] == pytest.approx(mean, abs=1e-8 * sd)
    assert ref.sd[0] == pytest.approx(sd, rel=1e-7)


@pytest.mark.parametrize(
    "a, b, n, ones, bound",
    [  # bound: tail mass beyond ±bound < e^-50
        (1.0, 1.0, 40, 13, 100.0),
        (0.5, 2.0, 7, 0, 100.0),
        (2.0, 3.0, 10**6, 312345, 100.0),
        (0.01, 1.0, 0, 0, 1e4),  # very heavy left tail (sd 100): long range, no overflow
        (1.0, 1.0, 10**7, 3, 1e4),  # narrow peak far from 0
    ],
)
def test_bernoulli_reference_wide_box_is_logit_beta(
    a: float, b: float, n: int, ones: int, bound: float
) -> None:
    m = Bernoulli(theta_bound=bound, prior_a=a, prior_b=b)
    ref = _check_ref(m.reference_from_stats(n, np.array([float(ones)])), 1)
    a2, b2 = a + ones, b + n - ones
    assert ref.mean[0] == pytest.approx(
        special.digamma(a2) - special.digamma(b2), rel=1e-8, abs=1e-9
    )
    assert ref.sd[0] == pytest.approx(
        math.sqrt(special.polygamma(1, a2) + special.polygamma(1, b2)), rel=1e-8
    )
    if n < 100:
        from_records = _check_ref(m.reference_posterior(_bernoulli_records(n, ones)), 1)
        np.testing.assert_allclose(
            [from_records.mean, from_records.sd], [ref.mean, ref.sd], rtol=1e-14
        )


@pytest.mark.parametrize(
    "params, counts",
    [
        ({}, [3, 0, 7, 2, 5, 1]),
        ({}, []),  # prior only
        ({"count_bound": 10, "theta_bound": 1.0}, [10] * 40),  # mode above Θ
        ({"theta_bound": 5.0, "prior_shape": 0.3, "prior_rate": 2.0}, [0] * 25),
        ({"count_bound": 20}, list(range(21)) * 50),  # narrower
    ],
)
def test_poisson_reference_against_grid(params: dict, counts: list[int]) -> None:
    m = Poisson(**params)
    records = np.array(counts, dtype=float).reshape(-1, 1)
    ref = _check_ref(m.reference_posterior(records), 1)
    grid = np.linspace(-m.theta_bound, m.theta_bound, 200001)
    values, counts = np.unique(records, return_counts=True)  # Σ_x ℓ(x, θ) over distinct counts
    log_post = m.log_prior(grid[:, None]) + m.log_lik(values[:, None], grid[:, None]) @ counts
    mean, sd = grid_moments(log_post, grid)
    assert ref.mean[0] == pytest.approx(mean, abs=1e-8 * sd)
    assert ref.sd[0] == pytest.approx(sd, rel=1e-7)


@pytest.mark.parametrize(
    "shape, rate, n, total, bound",
    [  # bound: tail mass beyond -bound < e^-49
        (1.0, 1.0, 12, 40.0, 70.0),
        (0.7, 3.0, 5, 0.0, 70.0),
        (2.0, 0.5, 10**6, 3.1e6, 70.0),
        (1.0, 1e-5, 0, 0.0, 700.0),  # near the largest allowed bound
    ],
)
def test_poisson_reference_wide_box_is_log_gamma(
    shape: float, rate: float, n: int, total: float, bound: float
) -> None:
    m = Poisson(theta_bound=bound, prior_shape=shape, prior_rate=rate)
    ref = _check_ref(m.reference_from_stats(n, np.array([total])), 1)
    a2, b2 = shape + total, rate + n
    assert ref.mean[0] == pytest.approx(special.digamma(a2) - math.log(b2), rel=1e-8, abs=1e-9)
    assert ref.sd[0] == pytest.approx(math.sqrt(special.polygamma(1, a2)), rel=1e-8)


def test_reference_rejects_unattainable_stats() -> None:
    with pytest.raises(ValueError):
        Bernoulli().reference_from_stats(5, np.array([6.0]))
    with pytest.raises(ValueError):
        Poisson().reference_from_stats(5, np.array([-1.0]))


def test_logistic_has_no_reference() -> None:
    m = Logistic()
    records = m.simulate_records(np.random.default_rng(0), np.array([1.0, -1.0]), 10)
    assert m.reference_posterior(records) is None


# --- records --------------------------------------------------------------------------------


def test_gaussian_prepare_clips_onto_ball_and_copies() -> None:
    m = GaussianMean(dim=3, data_bound=2.0)
    raw = np.array(
        [
            [10.0, 0.0, 0.0],
            [0.5, 0.5, 0.5],
            [3.0, -4.0, 0.0],
            [1e300, -1e300, 1e300],
            [0.0, 0.0, 0.0],
        ]
    )
    before = raw.copy()
    out = m.prepare_records(raw)
    np.testing.assert_array_equal(raw, before)
    assert not np.shares_memory(out, raw)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out[0], [2.0, 0.0, 0.0])
    np.testing.assert_array_equal(out[1], raw[1])
    np.testing.assert_allclose(out[2], [1.2, -1.6, 0.0])
    np.testing.assert_allclose(out[3], 2.0 / math.sqrt(3) * np.array([1.0, -1.0, 1.0]))
    np.testing.assert_array_equal(out[4], 0.0)
    assert np.all(np.linalg.norm(out, axis=1) <= 2.0 * (1 + 1e-15))
    # already-prepared records are unchanged (up to rounding on the sphere)
    np.testing.assert_allclose(m.prepare_records(out), out, rtol=1e-15)


def test_prepare_one_column_models_accept_1d() -> None:
    np.testing.assert_array_equal(
        GaussianMean(dim=1).prepare_records(np.array([-10.0, 2.0, 7.0])), [[-4.0], [2.0], [4.0]]
    )
    np.testing.assert_array_equal(
        Bernoulli().prepare_records(np.array([True, False, True])), [[1.0], [0.0], [1.0]]
    )
    raw = np.array([0, 3, 70, 50, 51])
    out = Poisson().prepare_records(raw)
    np.testing.assert_array_equal(out, [[0.0], [3.0], [50.0], [50.0], [50.0]])
    np.testing.assert_array_equal(raw, [0, 3, 70, 50, 51])
    with pytest.raises(DataError):
        Logistic(dim=1).prepare_records(np.array([0.1, 1.0]))
    with pytest.raises(DataError):
        GaussianMean(dim=2).prepare_records(np.array([0.1, 1.0]))


def test_logistic_prepare_clips_features_keeps_labels() -> None:
    m = Logistic(dim=2, data_bound=1.0)
    raw = np.array([[3.0, 4.0, 1.0], [0.1, -0.2, 0.0]])
    before = raw.copy()
    out = m.prepare_records(raw)
    np.testing.assert_array_equal(raw, before)
    np.testing.assert_allclose(out, [[0.6, 0.8, 1.0], [0.1, -0.2, 0.0]])


@pytest.mark.parametrize(
    "name, raw, match",
    [
        ("gaussian_mean", np.array([[0.0], [np.nan]]), "non-finite"),
        ("gaussian_mean", np.array([[0.0], [np.inf]]), "non-finite"),
        ("gaussian_mean", np.zeros((3, 2)), "shape"),
        ("gaussian_mean", np.zeros((2, 1, 1)), "shape"),
        ("gaussian_mean", np.array(["a", "b"]), "numeric"),
        ("bernoulli", np.array([0.0, 0.5, 1.0]), "0.5"),
        ("bernoulli", np.array([[1.0], [2.0]]), "2.0"),
        ("bernoulli", np.array([-1.0, 0.0]), "-1.0"),
        ("bernoulli", np.array([[0.0, 1.0]]), "shape"),
        ("bernoulli", np.array([0.0, np.nan]), "non-finite"),
        ("poisson", np.array([1.0, -1.0]), "-1.0"),
        ("poisson", np.array([1.0, 2.5]), "2.5"),
        ("poisson", np.array([1.0, -np.inf]), "non-finite"),
        ("logistic", np.array([[0.1, 0.2, 0.5]]), "0.5"),
        ("logistic", np.array([[0.1, 0.2, 2.0]]), "'y'"),
        ("logistic", np.array([[0.1, 0.2]]), "shape"),
        ("logistic", np.array([[0.1, np.nan, 1.0]]), "x1"),
    ],
)
def test_prepare_rejects_bad_records(name: str, raw: np.ndarray, match: str) -> None:
    m = build_model({"name": name})
    before = raw.copy()
    with pytest.raises(DataError, match=match):
        m.prepare_records(raw)
    np.testing.assert_array_equal(raw, before)


def test_prepare_does_not_modify_input(model: Model) -> None:
    rng = np.random.default_rng(12)
    raw = model.simulate_records(rng, np.zeros(model.dim), 20)
    if isinstance(model, (GaussianMean, Logistic)):
        raw[:, : model.dim] *= 10.0  # forces clipping
    if isinstance(model, Poisson):
        raw[:3] = model.count_bound + 5
    before = raw.copy()
    out = model.prepare_records(raw)
    np.testing.assert_array_equal(raw, before)
    assert out.shape == raw.shape
    assert not np.shares_memory(out, raw)


def test_simulate_records(model: Model) -> None:
    rng = np.random.default_rng(13)
    theta = np.linspace(-0.5, 0.4, model.dim) * model.theta_bound
    n = 20000
    rec = model.simulate_records(rng, theta, n)
    assert rec.shape == (n, len(model.column_names))
    np.testing.assert_allclose(model.prepare_records(rec), rec, rtol=1e-15, atol=0)
    if isinstance(model, Bernoulli):
        p = special.expit(theta[0])
        assert abs(rec.mean() - p) < 5 * math.sqrt(p * (1 - p) / n)
    elif isinstance(model, Poisson):
        lam = math.exp(theta[0])
        assert abs(rec.mean() - lam) < 5 * math.sqrt(lam / n)
    elif isinstance(model, Logistic):
        x, y = rec[:, :-1], rec[:, -1]
        assert set(np.unique(y)) <= {0.0, 1.0}
        p = special.expit(x @ theta)
        assert abs(y.sum() - p.sum()) < 5 * math.sqrt((p * (1 - p)).sum())
        inner = np.mean(np.linalg.norm(x, axis=1) <= model.data_bound / 2)  # uniform in the ball
        assert abs(inner - 0.5**model.dim) < 5 * math.sqrt(0.25 / n)
    elif isinstance(model, GaussianMean):
        assert np.all(np.linalg.norm(rec, axis=1) <= model.data_bound * (1 + 1e-15))


def test_simulate_is_reproducible(model: Model) -> None:
    a = model.simulate_records(np.random.default_rng(5), np.zeros(model.dim), 50)
    b = model.simulate_records(np.random.default_rng(5), np.zeros(model.dim), 50)
    np.testing.assert_array_equal(a, b)


def test_column_names() -> None:
    assert GaussianMean(dim=1).column_names == ["x"]
    assert GaussianMean(dim=3).column_names == ["x0", "x1", "x2"]
    assert Bernoulli().column_names == Poisson().column_names == ["x"]
    assert Logistic(dim=2).column_names == ["x0", "x1", "y"]


# --- build_model ----------------------------------------------------------------------------------


def test_registry() -> None:
    assert set(MODELS) == {
        "gaussian_mean",
        "bernoulli",
        "poisson",
        "logistic",
        "linear_regression",
        "poisson_regression",
    }
    for name, cls in MODELS.items():
        assert cls.name == name
        m = build_model({"name": name})
        assert isinstance(m, cls) and m.params() == cls.defaults()
    assert issubclass(MODELS["poisson"], ExpFamModel) and not issubclass(
        MODELS["logistic"], ExpFamModel
    )


def test_build_model_unknown_name() -> None:
    with pytest.raises(ConfigError) as exc:
        build_model({"name": "gaussian"})
    msg = str(exc.value)
    assert "'gaussian'" in msg
    for name in MODELS:
        assert name in msg
    with pytest.raises(ConfigError, match="name"):
        build_model({"dim": 2})
    with pytest.raises(ConfigError):
        build_model({"name": 3})
    with pytest.raises(ConfigError):
        build_model(["bernoulli"])  # type: ignore[arg-type]


def test_build_model_unknown_key() -> None:
    with pytest.raises(ConfigError) as exc:
        build_model({"name": "bernoulli", "theta_bnd": 3.0})
    msg = str(exc.value)
    assert "'theta_bnd'" in msg
    for key in ("theta_bound", "prior_a", "prior_b"):
        assert key in msg
    with pytest.raises(ConfigError, match="'dim'"):
        build_model({"name": "poisson", "dim": 1})


@pytest.mark.parametrize(
    "name, key, value",
    [
        ("gaussian_mean", "dim", 0),
        ("gaussian_mean", "dim", -1),
        ("gaussian_mean", "dim", 2.5),
        ("gaussian_mean", "dim", "3"),
        ("gaussian_mean", "dim", True),
        ("gaussian_mean", "dim", None),
        ("gaussian_mean", "noise_sd", 0.0),
        ("gaussian_mean", "noise_sd", -1.0),
        ("gaussian_mean", "data_bound", math.inf),
        ("gaussian_mean", "theta_bound", math.nan),
        ("gaussian_mean", "prior_sd", 0),
        ("gaussian_mean", "prior_mean", math.nan),
        ("gaussian_mean", "prior_mean", "0"),
        ("gaussian_mean", "prior_mean", [0.0]),
        ("bernoulli", "theta_bound", -6.0),
        ("bernoulli", "prior_a", 0.0),
        ("bernoulli", "prior_b", "1"),
        ("poisson", "count_bound", 2.5),
        ("poisson", "count_bound", 0),
        ("poisson", "count_bound", math.inf),
        ("poisson", "prior_shape", -1.0),
        ("poisson", "prior_rate", False),
        ("poisson", "theta_bound", 1000.0),
        ("logistic", "dim", 0),
        ("logistic", "dim", 1.5),
        ("logistic", "data_bound", 0.0),
        ("logistic", "prior_sd", -2.0),
    ],
)
def test_build_model_bad_values(name: str, key: str, value) -> None:
    with pytest.raises(ConfigError) as exc:
        build_model({"name": name, key: value})
    assert repr(key) in str(exc.value) or key in str(exc.value)


def test_bad_value_message_says_what_is_allowed() -> None:
    with pytest.raises(ConfigError, match=r"'dim' must be an integer >= 1, got 2\.5"):
        build_model({"name": "gaussian_mean", "dim": 2.5})
    with pytest.raises(ConfigError, match=r"'theta_bound' must be a finite number > 0"):
        build_model({"name": "logistic", "theta_bound": 0})


def test_build_model_coerces_numbers() -> None:
    m = build_model(
        {"name": "gaussian_mean", "dim": 3.0, "theta_bound": 5, "prior_mean": np.float32(1.5)}
    )
    assert m.params()["dim"] == 3 and isinstance(m.params()["dim"], int)
    assert m.params()["theta_bound"] == 5.0 and isinstance(m.params()["theta_bound"], float)
    assert type(m.params()["prior_mean"]) is float
    assert build_model({"name": "poisson", "count_bound": np.int64(7)}).params()["count_bound"] == 7


@pytest.mark.parametrize("section", SETTINGS, ids=_id)
def test_params_round_trip(section: dict) -> None:
    m = build_model(section)
    assert set(m.params()) == set(type(m).defaults())
    rebuilt = build_model({"name": m.name, **m.params()})
    assert rebuilt == m and hash(rebuilt) == hash(m)
    assert rebuilt.params() == m.params()
    assert rebuilt.lipschitz == m.lipschitz
    for k, v in section.items():
        if k != "name":
            assert m.params()[k] == v
    other = build_model({"name": m.name, **m.params(), "theta_bound": m.theta_bound + 1})
    assert other != m


def test_direct_construction_validates() -> None:
    assert GaussianMean(dim=2) == build_model({"name": "gaussian_mean", "dim": 2})
    with pytest.raises(ConfigError):
        Poisson(count_bound=-3)
    with pytest.raises(ConfigError):
        Logistic(bogus=1)
