"""Lattice gradient answers (docs/design.md §2.7): keyed Poisson sampling, exact discrete
Gaussian noise on the lattice, and their accounting by general subsampled-RDP bounds that are
checked against dp-accounting, against the tight PLD accountant, and against the exact Rényi
divergences of subsampled discrete Gaussians."""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest
from scipy.special import logsumexp

from fedpenalty.common import SGMCMC, Policy
from fedpenalty.errors import BudgetExhausted, ReplayConflict
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerHost, OwnerNode
from fedpenalty.owner.compute.gradient import clipped_gradient_sum
from fedpenalty.owner.noise.exact import poisson_sample
from fedpenalty.owner.noise.lattice import lattice_gradient_multiplier
from fedpenalty.owner.noise.sources import ChaChaSource, NoiseKey
from fedpenalty.privacy.subsampled import SubsampledGaussian
from fedpenalty.privacy.subsampled import epsilon as tight_epsilon
from fedpenalty.privacy.subsampled_rdp import (
    ORDERS,
    epsilon_from_rdp,
    subsampled_gaussian_rdp,
    zhu_wang_bound,
)

MODEL = build_model({"name": "gaussian_mean", "dim": 2})
RECORDS = MODEL.simulate_records(np.random.default_rng(4), np.array([0.3, -0.2]), 300)


def owner(key=b"k", records=RECORDS, **policy) -> OwnerHost:
    policy = {"budget_epsilon": 1e9, "sigma": 0.8, "max_sampling_rate": 1.0,
              "max_answers_per_request": 10**6, **policy}  # fmt: skip
    node = OwnerNode("o", MODEL, records, Policy(**policy), Ledger(":memory:"),
                     noise_key=NoiseKey.derive(key, "o"))  # fmt: skip
    return OwnerHost([node])


# --- the bounds --------------------------------------------------------------------------------
def test_zhu_wang_without_its_factor_3_is_the_exact_gaussian_formula_of_dp_accounting():
    """Zhu & Wang's bound with the factor 3 set to 1 is Mironov et al.'s exact integer-order
    formula for the subsampled Gaussian; dp-accounting computes that independently (agreement
    to 1e-10 relative: both are sums of the same positive terms in log space)."""
    for q, sigma in ((0.01, 1.1), (0.2, 3.0), (0.003, 0.7)):
        acc = dp_accounting.rdp.RdpAccountant(orders=list(ORDERS))
        acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)))
        ours = [zhu_wang_bound(np.arange(a + 1) / (2 * sigma**2), q, a, factor=1.0) for a in ORDERS]
        np.testing.assert_allclose(ours, acc._rdp, rtol=1e-10)


@pytest.mark.parametrize("neighbour", ["add_remove", "replace_one"])
@pytest.mark.parametrize("q,sigma", [(0.01, 1.1), (0.01, 4.0), (0.1, 1.0), (0.001, 0.8)])
def test_general_bounds_never_undercut_the_tight_gaussian_accountant(neighbour, q, sigma):
    """The general bounds hold for any mechanism, so they can never claim less than the tight
    PLD figure of the continuous Gaussian (a lower bound on what the discrete one needs). They
    stay within 4× of it (+1 nat where ε is tiny and integer orders make them loose), so they
    are usable."""
    for count in (100, 10_000):
        general = epsilon_from_rdp(count * subsampled_gaussian_rdp(q, sigma, neighbour), 1e-5)
        tight = tight_epsilon([SubsampledGaussian(q, sigma, count)], 1e-5, neighbour=neighbour)
        assert tight <= general
        assert general <= 4 * tight + 1.0


def _discrete_gaussian(scale: float, width: int) -> tuple[np.ndarray, np.ndarray]:
    support = np.arange(-width, width + 1)
    logp = -(support**2) / (2 * scale**2)
    return support, logp - logsumexp(logp)


def _renyi(logp: np.ndarray, logq: np.ndarray, alpha: int) -> float:
    return float(logsumexp(alpha * logp - (alpha - 1) * logq)) / (alpha - 1)


