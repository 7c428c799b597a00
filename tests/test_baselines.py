"""Tests of fedpenalty.coordinator.baselines: the log-likelihood bounds behind OPS, the OPS
temperature and tempered draws, the Laplace/Gaussian noisy statistics and their conjugate
posterior, and the hybrid budget split. All seeds are fixed.

Distributional checks compare iid draws with closed-form moments (the models' own
``reference_from_stats``, by quadrature or truncated-normal formulas, a separate code path):
|mean − m| and |sd − s| must be within Z = 4.5 standard errors. For iid draws,
SE(mean) = sd/√N and SE(sd) = √((m₄ − sd⁴)/N)/(2 sd) with m₄ the sample fourth central moment.
Two statistics per dimension at 4.5 SE give a false-alarm rate per check below ~1e-4.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from fedpenalty.coordinator import baselines as bl
from fedpenalty.models import build_model
from fedpenalty.privacy import subsampled
from fedpenalty.privacy.gaussian import epsilon_for_delta

Z = 4.5


def _moments_ok(draws: np.ndarray, mean: np.ndarray, sd: np.ndarray) -> bool:
    n = len(draws)
    m = draws.mean(axis=0)
    s = draws.std(axis=0, ddof=1)
    m4 = np.mean((draws - m) ** 4, axis=0)
    se_m = s / math.sqrt(n)
    se_s = np.sqrt(np.maximum(m4 - s**4, 0.0) / n) / (2 * s)
    return bool(np.all(np.abs(m - mean) <= Z * se_m) and np.all(np.abs(s - sd) <= Z * se_s))


# ------------------------------------------------------------------ B and C against brute force
#
# Each derivation in log_lik_bound / log_lik_range is checked against the model's own log_lik
# on a grid of data points × θ that contains the points where the supremum is attained (box
# corners, data opposite them, θ = log x for Poisson). The grid maximum must not exceed the
# bound and must reach it to 1e-9 relative.


def _grid(model):
    b = model.theta_bound
    if model.name == "gaussian_mean":  # d = 2
        r = model.data_bound
        ts = np.linspace(-b, b, 9)
        thetas = np.array([[u, v] for u in ts for v in ts])
        angles = np.linspace(0, 2 * np.pi, 72, endpoint=False)
        sphere = r * np.column_stack([np.cos(angles), np.sin(angles)])
        corner = r * np.array([[1, 1], [-1, -1], [1, -1], [-1, 1]]) / math.sqrt(2)
        records = np.vstack([sphere, corner, thetas[np.linalg.norm(thetas, axis=1) <= r], [[0, 0]]])
        return records, thetas
    if model.name == "bernoulli":
        return np.array([[0.0], [1.0]]), np.linspace(-b, b, 41)[:, None]
    if model.name == "poisson":
        x = np.arange(model.count_bound + 1, dtype=float)
        modes = np.log(x[1:])
        thetas = np.concatenate([np.linspace(-b, b, 41), modes[np.abs(modes) <= b]])
        return x[:, None], thetas[:, None]
    # logistic, d = 2
    ts = np.linspace(-b, b, 9)
    thetas = np.array([[u, v] for u in ts for v in ts])
    angles = np.linspace(0, 2 * np.pi, 72, endpoint=False)  # includes the 45° multiples
    x = model.data_bound * np.column_stack([np.cos(angles), np.sin(angles)])
    records = np.vstack([np.column_stack([x, np.zeros(72)]), np.column_stack([x, np.ones(72)])])
    return records, thetas


MODELS = [
    {"name": "gaussian_mean", "dim": 2},
    {"name": "gaussian_mean", "dim": 2, "noise_sd": 0.2, "data_bound": 1.0, "theta_bound": 0.3},
    {"name": "bernoulli"},
    {"name": "poisson", "count_bound": 20, "theta_bound": 3.0},
    {"name": "logistic", "dim": 2, "data_bound": 1.5, "theta_bound": 2.0},
]


@pytest.mark.parametrize("spec", MODELS, ids=lambda s: f"{s['name']}-{len(s)}")
def test_log_lik_bound_and_range_match_brute_force(spec):
    model = build_model(spec)
    records, thetas = _grid(model)
    ll = model.log_lik(records, thetas)  # (θ, x)
    bound, rng_c = bl.log_lik_bound(model), bl.log_lik_range(model)
    assert np.max(np.abs(ll)) <= bound * (1 + 1e-12)
    assert np.max(np.abs(ll)) >= bound * (1 - 1e-9)
    spread = np.max(ll.max(axis=1) - ll.min(axis=1))
    assert spread <= rng_c * (1 + 1e-12)
    assert spread >= rng_c * (1 - 1e-9)
    assert rng_c <= 2 * bound


def test_ops_temperature_formulas():
    model = build_model({"name": "bernoulli", "theta_bound": 5.0})
    b, c = math.log1p(math.exp(5.0)), 5.0
    assert bl.ops_temperature(model, 1.0) == pytest.approx(1.0 / (4 * b))  # Wang et al. Alg. 1
    assert bl.ops_temperature(model, 1.0, neighbour="add_remove") == pytest.approx(1.0 / (2 * b))
    assert bl.ops_temperature(model, 1.0, form="foulds") == pytest.approx(
        1.0 / (2 * c)
    )  # Foulds Thm 2
    assert bl.ops_temperature(model, 100.0) == 1.0
    with pytest.raises(ValueError, match="replace-one"):
        bl.ops_temperature(model, 1.0, form="foulds", neighbour="add_remove")
    with pytest.raises(ValueError, match="form"):
        bl.ops_temperature(model, 1.0, form="dimitrakakis")


# ------------------------------------------------------------------ tempered / conjugate draws


def _tempered_reference(model, n, stat_sum, rho):
    """Moments of ∝ [p(θ) Π p(x|θ)]^ρ: the same family with the prior's and the data's natural
    parameters multiplied by ρ, through the model's own reference_from_stats."""
    p = model.params()
    if model.name == "gaussian_mean":
        scaled = build_model({"name": model.name, **p, "prior_sd": p["prior_sd"] / math.sqrt(rho)})
        # precision ρ/s² + ρn/σ², mean unchanged: pass n' = ρn and Σ' = ρΣ
    elif model.name == "bernoulli":
        scaled = build_model(
            {"name": model.name, **p, "prior_a": rho * p["prior_a"], "prior_b": rho * p["prior_b"]}
        )
    else:
        scaled = build_model(
            {
                "name": model.name,
                **p,
                "prior_shape": rho * p["prior_shape"],
                "prior_rate": rho * p["prior_rate"],
            }
        )
    return scaled.reference_from_stats(rho * n, rho * np.asarray(stat_sum, dtype=float))


