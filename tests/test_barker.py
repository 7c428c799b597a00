"""The Barker kernel (docs/design.md §2.12): its correction variable, its stationary law on a
Gaussian model (the tempered posterior in closed form), and its clear errors."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
from scipy.special import expit

from fedpenalty.cli import main
from fedpenalty.coordinator import barker
from fedpenalty.coordinator.barker_correction import CDF_TOLERANCE, Correction, correction
from fedpenalty.models import build_model

MODEL = build_model(
    {"name": "gaussian_mean", "dim": 1, "data_bound": 3.0, "theta_bound": 2.0, "prior_sd": 10.0}
)
N = 2000
TAU = 0.05  # τN = 100: the tempered posterior's sd is 0.1
RECORDS = np.clip(np.random.default_rng(1).normal(0.3, 1.0, N), -3.0, 3.0)[:, None]
PRECISION = 1 / 10.0**2 + TAU * N
MEAN, SD = TAU * RECORDS.sum() / PRECISION, PRECISION**-0.5
Z = np.linspace(-15.0, 15.0, 3001)


@pytest.mark.parametrize("variance", [0.25, 0.5, 1.0])
def test_normal_plus_correction_is_logistic(variance):
    """N(0, C) + X_corr has the logistic CDF within CDF_TOLERANCE (sup distance, exact sums
    over the table): the test's acceptance is Barker's 1/(1 + e^{−Λ}) to that accuracy."""
    corr = correction(variance)
    assert np.max(np.abs(corr.convolved_cdf(Z) - expit(Z))) < CDF_TOLERANCE


def test_correction_is_for_its_variance_only():
    """The table for C is not one for C/2 or 2C (error ≫ the tolerance): a σ-for-σ² mix-up in
    the kernel's top-up would show in the law of its noise."""
    corr = correction(1.0)
    for wrong in (0.5, 2.0):
        shifted = Correction(wrong, corr.grid, corr.prob)
        assert np.max(np.abs(shifted.convolved_cdf(Z) - expit(Z))) > 10 * CDF_TOLERANCE


def test_correction_draws_follow_its_table():
    """400,000 draws of N(0, 1) + X_corr: the empirical CDF within 0.004 of the logistic one
    (KS: 1.95/√n ≈ 0.0031 at the 0.1% level, plus CDF_TOLERANCE)."""
    rng = np.random.default_rng(3)
    n = 400_000
    x = np.sort(rng.standard_normal(n) + correction(1.0).sample(rng, n))
    empirical = np.arange(1, n + 1) / n
    assert np.max(np.abs(empirical - expit(x))) < 0.004


def test_variance_beyond_the_correction_is_refused():
    with pytest.raises(ValueError, match=r"sampler\.barker_variance"):
        barker.check_variance(1.5, "sampler.barker_variance")


def pooled_ratio(q: float, clip: float, noise_sd: float, rng: np.random.Generator):
    """One data holder's answer on RECORDS: a Poisson(q) sample's clipped ratio sum + noise."""

    def ratio(iteration, chains, theta, theta_prop):
        diffs = np.clip(MODEL.log_lik_diff(RECORDS, theta, theta_prop), -clip, clip)
        taken = rng.random(diffs.shape) < q
        noise = noise_sd * rng.standard_normal(len(chains))
        return (diffs * taken).sum(axis=1) + noise, np.full(len(chains), noise_sd**2)

    return ratio


def run_chain(terms: barker.BarkerTerms, rng, steps: int = 12_000, chains: int = 8):
    """Draws ``(steps − 1000, chains)`` from MEAN and the mean acceptance."""
    state = barker.init(np.full((chains, 1), MEAN), MODEL)
    draws, accepted = [], 0.0
    for _ in range(steps):
        state, info = barker.step(rng, state, MODEL, terms)
        draws.append(state.theta[:, 0])
        accepted += info["accepted"].mean()
    return np.array(draws)[1000:], accepted / steps