@pytest.mark.parametrize("q", [0.05, 0.3])
def test_the_bounds_cover_the_exact_divergences_of_subsampled_discrete_gaussians(q):
    """Exact Rényi divergences of 1-D Poisson-subsampled discrete Gaussians (lattice scale 6,
    one record moves the sum by 6 lattice steps: noise multiplier 1), computed by summing over
    the lattice, in both directions: add/remove pairs (1−q)N(0)+qN(6) vs N(0), and the
    replace pair (1−q)N(0)+qN(6) vs (1−q)N(0)+qN(−6). The bound must be at least every one of
    them; it is within a factor 4 at order 2 (a wrong q-power or a missing term fails one or
    the other)."""
    support, base = _discrete_gaussian(6.0, 400)
    shift = lambda k: np.interp(support - k, support, base, left=-np.inf, right=-np.inf)  # noqa: E731
    mix = lambda k: np.logaddexp(np.log1p(-q) + base, np.log(q) + shift(k))  # noqa: E731
    add, replace = (
        subsampled_gaussian_rdp(q, 1.0, "add_remove"),
        subsampled_gaussian_rdp(q, 1.0, "replace_one"),
    )
    for i, alpha in enumerate(ORDERS[:12]):
        exact_add = max(_renyi(mix(6), base, alpha), _renyi(base, mix(6), alpha))
        exact_replace = _renyi(mix(6), mix(-6), alpha)
        assert exact_add <= add[i] * (1 + 1e-9)
        assert exact_replace <= replace[i] * (1 + 1e-9)
        if alpha == 2:
            assert add[i] <= 4 * exact_add and replace[i] <= 4 * exact_replace


def test_rounding_lowers_the_accounted_multiplier_by_the_lattice_step():
    sigma, width = 0.8, 5
    got = lattice_gradient_multiplier(sigma, width)
    assert got < sigma / (1 + np.sqrt(width) * sigma * 2.0**-20) * (1 + 1e-15)
    assert got > sigma * (1 - 1e-5)


# --- the owner's answers -----------------------------------------------------------------------
def test_keyed_poisson_sample_has_rate_at_most_q_and_depends_only_on_its_key():
    """200 keys × 5,000 records at q = 0.3: the included fraction is within 5 binomial standard
    errors of q; the same key gives the same sample from a fresh source; another chain differs."""
    source = ChaChaSource([NoiseKey.derive(b"p", "o")])
    keys = {"owner": 0, "chain": np.arange(200), "iteration": 7}
    mask = poisson_sample(source, "s", SGMCMC, 0.3, 5000, **keys)
    assert mask.shape == (200, 5000)
    assert abs(mask.mean() - 0.3) < 5 * np.sqrt(0.3 * 0.7 / mask.size)
    again = poisson_sample(ChaChaSource([NoiseKey.derive(b"p", "o")]), "s", SGMCMC, 0.3, 5000,
                           owner=0, chain=np.array([5]), iteration=7)  # fmt: skip
    np.testing.assert_array_equal(again[0], mask[5])
    assert not np.array_equal(mask[5], mask[6])
    assert poisson_sample(source, "s", SGMCMC, 1.0, 50, owner=0, chain=0, iteration=0).all()


def test_lattice_gradients_are_lattice_points_with_the_declared_noise_and_replay():
    """q = 1, 3,000 chains at one θ: every answer an exact multiple of the gradient lattice step;
    answer − exact clipped sum has mean 0 (5 standard errors) and sd σ·clip within 6% (relative
    sd of a 3,000-sample sd: 1.3%; σ/2 noise is off by 50%). A repeat replays; the same key
    from an owner with the same noise key (a restarted owner) gives the same answer."""
    host = owner()
    host.open_session("s", SGMCMC, 10**6, 1.0)
    m, clip = 3000, 2.0
    theta = np.tile([[0.1, 0.0]], (m, 1))
    answers = host.gradient("s", 0, np.arange(m), theta, clip)[0]
    gamma = host._noise.gamma * 2.0 ** np.floor(np.log2(clip))
    assert np.all(answers / gamma == np.round(answers / gamma))
    node = host.nodes[0]
    exact = clipped_gradient_sum(MODEL, node.records, theta[:1], np.ones((1, 300), bool), clip)
    noise = answers - exact
    assert np.all(np.abs(noise.mean(axis=0)) < 5 * 0.8 * clip / np.sqrt(m))
    assert np.all(np.abs(noise.std(axis=0, ddof=1) / (0.8 * clip) - 1) < 0.06)
    np.testing.assert_array_equal(host.gradient("s", 0, np.arange(m), theta, clip)[0], answers)
    with pytest.raises(ReplayConflict):
        host.gradient("s", 0, np.arange(1), theta[:1] + 0.5, clip)
    restarted = owner()
    restarted.open_session("s", SGMCMC, 10**6, 1.0)
    np.testing.assert_array_equal(
        restarted.gradient("s", 0, np.arange(5, 8), theta[5:8], clip)[0], answers[5:8]
    )


