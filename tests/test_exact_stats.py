"""The trusted curator's exact ratio from summed sufficient statistics equals the record-by-record
sum (docs/design.md §2.4): the O(1) path that makes exact_mh the fastest baseline."""

from __future__ import annotations

import numpy as np
import pytest

from fedpenalty.coordinator.exact import pooled_log_ratio
from fedpenalty.models import ExpFamModel, Logistic, build_model

EXPFAM = [
    {"name": "gaussian_mean", "dim": 2},
    {"name": "bernoulli"},
    {"name": "poisson"},
]


@pytest.mark.parametrize("section", EXPFAM, ids=lambda s: s["name"])
def test_stats_path_equals_record_sum(section):
    model = build_model(section)
    assert isinstance(model, ExpFamModel)
    rng = np.random.default_rng(3)
    records = model.simulate_records(rng, np.full(model.dim, 0.3), 5000)
    theta = rng.uniform(-1, 1, size=(6, model.dim))
    theta_prop = theta + rng.normal(0, 0.05, size=theta.shape)
    fast = pooled_log_ratio(model, records)(theta, theta_prop)
    slow = model.log_lik_diff(records, theta, theta_prop).sum(axis=1)
    # the two sum the same terms in another order: agreement to rounding of the 5,000 terms
    scale = np.abs(model.log_lik_diff(records, theta, theta_prop)).sum(axis=1)
    np.testing.assert_allclose(fast, slow, rtol=0, atol=1e-10 * scale.max())
    assert not np.allclose(fast, 0)  # a non-trivial ratio was compared


def test_models_without_statistics_sum_record_by_record():
    model = Logistic(dim=2)
    rng = np.random.default_rng(4)
    records = model.simulate_records(rng, np.array([0.5, -0.5]), 300)
    theta, prop = np.zeros((2, 2)), np.full((2, 2), 0.1)
    np.testing.assert_array_equal(
        pooled_log_ratio(model, records)(theta, prop),
        model.log_lik_diff(records, theta, prop).sum(axis=1),
    )
