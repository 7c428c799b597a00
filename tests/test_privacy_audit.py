"""The empirical privacy audit (scenarios/privacy_audit.py) at its ``--quick`` settings.

Seeds are fixed, so every figure below is deterministic; the tolerances say how far each lies
from what would make it fail (the bounds hold with 95% confidence by construction).
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

_PATH = Path(__file__).resolve().parents[1] / "scenarios" / "privacy_audit.py"
_SPEC = importlib.util.spec_from_file_location("privacy_audit", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
privacy_audit = importlib.util.module_from_spec(_SPEC)
sys.modules["privacy_audit"] = privacy_audit  # dataclasses resolve their module by name
_SPEC.loader.exec_module(privacy_audit)

REQUIRED = {"mechanism", "claimed_epsilon", "audited_epsilon_lower_bound", "violation"}
OPTIONAL = {"trials", "answers_per_trial", "delta", "confidence", "attack_accuracy"}
HONEST = ("penalty_answer", "suff_stats_answer", "gradient_answer")


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> dict[str, dict]:
    """The ``--quick`` audit, run through the command line and read back from its JSON."""
    out = tmp_path_factory.mktemp("audit") / "rows.json"
    assert privacy_audit.main(["--quick", "--no-progress", "--json", str(out)]) == 0
    return {r["mechanism"]: r for r in json.loads(out.read_text())}


def test_rows_have_the_required_keys(rows):
    assert set(rows) == {
        *HONEST,
        "broken_sigma_half",
        "float_noise_tiny_step",
        "penalty_answer_tiny_step",
    }
    for r in rows.values():
        assert REQUIRED <= set(r) <= REQUIRED | OPTIONAL
        assert isinstance(r["violation"], bool)
        assert r["violation"] == (r["audited_epsilon_lower_bound"] > r["claimed_epsilon"])


def test_honest_gaussian_answers_are_not_flagged(rows):
    for name in HONEST:
        r = rows[name]
        # μ = 0.75 at δ = 1e-5: lattice answers are accounted by Rényi DP, ε = 3.41 (the
        # gradient, sampled at rate 1, by its base mechanism's RDP: the same); the continuous
        # Gaussian's PLD would say 3.15. The quick audit finds 1.2–1.8.
        assert r["claimed_epsilon"] == pytest.approx(3.408, abs=0.05)
        assert not r["violation"]
        assert 0 < r["audited_epsilon_lower_bound"] <= r["claimed_epsilon"] - 1.0


def test_broken_sigma_half_is_flagged(rows):
    r = rows["broken_sigma_half"]
    assert r["violation"]
    # σ/2 doubles μ to 1.43: the quick audit finds ε ≥ 4.26 against the claimed 3.15
    assert r["audited_epsilon_lower_bound"] > r["claimed_epsilon"] + 0.5


def test_float_noise_tiny_step_is_flagged(rows):
    r = rows["float_noise_tiny_step"]
    assert r["violation"]
    assert r["claimed_epsilon"] < 1e-6
    # no false positive in 500 evaluation trials: ε ≥ log(0.99·500/3.7) ≈ 4.9
    assert r["audited_epsilon_lower_bound"] > 4.5
    assert r["attack_accuracy"] > 0.99


def test_float_distinguisher_never_rejects_the_true_ratio():
    rng = np.random.default_rng(0)
    lam, other = -1e-11, 1e-11
    answers = privacy_audit.old_float_answers(lam, 0.7, rng, (20_000,))
    assert privacy_audit.float_consistent(answers, lam, 0.7).all()
    # about 82% of answers are also consistent with the other ratio (per answer, at σ = 0.7)
    assert privacy_audit.float_consistent(answers, other, 0.7).mean() == pytest.approx(
        0.82, abs=0.02
    )


def test_clopper_pearson_matches_scipy():
    exact = stats.binomtest(7, 50).proportion_ci(0.95, method="exact")
    assert privacy_audit.clopper_pearson_upper(7, 50, 0.025) == pytest.approx(exact.high, rel=1e-12)
    upper = privacy_audit.clopper_pearson_upper(np.array([0, 50]), 50, 0.05)
    assert upper[0] == pytest.approx(1 - 0.05 ** (1 / 50), rel=1e-12)
    assert upper[1] == 1.0


def test_a_perfect_test_is_bounded_by_its_sample_size():
    """Separated scores: no errors on the 1,000 evaluation samples of each side, so the bound
    is log((1 − δ − p)/p) with p = 1 − (α/2)^(1/1000), whatever the mechanism."""
    scores_d, scores_d_prime = np.zeros(2000), np.ones(2000)
    result = privacy_audit.audit(scores_d, scores_d_prime, 1e-5)
    p = 1 - 0.025 ** (1 / 1000)
    assert result.epsilon_lower_bound == pytest.approx(math.log((1 - 1e-5 - p) / p), rel=1e-9)
    assert result.accuracy == 1.0
