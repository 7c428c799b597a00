"""The oracle contract, run against every transport: in-process, gRPC (owner hosts served
in this process on loopback, two hosts of 2 + 1 owners so that per-host batching is crossed)
and Ray (two actors of 2 + 1 owners on the session's local Ray).

A transport must not change the numbers: answers equal those of the same owners asked directly
(up to the last-bit rounding of how owners are grouped into hosts), in the order ``describe``
gives, with each owner's declared noise sd; refusals come back as the owner's own error class
and charge nothing. This holds for every kind of query: log-likelihood ratios, sufficient
statistics and gradients.
"""

from __future__ import annotations

import numpy as np
import pytest
from ray_support import ray_oracle_of

from fedpenalty.common import Policy
from fedpenalty.coordinator.grpc_oracle import GrpcOracle
from fedpenalty.coordinator.inprocess import InProcessOracle
from fedpenalty.errors import (
    BudgetExhausted,
    ConfigError,
    InvalidRequest,
    OwnerError,
    ReplayConflict,
    UnknownSession,
)
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerNode
from fedpenalty.owner.host import OwnerHost
from fedpenalty.owner.server import ServerThread
from fedpenalty.privacy.subsampled import SubsampledGaussian
from fedpenalty.privacy.subsampled import epsilon as sampled_epsilon

MODEL = build_model({"name": "gaussian_mean", "dim": 2, "data_bound": 3.0, "theta_bound": 2.0})
SIGMAS = (0.5, 1.0, 2.0)
GROUPS = ((0, 1), (2,))  # owners per host for the gRPC transport


def make_nodes(tmp_path, tag: str, sigmas: tuple[float, ...] = SIGMAS, **policy) -> list[OwnerNode]:
    """Three owners with seeded noise; owners of one host group share a ledger file."""
    settings = {"max_step": 0.05, "budget_epsilon": 500.0, **policy}
    ledgers = {
        g: Ledger(tmp_path / f"{tag}-ledger-{g}.sqlite", synchronous="NORMAL")
        for g in range(len(GROUPS))
    }
    group_of = {k: g for g, members in enumerate(GROUPS) for k in members}
    data_rng = np.random.default_rng(1)
    return [
        OwnerNode(
            f"owner-{k}",
            MODEL,
            MODEL.simulate_records(data_rng, np.array([0.3, -0.2]), 400 + 100 * k),
            Policy(sigma=sigmas[k], **settings),
            ledgers[group_of[k]],
            np.random.default_rng(100 + k),
        )
        for k in range(3)
    ]


@pytest.fixture(params=["inprocess", "grpc", "ray"])
def connect(request):
    """connect(nodes) → an oracle over those owners through the transport under test."""
    opened = []

    def make(nodes: list[OwnerNode]):
        if request.param == "inprocess":
            oracle = InProcessOracle(nodes)
        elif request.param == "ray":
            oracle, actors = ray_oracle_of(request.getfixturevalue("ray_actors"), nodes)
            opened.append(actors)
        else:
            servers = [ServerThread(OwnerHost([nodes[k] for k in group])) for group in GROUPS]
            opened.extend(servers)
            oracle = GrpcOracle(
                [s.address for s in servers], model=MODEL, deadline=10, retry_seconds=2
            )
        opened.append(oracle)
        return oracle

    yield make
    for thing in reversed(opened):
        thing.close()


def moves(rng: np.random.Generator, chains: int = 3, step: float = 0.05):
    theta = rng.uniform(-1, 1, size=(chains, 2))
    u = rng.normal(size=(chains, 2))
    u *= step / np.linalg.norm(u, axis=1, keepdims=True)
    return np.arange(chains), theta, theta + u


def totals(nodes: list[OwnerNode]):
    return [n.ledger.total(n.name) for n in nodes]


def test_describe_lists_every_owner_with_its_public_facts(tmp_path, connect):
    nodes = make_nodes(tmp_path, "a")
    assert connect(nodes).describe() == [n.describe() for n in nodes]


