"""The Laplace release charged by the owners' own ledgers (docs/design.md §2.10, "The Laplace
release"): the ``laplace_stats`` kind's pure ε in the ledger against an independent figure,
composed with Gaussian spend, charged once however long the chain, refused up front when over
budget; ``sampler.release = "laplace"`` for private_gibbs."""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
from fractions import Fraction

import numpy as np
import pytest
from scipy import optimize, stats

from fedpenalty.common import Policy
from fedpenalty.coordinator.private_gibbs import PRIVATE_GIBBS
from fedpenalty.errors import BudgetExhausted, ConfigError
from fedpenalty.kinds import query_kind
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerNode
from fedpenalty.owner.host import OwnerHost
from fedpenalty.refusals import PlanRefused
from fedpenalty.simulation import simulate

MODEL = build_model({"name": "linear_regression", "dim": 2, "known_variance": 1})
#: b = 4 = 2²: b/γ = 2²⁰ is exact, so b′ = b and the figure below is exact
SCALE = 4.0


def _independent_epsilon(scale: float) -> float:
    """(Δ₁ + γw)/b for a power-of-two b, γ = b/2²⁰, with Δ₁ = 2‖S(x*)‖₁ at the record that
    attains sup‖S(x)‖₁ (x = R/√d·1, y = Y; replace-one doubles it), w = stat_dim — none of it
    from the code under test's ε or sensitivity functions."""
    d, r, y = 2, MODEL.data_bound, MODEL.y_bound
    worst = np.array([[*np.full(d, r / math.sqrt(d)), y]])
    l1 = 2 * float(np.abs(MODEL.suff_stat(worst)).sum())
    gamma = Fraction(scale) / 2**20
    return float((Fraction(l1) + gamma * MODEL.stat_dim) / Fraction(scale))


def _gdp_epsilon(mu: float, delta: float) -> float:
    """ε of μ-GDP at δ: the root of Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) = δ."""

    def gap(eps: float) -> float:
        a = stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
        return a - delta

    return optimize.brentq(gap, 1e-9, 200.0, xtol=1e-13)


def _nodes(tmp_path, budget: float = 50.0, scale: float = SCALE) -> list[OwnerNode]:
    ledger = Ledger(tmp_path / "ledger.sqlite", synchronous="NORMAL")
    rng = np.random.default_rng(1)
    policy = Policy(
        sigma=30.0, max_step=0.05, budget_epsilon=budget, noise={"laplace_stats": scale}
    )
    return [
        OwnerNode(
            f"owner-{k}",
            MODEL,
            MODEL.simulate_records(rng, np.array([0.3, -0.2]), 300),
            policy,
            ledger,
            np.random.default_rng(10 + k),
        )
        for k in range(2)
    ]


def test_the_ledger_charges_the_independent_pure_epsilon_composed_with_gaussian_spend(tmp_path):
    """The ledger's ε of one Laplace release equals (Δ₁ + γw)/b to 1e-12; with one Gaussian
    statistic answer (μ = Δ₂/σ) added it equals ε_L + ε_GDP(μ, δ) (basic composition of the
    pure ε on top, the accountant's rule), the GDP term computed here by root finding. A
    ledger that dropped the rounding term, charged Δ₁/(2b) or forgot either part fails."""
    nodes = _nodes(tmp_path)
    host = OwnerHost(nodes)
    host.open_session("lap", "laplace_stats", 1)
    out = host.answer("laplace_stats", "lap", 0, np.array([0]))
    assert out.shape == (2, 1, MODEL.stat_dim)
    expected = _independent_epsilon(SCALE)
    assert expected > 2 * MODEL.stat_l1_sensitivity("add_remove") / SCALE  # the rounding term
    for node in nodes:
        report = node.privacy_report("lap")
        assert report.total.epsilon == pytest.approx(expected, rel=1e-12)
        assert report.session is not None and report.session.answers == 1
    host.open_session("gauss", "penalty_expfam", 1)
    host.suff_stats("gauss", np.array([0]), 0, 1)
    mu = MODEL.stat_sensitivity("replace_one") / 30.0
    for node in nodes:
        total = node.privacy_report().total
        delta = node.policy.delta
        assert total.answers == 2
        assert total.epsilon == pytest.approx(expected + _gdp_epsilon(mu, delta), rel=1e-9)


def test_a_repeated_release_is_replayed_and_a_second_key_refused(tmp_path):
    """The same release asked again returns the stored answer and charges nothing; another key
    (a second release) passes the plan of one and is refused, charging nothing."""
    nodes = _nodes(tmp_path)
    host = OwnerHost(nodes)
    host.open_session("lap", "laplace_stats", 1)
    first = host.answer("laplace_stats", "lap", 0, np.array([0]))
    again = host.answer("laplace_stats", "lap", 0, np.array([0]))
    np.testing.assert_array_equal(first, again)
    with pytest.raises(BudgetExhausted, match="pure-ε statistic answers"):
        host.answer("laplace_stats", "lap", 1, np.array([0]))
    for node in nodes:
        assert node.privacy_report("lap").total.answers == 1


