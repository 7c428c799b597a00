"""The masking graph of secure aggregation (docs/design.md §2.6, "The masking graph"): the
Harary graph over a hashed ring order, its degree choice and its failure bound, checked by
simulating many graphs; and that owners mask only with their neighbours yet still cancel."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from test_ray import samples, simulate

from fedpenalty.common import Policy, SecureTerms
from fedpenalty.coordinator.inprocess import InProcessOracle
from fedpenalty.coordinator.oracle import SecureAggregation
from fedpenalty.errors import BudgetExhausted, InvalidRequest
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerNode
from fedpenalty.owner.aggregation import (
    PeerKey,
    SecureSession,
    lattice_step,
    masking_graph,
    revealed_key,
    session_private_key,
)
from fedpenalty.owner.mask_graph import (
    COMPLETE_UP_TO,
    FAILURE_BITS,
    MaskGraph,
    graph_degree,
    graph_failure,
    log_disconnect_bound,
)
from fedpenalty.owner.noise.sources import NoiseKey

U64 = np.uint64


def honest_components(graph: MaskGraph, colluders: np.ndarray) -> int:
    """Connected components of ``graph`` once ``colluders`` are removed."""
    low, high = graph.pairs(np.arange(graph.owners))
    honest = np.ones(graph.owners, bool)
    honest[colluders] = False
    keep = honest[low] & honest[high]
    index = np.full(graph.owners, -1)
    index[honest] = np.arange(honest.sum())
    size = int(honest.sum())
    edges = coo_matrix((np.ones(keep.sum()), (index[low[keep]], index[high[keep]])), (size, size))
    return int(connected_components(edges, directed=False)[0])


def disconnected_rate(owners: int, colluders: int, degree: int, graphs: int) -> float:
    """Fraction of ``graphs`` uniform ring orders (fixed seed) whose Harary graph falls apart
    once ``colluders`` owners chosen at random are removed."""
    rng = np.random.default_rng(20261127)
    bad = 0
    for _ in range(graphs):
        graph = MaskGraph(owners, degree, 0.0, rng.permutation(owners))
        bad += honest_components(graph, rng.choice(owners, colluders, replace=False)) > 1
    return bad / graphs


@pytest.mark.parametrize("owners, colluders, degree", [(60, 20, 8), (100, 50, 16)])
def test_the_failure_bound_holds_over_many_simulated_graphs(owners, colluders, degree):
    """The union bound is an upper bound on the disconnection rate of 3,000 simulated graphs
    (tolerance: 4 binomial sds of the bound at 3,000 draws), and not a vacuous one: the rate is
    at least a quarter of it here (measured 0.5× and 0.3×; a bound missing its factor of pairs
    of gaps would be ~2,000× too small and fail the first check)."""
    bound = math.exp(log_disconnect_bound(owners, colluders, degree))
    assert 0.01 < bound < 0.2
    rate = disconnected_rate(owners, colluders, degree, 3000)
    assert rate <= bound + 4 * math.sqrt(bound * (1 - bound) / 3000)
    assert rate >= bound / 4


def test_a_lower_degree_does_fall_apart_and_more_colluders_than_the_degree_never_suffice():
    """The simulation sees disconnection where it must (k = 4, half the owners colluding: the
    graph falls apart almost always), and k-connectivity: with t < k it never does."""
    assert disconnected_rate(60, 30, 4, 300) > 0.9
    assert disconnected_rate(60, 7, 8, 300) == 0.0
    assert log_disconnect_bound(60, 7, 8) == -math.inf


@pytest.mark.parametrize("owners, colluders", [(100, 0), (100, 50), (1000, 500), (10000, 5000)])
def test_the_degree_is_the_smallest_even_one_meeting_two_to_the_minus_forty(owners, colluders):
    degree, failure = graph_degree(owners, colluders)
    assert degree % 2 == 0 and degree < owners - 1
    limit = -FAILURE_BITS * math.log(2)
    assert log_disconnect_bound(owners, colluders, degree) <= limit
    assert failure == pytest.approx(math.exp(log_disconnect_bound(owners, colluders, degree)))
    if degree > 2:
        assert log_disconnect_bound(owners, colluders, degree - 2) > limit
    assert graph_failure(owners, colluders) == failure
    assert graph_failure(owners, owners - 1) == 0.0  # charged at its own noise: no graph claim


def test_small_sessions_use_the_complete_graph():
    assert graph_degree(COMPLETE_UP_TO, COMPLETE_UP_TO // 2) == (COMPLETE_UP_TO - 1, 0.0)
    assert graph_degree(4, 0) == (3, 0.0)
    assert graph_degree(COMPLETE_UP_TO + 1, 0)[0] == 2  # t = 0: a ring is connected
    graph = MaskGraph.of(b"seed", [f"o{k}" for k in range(5)], 2)
    assert graph.complete and graph.pairs(np.array([1]))[0].size == 4


def keys(count: int, session: str = "s") -> tuple[list[PeerKey], list]:
    """``count`` owners' keys for ``session``, each with its graph commitment and revealed share
    (a sparse graph's seed hashes the shares, docs/design.md §2.6)."""
    private = [session_private_key(bytes([k % 256, k // 256]) * 16, session) for k in range(count)]
    peers = [revealed_key(f"o{k:05d}", p, session) for k, p in enumerate(private)]
    return peers, private


def test_every_owner_derives_the_same_regular_graph_from_the_transcript():
    """Each owner computes its neighbours alone; the edges agree (i lists j iff j lists i),
    the graph is k-regular, and another session or other terms give another graph."""
    peers, _ = keys(300)
    terms = SecureTerms(300, 150, 1.0)
    graph = masking_graph("s", terms, peers)
    assert not graph.complete and graph.degree == graph_degree(300, 150)[0]
    each = [set(masking_graph("s", terms, peers).neighbours(np.array([i]))[0]) for i in range(300)]
    assert all(len(n) == graph.degree and i not in n for i, n in enumerate(each))
    assert all(i in each[j] for i, n in enumerate(each) for j in n)
    assert not np.array_equal(masking_graph("s2", terms, keys(300, "s2")[0]).place, graph.place)
    other = masking_graph("s", SecureTerms(300, 149, 1.0), peers)
    assert not np.array_equal(other.place, graph.place)


@pytest.mark.parametrize("simulation", [True, False])
def test_sparse_masks_cancel_across_hosts_and_each_owner_masks_only_with_its_neighbours(
    simulation,
):
    """K = 100, t = 0 (a ring): three hosts' replies add to the owners' values exactly, and an
    owner's masked word minus its value is the sum of its two neighbours' pair words only."""
    count = 100
    peers, private = keys(count)
    terms = SecureTerms(count, 0, 1.0)
    values = np.random.default_rng(3).integers(-(2**40), 2**40, (count, 4, 2))
    chains, iterations = np.arange(4), np.full(4, 7)
    total = np.zeros((4, 3), dtype=U64)
    for part in np.array_split(np.arange(count), 3):
        hosted = [(peers[k].owner, private[k]) for k in part]
        session = SecureSession("s", "log_ratio", terms, peers, hosted, simulation)
        masked = session.mask(values[part], np.arange(part.size), chains, iterations)
        total += masked.sum(axis=0, dtype=U64)
        assert session.graph.degree == 2 and session._low.size <= 2 * part.size
    assert np.array_equal(total[:, :2].view(np.int64), values.sum(axis=0))
    assert np.all(total[:, 2] == 0)


# --------------------------------------------------------------------------- the δ it costs


def by_hand_failure(owners: int, colluders: int, degree: int) -> float:
    """The union bound with exact binomials: K(K − k − 1)/2 · C(t, k)/C(K, k)."""
    pairs = owners * (owners - degree - 1) / 2
    return pairs * math.comb(colluders, degree) / math.comb(owners, degree)


MODEL = build_model({"name": "gaussian_mean", "dim": 1, "data_bound": 4.0, "theta_bound": 3.0})


def seventy_owners(count: int, t: int, delta: float, budget: float) -> list[OwnerNode]:
    """``count`` simulated lattice owners of one in-memory ledger, secure at s = 1 and t."""
    ledger = Ledger(":memory:")
    policy = Policy(total_noise_sd=1.0, colluders=t, budget_epsilon=budget, max_step=0.2,
                    delta=delta, max_answers_per_request=10**6)  # fmt: skip
    rng = np.random.default_rng(5)
    return [
        OwnerNode(f"o{k:02d}", MODEL, MODEL.simulate_records(rng, np.array([0.4]), 20), policy,
                  ledger, noise_key=NoiseKey.derive(b"g", f"{k}"), simulated_peers=True)
        for k in range(count)
    ]  # fmt: skip


def test_the_ledger_reports_epsilon_at_delta_less_the_graph_failure():
    """70 simulated owners, t = 35, δ = 1e-12 (so that the graph's failure bound, 9.7e-14, is
    a visible part of δ): each owner's ε is the RDP ε (dp-accounting) of its answers at
    δ − p, p by exact binomials (tolerance 1e-9 relative, float rounding) — 0.19% above ε at
    δ, which a ledger forgetting the graph would report (> 10⁶ times the tolerance)."""
    count, t, s, delta = 70, 35, 1.0, 1e-12
    degree, failure = graph_degree(count, t)
    assert degree < count - 1
    assert failure == pytest.approx(by_hand_failure(count, t, degree), rel=1e-9)
    nodes = seventy_owners(count, t, delta, budget=1e9)
    oracle = InProcessOracle(nodes)
    oracle.open_session("penalty", 100, secure=SecureAggregation(s, t))
    theta = np.zeros((10, 1))
    oracle.log_ratio(0, np.arange(10), theta, theta + 0.02)
    report = oracle.privacy_reports()[0]
    gamma = lattice_step(SecureTerms(count, t, s))
    mu = math.sqrt(10) * (2 * MODEL.lipschitz * 0.02 + gamma) / s
    assert report.session is not None and report.session.mu == pytest.approx(mu, rel=1e-12)
    rdp = dp_accounting.rdp.RdpAccountant()
    rdp.compose(dp_accounting.GaussianDpEvent(1 / mu))
    assert report.delta == delta
    assert report.session.epsilon == pytest.approx(rdp.get_epsilon(delta - failure), rel=1e-9)
    assert report.total.epsilon == pytest.approx(rdp.get_epsilon(delta - failure), rel=1e-9)
    assert report.session.epsilon > 1.001 * rdp.get_epsilon(delta)
    oracle.close()


@pytest.mark.parametrize("above", [True, False], ids=["above", "between"])
def test_the_plan_check_asks_the_accountant_at_delta_less_the_graph_failure(above):
    """The same 70 owners (δ = 1e-12) with a budget between the plan's worst-case ε at δ and
    at δ − p: the owners refuse it; a budget just above ε(δ − p) is admitted. A plan check at
    δ would admit both."""
    count, t, delta, plan = 70, 35, 1e-12, 50
    failure = graph_degree(count, t)[1]
    nodes = seventy_owners(count, t, delta, budget=1e9)
    mu = math.sqrt(plan) * nodes[0].worst_case_mu("penalty", secure=SecureTerms(count, t, 1.0))
    rdp = dp_accounting.rdp.RdpAccountant()
    rdp.compose(dp_accounting.GaussianDpEvent(1 / mu))
    at_delta, folded_eps = rdp.get_epsilon(delta), rdp.get_epsilon(delta - failure)
    assert folded_eps > (1 + 1e-4) * at_delta
    budget = folded_eps * 1.0001 if above else (at_delta + folded_eps) / 2
    oracle = InProcessOracle(seventy_owners(count, t, delta, budget))
    if above:
        oracle.open_session("penalty", plan, secure=SecureAggregation(1.0, t))
    else:
        with pytest.raises(BudgetExhausted, match="past the budget"):
            oracle.open_session("penalty", plan, secure=SecureAggregation(1.0, t))
    oracle.close()


@pytest.mark.slow
def test_a_sparse_secure_ray_run_equals_the_in_process_run_and_counts_the_graph(
    tmp_path, ray_session
):
    """80 owners, t = 40 (degree 34 < 79): two Ray actors, each masking along the edges that
    touch its owners, decode the same sums as one in-process host — equal draws — and every
    owner's ledger ε (privacy.json) is the same, at δ less the one session's bound."""
    sparse = ["data.owners=80", "data.n_per_owner=100", "privacy.aggregation='secure'",
              "privacy.total_noise_sd=1.0", "privacy.colluders=40"]  # fmt: skip
    assert graph_degree(80, 40)[0] < 79
    ray = simulate(tmp_path, "ray", "run.transport='ray'", *sparse)
    local = simulate(tmp_path, "local", "run.transport='inprocess'", *sparse)
    assert ray.stopped is None and local.stopped is None
    for key, value in samples(local.out).items():
        np.testing.assert_array_equal(samples(ray.out)[key], value)
    assert ray.privacy["owners"] == local.privacy["owners"]
    assert all(o["owners_counted"] == 80 for o in ray.privacy["owners"])
    owner, failure = ray.privacy["owners"][0], graph_degree(80, 40)[1]
    rdp = dp_accounting.rdp.RdpAccountant()
    rdp.compose(dp_accounting.GaussianDpEvent(1 / owner["mu"]))
    assert owner["epsilon"] == pytest.approx(rdp.get_epsilon(owner["delta"] - failure), rel=1e-9)


def test_an_owner_refuses_a_graph_that_may_fail_more_often_than_its_delta_and_records_nothing():
    """δ = 5e-14 below the bound of 70 owners with t = 35 (9.7e-14): every owner refuses, naming
    privacy.delta; nothing is recorded. At t = 5 (k = 6 > t: bound 0) the same owners agree."""
    nodes = seventy_owners(70, 35, 5e-14, budget=1e9)
    oracle = InProcessOracle(nodes)
    with pytest.raises(InvalidRequest, match=r"privacy\.delta"):
        oracle.open_session("penalty", 10, secure=SecureAggregation(1.0, 35))
    assert nodes[0].ledger.sessions(nodes[0].name) == []
    oracle.close()
    oracle = InProcessOracle(seventy_owners(70, 5, 5e-14, budget=1e9))
    oracle.open_session("penalty", 10, secure=SecureAggregation(1.0, 5))
    oracle.close()
