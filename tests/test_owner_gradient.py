"""Gradient answers (federated SG-MCMC) at the owner: validation, plan and budget, replay,
and accounting of subsampled-Gaussian releases with dp-accounting (docs/design.md §2.3, §3)."""

from __future__ import annotations

import numpy as np
import pytest
from owners import SoloOwner

from fedpenalty.common import Policy
from fedpenalty.errors import BudgetExhausted, InvalidRequest, ReplayConflict, UnknownSession
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerNode
from fedpenalty.privacy import mu_for_epsilon
from fedpenalty.privacy.subsampled import SubsampledGaussian
from fedpenalty.privacy.subsampled import epsilon as sampled_epsilon

MODEL = build_model({"name": "logistic", "dim": 2, "data_bound": 1.0, "theta_bound": 3.0})
RECORDS = MODEL.simulate_records(np.random.default_rng(0), np.array([0.5, -0.5]), 400)


def make_node(tmp_path, **policy) -> SoloOwner:
    defaults = dict(sigma=2.0, budget_epsilon=20.0, delta=1e-5, max_sampling_rate=0.2, max_clip=1.0)
    return SoloOwner(
        OwnerNode(
            "ann",
            MODEL,
            RECORDS,
            Policy(**{**defaults, **policy}),
            Ledger(tmp_path / "ledger.sqlite", synchronous="NORMAL"),
            np.random.default_rng(1),
        )
    )


def ask(node, iteration, chains=3, clip=0.5, seed=0, session="g"):
    theta = np.random.default_rng(seed).uniform(-1, 1, (chains, 2))
    return node.gradient(session, iteration, np.arange(chains), theta, clip), theta


def test_gradient_answers_are_counted_and_accounted_with_pld(tmp_path):
    node = make_node(tmp_path)
    node.open_session("g", "sgmcmc", 300, sampling_rate=0.05)
    for t in range(50):
        values, _ = ask(node, t, seed=t)
        assert values.shape == (3, 2) and np.all(np.isfinite(values))
    report = node.privacy_report("g")
    expected = sampled_epsilon([SubsampledGaussian(0.05, 2.0, 150)], 1e-5, neighbour="replace_one")
    assert report.session.answers == 150 and report.session.accountant == "pld"
    assert report.session.epsilon == pytest.approx(expected, rel=1e-9)
    assert report.total.epsilon == pytest.approx(expected, rel=1e-9)


def test_gradient_noise_has_the_declared_scale(tmp_path):
    """q tiny so (almost) no record is sampled: answers are the N(0, (σ·clip)²) noise alone."""
    node = make_node(tmp_path, budget_epsilon=1e6, max_sampling_rate=1.0)
    node.open_session("g", "sgmcmc", 10**6, sampling_rate=1e-9)
    values = np.concatenate([ask(node, t, chains=50, clip=0.5, seed=t)[0] for t in range(40)])
    sd = 2.0 * 0.5
    # 4000 values: sample variance within ±7% of sd² except with probability ~1e-5 (χ² bounds)
    assert 0.93 < values.var() / sd**2 < 1.07
    assert abs(values.mean()) < 5 * sd / np.sqrt(values.size)


@pytest.mark.parametrize(
    "bad,message",
    [
        (dict(clip=2.0), "exceeds this owner's max_clip"),
        (dict(clip=-1.0), "positive finite"),
        (dict(clip=float("nan")), "positive finite"),
        (dict(theta=np.full((3, 2), np.nan)), "NaN"),
        (dict(theta=np.full((3, 2), 9.0)), "outside Θ"),
        (dict(theta=np.zeros((3, 3))), "shape"),
    ],
)
def test_bad_gradient_requests_change_nothing(tmp_path, bad, message):
    node = make_node(tmp_path)
    node.open_session("g", "sgmcmc", 30, sampling_rate=0.05)
    theta = bad.get("theta", np.zeros((3, 2)))
    with pytest.raises(InvalidRequest, match=message):
        node.gradient("g", 0, np.arange(3), theta, bad.get("clip", 0.5))
    assert node.privacy_report("g").session.answers == 0