def test_an_over_budget_release_is_refused_before_anything_is_recorded(tmp_path):
    """A budget below the release's ε refuses the plan at open: no session, no release row."""
    nodes = _nodes(tmp_path, budget=0.9 * _independent_epsilon(SCALE))
    host = OwnerHost(nodes)
    with pytest.raises(BudgetExhausted, match="refusing a plan of 1 laplace_stats answers"):
        host.open_session("lap", "laplace_stats", 1)
    db = sqlite3.connect(tmp_path / "ledger.sqlite")
    assert db.execute("SELECT COUNT(*) FROM sessions").fetchone() == (0,)
    assert db.execute("SELECT COUNT(*) FROM pure_releases").fetchone() == (0,)


def _run(tmp_path, name: str, privacy: dict, **overrides) -> tuple[dict, dict]:
    scenario = {"privacy": privacy} if privacy else None
    settings = {
        "model.name": "linear_regression",
        "sampler.algorithm": "private_gibbs",
        "sampler.release": "laplace",
        "sampler.warmup": 5,
        "sampler.chains": 2,
        "data.n_per_owner": 500,
        "run.transport": "inprocess",
        "run.progress": False,
        **overrides,
    }
    simulate(scenario, settings, tmp_path / name)
    read = [
        json.loads((tmp_path / name / f"{f}.json").read_text()) for f in ("privacy", "diagnostics")
    ]
    return read[0], read[1]


def test_a_laplace_run_is_charged_once_at_the_independent_epsilon(tmp_path):
    """A 200-iteration run with b = 4 named in [privacy.noise]: each owner's ledger holds one
    release row of one answer, at the independent ε (privacy.json's epsilon and ledger_epsilon),
    and the run directory has the files every run writes."""
    privacy, diagnostics = _run(
        tmp_path, "run", {"noise": {"laplace_scale": SCALE}}, **{"sampler.iterations": 200}
    )
    expected = _independent_epsilon(SCALE)
    assert privacy["kind"] == "laplace_stats"
    assert "discrete Laplace" in privacy["noise"] and "Gaussian" not in privacy["noise"]
    for owner in privacy["owners"]:
        assert owner["answers"] == 1 and owner["laplace_scale"] == SCALE
        assert owner["epsilon"] == pytest.approx(expected, rel=1e-12)
        assert owner["ledger_epsilon"] == pytest.approx(expected, rel=1e-12)
    ledgers = list((tmp_path / "run").glob("**/*.sqlite"))
    rows = [r for f in ledgers for r in sqlite3.connect(f).execute("SELECT * FROM pure_releases")]
    assert len(rows) == len(privacy["owners"]) and {r[3] for r in rows} == {1}
    assert diagnostics["kept_draws"] == 200 and diagnostics["reference"]["source"]
    for name in ("samples.npz", "posterior.nc", "run.json", "cost.json", "config.toml"):
        assert (tmp_path / "run" / name).exists()


def test_the_calibrated_scale_spends_the_whole_budget_on_the_one_release(tmp_path):
    """Without laplace_scale the owners' b is calibrated to the plan, which counts the release
    once per run (``ChainAlgorithm.once``), not once per chain: with 4 chains each owner's one
    release ends its ledger at ε just under privacy.budget_epsilon (within 1e-9 relative, the
    calibration's last step), and b = (Δ₁ + γw)/budget with Δ₁ and γ computed here. A plan
    that reserved one release per chain spends budget/4 at 4× this b (issue 24's leftover)."""
    privacy, _ = _run(tmp_path, "run", {}, **{"sampler.iterations": 20, "sampler.chains": 4})
    budget = privacy["owners"][0]["budget_epsilon"]
    for owner in privacy["owners"]:
        assert owner["answers"] == 1
        assert budget * (1 - 1e-9) <= owner["epsilon"] <= budget
        assert budget * (1 - 1e-9) <= owner["ledger_epsilon"] <= budget
        scale = owner["laplace_scale"]
        gamma = 2.0 ** (math.floor(math.log2(scale)) - 20)  # the owner's lattice step
        d, r, y = 2, MODEL.data_bound, MODEL.y_bound
        worst = np.array([[*np.full(d, r / math.sqrt(d)), y]])
        l1 = 2 * float(np.abs(MODEL.suff_stat(worst)).sum())  # replace-one
        assert scale == pytest.approx((l1 + gamma * MODEL.stat_dim) / budget, rel=1e-9)


SAMPLER = {"warmup": 5, "iterations": 20, "step": 0.05}


