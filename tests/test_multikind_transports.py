"""Sessions of several kinds and sub-steps over the remote transports (docs/design.md §4,
"Sessions of several kinds"): over gRPC (two owner hosts of 2 + 1 owners on loopback) and over
Ray (two actors of 2 + 1 owners on the session's local Ray) a session of log-ratio and gradient
answers at sub-steps 0..2 gives the in-process oracle's answers draw for draw, charges the same,
replays a (kind, sub-step) key and refuses a joint plan past the budget naming both kinds. The
protocol's v2 fields (``OpenSessionRequest.kinds``, ``KindQuery.substep``) are decoded here too,
and a v1-shaped ``OpenSession`` still opens one kind as before."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from ray_support import ray_oracle_of

from fedpenalty.common import Policy
from fedpenalty.coordinator.grpc_oracle import GrpcOracle
from fedpenalty.coordinator.inprocess import InProcessOracle
from fedpenalty.coordinator.oracle import SecureAggregation
from fedpenalty.errors import BudgetExhausted, InvalidRequest, ReplayConflict
from fedpenalty.kinds import KINDS as REGISTRY
from fedpenalty.kinds import KindTerms
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerNode, wire
from fedpenalty.owner.host import OwnerHost
from fedpenalty.owner.server import ServerThread
from fedpenalty.owner.session_request import SessionRequest
from fedpenalty.proto import owner_pb2 as pb
from fedpenalty.proto import owner_pb2_grpc as pb_grpc

MODEL = build_model({"name": "gaussian_mean", "dim": 2, "data_bound": 3.0, "theta_bound": 2.0})
SIGMAS = (0.5, 1.0, 2.0)
GROUPS = ((0, 1), (2,))  # owners per host (gRPC) or actor (Ray)
CHAINS = np.array([0, 1, 2])
THETA = np.array([[0.1, 0.0], [0.0, 0.1], [-0.2, 0.3]])
KINDS = [KindTerms("log_ratio", 20), KindTerms("gradient", 20, 0.1)]


def make_nodes(tmp_path, tag: str, budget_epsilon: float = 500.0) -> list[OwnerNode]:
    """Three owners with seeded noise; the owners of one group share a ledger file."""
    policy = {"max_step": 0.05, "budget_epsilon": budget_epsilon, "delta": 1e-5}
    ledgers = [Ledger(tmp_path / f"{tag}-{g}.sqlite", synchronous="NORMAL") for g in range(2)]
    group_of = {k: g for g, members in enumerate(GROUPS) for k in members}
    rng = np.random.default_rng(1)
    return [
        OwnerNode(
            f"owner-{k}",
            MODEL,
            MODEL.simulate_records(rng, np.array([0.3, -0.2]), 400 + 100 * k),
            Policy(sigma=SIGMAS[k], **policy),
            ledgers[group_of[k]],
            np.random.default_rng(100 + k),
        )
        for k in range(3)
    ]


@pytest.fixture(params=["grpc", "ray"])
def connect(request):
    """connect(nodes) → an oracle over those owners through the remote transport under test."""
    opened: list = []

    def make(nodes: list[OwnerNode]):
        if request.param == "ray":
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


def ask(oracle, kind: str, iteration: int, substep: int, shift: float = 0.0):
    """One query of ``kind`` (log_ratio or gradient) for every chain."""
    if kind == "log_ratio":
        arrays = {"theta": THETA, "theta_prop": THETA + 0.01 + shift}
    else:
        arrays = {"theta": THETA + shift, "clip": 1.0}
    return oracle.query(kind, iteration, CHAINS, substep=substep, **arrays)


def spend(nodes: list[OwnerNode], session: str) -> list:
    return [n.ledger.kind_spend([n.name], session)[0] for n in nodes]


def test_two_kinds_at_three_substeps_equal_the_in_process_oracle_draw_for_draw(tmp_path, connect):
    """The in-process reference hosts the owners in the same groups as the transport's hosts
    (a host computes its owners' answers together: grouping them otherwise changes the last
    bit, tests/test_oracle_contract.py), so the answers are equal bit for bit."""
    local_nodes = make_nodes(tmp_path, "local")
    local = [InProcessOracle([local_nodes[k] for k in group]) for group in GROUPS]
    nodes = make_nodes(tmp_path, "remote")
    remote = connect(nodes)
    assert remote.open_kinds(KINDS, session="mk") == "mk"
    assert {o.open_kinds(KINDS, session="mk") for o in local} == {"mk"}
    released = {}
    for kind in ("log_ratio", "gradient"):
        for substep in range(3):
            got = ask(remote, kind, 0, substep)
            want = [ask(o, kind, 0, substep) for o in local]
            np.testing.assert_array_equal(got.values, np.concatenate([a.values for a in want]))
            np.testing.assert_array_equal(got.noise_sd, np.concatenate([a.noise_sd for a in want]))
            released[kind, substep] = got.values
        assert not np.array_equal(released[kind, 0], released[kind, 1])  # fresh noise per key
    for (kind, substep), values in released.items():  # a replay releases what was released
        np.testing.assert_array_equal(ask(remote, kind, 0, substep).values, values)
    assert spend(nodes, "mk") == spend(local_nodes, "mk")  # the same charges, nothing twice
    for per_kind in spend(nodes, "mk"):
        assert per_kind["penalty"][0].answers == 3 * 3
        assert [e.count for e in per_kind["sgmcmc"][1]] == [3 * 3]
    assert remote.privacy_reports() == [r for o in local for r in o.privacy_reports()]
    for o in local:
        o.close()


def test_a_repeated_kind_and_substep_key_with_another_request_is_refused(tmp_path, connect):
    oracle = connect(make_nodes(tmp_path, "r"))
    oracle.open_kinds(KINDS, session="mk")
    for kind in ("log_ratio", "gradient"):
        ask(oracle, kind, 5, 2)
        with pytest.raises(ReplayConflict, match="sub-step 2"):
            ask(oracle, kind, 5, 2, shift=0.001)
        ask(oracle, kind, 5, 3, shift=0.001)  # another sub-step is another key
    with pytest.raises(InvalidRequest, match="substep"):
        ask(oracle, "log_ratio", 6, -1)


def test_a_joint_plan_past_the_budget_is_refused_naming_both_kinds(tmp_path, connect):
    nodes = make_nodes(tmp_path, "b", budget_epsilon=200.0)
    plans = {}
    for kind in ("log_ratio", "suff_stats"):  # each kind alone fits every owner
        plans[kind] = min(int(0.6 * n.max_mu_squared / n.worst_case_mu(kind) ** 2) for n in nodes)
        assert plans[kind] > 0
    oracle = connect(nodes)
    terms = [KindTerms(kind, n) for kind, n in plans.items()]
    with pytest.raises(BudgetExhausted, match=r"penalty answers and .* penalty_expfam answers"):
        oracle.open_kinds(terms, session="joint")
    # the host of owner-0 (the smallest sigma, whose budget the joint plan passes) refused as a
    # whole and recorded nothing; each host admits its own owners, as for sessions of one kind
    assert spend(nodes[:2], "joint") == [{}, {}]
    oracle.open_session("log_ratio", plans["log_ratio"], session="alone")


def test_secure_aggregation_with_several_kinds_is_decided_by_the_owners_policy(tmp_path, connect):
    """Several kinds with secure aggregation reach the owners (each kind masked under its own
    transcript: tests/test_dp_hmc_secure.py); these owners' policies allow no secure session,
    so they refuse it for that reason and record nothing."""
    nodes = make_nodes(tmp_path, "s")
    oracle = connect(nodes)
    with pytest.raises(InvalidRequest, match=r"sets no privacy\.total_noise_sd"):
        oracle.open_kinds(KINDS, session="s", secure=SecureAggregation(1.0))
    assert spend(nodes, "s") == [{}, {}, {}]


# --- the protocol's v2 fields ---------------------------------------------------------------
def test_a_v1_shaped_open_session_opens_one_kind_as_before(tmp_path):
    nodes = make_nodes(tmp_path, "v1")
    with ServerThread(OwnerHost(nodes[:2])) as server:
        channel = grpc.insecure_channel(server.address)
        stub = pb_grpc.OwnerStub(channel)
        v1 = pb.OpenSessionRequest(session="v1", algorithm="penalty", planned_answers=10)
        stub.OpenSession(v1)
        query = wire.kind_query(
            "log_ratio", "v1", 0, CHAINS, {"theta": THETA, "theta_prop": THETA + 0.01}
        )
        assert tuple(stub.Ask(query).shape) == (2, 3)
        channel.close()
    for node in nodes[:2]:
        assert node.require_session("v1", "log_ratio").kind.name == "log_ratio"
        assert node.ledger.session(node.name, "v1") is not None  # stored as before: one kind


def test_one_kind_travels_in_the_single_kind_fields_and_several_in_kinds():
    one = wire.open_message(SessionRequest.several("s", [KindTerms("gradient", 7, 0.1)]))
    assert (one.kind, one.algorithm, one.sampling_rate, len(one.kinds)) == (
        "gradient",
        "sgmcmc",
        0.1,
        0,
    )
    several = wire.open_message(SessionRequest.several("s", KINDS))
    assert (several.kind, several.algorithm, several.planned_answers) == ("", "", 0)
    assert [(t.kind, t.planned_answers) for t in several.kinds] == [
        ("log_ratio", 20),
        ("gradient", 20),
    ]
    assert not several.kinds[0].HasField("sampling_rate") and several.kinds[1].sampling_rate == 0.1
    decoded = wire.session_request(several, "alice", None)
    assert decoded == SessionRequest("s", tuple(KINDS), "alice")
    assert wire.session_request(one, None, None).terms == (KindTerms("gradient", 7, 0.1),)


def test_single_kind_fields_and_kinds_must_agree():
    kinds = [pb.KindTerms(kind="penalty", planned_answers=5, max_step=0.02)]
    same = pb.OpenSessionRequest(
        session="s", kind="log_ratio", planned_answers=5, max_step=0.02, kinds=kinds
    )
    assert wire.session_request(same, None, None).terms == (KindTerms("penalty", 5, None, 0.02),)
    for other in (
        {"kind": "log_ratio", "planned_answers": 6, "max_step": 0.02},  # another plan
        {"kind": "log_ratio", "planned_answers": 5},  # no step
        {"algorithm": "sgmcmc", "planned_answers": 5, "max_step": 0.02},  # another kind
        {"planned_answers": 5},  # a plan of no kind
    ):
        msg = pb.OpenSessionRequest(session="s", kinds=kinds, **other)
        with pytest.raises(InvalidRequest, match="single-kind fields"):
            wire.session_request(msg, None, None)
    two = pb.OpenSessionRequest(
        session="s",
        kind="log_ratio",
        planned_answers=5,
        kinds=[*kinds, pb.KindTerms(kind="gradient", planned_answers=5, sampling_rate=0.1)],
    )
    with pytest.raises(InvalidRequest, match="single-kind fields"):
        wire.session_request(two, None, None)


def test_more_kinds_than_there_are_is_refused_before_decoding_them():
    more = len(REGISTRY) + 1  # one more than the registry holds
    many = pb.OpenSessionRequest(
        session="s", kinds=[pb.KindTerms(kind="log_ratio", planned_answers=1)] * more
    )
    with pytest.raises(InvalidRequest, match=f"{more} query kinds; each kind is asked once"):
        wire.session_request(many, None, None)
    twice = pb.OpenSessionRequest(
        session="s", kinds=[pb.KindTerms(kind="log_ratio", planned_answers=1)] * 2
    )
    with pytest.raises(InvalidRequest, match="each query kind once"):
        wire.session_request(twice, None, None).kinds()


def test_the_substep_travels_in_the_kind_query_and_zero_is_not_written():
    arrays = {"theta": THETA, "clip": 1.0}
    zero = wire.kind_query("gradient", "s", 3, CHAINS, arrays)
    assert zero.substep == 0 and zero == wire.kind_query("gradient", "s", 3, CHAINS, arrays, 0)
    before = pb.KindQuery(
        kind="gradient",
        session="s",
        iteration=3,
        chains=CHAINS.tolist(),
        arrays=[wire._named_array(k, v) for k, v in arrays.items()],
    )
    assert zero.SerializeToString() == before.SerializeToString()  # a v1-era KindQuery's bytes
    assert wire.kind_query("gradient", "s", 3, CHAINS, arrays, substep=2).substep == 2