CONJUGATE = [
    ({"name": "gaussian_mean", "dim": 2}, np.array([0.5, -0.3])),
    ({"name": "bernoulli"}, np.array([-2.0])),
    ({"name": "poisson", "count_bound": 30}, np.array([1.2])),
]


@pytest.mark.parametrize(
    "spec, theta", CONJUGATE, ids=lambda v: v["name"] if isinstance(v, dict) else ""
)
@pytest.mark.parametrize("rho", [1.0, 0.05])
def test_conjugate_draws_match_tempered_posterior(spec, theta, rho):
    model = build_model(spec)
    records = model.simulate_records(np.random.default_rng(0), theta, 120)
    total = model.suff_stat(records).sum(axis=0)
    draws = bl.conjugate_draws(np.random.default_rng(1), model, len(records), total, 40_000, rho)
    ref = _tempered_reference(model, len(records), total, rho)
    assert np.all(np.abs(draws) <= model.theta_bound)
    assert _moments_ok(draws, ref.mean, ref.sd)


def test_conjugate_draws_near_the_edge_of_theta():
    # all-ones Bernoulli data: the posterior piles against θ = theta_bound; the draws must
    # still follow the truncated posterior (the upper-tail branch of the inverse CDF)
    model = build_model({"name": "bernoulli", "theta_bound": 4.0})
    draws = bl.conjugate_draws(np.random.default_rng(2), model, 500, np.array([500.0]), 40_000)
    ref = model.reference_from_stats(500, np.array([500.0]))
    assert _moments_ok(draws, ref.mean, ref.sd)


def test_tempered_mh_matches_closed_form():
    # the MH path (used for logistic) on a conjugate model: 1500 independent chains, each
    # tuned and then run 300 steps from θ = 0; their last states are compared with the closed
    # form. (Tempered mean ≈ 0.4, sd ≈ 0.26 for ρ = 0.15; 300 tuned steps are ≫ the mixing time.)
    model = build_model({"name": "gaussian_mean", "dim": 1})
    records = model.simulate_records(np.random.default_rng(3), np.array([0.4]), 100)
    rho = 0.15
    draws = bl.tempered_mh_draws(np.random.default_rng(4), model, records, rho, 1500, 300)
    ref = _tempered_reference(model, 100, records.sum(axis=0), rho)
    assert _moments_ok(draws, ref.mean, ref.sd)


