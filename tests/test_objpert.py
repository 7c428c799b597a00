"""Objective perturbation (``objpert``, docs/design.md §2.4): the calibration against hand
computations, the perturbation's law, the minimiser's optimality, the ``simulate`` outputs
(central DP, pure ε) and the refusals."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import optimize, stats

from fedpenalty.cli import main
from fedpenalty.coordinator import objpert
from fedpenalty.models import build_model

LOGISTIC = {"name": "logistic", "dim": 3, "data_bound": 2.0, "theta_bound": 5.0, "prior_sd": 2.0}


def test_epsilon_prime_by_hand():
    """ε = 1, n = 1000, Λ = 0.01: c/(nΛ) = 0.25/10 = 0.025, so
    ε′ = 1 − log(1 + 0.05 + 0.000625) = 1 − 2 log 1.025 = 0.9506147748…"""
    cal = objpert.calibrate(1.0, 1000, 0.01)
    assert cal.epsilon_prime == pytest.approx(0.9506147748, abs=1e-10)
    assert cal.regulariser == 0.01 and not cal.raised


def test_regulariser_raised_by_hand():
    """ε = 0.1, n = 100, Λ = 1e-4: log(1 + 2·25 + 25²) = log 676 > 0.1, so Λ + Δ =
    0.25/(100 (e^{0.025} − 1)) = 0.0987552… and ε′ = 0.05; at that Λ the formula's own ε′ is
    exactly ε/2 (2 log(1 + c/(nΛ)) = ε/2)."""
    cal = objpert.calibrate(0.1, 100, 1e-4)
    assert cal.raised and cal.epsilon_prime == 0.05
    assert cal.regulariser == pytest.approx(0.25 / (100 * 0.025315120524), rel=1e-9)
    assert 0.1 - math.log1p(
        2 * 0.25 / (100 * cal.regulariser) + (0.25 / (100 * cal.regulariser)) ** 2
    ) == pytest.approx(0.05, abs=1e-12)


def test_perturbation_norm_is_gamma_and_direction_uniform():
    """5,000 draws at d = 3, ε′ = 0.7: KS of ‖b‖ against Gamma(3, scale 2/0.7) accepts at
    p > 0.01 (a false alarm once in a hundred seeds; this seed is fixed), and rejects a scale
    of 1/ε′ (density ∝ exp(−ε′‖b‖), the common slip) at p < 1e-6. On the sphere in R³ a
    uniform direction's first coordinate is uniform on [−1, 1] (Archimedes)."""
    rng = np.random.default_rng(3)
    b = np.array([objpert.perturbation(rng, 3, 0.7) for _ in range(5000)])
    norms = np.linalg.norm(b, axis=1)
    assert stats.kstest(norms, stats.gamma(3, scale=2 / 0.7).cdf).pvalue > 0.01
    assert stats.kstest(norms, stats.gamma(3, scale=1 / 0.7).cdf).pvalue < 1e-6
    assert stats.kstest(b[:, 0] / norms, stats.uniform(-1, 2).cdf).pvalue > 0.01


def records(n: int, seed: int = 0) -> np.ndarray:
    model = build_model(LOGISTIC)
    return model.simulate_records(np.random.default_rng(seed), np.array([1.0, -2.0, 0.5]), n)


def test_release_minimises_the_perturbed_objective():
    """The released θ = f/R solves ∇J(f) = 0 for the b drawn (‖∇J‖ ≤ 1e-9), and agrees with an
    independent BFGS minimisation of J written here from the paper's formula."""
    data = records(400)
    fit = objpert.release(np.random.default_rng(1), data, 0.5, 0.01, LOGISTIC["data_bound"])
    x, s = data[:, :-1] / LOGISTIC["data_bound"], 2 * data[:, -1] - 1
    lam, b, n = fit.calibration.regulariser, fit.b, len(x)
    f = fit.theta * LOGISTIC["data_bound"]
    assert np.linalg.norm(objpert.gradient(f, x, s, lam, b)) <= 1e-9

    def objective(g: np.ndarray) -> float:
        return float(np.mean(np.log1p(np.exp(-s * (x @ g)))) + lam / 2 * g @ g + b @ g / n)

    bfgs = optimize.minimize(objective, np.zeros(3), method="BFGS", options={"gtol": 1e-12})
    np.testing.assert_allclose(f, bfgs.x, atol=1e-5)


