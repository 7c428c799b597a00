"""Clipped answers without the per-record pass (docs/design.md §2.9, "Answers without the
per-record pass"): where the model certifies from its data domain that no record's term can
reach the clip, the owner sums from Σ S(x). The answers must equal the per-record path's up to
float summation order (relative 1e-9: the two sums differ by rounding of ~n ulps of the
terms, ~1e-12 relative here) and the clip-hit counters must say the same (zero hits on a
certified chain, every record counted as evaluated)."""

from __future__ import annotations

import numpy as np
import pytest

from fedpenalty.common import Policy
from fedpenalty.coordinator.inprocess import InProcessOracle
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerNode
from fedpenalty.owner.compute import clipped_gradient as gradient_module
from fedpenalty.owner.compute import clipped_log_ratio as ratio_module
from fedpenalty.owner.compute.clip_free import clip_free
from fedpenalty.owner.compute.clipped_gradient import clipped_gradient_total
from fedpenalty.owner.compute.clipped_log_ratio import clip_free_ratio_sum

DIM = 5
MODEL = build_model({"name": "gaussian_mean", "dim": DIM, "data_bound": 3.0, "theta_bound": 2.0})
RECORDS = MODEL.simulate_records(np.random.default_rng(7), np.full(DIM, 0.05), 3000)
NEAR = np.random.default_rng(8).normal(0.05, 0.02, (3, DIM))  # ‖θ‖ ≈ 0.1: certified at 3.2
FAR = np.full((1, DIM), 1.5)  # ‖θ‖ = 3.4: bound 6.4, not certified at 3.2
CLIP = 3.2
KIND = "gradient_clipped"


def owner(tmp_path, name: str, per_record: bool | None = None, sigma: float = 2.0) -> OwnerNode:
    """A simulated owner of RECORDS with simulation counters; ``per_record=True`` forces the
    per-record path (the reference)."""
    terms = Policy(sigma=sigma, budget_epsilon=1e40, delta=1e-5, max_clip=10.0)
    ledger = Ledger(tmp_path / f"{name}.sqlite", synchronous="NORMAL")
    rng = np.random.default_rng(3)
    return OwnerNode(name, MODEL, RECORDS, terms, ledger, rng, True, per_record)