def test_answers_are_the_owners_own_numbers_with_declared_noise_sd(tmp_path, connect):
    oracle = connect(make_nodes(tmp_path, "a"))
    direct = OwnerHost(make_nodes(tmp_path, "b"))  # same data, same noise seeds, no transport
    oracle.open_session("penalty", 100, session="s")  # simulated noise is keyed by session too
    direct.open_session("s", "penalty", 100)
    for t in range(3):
        request = moves(np.random.default_rng(t))
        answers = oracle.log_ratio(t, *request)
        assert answers.values.shape == (3, 3)
        np.testing.assert_array_equal(answers.noise_sd, SIGMAS)
        np.testing.assert_allclose(
            answers.values, direct.log_ratio("s", t, *request), rtol=1e-13, atol=1e-12
        )


def test_sufficient_statistic_blocks_have_shape_owners_chains_block_stat(tmp_path, connect):
    oracle = connect(make_nodes(tmp_path, "a", budget_epsilon=1e5))
    direct = OwnerHost(make_nodes(tmp_path, "b", budget_epsilon=1e5))
    oracle.open_session("penalty_expfam", 3 * 40, session="s")
    direct.open_session("s", "penalty_expfam", 3 * 40)
    answers = oracle.suff_stats(np.array([0, 1, 2]), 0, 40)
    assert answers.values.shape == (3, 3, 40, 2)
    np.testing.assert_array_equal(answers.noise_sd, SIGMAS)
    np.testing.assert_allclose(
        answers.values, direct.suff_stats("s", np.array([0, 1, 2]), 0, 40), rtol=1e-13
    )


def test_laplace_statistics_are_the_owners_own_numbers_charged_once(tmp_path, connect):
    """laplace_stats (docs/design.md §2.10): the owners' own releases (as the same owners asked
    directly), with sd √2·b each, one pure-ε release in each ledger; the same key asked again
    is replayed and charges nothing."""
    nodes = make_nodes(tmp_path, "a")
    oracle = connect(nodes)
    direct = OwnerHost(make_nodes(tmp_path, "b"))
    oracle.open_session("laplace_stats", 3, session="s")
    direct.open_session("s", "laplace_stats", 3)
    first = oracle.query("laplace_stats", 0, np.array([0]))
    assert first.values.shape == (3, 1, 2)
    np.testing.assert_array_equal(
        first.values, direct.answer("laplace_stats", "s", 0, np.array([0]))
    )
    np.testing.assert_allclose(first.noise_sd, np.sqrt(2) * np.array(SIGMAS))
    charged = [n.ledger.sampled(n.name) for n in nodes]
    assert [len(c) for c in charged] == [1, 1, 1] and {c[0].count for c in charged} == {1}
    again = oracle.query("laplace_stats", 0, np.array([0]))
    np.testing.assert_array_equal(again.values, first.values)
    assert [n.ledger.sampled(n.name) for n in nodes] == charged


def test_replayed_request_returns_the_stored_answer_and_charges_nothing(tmp_path, connect):
    nodes = make_nodes(tmp_path, "a")
    oracle = connect(nodes)
    oracle.open_session("penalty", 100)
    request = moves(np.random.default_rng(0))
    first = oracle.log_ratio(7, *request).values
    before = totals(nodes)
    np.testing.assert_array_equal(oracle.log_ratio(7, *request).values, first)
    assert totals(nodes) == before


def test_a_different_query_at_an_answered_iteration_is_refused(tmp_path, connect):
    nodes = make_nodes(tmp_path, "a")
    oracle = connect(nodes)
    oracle.open_session("penalty", 100)
    chains, theta, prop = moves(np.random.default_rng(0))
    oracle.log_ratio(0, chains, theta, prop)
    before = totals(nodes)
    with pytest.raises(ReplayConflict, match="different query"):
        oracle.log_ratio(0, chains, theta, theta + 0.5 * (prop - theta))
    assert totals(nodes) == before


