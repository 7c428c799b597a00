"""Algorithms that ask several kinds (docs/design.md §4, "Algorithms of several kinds"): a toy
kernel registered with one line asks ``clipped_gradient`` and ``clipped_log_ratio`` each
iteration; a simulated run opens one session with both kinds, at the levels of
``[privacy.noise]``, in process and over gRPC, and privacy.json's per-owner ε is the exact GDP
composition of the answers each owner released of both kinds."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from fedpenalty.common import Policy
from fedpenalty.config import load_scenario
from fedpenalty.coordinator import mh
from fedpenalty.coordinator.adapt import StepAdaptation
from fedpenalty.coordinator.algorithms import ALGORITHMS
from fedpenalty.coordinator.base import ChainAlgorithm, ChainData, NoSettings, planned_steps
from fedpenalty.errors import ConfigError
from fedpenalty.kinds import KindTerms
from fedpenalty.models import Model, build_model
from fedpenalty.privacy.gaussian import epsilon_for_delta
from fedpenalty.refusals import PlanRefused, plan_needs_kinds
from fedpenalty.simulation import simulate

CLIP = 2.0


def build(model: Model, data: ChainData, *, step: float):
    """Random-walk penalty MH on clipped ratios that also asks the clipped gradient at θ
    (sub-step 0) before the ratio (sub-step 1) every iteration."""
    oracle = data.require_oracle("toy_two_kinds")

    def ratio(iteration: int, chains: np.ndarray, theta: np.ndarray, theta_prop: np.ndarray):
        oracle.query("clipped_gradient", iteration, chains, substep=0, theta=theta, clip=CLIP)
        answers = oracle.query(
            "clipped_log_ratio",
            iteration,
            chains,
            substep=1,
            theta=theta,
            theta_prop=theta_prop,
            clip=CLIP,
        )
        lam, s2 = answers.total()
        return lam, np.full(len(chains), s2)

    return mh.kernel(model, ratio, StepAdaptation.start(step), 0.0, False)


def two_kinds(sampler: Mapping[str, Any]) -> dict[str, int]:
    return {"clipped_log_ratio": planned_steps(sampler), "clipped_gradient": planned_steps(sampler)}


TOY = ChainAlgorithm(
    "toy_two_kinds",
    "penalty MH on clipped ratios that also asks clipped gradients",
    build,
    NoSettings,
    mh.MHState,
    "penalty_clipped",
    kinds=two_kinds,
    clips=lambda sampler: {"clipped_log_ratio": CLIP, "clipped_gradient": CLIP},
)

SCENARIO = {
    "sampler.algorithm": "toy_two_kinds",
    "model.name": "gaussian_mean",
    "model.dim": 2,
    "data.owners": 3,
    "data.n_per_owner": 200,
    "sampler.step": 0.3,
    "sampler.warmup": 20,
    "sampler.iterations": 40,
    "sampler.chains": 2,
    "privacy.sigma": 0.2,  # the ratios' multiplier: s² = 3 × (0.2 × 2)², the chains move
    "privacy.noise": {"clipped_gradient_noise_multiplier": 10.0},
    "privacy.budget_epsilon": 1e6,
    "run.seed": 5,
}


@pytest.mark.parametrize("transport", ["inprocess", "grpc"])
def test_a_run_of_two_kinds_opens_both_and_reports_their_composition(
    tmp_path, monkeypatch, transport
):
    monkeypatch.setitem(ALGORITHMS, "toy_two_kinds", TOY)
    result = simulate(None, {**SCENARIO, "run.transport": transport}, out=tmp_path / "run")
    assert result.stopped is None and result.theta.shape == (2, 40, 2)
    privacy = json.loads((result.out / "privacy.json").read_text())
    assert privacy["kind"] == "penalty_clipped"
    assert {k: v["answers_per_chain"] for k, v in privacy["kinds"].items()} == {
        "penalty_clipped": 60,
        "gradient_clipped": 60,
    }
    assert privacy["target"] == (
        "clipped-likelihood posterior (per-record clip 2 on clipped_log_ratio, 2 on "
        "clipped_gradient)"
    )
    asked = 2 * 60  # chains × (warmup + iterations) of each kind: no proposal left Θ
    assert 0 < result.diagnostics["acceptance_rate"] < 1
    for owner in privacy["owners"]:
        assert owner["noise"] == {
            "ratio_noise_multiplier": 0.2,
            "clipped_gradient_noise_multiplier": 10.0,
        }
        assert owner["answers"] == 2 * asked
        # an independent composition: replace_one, μ = 2/σ per answer of each kind
        mu = np.sqrt(asked * (2 / 0.2) ** 2 + asked * (2 / 10.0) ** 2)
        if transport == "inprocess":  # float noise: exact GDP
            assert owner["mu"] == pytest.approx(mu, rel=1e-9)
            assert owner["epsilon"] == pytest.approx(epsilon_for_delta(mu, 1e-5), rel=1e-9)
        else:  # never below the exact composition (lattice rounding, RDP, add to it)
            assert owner["epsilon"] >= epsilon_for_delta(mu, 1e-5) * (1 - 1e-9)
    diagnostics = json.loads((result.out / "diagnostics.json").read_text())
    assert diagnostics["target"] == privacy["target"]
    if transport == "inprocess":  # simulated in-process owners count clip-bound hits
        hits = diagnostics["simulation_only"]["clip_hits"]
        assert set(hits) == {"penalty_clipped", "gradient_clipped"}
        assert hits["gradient_clipped"]["evaluations"] == [asked * 200] * 3
        assert 0 <= hits["gradient_clipped"]["fraction"] <= 1


def test_privacy_noise_names_only_known_kind_keys():
    with pytest.raises(ConfigError, match="unknown noise keys"):
        load_scenario(None, {"privacy.noise": {"ratio_noise_sd": 1.0}})
    with pytest.raises(ConfigError, match=r"privacy\.noise"):
        load_scenario(None, {"privacy.noise": {"ratio_noise_multiplier": -1.0}})


def test_a_refused_plan_of_two_kinds_says_what_fits_for_both(tmp_path, monkeypatch):
    """Budget ε = 5 against 120 + 120 answers of μ = 10 and 0.2: refused, with the composed
    ε it needs; the advice is right — a plan of the answers it names (in proportion) fits,
    one answer more of each kind does not, and levels × the factor it names fit."""
    monkeypatch.setitem(ALGORITHMS, "toy_two_kinds", TOY)
    budget = {**SCENARIO, "privacy.budget_epsilon": 5.0, "run.transport": "inprocess"}
    with pytest.raises(PlanRefused) as refused:
        simulate(None, budget, out=tmp_path / "run")
    message = str(refused.value)
    assert "120 penalty_clipped, 120 gradient_clipped" in message
    assert "ratio_noise_multiplier, clipped_gradient_noise_multiplier" in message
    policy = Policy(sigma=0.2, budget_epsilon=5.0, noise={"gradient_clipped": 10.0})
    model = build_model({"name": "gaussian_mean", "dim": 2})
    terms = [KindTerms("clipped_log_ratio", 120), KindTerms("clipped_gradient", 120)]
    needs = plan_needs_kinds(terms, model, policy, False, 0.0)
    mu = np.sqrt(120 * (2 / 0.2) ** 2 + 120 * (2 / 10.0) ** 2)
    assert needs.epsilon == pytest.approx(epsilon_for_delta(mu, 1e-5), rel=1e-9)
    assert needs.max_answers is not None and needs.sigma is not None
    each = needs.max_answers // 2
    fits = np.sqrt(each * (2 / 0.2) ** 2 + each * (2 / 10.0) ** 2)
    over = np.sqrt((each + 1) * (2 / 0.2) ** 2 + (each + 1) * (2 / 10.0) ** 2)
    assert epsilon_for_delta(fits, 1e-5) <= 5.0 < epsilon_for_delta(over, 1e-5)
    assert epsilon_for_delta(mu / needs.sigma, 1e-5) == pytest.approx(5.0, rel=1e-6)
