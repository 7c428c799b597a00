"""Regression tests of the owner's lower bounds and work limits (docs/design.md §3, invariants 1,
4, 9): each reproduces an attack on the owner node and checks that it is refused before any
work, with nothing charged."""

from __future__ import annotations

import numpy as np
import pytest

from fedpenalty.common import Policy
from fedpenalty.config import resolve
from fedpenalty.errors import BudgetExhausted, ConfigError, InvalidRequest
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerHost, OwnerNode
from fedpenalty.privacy.owner_epsilon import max_gdp_mu_squared

GAUSS = build_model({"name": "gaussian_mean", "dim": 1})
LOGISTIC = build_model({"name": "logistic", "dim": 2})


class CountingLogistic(type(LOGISTIC)):  # type: ignore[misc]
    """The logistic model, counting the per-record evaluations an owner makes."""

    evaluations = 0

    def log_lik_diff(self, records, theta, theta_prop):
        CountingLogistic.evaluations += len(records) * len(theta)
        return super().log_lik_diff(records, theta, theta_prop)

    def grad_log_lik(self, records, theta):
        CountingLogistic.evaluations += len(records) * len(theta)
        return super().grad_log_lik(records, theta)


def host(model, records, **policy) -> OwnerHost:
    """One owner on ``records`` with a budget large enough for any plan here."""
    policy = {"budget_epsilon": 1e9, **policy}
    node = OwnerNode("o", model, records, Policy(**policy), Ledger(":memory:"),
                     np.random.default_rng(0))  # fmt: skip
    return OwnerHost([node])


def answers(h: OwnerHost) -> int:
    return h.nodes[0].ledger.total("o").answers


@pytest.mark.parametrize("step", [0.0, 1e-12])
def test_zero_information_steps_are_refused_and_cost_nothing(step):
    """θ' = θ (or a step of 1e-12) used to be answered, charged ε ≈ 0 and stored: free answers
    that fill the disk, and, with float noise, a way to read λ exactly (Mironov 2012)."""
    records = GAUSS.simulate_records(np.random.default_rng(1), np.array([0.2]), 200)
    h = host(GAUSS, records, max_step=0.05)
    h.open_session("s", "penalty", 10)
    theta = np.array([[0.1]])
    with pytest.raises(InvalidRequest, match="min_step"):
        h.log_ratio("s", 0, np.array([0]), theta, theta + step)
    assert answers(h) == 0
    h.log_ratio("s", 0, np.array([0]), theta, theta + 0.01)  # a real step is answered
    assert answers(h) == 1


def test_a_vanishing_clip_is_refused():
    """A clip of 5e-324 made the noise sd σ·clip exactly 0 while the ledger charged ε 5.94."""
    records = LOGISTIC.simulate_records(np.random.default_rng(1), np.zeros(2), 100)
    h = host(LOGISTIC, records, sigma=0.5, max_sampling_rate=1.0)
    h.open_session("g", "sgmcmc", 10, sampling_rate=1.0)
    for clip in (5e-324, 1e-9):
        with pytest.raises(InvalidRequest, match="min_clip"):
            h.gradient("g", 0, np.array([0]), np.zeros((1, 2)), clip)
    assert sum(e.count for e in h.nodes[0].ledger.sampled("o")) == 0


def test_policies_refuse_noise_that_underflows():
    with pytest.raises(ConfigError, match="min_clip"):
        Policy(sigma=1e-300, min_clip=1e-10)
    with pytest.raises(ConfigError, match="min_step"):
        Policy(max_step=0.01, min_step=0.1)


@pytest.mark.parametrize("query", ["log_ratio", "gradient"])
def test_oversized_requests_are_refused_before_any_work(query):
    """One 9,000-chain logistic request OOM-killed a 100k-record owner; a 60,000-chain gradient
    computed for seconds before its refusal. The bound is checked before computing."""
    model = CountingLogistic(**LOGISTIC.params())
    records = model.simulate_records(np.random.default_rng(2), np.zeros(2), 1000)
    h = host(model, records, max_record_evaluations=50_000, max_sampling_rate=1.0)
    h.open_session("s", "penalty" if query == "log_ratio" else "sgmcmc", 100,
                   **({} if query == "log_ratio" else {"sampling_rate": 1.0}))  # fmt: skip
    chains = np.arange(51)  # 51 × 1000 records > 50,000
    theta = np.zeros((51, 2))
    CountingLogistic.evaluations = 0
    with pytest.raises(InvalidRequest, match="max_record_evaluations"):
        if query == "log_ratio":
            h.log_ratio("s", 0, chains, theta, theta + 0.01)
        else:
            h.gradient("s", 0, chains, theta, 1.0)
    assert CountingLogistic.evaluations == 0 and answers(h) == 0
    if query == "log_ratio":  # 50 chains fit
        h.log_ratio("s", 0, chains[:50], theta[:50], theta[:50] + 0.01)
        assert CountingLogistic.evaluations == 50_000