def test_released_perturbations_follow_the_calibrated_law():
    """The b of 600 releases on 60 records at ε = 2, Λ = 0.05: ε′ = 2 − log(1 + 2·0.0833 +
    0.0833²) = 1.8400…; their norms pass KS against Gamma(3, scale 2/ε′) at p > 0.01."""
    data, rng = records(60, seed=2), np.random.default_rng(4)
    fits = [objpert.release(rng, data, 2.0, 0.05, 2.0) for _ in range(600)]
    eps_prime = 2 - math.log1p(2 * 0.25 / 3 + (0.25 / 3) ** 2)
    assert fits[0].calibration.epsilon_prime == pytest.approx(eps_prime, abs=1e-12)
    norms = [np.linalg.norm(f.b) for f in fits]
    assert stats.kstest(norms, stats.gamma(3, scale=2 / eps_prime).cdf).pvalue > 0.01


def scenario(tmp_path, model: str, sampler: str = "", privacy: str = "") -> str:
    path = tmp_path / "s.toml"
    path.write_text(
        f'[model]\nname = "{model}"\n[data]\nowners = 3\nn_per_owner = 500\n'
        f"[privacy]\nepsilon = 2.0\n{privacy}\n[sampler]\n"
        f'algorithm = "objpert"\nchains = 2\niterations = 3\nwarmup = 0\n{sampler}\n'
        '[run]\ntransport = "inprocess"\n'
    )
    return str(path)


def simulate(tmp_path, capsys, *args: str) -> tuple[int, str, str]:
    code = main(["simulate", *args, "--no-progress", "--out", str(tmp_path / "run")])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("per_owner", [False, True])
def test_simulate_writes_a_pure_epsilon_release(tmp_path, capsys, per_owner):
    """Every owner spends privacy.epsilon at δ = 0 over the 6 releases (ε/6 each); the pooled
    form says central DP in privacy.json and on the console, the per-owner form does not."""
    path = scenario(tmp_path, "logistic", f"objpert_per_owner = {str(per_owner).lower()}")
    code, out, err = simulate(tmp_path, capsys, path)
    assert code == 0, err
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert privacy["algorithm"] == "objpert" and privacy["draws"] == 6
    assert [o["epsilon"] for o in privacy["owners"]] == [2.0] * 3
    assert privacy["delta"] == 0 and privacy["owners"][0]["epsilon_per_draw"] == pytest.approx(
        2 / 6
    )
    assert privacy["trusted_curator"] is (not per_owner) and privacy["central_dp"] is (
        not per_owner
    )
    assert ("CENTRAL DP" in out) is (not per_owner)
    assert [p["n"] for p in privacy["objpert"]] == ([500] * 3 if per_owner else [1500])


@pytest.mark.parametrize(
    ("model", "privacy", "message"),
    [
        ("bernoulli", "", "for model.name = 'logistic' only; 'bernoulli'"),
        ("logistic", 'neighbour = "add_remove"', "privacy.neighbour = 'replace_one'"),
    ],
)
def test_refusals_name_the_key_and_write_nothing(tmp_path, capsys, model, privacy, message):
    path = scenario(tmp_path, model, privacy=privacy)
    code, _, err = simulate(tmp_path, capsys, path)
    assert code == 2 and message in err, err
    assert not (tmp_path / "run").exists()


def test_embedded_default_refuses_gaussian_mean(tmp_path, capsys):
    code, _, err = simulate(tmp_path, capsys, "--set", "sampler.algorithm='objpert'")
    assert code == 2 and "'gaussian_mean' is not supported" in err, err


def test_per_owner_releases_are_averaged_by_n():
    """objpert_per_owner: each draw is Σ_k (n_k/n) θ_k of the owners' own releases at ε/draws,
    replayed here with the same generator (owner by owner, draw by draw)."""
    model = build_model(LOGISTIC)
    parts = [records(40, seed=5), records(120, seed=6)]
    sections = {
        "sampler": {
            "chains": 1,
            "iterations": 2,
            "objpert_lambda": 0.05,
            "objpert_per_owner": True,
        },
        "privacy": {"epsilon": 3.0, "neighbour": "replace_one"},
    }
    out = objpert.OBJPERT.release(np.random.default_rng(7), model, parts, sections)
    rng = np.random.default_rng(7)
    for draw in range(2):
        fits = [objpert.release(rng, p, 1.5, 0.05, 2.0).theta for p in parts]
        np.testing.assert_allclose(out.theta[0, draw], 0.25 * fits[0] + 0.75 * fits[1])
    assert out.epsilon == 3.0 and out.delta == 0.0 and not out.trusted_curator