def test_sessions_need_a_valid_sampling_rate(tmp_path):
    node = make_node(tmp_path)
    for q in (None, 0.0, 0.5, True):
        with pytest.raises(InvalidRequest, match="sampling_rate"):
            node.open_session("g", "sgmcmc", 10, sampling_rate=q)
    with pytest.raises(InvalidRequest, match="only sgmcmc"):
        node.open_session("p", "penalty", 10, sampling_rate=0.1)
    with pytest.raises(UnknownSession):
        ask(node, 0)
    node.open_session("g", "sgmcmc", 10, sampling_rate=0.1)
    with pytest.raises(InvalidRequest, match="not 'penalty'"):
        node.log_ratio("g", 0, np.array([0]), np.zeros((1, 2)), np.full((1, 2), 0.01))


def test_replay_and_conflict(tmp_path):
    node = make_node(tmp_path)
    node.open_session("g", "sgmcmc", 30, sampling_rate=0.05)
    first, theta = ask(node, 7)
    again = node.gradient("g", 7, np.arange(3), theta, 0.5)
    np.testing.assert_array_equal(first, again)
    assert node.privacy_report("g").session.answers == 3
    with pytest.raises(ReplayConflict):
        node.gradient("g", 7, np.arange(3), theta + 0.01, 0.5)
    with pytest.raises(ReplayConflict):  # the clip is part of the query
        node.gradient("g", 7, np.arange(3), theta, 0.4)
    assert node.privacy_report("g").session.answers == 3


def test_plan_caps_the_answers_and_the_budget_caps_the_plan(tmp_path):
    node = make_node(tmp_path)
    with pytest.raises(BudgetExhausted, match="refusing a plan"):
        node.open_session("big", "sgmcmc", 10**7, sampling_rate=0.2)
    node.open_session("g", "sgmcmc", 6, sampling_rate=0.05)
    ask(node, 0)
    ask(node, 1)
    with pytest.raises(BudgetExhausted, match="plan of 6 gradient answers") as refused:
        ask(node, 2)
    spent = node.privacy_report().total.epsilon
    assert refused.value.epsilon_left == pytest.approx(
        20.0 - spent
    )  # the budget itself is not used up
    assert node.privacy_report("g").session.answers == 6


def test_gradient_spend_shrinks_what_gaussian_answers_may_spend(tmp_path):
    node = make_node(tmp_path, budget_epsilon=3.0)
    analytic = mu_for_epsilon(3.0, 1e-5) ** 2
    assert node.max_mu_squared == pytest.approx(analytic)
    node.open_session("p", "penalty", 0)
    node.open_session("g", "sgmcmc", 150, sampling_rate=0.05)
    assert 0 < node.max_mu_squared < analytic  # the reserved plan is held against Gaussian answers
    for t in range(50):
        ask(node, t, seed=t)
    report = node.privacy_report()
    assert report.total.accountant == "pld" and 0 < report.total.epsilon < 3.0


def test_gradient_ledger_survives_restart(tmp_path):
    node = make_node(tmp_path)
    node.open_session("g", "sgmcmc", 30, sampling_rate=0.05)
    first, theta = ask(node, 0)
    node.ledger.close()
    again = make_node(tmp_path)
    again.open_session("g", "sgmcmc", 30, sampling_rate=0.05)
    np.testing.assert_array_equal(again.gradient("g", 0, np.arange(3), theta, 0.5), first)
    assert again.privacy_report("g").session.answers == 3
    with pytest.raises(InvalidRequest, match="sampling rate"):
        again.open_session("g", "sgmcmc", 30, sampling_rate=0.1)


def test_hostile_plans_are_refused_in_bounded_memory(tmp_path):
    """A plan worth ε ≈ 10⁶ would need GiBs of PLD support; RDP bounds it first (O(1) memory)."""
    node = make_node(tmp_path, max_sampling_rate=1.0)
    with pytest.raises(BudgetExhausted, match="refusing a plan"):
        node.open_session("g", "sgmcmc", 10**9, sampling_rate=1.0)
    node.open_session("p", "penalty", 0)
    with pytest.raises(BudgetExhausted, match="refusing a plan"):
        node.open_session("h", "sgmcmc", 10**9, sampling_rate=0.2)
