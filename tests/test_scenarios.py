"""The scenario scripts (scenarios/README.md) at their ``--quick`` settings: each writes its JSON
and PNG, and its headline result points the way the paper (or the question) says.

Seeds are fixed, so every figure is deterministic; each tolerance says how far the measured
value sits from failing and why a real bug would cross it. The checks are on directions and
ratios, not on exact numbers.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
RAY_OR_SECAGG = "not yet: needs the Ray transport / secure aggregation"


def load(name: str) -> ModuleType:
    """A scenario script as a module (dataclasses resolve their module by name)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scenarios" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def quick(name: str, folder: Path) -> dict:
    """Run ``scenarios/NAME.py --quick`` and return its JSON (after checking both files)."""
    assert load(name).main(["--quick", "--no-progress", "--out", str(folder)]) == 0
    png = folder / f"{name}.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads((folder / f"{name}.json").read_text())
    assert report["scenario"] == name
    assert report["fedpenalty_version"]
    assert "--quick" in report["command"]
    assert report["settings"] and report["notes"]
    return report


def rows_of(report: dict, method: str) -> dict:
    return {r["target_epsilon"]: r for r in report["results"]["runs"] if r["method"] == method}


# ------------------------------------------------------------------ privacy_mixing


@pytest.fixture(scope="module")
def mixing(tmp_path_factory) -> dict:
    return quick("privacy_mixing", tmp_path_factory.mktemp("mixing"))


def test_mixing_every_owner_stays_within_its_target(mixing):
    """Each owner's ledger ε never passes the target; the calibrated methods whose every
    answer is charged at the worst case spend it to within 1% (least noisy owner)."""
    for r in mixing["results"]["runs"]:
        if r["method"] == "exact_mh":
            assert r["epsilon_per_owner"] == []
            continue
        assert max(r["epsilon_per_owner"]) <= r["target_epsilon"] * 1.001, r["method"]
        if r["method"] in ("penalty_expfam", "sgld", "sghmc", "ops", "noisy_stats"):
            assert max(r["epsilon_per_owner"]) == pytest.approx(r["target_epsilon"], rel=0.01)


def test_mixing_unequal_owners_spend_by_their_noise(mixing):
    """Unequal owners: the least noisy owner (noise ratio 1) spends most, the noisiest least."""
    for r in mixing["results"]["runs"]:
        eps = r["epsilon_per_owner"]
        if r["config"] == "unequal" and r["method"] in ("penalty", "penalty_expfam", "sgld"):
            assert eps == sorted(eps, reverse=True) and eps[0] > eps[-1] * 1.5


def test_mixing_error_falls_as_epsilon_grows(mixing):
    """The headline: more ε buys a better posterior. W1 to the exact posterior falls by at
    least 20% from ε = 0.5 to ε = 2 for every method that uses the extra budget; Wang et al.'s
    loose calibration barely moves."""
    low, high = mixing["settings"]["setup"]["epsilons"]
    for method in ("penalty", "penalty_expfam", "sgld", "sghmc", "ops", "noisy_stats"):
        rows = rows_of(mixing, method)
        assert rows[high]["w1_in_sd"] < 0.8 * rows[low]["w1_in_sd"], method


def test_mixing_noisy_statistics_beat_ops_and_wang_spends_little(mixing):
    """Conjugate model: one noisy release of the statistics is far closer to the posterior
    than OPS draws at every ε (measured 100× closer); Wang et al.'s calibration spends under a
    fifth of what the exact accountant lets the same target spend (measured ≈ 1/30)."""
    noisy, ops = rows_of(mixing, "noisy_stats"), rows_of(mixing, "ops")
    wang, tight = rows_of(mixing, "sgld_wang"), rows_of(mixing, "sgld")
    for eps in noisy:
        assert noisy[eps]["w1_in_sd"] < 0.2 * ops[eps]["w1_in_sd"]
        assert wang[eps]["epsilon_max"] < 0.2 * tight[eps]["epsilon_max"]
    assert any(RAY_OR_SECAGG in n for n in mixing["notes"])


# ------------------------------------------------------------------ penalty_paper


@pytest.fixture(scope="module")
def penalty(tmp_path_factory) -> dict:
    return quick("penalty_paper", tmp_path_factory.mktemp("penalty"))["results"]


def test_proposition_1_acceptance_falls_with_noise_as_expected(penalty):
    """Acceptance decreases strictly in s², and each measured value lies within 0.05 of the
    expected acceptance (about 4 standard errors of an acceptance rate over 1,600 draws; a
    penalty term with the wrong sign or size moves it by far more)."""
    rows = sorted(penalty["proposition_1"], key=lambda r: r["noise_var"])
    measured = [r["acceptance"] for r in rows]
    assert measured == sorted(measured, reverse=True) and measured[0] > measured[-1] + 0.3
    for r in rows:
        assert abs(r["acceptance"] - r["expected_acceptance"]) < 0.05, r["noise_var"]


def test_theorem_1_regime_privacy_and_mixing(penalty):
    """μ = 2 for T = n answers: the exact ε grows only through δ = n^-1.5 (9.45 at n = 10³, the
    independent check's figure), the paper's bound is 20-35× larger, and acceptance stays
    within 0.1 of its value at n = 10³ while the chains converge (R-hat < 1.3)."""
    rows = {r["n"]: r for r in penalty["theorem_1"]}
    sizes = sorted(rows)
    assert rows[1000]["epsilon_exact"] == pytest.approx(9.45, abs=0.01)
    assert rows[1000]["mu_total"] == pytest.approx(2.0)
    for n in sizes:
        assert 20 < rows[n]["paper_over_exact"] < 35
        assert abs(rows[n]["acceptance"] - rows[1000]["acceptance"]) < 0.1
        assert rows[n]["rhat"] < 1.3
    assert (
        rows[sizes[0]]["epsilon_exact"]
        < rows[sizes[-1]]["epsilon_exact"]
        < 1.4 * rows[sizes[0]]["epsilon_exact"]
    )


