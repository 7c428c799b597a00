"""The reference posterior of a model without a closed form (logistic): importance sampling
from a Laplace-centred Student-t, checked against the exact-MH reference it replaces, with the
fallback to exact MH when the importance weights are too uneven."""

from __future__ import annotations

import numpy as np
from arviz_stats.base import array_stats
from scipy import stats

from fedpenalty.coordinator import reference
from fedpenalty.models.logistic import Logistic

MODEL = Logistic(dim=2)
RECORDS = MODEL.simulate_records(np.random.default_rng(7), np.array([1.0, -1.0]), 400)


def test_importance_reference_agrees_with_exact_mh() -> None:
    proposal = reference.laplace_proposal(MODEL, RECORDS)
    assert proposal is not None
    imp = reference.importance_moments(
        MODEL, RECORDS, np.random.default_rng(1), proposal, reference.IS_DRAWS
    )
    # 400 records: the posterior is close to normal, so a t proposal at the Laplace fit keeps
    # most of its draws' weight (measured ≈ 0.9 of the draws); a real bug (wrong mode, wrong
    # sign of a covariance, weights not normalised) leaves far less or shifts the moments.
    assert imp.ess > 0.5 * reference.IS_DRAWS
    draws = reference.exact_mh_draws(MODEL, RECORDS, np.random.default_rng(2), 8, 10_000)
    mh_mean, mh_sd = draws.mean(axis=(0, 1)), draws.std(axis=(0, 1), ddof=1)
    mh_ess = np.array([array_stats.ess(draws[..., j], chain_axis=0, draw_axis=1) for j in range(2)])
    # Tolerance: 4.5 Monte-Carlo standard errors of the difference of two independent
    # estimates, sd/√ESS for a mean and sd/√(2 ESS) for an sd (normal approximation).
    se_mean = mh_sd * np.sqrt(1 / imp.ess + 1 / mh_ess)
    se_sd = mh_sd * np.sqrt(1 / (2 * imp.ess) + 1 / (2 * mh_ess))
    assert np.all(np.abs(imp.mean - mh_mean) <= 4.5 * se_mean), (imp, mh_mean, se_mean)
    assert np.all(np.abs(imp.sd - mh_sd) <= 4.5 * se_sd), (imp, mh_sd, se_sd)


def test_bad_proposal_has_low_ess_and_falls_back_to_exact_mh() -> None:
    # A narrow proposal 10 posterior sds off the mode: nearly all weight on one draw.
    bad = stats.multivariate_t(loc=[3.0, -3.0], shape=1e-4 * np.eye(2), df=reference.IS_DF)
    imp = reference.importance_moments(
        MODEL, RECORDS, np.random.default_rng(3), bad, reference.IS_DRAWS
    )
    assert imp.ess < 10
    ref = reference.sampled_reference(MODEL, RECORDS, np.random.default_rng(4), bad)
    assert ref.source == "exact_mh"
    good = reference.sampled_reference(
        MODEL, RECORDS, np.random.default_rng(4), reference.laplace_proposal(MODEL, RECORDS)
    )
    assert good.source == "importance_sampling"
    # the fallback estimates the same posterior (tolerance: 0.15 posterior sd, far above the
    # Monte-Carlo error of either at these sizes, far below an off-by-a-mode error)
    np.testing.assert_allclose(ref.mean, good.mean, atol=0.15 * good.sd.max())


def test_reference_posterior_uses_importance_sampling_and_caches(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FEDPENALTY_CACHE", str(tmp_path))
    first = reference.reference_posterior(MODEL, RECORDS)
    assert first.source == "importance_sampling"
    assert len(list(tmp_path.glob("reference-*.npz"))) == 1
    again = reference.reference_posterior(MODEL, RECORDS)
    assert again.source == "importance_sampling"
    np.testing.assert_array_equal(again.mean, first.mean)
    np.testing.assert_array_equal(again.sd, first.sd)