def test_lattice_gradient_sums_are_unbiased_under_subsampling():
    """q = 0.25: the mean of 2,000 answers / q is within 5 standard errors of the full clipped
    gradient sum (keyed sampling draws each record with probability ≤ q, = q to 2^-53)."""
    host = owner()
    q, clip, m = 0.25, 1.0, 2000
    host.open_session("s", SGMCMC, 10**6, q)
    theta = np.tile([[0.4, 0.1]], (m, 1))
    answers = host.gradient("s", 3, np.arange(m), theta, clip)[0] / q
    full = clipped_gradient_sum(MODEL, RECORDS, theta[:1], np.ones((1, 300), bool), clip)[0]
    se = answers.std(axis=0, ddof=1) / np.sqrt(m)
    assert np.all(np.abs(answers.mean(axis=0) - full) < 5 * se)


@pytest.mark.parametrize("neighbour", ["replace_one", "add_remove"])
def test_lattice_gradient_answers_are_charged_by_the_general_bound(neighbour):
    host = owner(neighbour=neighbour)
    node = host.nodes[0]
    q = 0.1
    host.open_session("s", SGMCMC, 100, q)
    for it in range(5):
        host.gradient("s", it, np.arange(4), np.zeros((4, 2)), 1.0)
    report = host.privacy_reports("s")[0]
    sigma_eff = lattice_gradient_multiplier(0.8, 2)
    expected = epsilon_from_rdp(20 * subsampled_gaussian_rdp(q, sigma_eff, neighbour), 1e-5)
    assert report.session is not None
    assert report.session.accountant == "rdp"
    assert report.session.epsilon == pytest.approx(expected, rel=1e-12)
    float_owner = OwnerHost([OwnerNode("f", MODEL, RECORDS, node.policy, Ledger(":memory:"),
                                       np.random.default_rng(0))])  # fmt: skip
    float_owner.open_session("s", SGMCMC, 100, q)
    for it in range(5):
        float_owner.gradient("s", it, np.arange(4), np.zeros((4, 2)), 1.0)
    assert float_owner.privacy_reports("s")[0].session.epsilon < expected


def test_a_lattice_gradient_plan_is_checked_with_the_general_bound():
    """A plan the tight (continuous-Gaussian) accountant would admit but the general bound
    does not is refused by a lattice owner: the plan check and the charges agree."""
    q, plan = 0.01, 5000
    sigma_eff = lattice_gradient_multiplier(1.0, 2)
    general = epsilon_from_rdp(plan * subsampled_gaussian_rdp(q, sigma_eff, "replace_one"), 1e-5)
    tight = tight_epsilon([SubsampledGaussian(q, 1.0, plan)], 1e-5, neighbour="replace_one")
    budget = (general + tight) / 2
    host = owner(sigma=1.0, budget_epsilon=budget)
    with pytest.raises(BudgetExhausted):
        host.open_session("s", SGMCMC, plan, q)
    host.open_session("t", SGMCMC, plan // 2, q)


def test_the_ledger_remembers_lattice_answers_for_later_accounting(tmp_path):
    """A ledger that a lattice owner answered from is accounted by Rényi DP by whoever reads it
    next — a float (simulated) owner on the same file, or an offline report."""
    path = tmp_path / "l.sqlite"
    lattice = OwnerNode("o", MODEL, RECORDS, Policy(sigma=0.8, budget_epsilon=1e9), Ledger(path),
                        noise_key=NoiseKey.derive(b"k", "o"))  # fmt: skip
    assert lattice.renyi_accounting
    OwnerHost([lattice]).open_session("s", "penalty", 10)
    assert lattice.ledger.answered_on_lattice("o")
    lattice.ledger.close()
    simulated = OwnerNode("o", MODEL, RECORDS, Policy(sigma=0.8, budget_epsilon=1e9), Ledger(path),
                          np.random.default_rng(0))  # fmt: skip
    assert not simulated.lattice and simulated.renyi_accounting
    simulated.ledger.close()
    fresh = OwnerNode("p", MODEL, RECORDS, Policy(sigma=0.8), Ledger(tmp_path / "m.sqlite"),
                      np.random.default_rng(0))  # fmt: skip
    assert not fresh.renyi_accounting