def test_budget_refusal_names_the_owner_and_what_it_had_left(tmp_path, connect):
    nodes = make_nodes(tmp_path, "a", budget_epsilon=20.0)
    oracle = connect(nodes)
    oracle.open_session("penalty", 3)  # a plan its worst case fits; the run then asks for more
    rng = np.random.default_rng(0)
    with pytest.raises(BudgetExhausted, match="budget") as info:
        for t in range(10_000):
            before = totals(nodes)
            oracle.log_ratio(t, *moves(rng))
    refused = next(n for n in nodes if n.name == info.value.owner)
    assert refused.name in str(info.value)
    assert totals([refused]) == [
        before[nodes.index(refused)]
    ]  # the refused request charged it nothing
    left = refused.policy.budget_epsilon - refused.ledger.total(refused.name).epsilon(
        refused.policy.delta
    )
    assert info.value.epsilon_left == pytest.approx(left)


def test_a_plan_beyond_the_budget_is_refused_up_front(tmp_path, connect):
    oracle = connect(make_nodes(tmp_path, "a", budget_epsilon=1.0))
    with pytest.raises(BudgetExhausted, match="refusing a plan"):
        oracle.open_session("penalty", 10**6)


BAD = {
    "nan": (
        lambda c, t, p: (c, np.where(np.arange(t.size).reshape(t.shape) == 0, np.nan, t), p),
        "NaN",
    ),
    "wrong dimension": (lambda c, t, p: (c, t[:, :1], p[:, :1]), "shape"),
    "step too large": (lambda c, t, p: (c, t, t + 0.5), "max_step"),
    "outside theta": (lambda c, t, p: (c, t + 5.0, p + 5.0), "outside"),
    "duplicate chains": (lambda c, t, p: (np.array([0, 0, 1]), t, p), "distinct"),
}


@pytest.mark.parametrize("bad", sorted(BAD))
def test_malformed_requests_are_refused_and_change_nothing(tmp_path, connect, bad):
    nodes = make_nodes(tmp_path, "a")
    oracle = connect(nodes)
    oracle.open_session("penalty", 100)
    mangle, message = BAD[bad]
    with pytest.raises(InvalidRequest, match=message):
        oracle.log_ratio(0, *mangle(*moves(np.random.default_rng(0))))
    assert all(t.answers == 0 for t in totals(nodes))
    oracle.log_ratio(0, *moves(np.random.default_rng(0)))  # the key was not consumed
    assert all(t.answers == 3 for t in totals(nodes))


def test_unknown_session_is_refused(tmp_path, connect):
    nodes = make_nodes(tmp_path, "a")
    oracle = connect(nodes)
    oracle.open_session("penalty", 100)
    opened, oracle.session = oracle.session, "never-opened"
    with pytest.raises(UnknownSession):
        oracle.log_ratio(0, *moves(np.random.default_rng(0)))
    oracle.session = opened
    assert all(t.answers == 0 for t in totals(nodes))


def test_privacy_reports_are_each_owners_ledger(tmp_path, connect):
    nodes = make_nodes(tmp_path, "a")
    oracle = connect(nodes)
    oracle.open_session("penalty", 100)
    rng = np.random.default_rng(0)
    for t in range(4):
        oracle.log_ratio(t, *moves(rng))
    reports = oracle.privacy_reports()
    assert reports == [n.privacy_report(oracle.session) for n in nodes]
    assert [r.session.answers for r in reports] == [12, 12, 12]
    assert all(r.total.mu == pytest.approx(t.mu) for r, t in zip(reports, totals(nodes)))


def test_grpc_oracle_refuses_owners_whose_model_differs(tmp_path):
    nodes = make_nodes(tmp_path, "a")
    other = build_model({"name": "gaussian_mean", "dim": 2, "data_bound": 3.0, "theta_bound": 1.5})
    with ServerThread(OwnerHost(nodes)) as server:
        with pytest.raises(ConfigError, match=r"theta_bound: owner 2\.0 vs scenario 1\.5"):
            GrpcOracle([server.address], model=other)


