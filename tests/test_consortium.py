"""scenarios/consortium.py and its user-written model (scenarios/consortium_model.py): the
model's gradients are its log-likelihood's and log-prior's, its deterministic reference is the
pooled posterior (checked against the least-squares fit it must sit near), and the quick run
spends each owner's ε exactly as calibrated for every method."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from test_scenarios import ROOT, quick

pytest.importorskip("statsmodels")
sys.path.insert(0, str(ROOT / "scenarios"))
import consortium
from consortium_model import GroupEffectsRegression


@pytest.fixture(scope="module")
def pooled(tmp_path_factory) -> tuple[GroupEffectsRegression, np.ndarray]:
    folder = tmp_path_factory.mktemp("owners")
    model = GroupEffectsRegression(**{k: v for k, v in consortium.MODEL.items() if k != "name"})
    parts = []
    for path in consortium.owners_data(Path(folder)):
        with np.load(path) as z:
            parts.append(np.column_stack([z[name] for name in model.column_names]))
    return model, model.prepare_records(np.concatenate(parts))


def test_owners_are_the_plans_of_unequal_sizes(pooled):
    model, records = pooled
    sizes = np.bincount(records[:, -2].astype(int))
    assert len(sizes) == consortium.OWNERS == 6 and model.dim == 15
    assert list(sizes) == sorted(sizes, reverse=True) and sizes.sum() == 20190
    assert sizes.min() == 1074 and sizes.max() == 6822


def test_gradients_are_the_derivatives_of_the_log_density(pooled):
    """Central differences at h = 1e-6 on the pooled records: the log likelihood's terms reach
    ~3e3 nats per unit, so a relative error of 1e-6 is the differencing's own; a wrong factor
    (e.g. 1/σ instead of 1/σ²) is off by order 1."""
    model, records = pooled
    theta = 0.1 * np.random.default_rng(0).standard_normal((2, model.dim))
    h, eye = 1e-6, np.eye(model.dim)

    def total(t):
        return model.log_lik(records, t).sum(axis=1)

    fd = np.stack([(total(theta + h * e) - total(theta - h * e)) / (2 * h) for e in eye], 1)
    grad = model.grad_log_lik(records, theta).sum(axis=1)
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-3)
    fdp = np.stack(
        [(model.log_prior(theta + h * e) - model.log_prior(theta - h * e)) / (2 * h) for e in eye],
        1,
    )
    np.testing.assert_allclose(model.grad_log_prior(theta), fdp, rtol=1e-6, atol=1e-6)


def test_reference_sits_at_the_least_squares_fit_of_the_pooled_records(pooled):
    """With 20,190 records the prior barely moves β: the reference mean of β must lie within
    0.2 of its posterior sd of the least-squares fit with plan effects (measured: 0.05 at
    most; a reference on the wrong records misses by several sd), each plan's α + b_k within
    0.5 sd of its fit (measured 0.03), and β's posterior sd within 5% of the fit's standard
    error σ√((XᵀX)⁻¹) (measured: 0.97–1.00; a noise sd of 0.5 or 2 instead of 0.95 is off by
    a factor of about 2)."""
    model, records = pooled
    ref = model.reference_posterior(records)
    d = consortium.MODEL["covariates"]
    x, group, y = records[:, :d], records[:, d].astype(int), records[:, d + 1]
    design = np.column_stack([x, np.eye(consortium.OWNERS)[group]])
    fit = np.linalg.lstsq(design, y, rcond=None)[0]
    beta = slice(1, 1 + d)
    assert np.all(np.abs(ref.mean[beta] - fit[:d]) < 0.2 * ref.sd[beta])
    se = consortium.MODEL["noise_sd"] * np.sqrt(np.diag(np.linalg.inv(design.T @ design)))
    np.testing.assert_allclose(ref.sd[beta], se[:d], rtol=0.05)
    intercepts = ref.mean[0] + ref.mean[2 + d :]
    assert np.all(np.abs(intercepts - fit[d:]) < 0.5 * ref.sd[2 + d :])
    again = model.reference_posterior(records)
    assert np.array_equal(again.mean, ref.mean) and np.array_equal(again.sd, ref.sd)


@pytest.mark.slow
def test_quick_run_spends_each_owners_epsilon_as_calibrated(tmp_path):
    report = quick("consortium", tmp_path)
    rows = report["results"]
    assert {r["method"] for r in rows} == set(consortium.METHODS)
    for r in rows:
        assert r["epsilon_max"] <= r["target_epsilon"] * (1 + 1e-9), r
        assert r["epsilon_max"] >= 0.9 * r["target_epsilon"], r  # calibrated, not loose
        assert np.isfinite(r["error_max_sd"]) and r["ess_bulk_min"] > 0
