"""Owners with exact lattice noise (docs/design.md §2.7): every answer an exact lattice point,
the floating-point attack defeated, the accounting Rényi-DP, and the penalty chain still exact."""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest
from owners import kernel
from test_samplers import Z, z_scores

from fedpenalty.common import Policy
from fedpenalty.coordinator.driver import sample
from fedpenalty.coordinator.inprocess import InProcessOracle
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerHost, OwnerNode
from fedpenalty.owner.noise.sources import NoiseKey

MODEL = build_model({"name": "gaussian_mean", "dim": 1})
RECORDS = MODEL.simulate_records(np.random.default_rng(1), np.array([0.3]), 400)


def owner(records=RECORDS, key=b"k", **policy) -> OwnerHost:
    """One lattice owner whose noise key is derived from ``key`` (reproducible)."""
    policy = {"budget_epsilon": 1e9, "sigma": 0.7, "max_answers_per_request": 10**6, **policy}
    node = OwnerNode("o", MODEL, records, Policy(**policy), Ledger(":memory:"),
                     noise_key=NoiseKey.derive(key, "o"))  # fmt: skip
    return OwnerHost([node])


def test_a_deployed_owner_uses_lattice_noise_by_default():
    node = OwnerNode("o", MODEL, RECORDS, Policy(), Ledger(":memory:"))
    assert node.lattice and node.noise_key is not None
    simulated = OwnerNode("s", MODEL, RECORDS, Policy(), Ledger(":memory:"),
                          np.random.default_rng(0))  # fmt: skip
    assert not simulated.lattice


def test_answers_are_exact_lattice_points_and_replay():
    host = owner()
    host.open_session("s", "penalty", 1000)
    theta = np.zeros((50, 1))
    first = host.log_ratio("s", 0, np.arange(50), theta, theta + 0.01)
    gamma = host._noise.gamma
    assert np.all(first / gamma == np.round(first / gamma))
    np.testing.assert_array_equal(host.log_ratio("s", 0, np.arange(50), theta, theta + 0.01), first)
    host.open_session("e", "penalty_expfam", 1000)
    stats = host.suff_stats("e", np.arange(3), 0, 4)
    assert stats.shape == (1, 3, 4, 1) and np.all(stats / gamma == np.round(stats / gamma))


def test_lattice_answers_have_the_declared_noise():
    """4,000 answers: mean within 5 standard errors of the exact ratio, sd within 6% of σ (the
    sd of a sample of 4,000 has relative sd 1.1%; σ/2 noise would be off by 50%)."""
    host = owner()
    host.open_session("s", "penalty", 10**5)
    theta = np.zeros((4000, 1))
    values = host.log_ratio("s", 0, np.arange(4000), theta, theta + 0.01)[0]
    exact = MODEL.log_lik_diff(host.nodes[0].records, theta[:1], theta[:1] + 0.01).sum()
    assert abs(values.mean() - exact) < 5 * 0.7 / np.sqrt(4000)
    assert abs(values.std(ddof=1) / 0.7 - 1) < 0.06


def test_the_floating_point_attack_finds_nothing():
    """Mironov (2012): with float noise, datasets differing in one record gave answers whose low
    bits differ even at a step of 1e-8 (the ledger charged ε ≈ 0). Lattice owners with the same
    key round both exact values to the same lattice point and release identical answers."""
    records_prime = RECORDS.copy()
    records_prime[0] = -records_prime[0]
    d, d_prime = owner(RECORDS), owner(records_prime)
    theta = np.zeros((200, 1))
    for host in (d, d_prime):
        host.open_session("s", "penalty", 1000)
    a = d.log_ratio("s", 0, np.arange(200), theta, theta + 1e-8)
    b = d_prime.log_ratio("s", 0, np.arange(200), theta, theta + 1e-8)
    np.testing.assert_array_equal(a, b)
    # the float owners of the past, with one seed, do not
    floats = [OwnerHost([OwnerNode("o", MODEL, r, Policy(budget_epsilon=1e9, sigma=0.7),
                                   Ledger(":memory:"), np.random.default_rng(0))])
              for r in (RECORDS, records_prime)]  # fmt: skip
    for host in floats:
        host.open_session("s", "penalty", 1000)
    fa, fb = (h.log_ratio("s", 0, np.arange(200), theta, theta + 1e-8) for h in floats)
    assert np.any(fa != fb)


def test_lattice_accounting_is_renyi_dp_of_the_total_mu():
    """Each answer is charged μ = (2 L step + γ)/σ; ε is dp-accounting's RDP ε of one Gaussian
    of the total μ (the discrete Gaussian's Rényi divergences are the continuous ones)."""
    host = owner()
    host.open_session("s", "penalty", 1000)
    theta = np.zeros((10, 1))
    host.log_ratio("s", 0, np.arange(10), theta, theta + 0.01)
    report = host.privacy_reports("s")[0].session
    assert report is not None and report.accountant == "rdp"
    mu_each = (2 * MODEL.lipschitz * 0.01 + host._noise.gamma) / 0.7
    assert report.mu == pytest.approx(np.sqrt(10) * mu_each, rel=1e-12)
    rdp = dp_accounting.rdp.RdpAccountant()
    rdp.compose(dp_accounting.GaussianDpEvent(1 / report.mu))
    assert report.epsilon == pytest.approx(rdp.get_epsilon(1e-5), rel=1e-9)


def test_penalty_chain_with_lattice_owners_is_exact():
    """The closed-form posterior within Z = 4.5 MCSE (as the float owners' test)."""
    records = [MODEL.simulate_records(np.random.default_rng(k), np.array([0.4]), 200)
               for k in range(2)]  # fmt: skip
    ledger = Ledger(":memory:")
    nodes = [OwnerNode(f"o{k}", MODEL, r, Policy(sigma=1.0, max_step=0.15, budget_epsilon=1e9),
                       ledger, noise_key=NoiseKey.derive(b"chain", f"o{k}"))
             for k, r in enumerate(records)]  # fmt: skip
    oracle = InProcessOracle(nodes)
    ref = MODEL.reference_posterior(np.concatenate(records))
    rng = np.random.default_rng(3)
    theta0 = ref.mean + 0.5 * ref.sd * rng.standard_normal((8, 1))
    oracle.open_session("penalty", 8 * 3500)
    result = sample(kernel("penalty", MODEL, oracle=oracle, step=0.15), rng, theta0,
                    iterations=3000, warmup=500, progress=False)  # fmt: skip
    assert z_scores(result.theta, ref).max() < Z