def test_chain_hits_the_tempered_posterior():
    """q = 1 (no subsampling error; owner noise 12 nats sd → (τ/q)²·144 = 0.36 of C = 1): the
    chain's mean within 0.1 sd and its sd within 6% of the tempered posterior
    N(MEAN, SD²) ∝ p(θ) Π p(x|θ)^τ (the clip 2.5 never binds: |x − θ| ≤ 5, |θ′ − θ| < 0.5 for
    every draw of this seed). 8 chains × 11,000 draws at ~35% acceptance; measured with this
    seed: mean 0.013 SD off and sd ratio 1.007, while the uncorrected test (normal noise of
    variance 1 instead of logistic, acceptance Φ(Λ)) gives an sd ratio of 0.76."""
    rng = np.random.default_rng(2)
    terms = barker.BarkerTerms(
        0.15, 1.0, 2.5, TAU, N, correction(1.0), pooled_ratio(1.0, 2.5, 12.0, rng)
    )
    draws, acceptance = run_chain(terms, rng)
    assert abs(draws.mean() - MEAN) < 0.1 * SD
    assert abs(draws.std() / SD - 1) < 0.06
    assert 0.2 < acceptance < 0.5


def test_noise_beyond_the_correction_names_the_keys():
    """Owner noise (τ/q)²·s² above C: an error naming the keys to change, before any move."""
    rng = np.random.default_rng(4)
    terms = barker.BarkerTerms(
        0.15, 1.0, 2.5, TAU, N, correction(1.0), pooled_ratio(1.0, 2.5, 25.0, rng)
    )
    state = barker.init(np.full((2, 1), MEAN), MODEL)
    with pytest.raises(ValueError, match=r"sampler\.temperature") as err:
        barker.step(rng, state, MODEL, terms)
    assert "sampler.barker_variance" in str(err.value)


Q, SIGMA, CLIP, CHAINS, ITERATIONS, WARMUP, OWNERS = 0.2, 30.0, 0.5, 2, 60, 20, 3


def simulate(tmp_path, *extra: str) -> int:
    """``fedpenalty simulate`` of barker in process: 3 owners × 2,000 records, τ = 0.005."""
    sets = {
        "run.transport": "'inprocess'",
        "sampler.algorithm": "'barker'",
        "data.owners": OWNERS,
        "data.n_per_owner": 2000,
        "sampler.iterations": ITERATIONS,
        "sampler.warmup": WARMUP,
        "sampler.chains": CHAINS,
        "sampler.sampling_rate": Q,
        "sampler.barker_clip": CLIP,
        "sampler.temperature": 0.005,
        "privacy.sigma": SIGMA,
        "privacy.budget_epsilon": 1000,
    }
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    return main(["simulate", *args, *extra, "--no-progress", "--out", str(tmp_path / "run")])


def test_each_owners_epsilon_is_dp_accountings(capsys, tmp_path):
    """privacy.json: every owner's ε is dp-accounting's PLD ε of CHAINS × (ITERATIONS +
    WARMUP) Poisson-subsampled Gaussian answers at (Q, SIGMA), computed here independently;
    the noise fields name the ratio clip."""
    assert simulate(tmp_path) == 0, capsys.readouterr().err
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    answers = CHAINS * (ITERATIONS + WARMUP)
    event = dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(SIGMA))
    pld = dp_accounting.pld.PLDAccountant(
        dp_accounting.NeighboringRelation.REPLACE_ONE, value_discretization_interval=1e-4
    )
    expected = pld.compose(event, answers).get_epsilon(1e-5)
    assert len(privacy["owners"]) == OWNERS
    for owner in privacy["owners"]:
        assert owner["answers"] == answers
        assert owner["epsilon"] == pytest.approx(expected, rel=1e-6)
        assert owner["sampling_rate"] == Q and owner["clip"] == CLIP
    diagnostics = json.loads((tmp_path / "run" / "diagnostics.json").read_text())
    assert diagnostics["target"].startswith("clipped-likelihood posterior")
    # the error is against the tempered posterior it samples (τ = 0.005 of 6,000 records, prior
    # sd 10, noise sd 1: sd (0.01 + 30)^−½ = 0.1826), not the untempered one (sd 0.0129)
    reference = diagnostics["reference"]
    assert reference["sd"][0] == pytest.approx((0.01 + 0.005 * OWNERS * 2000) ** -0.5, rel=1e-6)
    assert "tempered τ = 0.005" in reference["source"]
    # the owners' noise as the test sees it: (τ/q)²·Σ_k (σc)², nats² of the tempered log ratio
    expected_s2 = (0.005 / Q) ** 2 * OWNERS * (SIGMA * CLIP) ** 2
    assert diagnostics["mean_noise_variance"] == pytest.approx(expected_s2, rel=1e-9)