def forbid(monkeypatch, module, name: str) -> None:
    """Make ``module.name`` raise: the certified path must not take the per-record one."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"{name} was called on a certified chain")

    monkeypatch.setattr(module, name, refuse)


def test_gaussian_mean_bounds_cover_every_record_and_are_reached(tmp_path):
    """The certificate is an upper bound on every record of the data ball, and is attained by
    the worst record (the sphere point opposite θ, or along the move where θ̄ is parallel)."""
    theta = np.array([[0.3, -0.2, 0.1, 0.0, 0.4]])
    prop = 1.7 * theta
    worst_grad = -3.0 * theta / np.linalg.norm(theta)
    worst_ratio = -3.0 * (prop - theta) / np.linalg.norm(prop - theta)
    x = np.vstack([MODEL.prepare_records(RECORDS), worst_grad, worst_ratio])
    grads = np.linalg.norm(MODEL.grad_log_lik(x, theta), axis=2)
    diffs = np.abs(MODEL.log_lik_diff(x, theta, prop))
    bound_g, bound_r = MODEL.gradient_norm_bound(theta), MODEL.log_lik_diff_bound(theta, prop)
    assert np.all(grads <= bound_g[:, None] * (1 + 1e-12))
    assert np.all(diffs <= bound_r[:, None] * (1 + 1e-12))
    assert grads.max() == pytest.approx(bound_g[0], rel=1e-12)
    assert diffs.max() == pytest.approx(bound_r[0], rel=1e-12)


def test_certified_gradient_sums_equal_the_per_record_sums_and_count_no_hit(tmp_path, monkeypatch):
    reference = owner(tmp_path, "slow", per_record=True)
    want = clipped_gradient_total(reference, NEAR, CLIP, KIND, MODEL.gradient_norm_bound(NEAR))
    assert reference.simulation_diagnostics().by_kind[KIND] == [0, 3 * len(RECORDS)]
    fast = owner(tmp_path, "fast")
    forbid(monkeypatch, gradient_module, "clipped_gradients")
    got = clipped_gradient_total(fast, NEAR, CLIP, KIND, MODEL.gradient_norm_bound(NEAR))
    np.testing.assert_allclose(got, want, rtol=1e-9)
    assert fast.simulation_diagnostics().by_kind[KIND] == [0, 3 * len(RECORDS)]


def test_a_chain_that_cannot_be_certified_goes_record_by_record_with_its_hits(tmp_path):
    theta = np.vstack([NEAR, FAR])
    reference = owner(tmp_path, "slow", per_record=True)
    fast = owner(tmp_path, "fast")
    assert list(clip_free(fast, MODEL.gradient_norm_bound(theta), np.full(4, CLIP))) == [
        True,
        True,
        True,
        False,
    ]
    want = clipped_gradient_total(reference, theta, CLIP, KIND, MODEL.gradient_norm_bound(theta))
    got = clipped_gradient_total(fast, theta, CLIP, KIND, MODEL.gradient_norm_bound(theta))
    np.testing.assert_allclose(got, want, rtol=1e-9)
    hits = reference.simulation_diagnostics().by_kind[KIND]
    assert hits[0] > 0  # the far chain's clip binds on records: counted by both
    assert fast.simulation_diagnostics().by_kind[KIND] == hits


@pytest.mark.parametrize("per_distance", [False, True])
def test_certified_ratio_sums_equal_the_per_record_sums(tmp_path, monkeypatch, per_distance):
    prop = NEAR + np.random.default_rng(9).normal(0, 0.003, NEAR.shape)
    unit = np.linalg.norm(prop - NEAR, axis=1) if per_distance else np.full(3, 0.05)
    bound = CLIP * unit if per_distance else unit
    kind = "penalty_clipped"
    reference = owner(tmp_path, "slow", per_record=True)
    want = clip_free_ratio_sum(
        reference, NEAR, prop, bound, kind, MODEL.log_lik_diff_bound(NEAR, prop)
    )
    fast = owner(tmp_path, "fast")
    forbid(monkeypatch, ratio_module, "clipped_ratio_sum")
    got = clip_free_ratio_sum(fast, NEAR, prop, bound, kind, MODEL.log_lik_diff_bound(NEAR, prop))
    np.testing.assert_allclose(got, want, rtol=1e-9)
    counts = [0, 3 * len(RECORDS)]
    assert reference.simulation_diagnostics().by_kind[kind] == counts
    assert fast.simulation_diagnostics().by_kind[kind] == counts


def test_ratio_chains_past_the_certificate_keep_their_clipped_sums_and_hits(tmp_path):
    theta = np.vstack([NEAR, FAR])
    prop = theta + 0.01
    bound = np.full(4, CLIP * np.linalg.norm(np.full(DIM, 0.01)))
    kind = "penalty_clipped"
    reference, fast = owner(tmp_path, "slow", per_record=True), owner(tmp_path, "fast")
    want = clip_free_ratio_sum(
        reference, theta, prop, bound, kind, MODEL.log_lik_diff_bound(theta, prop)
    )
    np.testing.assert_allclose(
        clip_free_ratio_sum(fast, theta, prop, bound, kind, MODEL.log_lik_diff_bound(theta, prop)),
        want,
        rtol=1e-9,
    )
    hits = reference.simulation_diagnostics().by_kind[kind]
    assert hits[0] > 0
    assert fast.simulation_diagnostics().by_kind[kind] == hits


@pytest.mark.parametrize("kind", ["clipped_gradient", "clipped_log_ratio"])
def test_noiseless_oracle_answers_agree_between_the_paths(tmp_path, kind):
    """Through the answer path (checks, per-distance quotient, noise of sd ~0)."""
    answers = []
    for name, per_record in (("slow", True), ("fast", None)):
        oracle = InProcessOracle([owner(tmp_path, name, per_record, sigma=1e-12)])
        oracle.open_session(kind, 10, session="s")
        arrays: dict = {"theta": NEAR, "clip": CLIP}
        if kind == "clipped_log_ratio":
            arrays = {"theta": NEAR, "theta_prop": NEAR + 0.004, "clip_per_distance": CLIP}
        answers.append(oracle.query(kind, 0, np.arange(3), **arrays).values[0])
    np.testing.assert_allclose(answers[1], answers[0], rtol=1e-9, atol=1e-9)


def test_a_model_without_a_certificate_is_never_clip_free(tmp_path):
    logistic = build_model({"name": "logistic"})
    assert logistic.gradient_norm_bound(np.zeros((2, 2))) is None
    node = owner(tmp_path, "plain")
    assert not clip_free(node, None, np.full(2, CLIP)).any()
    # a certified bound above the clip (or within the rounding margin of it) is not clip-free
    assert list(clip_free(node, np.array([CLIP, CLIP * 0.99]), np.full(2, CLIP))) == [False, True]