def test_add_remove_owners_do_not_release_their_record_count():
    """Under add_remove, n and n + 1 are neighbours: Describe released the exact n with no
    noise and no charge. Now n is withheld, and penalty_expfam (which needs it) is refused."""
    records = GAUSS.simulate_records(np.random.default_rng(3), np.array([0.2]), 1000)
    h = host(GAUSS, records, neighbour="add_remove")
    assert [d.n for d in h.describe()] == [None]
    assert [r.n for r in h.privacy_reports()] == [None]
    with pytest.raises(InvalidRequest, match="add_remove"):
        h.open_session("s", "penalty_expfam", 10)
    replace_one = host(GAUSS, records)
    assert [d.n for d in replace_one.describe()] == [1000]
    with pytest.raises(ConfigError, match="add_remove"):
        resolve(
            {"sampler": {"algorithm": "penalty_expfam"}, "privacy": {"neighbour": "add_remove"}}
        )


def test_heavy_work_does_not_block_the_server(monkeypatch):
    """Session opens with gradient plans blocked the event loop for 12–25 s, so health checks and
    every other call waited. While a host call is stuck, the health check must still answer."""
    import threading

    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from fedpenalty.owner.server import ServerThread
    from fedpenalty.proto import owner_pb2 as pb
    from fedpenalty.proto import owner_pb2_grpc as pb_grpc

    records = GAUSS.simulate_records(np.random.default_rng(4), np.array([0.2]), 100)
    h = host(GAUSS, records)
    entered, release = threading.Event(), threading.Event()
    open_session = h.open  # what the server calls with the decoded SessionRequest

    def slow_open(*args, **kwargs):
        entered.set()
        release.wait(30)  # bounded: the test releases it at once
        open_session(*args, **kwargs)

    monkeypatch.setattr(h, "open", slow_open)
    with ServerThread(h) as server, grpc.insecure_channel(server.address) as channel:
        opening = pb_grpc.OwnerStub(channel).OpenSession.future(
            pb.OpenSessionRequest(session="s", algorithm="penalty", planned_answers=10), timeout=60
        )
        assert entered.wait(30)
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=20
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING and not opening.done()
        release.set()
        opening.result()


def test_a_nearly_free_flood_is_charged_and_stopped_by_the_budget():
    """Issue 20: requests of the most answers at the smallest step were charged μ ≈ 1e-8 per
    answer and stored without end (8 MB/s of ledger). Each answer now costs at least the μ of a
    step max_step/10, so an owner's default budget (ε = 10) stops such a flood after a few
    thousand stored answers, and its refusals store nothing."""
    records = GAUSS.simulate_records(np.random.default_rng(5), np.array([0.2]), 200)
    node = OwnerNode("o", GAUSS, records, Policy(max_step=0.05), Ledger(":memory:"),
                     np.random.default_rng(0))  # fmt: skip
    h = OwnerHost([node])
    h.open_session("s", "penalty", 1)
    chains = np.arange(256)
    theta = np.full((len(chains), 1), 0.1)
    refused = 0
    for iteration in range(100):
        try:
            h.log_ratio("s", iteration, chains, theta, theta + 1.5 * node.policy.min_step)
        except BudgetExhausted:
            refused += 1
    total = h.privacy_reports()[0].total
    least = GAUSS.log_ratio_sensitivity(0.05 / 10, "replace_one") / node.policy.sigma
    assert total.mu**2 >= total.answers * least**2 * (1 - 1e-9)
    assert 0 < total.answers < 10_000 and refused > 80 and total.epsilon <= 10


def test_simulated_owners_answer_every_chain_of_the_run_in_one_request():
    """A deployed owner answers at most 512 answers a request by default (floods); the
    simulation's own owners answer only its coordinator, so a run with more chains than that
    still asks each iteration in one request."""
    from fedpenalty.simulation import owner_policies

    many = owner_policies(resolve({"sampler": {"chains": 600}}), 2)
    assert [p.max_answers_per_request for p in many] == [600, 600]
    few = owner_policies(resolve({"sampler": {"chains": 4}}), 1)
    assert few[0].max_answers_per_request == Policy.max_answers_per_request == 512


def test_a_plan_declaring_a_step_below_the_charging_floor_is_admitted_at_the_floor():
    """Answers are charged at least as at the owner's charged_step (max_step/10). A session
    declaring a shorter largest step (the scenario's 0.001 against OWNER.toml's max_step 0.05)
    was admitted at 0.001, then charged 25× its reservation per answer and refused part-way
    through its plan; its admission now reserves the floor, so an admitted plan is answered in
    full, and a plan the floor cannot cover is refused at the open."""
    records = GAUSS.simulate_records(np.random.default_rng(5), np.array([0.2]), 200)
    policy = Policy(max_step=0.05, budget_epsilon=10.0)
    floor = GAUSS.log_ratio_sensitivity(policy.charged_step, "replace_one") / policy.sigma
    fits = int(max_gdp_mu_squared(10.0, policy.delta, "replace_one", []) / floor**2)

    def owner() -> OwnerHost:
        node = OwnerNode("o", GAUSS, records, policy, Ledger(":memory:"),
                         np.random.default_rng(0))  # fmt: skip
        return OwnerHost([node])

    with pytest.raises(BudgetExhausted):
        owner().open_session("s", "penalty", fits + 1, max_step=0.001)
    h = owner()
    h.open_session("s", "penalty", fits, max_step=0.001)
    theta = np.full((1, 1), 0.1)
    for iteration in range(fits):
        h.log_ratio("s", iteration, np.array([0]), theta, theta + 0.0009)
    assert answers(h) == fits
