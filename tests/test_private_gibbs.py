"""private_gibbs (docs/design.md §2.10): exact conjugate posterior from exact statistics, one
charge per owner however long the chain, ε from an independent computation, refusals."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import optimize, stats

from fedpenalty.coordinator import private_gibbs
from fedpenalty.errors import ConfigError
from fedpenalty.models import build_model
from fedpenalty.simulation import simulate

N = 300


def _regression(known: int, prior_sd: float):
    model = build_model(
        {"name": "linear_regression", "dim": 2, "known_variance": known, "prior_sd": prior_sd}
    )
    theta = np.array([0.3, -0.2] + ([] if known else [0.2]))
    records = model.simulate_records(np.random.default_rng(3), theta, N)
    return model, model.suff_stat(records).sum(axis=0)


def _chain(model, stat_sum, sweeps: int) -> np.ndarray:
    """4 chains × ``sweeps`` Gibbs sweeps from exact statistics (noise variance 0):
    (4·sweeps, d)."""
    algorithm = private_gibbs.kernel(model, lambda: (stat_sum, 0.0), N)
    rng = np.random.default_rng(11)
    state = algorithm.init(rng, np.zeros((4, model.dim)))
    draws = []
    for _ in range(sweeps + 100):
        state, _ = algorithm.step(rng, state)
        draws.append(state.position)
    return np.concatenate(np.array(draws[100:]).transpose(1, 0, 2))


def _batch_mcse(draws: np.ndarray, batches: int = 40) -> np.ndarray:
    """Monte Carlo standard error of the mean per coordinate, by batch means (per chain order)."""
    means = np.array([b.mean(axis=0) for b in np.array_split(draws, batches)])
    return means.std(axis=0, ddof=1) / math.sqrt(batches)


@pytest.mark.parametrize("known", [1, 0])
def test_exact_statistics_give_the_exact_conjugate_posterior(known):
    """Tolerance: mean within 5 batch-means MCSE (a false alarm has probability < 1e-5 per
    coordinate), sd within 4 % (its MC error is ≈ 0.5 % at ~20,000 near-independent draws).
    The prior (sd 0.3) moves the mean by over 4× that tolerance
    (next test), so a conditional that drops it, or uses σ for σ², fails."""
    model, stat_sum = _regression(known, prior_sd=0.3)
    ref = model.reference_from_stats(N, stat_sum)
    assert ref is not None
    draws = _chain(model, stat_sum, 5000)
    mcse = _batch_mcse(draws)
    assert np.all(np.abs(draws.mean(axis=0) - ref.mean) < 5 * mcse), (draws.mean(0), ref.mean)
    assert np.allclose(draws.std(axis=0), ref.sd, rtol=0.04), (draws.std(0), ref.sd)


def test_the_posterior_test_has_power():
    """The prior of the test above shifts the mean by over 4× its tolerance (known σ_y)."""
    model, stat_sum = _regression(1, prior_sd=0.3)
    ref = model.reference_from_stats(N, stat_sum)
    flat = build_model(
        {"name": "linear_regression", "dim": 2, "known_variance": 1, "prior_sd": 100.0}
    ).reference_from_stats(N, stat_sum)
    assert ref is not None and flat is not None
    mcse = _batch_mcse(_chain(model, stat_sum, 5000))
    assert np.min(np.abs(flat.mean - ref.mean) / mcse) > 20


def test_the_noisy_gram_matrix_is_projected_onto_the_psd_cone():
    bad = np.array([[1.0, 3.0], [2.0, -4.0]])
    projected = private_gibbs.psd_projection(bad)
    assert np.allclose(projected, projected.T)
    assert np.linalg.eigvalsh(projected).min() >= -1e-12
    good = np.array([[2.0, 0.5], [0.5, 1.0]])
    assert np.allclose(private_gibbs.psd_projection(good), good)


def _run(tmp_path, iterations: int, name: str) -> dict:
    overrides = {
        "model.name": "linear_regression",
        "sampler.algorithm": "private_gibbs",
        "sampler.iterations": iterations,
        "sampler.warmup": 5,
        "sampler.chains": 2,
        "data.n_per_owner": 500,
        "run.transport": "inprocess",
        "run.progress": False,
    }
    simulate(None, overrides, tmp_path / name)
    return json.loads((tmp_path / name / "privacy.json").read_text())


def _gdp_epsilon(mu: float, delta: float) -> float:
    """ε of one μ-GDP release at δ: the root of Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) = δ."""

    def gap(eps: float) -> float:
        return (
            stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
        ) - delta

    return optimize.brentq(gap, 1e-9, 100.0, xtol=1e-12)


def test_the_statistics_are_charged_once_however_long_the_chain(tmp_path):
    short, long = _run(tmp_path, 20, "short"), _run(tmp_path, 300, "long")
    # independent: Δ = 2 sup‖S(x)‖₂ = 2√(R²Y² + R⁴) at the defaults R = 1, Y = 3 (replace-one)
    sensitivity = 2 * math.sqrt(1.0 * 9.0 + 1.0)
    for report in (short, long):
        for owner in report["owners"]:
            assert owner["answers"] == 1
            expected = _gdp_epsilon(sensitivity / owner["sigma"], report["delta"])
            assert owner["epsilon"] == pytest.approx(expected, rel=1e-6)
            assert owner["ledger_epsilon"] == pytest.approx(expected, rel=1e-6)
    assert [o["epsilon"] for o in short["owners"]] == [o["epsilon"] for o in long["owners"]]


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"model.name": "gaussian_mean"}, "supports the models linear_regression"),
        (
            {"model.name": "linear_regression", "privacy.neighbour": "add_remove"},
            r"privacy\.neighbour = 'replace_one'",
        ),
    ],
)
def test_unsupported_settings_are_refused_naming_the_key(tmp_path, overrides, match):
    with pytest.raises(ConfigError, match=match):
        simulate(None, {**overrides, "sampler.algorithm": "private_gibbs"}, tmp_path / "run")
    assert not (tmp_path / "run").exists()