# --- gradient queries (sgmcmc sessions) --------------------------------------------------------
# noise multipliers large enough that each PLD evaluation takes milliseconds, not seconds
GRADIENT_SIGMAS = (2.0, 4.0, 8.0)
GRADIENT_POLICY = {"max_sampling_rate": 0.05, "max_clip": 1.0}
RATE, CLIP = 0.02, 0.5


def gradient_nodes(tmp_path, tag: str, **policy) -> list[OwnerNode]:
    return make_nodes(tmp_path, tag, GRADIENT_SIGMAS, **{**GRADIENT_POLICY, **policy})


def at(rng: np.random.Generator, chains: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Chains and their θ for a gradient query."""
    return np.arange(chains), rng.uniform(-1, 1, size=(chains, 2))


def spent(nodes: list[OwnerNode]):
    """Everything each owner's ledger has charged: Gaussian answers and gradient answers."""
    return [(n.ledger.total(n.name), n.ledger.sampled(n.name)) for n in nodes]


def test_gradient_answers_are_the_owners_own_numbers_with_noise_sd_sigma_times_clip(
    tmp_path, connect
):
    nodes = gradient_nodes(tmp_path, "a")
    oracle = connect(nodes)
    assert oracle.describe() == [n.describe() for n in nodes]  # max_sampling_rate and max_clip too
    direct = OwnerHost(gradient_nodes(tmp_path, "b"))  # same data, same seeds, no transport
    oracle.open_session("sgmcmc", 30, session="s", sampling_rate=RATE)
    direct.open_session("s", "sgmcmc", 30, sampling_rate=RATE)
    for t in range(3):
        chains, theta = at(np.random.default_rng(t))
        answers = oracle.gradient(t, chains, theta, CLIP)
        assert answers.values.shape == (3, 3, 2)
        np.testing.assert_array_equal(answers.noise_sd, np.array(GRADIENT_SIGMAS) * CLIP)
        np.testing.assert_allclose(
            answers.values, direct.gradient("s", t, chains, theta, CLIP), rtol=1e-13, atol=1e-12
        )


def test_replayed_gradient_request_returns_the_stored_answer_and_charges_nothing(tmp_path, connect):
    nodes = gradient_nodes(tmp_path, "a")
    oracle = connect(nodes)
    oracle.open_session("sgmcmc", 30, sampling_rate=RATE)
    chains, theta = at(np.random.default_rng(0))
    first = oracle.gradient(7, chains, theta, CLIP).values
    before = spent(nodes)
    np.testing.assert_array_equal(oracle.gradient(7, chains, theta, CLIP).values, first)
    assert spent(nodes) == before


@pytest.mark.parametrize("change", ["theta", "clip"])
def test_a_different_gradient_query_at_an_answered_iteration_is_refused(tmp_path, connect, change):
    nodes = gradient_nodes(tmp_path, "a")
    oracle = connect(nodes)
    oracle.open_session("sgmcmc", 30, sampling_rate=RATE)
    chains, theta = at(np.random.default_rng(0))
    oracle.gradient(0, chains, theta, CLIP)
    before = spent(nodes)
    with pytest.raises(ReplayConflict, match="different query"):
        if change == "theta":
            oracle.gradient(0, chains, theta + 0.01, CLIP)
        else:
            oracle.gradient(0, chains, theta, 0.9 * CLIP)
    assert spent(nodes) == before


def test_a_gradient_session_gives_no_more_answers_than_its_plan(tmp_path, connect):
    nodes = gradient_nodes(tmp_path, "a")
    oracle = connect(nodes)
    oracle.open_session("sgmcmc", 6, sampling_rate=RATE)
    rng = np.random.default_rng(0)
    oracle.gradient(0, *at(rng), CLIP)
    oracle.gradient(1, *at(rng), CLIP)
    before = spent(nodes)
    with pytest.raises(BudgetExhausted, match="plan of 6 gradient answers") as info:
        oracle.gradient(2, *at(rng), CLIP)
    assert info.value.owner in [n.name for n in nodes] and info.value.owner in str(info.value)
    assert spent(nodes) == before


def test_a_gradient_plan_beyond_the_budget_is_refused_up_front(tmp_path, connect):
    oracle = connect(gradient_nodes(tmp_path, "a", budget_epsilon=1.0))
    with pytest.raises(BudgetExhausted, match="refusing a plan"):
        oracle.open_session("sgmcmc", 10**6, sampling_rate=RATE)


def test_out_of_policy_rates_and_clips_are_refused_and_charge_nothing(tmp_path, connect):
    nodes = gradient_nodes(tmp_path, "a")
    oracle = connect(nodes)
    with pytest.raises(InvalidRequest, match="max_sampling_rate"):
        oracle.open_session("sgmcmc", 30, sampling_rate=0.06)
    with pytest.raises(InvalidRequest, match="sampling_rate"):
        oracle.open_session("sgmcmc", 30)
    with pytest.raises(InvalidRequest, match="only sgmcmc"):
        oracle.open_session("penalty", 30, sampling_rate=RATE)
    oracle.open_session("sgmcmc", 30, sampling_rate=RATE)
    chains, theta = at(np.random.default_rng(0))
    with pytest.raises(InvalidRequest, match="exceeds this owner's max_clip"):
        oracle.gradient(0, chains, theta, 1.5)
    with pytest.raises(InvalidRequest, match="NaN"):
        oracle.gradient(0, chains, np.full_like(theta, np.nan), CLIP)
    assert all(total.answers == 0 and not sampled for total, sampled in spent(nodes))
    oracle.gradient(0, chains, theta, CLIP)  # the key was not consumed
    assert all(
        sampled == [SubsampledGaussian(RATE, n.policy.sigma, 3)]
        for n, (_, sampled) in zip(nodes, spent(nodes))
    )


def test_gradient_privacy_reports_account_the_subsampled_gaussian_with_pld(tmp_path, connect):
    nodes = gradient_nodes(tmp_path, "a")
    oracle = connect(nodes)
    oracle.open_session("sgmcmc", 30, sampling_rate=RATE)
    rng = np.random.default_rng(0)
    for t in range(4):
        oracle.gradient(t, *at(rng), CLIP)
    reports = oracle.privacy_reports()
    assert reports == [n.privacy_report(oracle.session) for n in nodes]
    for report, sigma in zip(reports, GRADIENT_SIGMAS):
        expected = sampled_epsilon(
            [SubsampledGaussian(RATE, sigma, 12)], 1e-5, neighbour="replace_one"
        )
        for spend in (report.session, report.total):
            assert (spend.answers, spend.accountant) == (12, "pld")
            assert spend.epsilon == pytest.approx(expected, rel=1e-12)


def test_grpc_oracle_refuses_answers_whose_noise_sd_is_not_the_described_policy(tmp_path):
    """An owner restarted with another σ after the coordinator read its policy is caught."""
    first = ServerThread(OwnerHost(make_nodes(tmp_path, "a")))
    oracle = GrpcOracle([first.address], model=MODEL, deadline=10, retry_seconds=5)
    try:
        oracle.open_session("penalty", 100, session="s")
        first.close()
        restarted = OwnerHost(make_nodes(tmp_path, "b", sigmas=(0.5, 1.0, 3.0)))
        restarted.open_session("s", "penalty", 100)
        with ServerThread(restarted, listen=first.address):
            with pytest.raises(
                OwnerError,
                match="owner 'owner-2' answered with noise sd 3, but its described policy gives 2",
            ):
                oracle.log_ratio(0, *moves(np.random.default_rng(0)))
    finally:
        oracle.disconnect()