def test_ops_releases_one_labelled_sample():
    model = build_model({"name": "logistic", "dim": 2})
    records = model.simulate_records(np.random.default_rng(5), np.array([1.0, -1.0]), 60)
    out = bl.ops(np.random.default_rng(6), model, records, 2.0, mh_steps=200)
    assert out.theta.shape == (2,) and np.all(np.abs(out.theta) <= model.theta_bound)
    assert out.method == "mh" and out.trusted_curator
    assert out.rho == pytest.approx(2.0 / (4 * bl.log_lik_bound(model)))
    assert out.epsilon_per_owner == 2.0
    three = bl.ops(
        np.random.default_rng(6),
        build_model({"name": "bernoulli"}),
        np.ones((10, 1)),
        0.5,
        samples=3,
    )
    assert (
        three.theta.shape == (3, 1)
        and three.method == "closed_form"
        and three.epsilon_per_owner == 1.5
    )


# ------------------------------------------------------------------ noisy statistics


def test_laplace_scale_is_l1_sensitivity_over_epsilon():
    gm = build_model({"name": "gaussian_mean", "dim": 3, "data_bound": 2.0})
    assert bl.laplace_scale(gm, 0.5, "replace_one") == pytest.approx(2 * 2.0 * math.sqrt(3) / 0.5)
    assert bl.laplace_scale(gm, 0.5, "add_remove") == pytest.approx(2.0 * math.sqrt(3) / 0.5)
    assert bl.laplace_scale(
        build_model({"name": "bernoulli"}), 0.2, "replace_one"
    ) == pytest.approx(5.0)
    assert (
        bl.laplace_scale(build_model({"name": "poisson", "count_bound": 7}), 1.0, "add_remove")
        == 7.0
    )


def test_released_noise_is_laplace_with_that_scale():
    # 3000 independent releases by one Bernoulli owner (400 ones in 1000 records, so the
    # projection to [0, 1000] never binds at scale 1/ε = 2). The noise must pass a KS test
    # against Laplace(0, 2) at level 1e-4 (fixed seed); at scale 1 or 4 it fails badly.
    model = build_model({"name": "bernoulli"})
    records = np.r_[np.ones(400), np.zeros(600)][:, None]
    rng = np.random.default_rng(7)
    noise = (
        np.array(
            [
                bl.noisy_stats(
                    rng, model, [records], 0.5, neighbour="replace_one", draws=1
                ).released[0, 0]
                for _ in range(3000)
            ]
        )
        - 400.0
    )
    assert stats.kstest(noise, stats.laplace(scale=2.0).cdf).pvalue > 1e-4
    assert stats.kstest(noise, stats.laplace(scale=1.0).cdf).pvalue < 1e-6
    assert stats.kstest(noise, stats.laplace(scale=4.0).cdf).pvalue < 1e-6


def test_gaussian_variant_is_calibrated_exactly():
    model = build_model({"name": "gaussian_mean", "dim": 2})
    records = [model.simulate_records(np.random.default_rng(8), np.array([0.0, 1.0]), 50)]
    out = bl.noisy_stats(
        np.random.default_rng(9),
        model,
        records,
        1.0,
        neighbour="replace_one",
        draws=10,
        mechanism="gaussian",
        delta=1e-5,
    )
    assert out.sensitivity == model.stat_sensitivity("replace_one")
    assert out.mu == pytest.approx(out.sensitivity / out.scale)
    assert epsilon_for_delta(out.mu, 1e-5) == pytest.approx(1.0, rel=1e-9)
    with pytest.raises(ValueError, match="delta"):
        bl.noisy_stats(
            np.random.default_rng(9),
            model,
            records,
            1.0,
            neighbour="replace_one",
            draws=1,
            mechanism="gaussian",
        )


def test_projection_to_attainable_sums():
    assert bl.project_stats(build_model({"name": "bernoulli"}), np.array([-3.2]), 10)[0] == 0.0
    assert bl.project_stats(build_model({"name": "bernoulli"}), np.array([12.5]), 10)[0] == 10.0
    assert (
        bl.project_stats(build_model({"name": "poisson", "count_bound": 5}), np.array([60.0]), 10)[
            0
        ]
        == 50.0
    )
    gm = build_model({"name": "gaussian_mean", "dim": 2, "data_bound": 1.0})
    out = bl.project_stats(gm, np.array([30.0, 40.0]), 10)
    np.testing.assert_allclose(out, [6.0, 8.0])
    np.testing.assert_allclose(bl.project_stats(gm, np.array([3.0, 4.0]), 10), [3.0, 4.0])