def test_owner_noise_beyond_the_correction_stops_the_run(capsys, tmp_path):
    """σ = 500: (τ/q)²·3·(σc)² = 117 > C = 1, a clear error naming the keys."""
    code = simulate(tmp_path, "--set", "privacy.sigma=500")
    assert code != 0
    assert "sampler.barker_variance" in capsys.readouterr().err


def test_barker_variance_beyond_the_correction_is_a_config_error(capsys, tmp_path):
    assert simulate(tmp_path, "--set", "sampler.barker_variance=2.0") != 0
    assert "sampler.barker_variance" in capsys.readouterr().err


@pytest.mark.slow
def test_barker_paper_quick(tmp_path):
    """``scenarios/barker_paper.py --quick`` (about 45 s) writes its JSON and PNG; ε grows with
    the answers as dp-accounting's; the final running means lie within 0.6 reference sd of the
    tempered posterior's (measured: 0.3 and 0.3 sd — a smoke bound for a bimodal target at
    4,000 draws, not a precision claim; the closed-form check is
    test_chain_hits_the_tempered_posterior)."""
    path = Path(__file__).parent.parent / "scenarios" / "barker_paper.py"
    spec = importlib.util.spec_from_file_location("barker_paper", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    assert module.main(["--quick", "--out", str(tmp_path), "--no-progress"]) == 0
    report = json.loads((tmp_path / "barker_paper.json").read_text())
    assert (tmp_path / "barker_paper.png").stat().st_size > 0
    for run in report["results"]["runs"]:
        eps = np.array(run["epsilon"])
        assert np.all(np.diff(eps) > 0)
        sd = np.sqrt(run["reference_var"])
        assert np.all(np.array(run["mean_error"][-1]) < 0.6 * sd)


def test_a_plan_past_the_budget_is_refused_with_the_kinds_own_advice(capsys, tmp_path):
    """Budget 0.9 × the plan's ε: refused at session open, nothing written; the advice is at
    this kind's own noise level — with the gradient kind's level set 100× higher (a
    per-kind noise key), the least σ advised is still the one for barker's answers."""
    answers = CHAINS * (ITERATIONS + WARMUP)
    event = dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(SIGMA))
    pld = dp_accounting.pld.PLDAccountant(
        dp_accounting.NeighboringRelation.REPLACE_ONE, value_discretization_interval=1e-4
    )
    needed = pld.compose(event, answers).get_epsilon(1e-5)
    code = simulate(
        tmp_path,
        "--set",
        f"privacy.budget_epsilon={needed * 0.9}",
        "--set",
        f"privacy.noise={{gradient_noise_multiplier = {100 * SIGMA}}}",
    )
    err = capsys.readouterr().err
    assert code == 2 and "refused the run at session open" in err and "barker" in err
    stated = float(re.search(r"needs ε = ([0-9.]+)", err).group(1))  # type: ignore[union-attr]
    assert stated == pytest.approx(needed, rel=0.01)  # the gradient level would give ≈ 0
    least = re.search(r"privacy.sigma \(noise multiplier\) ≥ ([0-9.]+)", err)
    assert least is not None and SIGMA < float(least.group(1)) < 1.3 * SIGMA
    assert not (tmp_path / "run").exists()
