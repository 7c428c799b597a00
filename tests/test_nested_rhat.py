"""Nested R-hat (fedpenalty/nested_rhat.py): the formula against hand computations, its verdict
on mixed and stuck superchains, shared starts (sampler.superchains) and diagnostics.json."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedpenalty.config import ConfigError, resolve
from fedpenalty.diagnostics import summarize
from fedpenalty.models import build_model
from fedpenalty.nested_rhat import NESTED_RHAT_LIMIT, nested_rhat, nested_summary
from fedpenalty.run_session import chain_start


def test_nested_rhat_matches_a_hand_computation():
    # superchain A: chains (1, 2, 3), (2, 3, 4); B: (3, 4, 5), (4, 5, 6).
    # chain means 2, 3 | 4, 5; superchain means 2.5, 4.5, overall 3.5: B = 1 + 1 = 2.
    # within A: variance of the chain means (2, 3) = 0.5, mean chain variance 1 → 1.5; B alike
    # → nR̂ = √(1 + 2 / 1.5) = √(7/3)
    theta = np.array([[1, 2, 3], [2, 3, 4], [3, 4, 5], [4, 5, 6]], float)[:, :, None]
    assert nested_rhat(theta, 2) == pytest.approx([math.sqrt(7 / 3)], rel=1e-12)
    # one draw per chain (N = 1): no within-chain term; chains 0, 1 | 2, 3: B = 2, W = 0.5
    single = np.arange(4.0).reshape(4, 1, 1)
    assert nested_rhat(single, 2) == pytest.approx([math.sqrt(5.0)], rel=1e-12)
    # one chain per superchain (M = 1): no among-chain term; means 2 and 4 → B = 2, W = 1
    assert nested_rhat(theta[[0, 2]], 2) == pytest.approx([math.sqrt(3.0)], rel=1e-12)
    # each parameter on its own, and unchanged by an affine map of it
    two = np.concatenate([theta, 2.0 * theta + 7.0], axis=2)
    assert nested_rhat(two, 2) == pytest.approx([math.sqrt(7 / 3)] * 2, rel=1e-12)
    with pytest.raises(ValueError, match="superchains"):
        nested_rhat(theta, 3)


def test_nested_rhat_passes_mixed_and_flags_stuck_superchains():
    rng = np.random.default_rng(0)
    # 16 superchains × 4 chains × 100 independent N(0, 1) draws: nR̂ − 1 ≈ 1/(2·400) ≈ 0.0013,
    # B / W fluctuates as χ²₁₅/15 (≤ 2.2 at 99.5 %): far below the 0.01 limit
    mixed = rng.normal(size=(64, 100, 1))
    summary = nested_summary(mixed, 16)
    assert summary is not None and summary["mixed"] and summary["shared_start"]
    assert summary["values"][0] < 1.004
    # the same chains as slow AR(1) (ρ = 0.999, stationary sd 1) started at their superchain's
    # common point (sd 1): 100 draws do not forget it, so superchain means differ
    starts = np.repeat(rng.normal(size=16), 4)
    stuck = np.empty((64, 100))
    stuck[:, 0] = starts
    rho = 0.999
    for t in range(1, 100):
        stuck[:, t] = rho * stuck[:, t - 1] + math.sqrt(1 - rho**2) * rng.normal(size=64)
    flagged = nested_summary(stuck[:, :, None], 16)
    assert flagged is not None and not flagged["mixed"]
    assert flagged["values"][0] > 2.0  # B ≈ 1 (start spread), W ≈ 0.1 (local moves)


def test_nested_summary_default_grouping_and_small_runs():
    rng = np.random.default_rng(1)
    assert nested_summary(rng.normal(size=(8, 50, 1)), 0) is None  # fewer than 16 chains
    assert nested_summary(rng.normal(size=(18, 50, 1)), 0) is None  # 4 does not divide 18
    default = nested_summary(rng.normal(size=(32, 50, 2)), 0)
    assert default is not None
    assert (default["superchains"], default["chains_per_superchain"]) == (8, 4)
    assert not default["shared_start"] and default["limit"] == NESTED_RHAT_LIMIT
    assert "nested_rhat" not in summarize(rng.normal(size=(4, 50, 1)), None)
    out = summarize(rng.normal(size=(16, 50, 1)), None, superchains=2)
    assert out["nested_rhat"]["chains_per_superchain"] == 8


def raw(chains: int, superchains: int) -> dict:
    return {
        "model": {"name": "gaussian_mean", "data_bound": 2.0, "theta_bound": 1.0},
        "sampler": {"algorithm": "penalty", "chains": chains, "superchains": superchains},
        "run": {"transport": "inprocess"},
    }


def test_superchains_share_starts_and_bad_values_name_the_key():
    model = build_model({"name": "gaussian_mean", "data_bound": 2.0, "theta_bound": 1.0})
    _, shared = chain_start(resolve(raw(16, 4)), model)
    assert shared.shape == (16, 1)
    groups = shared.reshape(4, 4)
    assert np.all(groups == groups[:, :1]) and len(np.unique(groups[:, 0])) == 4
    _, free = chain_start(resolve(raw(16, 0)), model)
    assert len(np.unique(free)) == 16
    for bad in (1, 3):
        with pytest.raises(ConfigError, match=r"sampler\.superchains"):
            resolve(raw(16, bad))