def test_more_owners_lower_acceptance_at_equal_privacy(penalty):
    """Algorithm 2: K owners at σ = 0.5 each — acceptance falls with K as s² = Kσ² predicts
    (within 0.05), while each owner's ledger ε stays what it was with one owner (within 1%)."""
    rows = sorted(penalty["more_owners"], key=lambda r: r["owners"])
    measured = [r["acceptance"] for r in rows]
    assert measured == sorted(measured, reverse=True)
    one = rows[0]["ledger_epsilon_per_owner"][0]
    for r in rows:
        assert abs(r["acceptance"] - r["expected_acceptance"]) < 0.05
        assert r["ledger_epsilon_per_owner"] == pytest.approx([one] * r["owners"], rel=0.01)


# ------------------------------------------------------------------ foulds_beta_bernoulli


@pytest.fixture(scope="module")
def foulds(tmp_path_factory) -> dict:
    return quick("foulds_beta_bernoulli", tmp_path_factory.mktemp("foulds"))["results"]


def test_foulds_laplace_beats_ops_for_large_n(foulds):
    """Laplace (both constructions) has a lower L1 error than OPS for N ≥ 1,000 by more than
    3 standard errors (measured: 2× at 10³, 5× at 10⁵), and converges to the non-private
    curve: at N = 10⁵ its error is within 25% of the non-private one (about 3 SE at 120
    repeats)."""
    l1 = foulds["l1_error"]
    for n in ("1000", "100000"):
        for m in ("laplace_paper", "laplace_project"):
            gap = l1["ops"][n]["mean"] - l1[m][n]["mean"]
            assert gap > 3 * (l1["ops"][n]["se"] ** 2 + l1[m][n]["se"] ** 2) ** 0.5, (m, n)
    for m in ("laplace_paper", "laplace_project"):
        assert 0.75 < l1[m]["100000"]["mean"] / l1["non_private"]["100000"]["mean"] < 1.25
    # n public and one count noised at half the scale: the project's variant is closer at 10³
    assert l1["laplace_project"]["1000"]["mean"] < l1["laplace_paper"]["1000"]["mean"]


def test_foulds_asymptotic_relative_efficiencies(foulds):
    """§3: ARE 2 for posterior sampling and Laplace, 1 + T for OPS (T = 1/ρ). Measured at
    N = 10⁵ with 120 repeats the estimate has a relative SE of about 13%, so ±40% is 3 SE; a
    wrong temperature (ρ off by 2) would put OPS's ratio at 0.5 or 2."""
    for r in foulds["efficiency"]:
        assert 0.6 < r["are"] / r["theory_vs_mle"] < 1.4, (r["method"], r["epsilon"])
    ops = sorted(
        (r for r in foulds["efficiency"] if r["method"] == "ops"), key=lambda r: r["epsilon"]
    )
    assert ops[0]["are"] > 3 * ops[-1]["are"]  # smaller ε, hotter OPS, less efficient


def test_foulds_penalty_chain_cannot_leave_its_start_at_this_epsilon(foulds):
    """At ε = 0.1 the penalty chain's 2,000 steps move it at most max_travel from its
    data-independent start, so its error does not fall with N (stays above 10× non-private)."""
    l1 = foulds["l1_error"]
    assert l1["penalty"]["100000"]["mean"] > 10 * l1["non_private"]["100000"]["mean"]


# ------------------------------------------------------------------ wang_logistic


@pytest.fixture(scope="module")
def wang(tmp_path_factory) -> dict:
    return quick("wang_logistic", tmp_path_factory.mktemp("wang"))


def test_wang_steps_and_spend(wang):
    """Li et al.'s Figure 1: the accountant admits a step over 100× Wang et al.'s at every ε
    (measured 400-500×), and Wang et al.'s noise really spends under a fifth of the target."""
    for r in wang["results"]["step_curve"]:
        assert r["gain"] > 100 and r["wang_exact_epsilon"] < 0.2 * r["epsilon"]
    for r in wang["results"]["runs"]:
        if r["target_epsilon"] is not None:
            assert r["epsilon_max"] <= r["target_epsilon"] * 1.001, r["method"]


def test_wang_tight_dp_sgld_predicts_better(wang):
    """Real data: non-private accuracy ≥ 0.9. Wang et al.'s admissible step is too small for
    its chains to leave their start: LPD within 0.02 of log ½ (a chain at θ ≈ 0 predicts ½
    everywhere). Tight DP-SGLD learns: LPD at least 0.05 above that and accuracy ≥ 0.8."""
    runs = wang["results"]["runs"]
    exact = next(r for r in runs if r["method"] == "exact_mh")
    assert exact["accuracy"] >= 0.9
    (eps,) = wang["settings"]["setup"]["epsilons"]
    tight, loose = rows_of(wang, "sgld")[eps], rows_of(wang, "sgld_wang")[eps]
    assert abs(loose["lpd"] - math.log(0.5)) < 0.02
    assert tight["lpd"] > loose["lpd"] + 0.05 and tight["accuracy"] >= 0.8