@pytest.mark.parametrize(
    "spec, theta", CONJUGATE, ids=lambda v: v["name"] if isinstance(v, dict) else ""
)
def test_noisy_stats_draws_follow_the_posterior_given_the_released_sums(spec, theta):
    # small ε so the released total differs visibly from the true one; the draws must follow
    # the conjugate posterior given the *released* total, not the true one
    model = build_model(spec)
    rng = np.random.default_rng(10)
    records = [model.simulate_records(rng, theta, n) for n in (80, 120)]
    out = bl.noisy_stats(rng, model, records, 0.05, neighbour="replace_one", draws=40_000)
    true_total = sum(model.suff_stat(r).sum(axis=0) for r in records)
    assert out.n == 200 and out.released.shape == (2, model.stat_dim)
    np.testing.assert_allclose(out.total, out.released.sum(axis=0))
    assert np.all(np.abs(out.total - true_total) > 1.0)
    ref = model.reference_from_stats(out.n, out.total)
    assert _moments_ok(out.theta, ref.mean, ref.sd)
    wrong = model.reference_from_stats(out.n, true_total)
    assert not _moments_ok(out.theta, wrong.mean, wrong.sd)


# ------------------------------------------------------------------ hybrid


def test_hybrid_splits_the_budget():
    model = build_model({"name": "bernoulli"})
    rng = np.random.default_rng(11)
    pooled = np.concatenate([model.simulate_records(rng, np.array([0.4]), n) for n in (150, 250)])
    eps, delta, chains, steps, q = 3.0, 1e-5, 2, 100, 0.2
    start, sigma = bl.hybrid_start(
        rng,
        model,
        pooled,
        eps,
        delta,
        sampling_rate=q,
        answers=chains * steps,
        chains=chains,
        neighbour="replace_one",
        accountant="rdp",
    )
    # OPS: `chains` samples at ε/(2·chains) each, i.e. ε/2 per owner; ρ from Wang et al.
    assert start.epsilon_per_owner == pytest.approx(eps / 2)
    assert start.rho == pytest.approx(bl.ops_temperature(model, eps / (2 * chains)))
    theta0 = np.atleast_2d(start.theta)
    assert theta0.shape == (chains, 1) and np.all(np.abs(theta0) <= model.theta_bound)
    # SGLD: chains × steps answers per owner, σ calibrated to the remaining ε/2 at δ
    spent = subsampled.epsilon(
        subsampled.SubsampledGaussian(q, sigma, chains * steps),
        delta,
        neighbour="replace_one",
        accountant="rdp",
    )
    assert spent <= eps / 2 and spent == pytest.approx(eps / 2, rel=1e-3)
    assert start.epsilon_per_owner + spent <= eps + 1e-12


# ------------------------------------------------------------------ capabilities, not classes


def test_the_baselines_ask_capabilities_not_model_classes():
    """Each registered model has the capabilities the baselines ask (models/capabilities.py);
    a model class is not consulted: a model without ``BoundedLogLikelihood`` is refused by name,
    and one that states its own bounds gets the OPS temperature from them."""
    from fedpenalty.models import MODELS, BoundedLogLikelihood, ConjugateUpdate
    from fedpenalty.models.logistic import Logistic

    conjugate = {name for name, cls in MODELS.items() if issubclass(cls, ConjugateUpdate)}
    assert conjugate == {"gaussian_mean", "bernoulli", "poisson"}
    assert all(issubclass(cls, BoundedLogLikelihood) for cls in MODELS.values())

    class Unbounded(Logistic):
        name = "unbounded"
        log_lik_bound = None  # type: ignore[assignment]  # the capability withdrawn

    class Stated(Logistic):
        name = "stated"

        def log_lik_bound(self) -> float:
            return 8.0

    assert not isinstance(Unbounded(), BoundedLogLikelihood)
    with pytest.raises(
        ValueError, match="no log-likelihood bound is derived for model 'unbounded'"
    ):
        bl.ops_temperature(Unbounded(), 1.0)
    assert bl.ops_temperature(Stated(), 2.0) == pytest.approx(2.0 / (4 * 8.0), rel=1e-15)
    logistic = build_model({"name": "logistic"})
    with pytest.raises(ValueError, match="model 'logistic' has no conjugate posterior"):
        bl.conjugate_draws(np.random.default_rng(0), logistic, 10, np.zeros(2), 3)
    with pytest.raises(ValueError, match="no projection is defined for model 'logistic'"):
        bl.project_stats(logistic, np.zeros(2), 10)