@pytest.mark.parametrize("release", ["laplace", "gaussian"])
@pytest.mark.parametrize("chains", [1, 4, 7])
def test_the_release_is_planned_once_per_run_whatever_the_chains(release, chains):
    """private_gibbs's session terms reserve one release per run for either release kind,
    whatever the chain count; the same entry without ``once`` reserves one per chain (the
    multiplication the flag turns off, still applied to every other kind)."""
    sampler = {**SAMPLER, "chains": chains, "release": release}
    kind = "laplace_stats" if release == "laplace" else "suff_stats"
    [terms] = PRIVATE_GIBBS.kind_terms(sampler)
    assert query_kind(terms.kind) is query_kind(kind) and terms.planned_answers == 1
    assert PRIVATE_GIBBS.planned_answers(sampler) == 1
    per_chain = dataclasses.replace(PRIVATE_GIBBS, once=())
    assert [t.planned_answers for t in per_chain.kind_terms(sampler)] == [chains]
    assert per_chain.planned_answers(sampler) == chains


def test_the_owner_refuses_a_second_release_past_the_run_plan(tmp_path):
    """The plan private_gibbs declares for 4 chains (one release) is the owners' bound: chain
    0's release is answered and charged; chain 1's — a coordinator asking a release per chain —
    is refused by every owner though its budget (50) would pay for many, charging nothing."""
    nodes = _nodes(tmp_path)
    host = OwnerHost(nodes)
    [terms] = PRIVATE_GIBBS.kind_terms({**SAMPLER, "chains": 4, "release": "laplace"})
    host.open_session("lap", terms.kind, terms.planned_answers)
    host.answer("laplace_stats", "lap", 0, np.array([0]))
    assert 2 * _independent_epsilon(SCALE) < 50.0  # the budget is not what refuses
    with pytest.raises(BudgetExhausted, match="pure-ε statistic answers"):
        host.answer("laplace_stats", "lap", 0, np.array([1]))
    for node in nodes:
        report = node.privacy_report("lap")
        assert report.total.answers == 1
        assert report.total.epsilon == pytest.approx(_independent_epsilon(SCALE), rel=1e-12)


def test_tiny_laplace_noise_gives_the_exact_conjugate_posterior(tmp_path):
    """b = 2⁻²⁰ (budget raised to pay for it): the released statistics are exact to ~1e-5, so
    the chain samples the closed-form posterior — mean within 0.1 reference sd and sd within
    8 % over 4 × 1,000 draws (MC errors ≈ 0.02 sd and ≈ 1.5 %: 5 sd). A release that mixed up
    components, dropped an owner or summed twice moves the mean by far more."""
    _, diagnostics = _run(
        tmp_path,
        "tiny",
        {"noise": {"laplace_scale": 2.0**-20}, "budget_epsilon": 1e9},
        **{"sampler.iterations": 1000, "sampler.chains": 4},
    )
    err = diagnostics["error"]
    assert max(err["mean_in_sd"]) < 0.1, err
    assert np.allclose(err["sd_ratio"], 1.0, atol=0.08), err


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"sampler.release": "laplcae"}, ConfigError, "sampler.release"),
        (
            {"privacy.budget_epsilon": 1e-3},
            PlanRefused,
            r"privacy\.budget_epsilon ≥ .*; \[privacy\.noise\] laplace_scale ≥ ",
        ),
    ],
)
def test_bad_settings_are_refused_naming_the_key(tmp_path, overrides, error, match):
    """A misspelt release, and a budget below the plan's releases (refused by every owner at
    session open, before any release), each name the key to change; no run directory stays."""
    privacy = {"noise": {"laplace_scale": SCALE}}
    with pytest.raises(error, match=match):
        _run(tmp_path, "run", privacy, **{"sampler.iterations": 5, **overrides})
    assert not (tmp_path / "run").exists()


def test_a_lattice_owner_releases_lattice_multiples_stored_for_replay(tmp_path):
    """An owner with a noise key (the deployed noise path: ChaCha20 words) releases exact
    multiples of its γ = b/2²⁰, noised (not the rounded exact sum), and its ledger stores the
    answer, which a restarted owner replays bit for bit without a second charge."""
    from fedpenalty.owner.noise.sources import NoiseKey

    def node(ledger: Ledger) -> OwnerNode:
        records = MODEL.simulate_records(np.random.default_rng(1), np.array([0.3, -0.2]), 300)
        policy = Policy(sigma=30.0, max_step=0.05, noise={"laplace_stats": SCALE})
        return OwnerNode("o", MODEL, records, policy, ledger, noise_key=NoiseKey.derive(b"k", "o"))

    ledger = Ledger(tmp_path / "l.sqlite")
    first = node(ledger)
    host = OwnerHost([first])
    host.open_session("lap", "laplace_stats", 1)
    out = host.answer("laplace_stats", "lap", 0, np.array([0]))[0, 0]
    gamma = SCALE / 2**20
    assert np.array_equal(out / gamma, np.rint(out / gamma))
    assert not np.allclose(out, first.stat_sum, atol=gamma)
    ledger.close()
    again = Ledger(tmp_path / "l.sqlite")
    restarted = OwnerHost([node(again)])
    restarted.open_session("lap", "laplace_stats", 1)
    np.testing.assert_array_equal(
        restarted.answer("laplace_stats", "lap", 0, np.array([0]))[0, 0], out
    )
    assert restarted.nodes[0].privacy_report("lap").total.answers == 1
