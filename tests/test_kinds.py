"""Query kinds as objects in one registry (docs/design.md §6): the registry is the list of
kinds every layer uses, an unknown kind is refused wherever it is named, and each kind's one
sensitivity function is what admission, refusal advice and charging all use."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from fedpenalty.common import LOG_RATIO, SGMCMC, SUFF_STATS, Policy
from fedpenalty.coordinator.inprocess import InProcessOracle
from fedpenalty.coordinator.oracle import Oracle
from fedpenalty.errors import ConfigError, InvalidRequest, UnknownSession
from fedpenalty.kinds import KINDS, KindTerms, query_kind
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerHost, OwnerNode, wire
from fedpenalty.owner.owner_config import noise_level
from fedpenalty.owner.session_request import SessionRequest
from fedpenalty.proto import owner_pb2 as pb
from fedpenalty.refusals import plan_needs

MODEL = build_model({"name": "gaussian_mean", "dim": 2, "data_bound": 3.0, "theta_bound": 2.0})
RECORDS = MODEL.simulate_records(np.random.default_rng(1), np.array([0.3, -0.2]), 500)
POLICY = Policy(sigma=2.0, max_step=0.05, budget_epsilon=500.0, delta=1e-5)


def make_node(tmp_path, name: str = "alice") -> OwnerNode:
    ledger = Ledger(tmp_path / f"{name}.sqlite", synchronous="NORMAL")
    return OwnerNode(name, MODEL, RECORDS, POLICY, ledger, np.random.default_rng(7))


# --- the registry -------------------------------------------------------------------------
#: the kinds of the first release, each with a v1 wire message, host method and oracle wrapper
FIRST_RELEASE = ["log_ratio", "suff_stats", "gradient"]


def test_the_registry_lists_exactly_the_eight_kinds():
    assert list(KINDS) == [
        *FIRST_RELEASE,
        "clipped_log_ratio",
        "clipped_gradient",
        "grad_fisher",
        "sampled_log_ratio",
        "laplace_stats",
    ]
    assert [k.ledger_name for k in KINDS.values()] == [
        "penalty",
        "penalty_expfam",
        "sgmcmc",
        "penalty_clipped",
        "gradient_clipped",
        "sgfs",
        "barker",
        "laplace_stats",
    ]
    assert (LOG_RATIO, SUFF_STATS, SGMCMC) == ("penalty", "penalty_expfam", "sgmcmc")
    for name, kind in KINDS.items():
        assert kind.name == name
        assert query_kind(name) is kind and query_kind(kind.ledger_name) is kind


def test_every_first_release_kind_has_a_host_method_an_oracle_wrapper_and_a_wire_message():
    oneof = pb.QueryRequest.DESCRIPTOR.oneofs_by_name["query"].fields
    assert {f.name for f in oneof} == set(FIRST_RELEASE) == set(wire.QUERY_CODECS)
    for name in FIRST_RELEASE:
        assert callable(getattr(OwnerHost, name)) and callable(getattr(Oracle, name))


@pytest.mark.parametrize("name", ["hmc", "", "PENALTY", None, 3])
def test_an_unknown_kind_is_an_error_that_names_the_known_ones(name):
    with pytest.raises(InvalidRequest, match="unknown algorithm") as caught:
        query_kind(name)
    for kind in KINDS.values():
        assert kind.name in str(caught.value) and kind.ledger_name in str(caught.value)


def test_an_unknown_kind_is_refused_at_session_open(tmp_path):
    host = OwnerHost([make_node(tmp_path)])
    with pytest.raises(InvalidRequest, match=r"unknown algorithm.*'hmc'.*log_ratio \(penalty\)"):
        host.open_session("s", "hmc", 10)
    with pytest.raises(UnknownSession):  # nothing was opened
        host.log_ratio("s", 0, np.array([0]), np.zeros((1, 2)), np.full((1, 2), 0.01))


def test_an_unknown_kind_is_refused_at_query(tmp_path):
    oracle = InProcessOracle([make_node(tmp_path)])
    oracle.open_session("log_ratio", 10, "s")
    with pytest.raises(InvalidRequest, match=r"unknown algorithm.*'hmc'"):
        oracle.query("hmc", 0, np.array([0]), theta=np.zeros((1, 2)))
    with pytest.raises(InvalidRequest, match="carries theta, theta_prop"):
        oracle.query("log_ratio", 0, np.array([0]), theta=np.zeros((1, 2)))
    # a query of another kind than the session's is refused too
    with pytest.raises(InvalidRequest, match="is a 'penalty' session, not 'penalty_expfam'"):
        oracle.query("suff_stats", 0, np.array([0]), block=1)


def test_v2_and_v1_names_open_the_same_session(tmp_path):
    node = make_node(tmp_path)
    node.open_session("v2", "log_ratio", 10)
    node.open_session("v1", "penalty", 10)
    assert node.require_session("v2", "penalty").kind is node.require_session("v1", None).kind


# --- the wire: the v2 field and the v1 one ------------------------------------------------
def test_the_wire_carries_the_kind_by_both_names_and_reads_either():
    msg = wire.open_message(SessionRequest.of("s", "sgmcmc", 7, sampling_rate=0.1))
    assert (msg.kind, msg.algorithm, msg.sampling_rate) == ("gradient", "sgmcmc", 0.1)
    v2 = pb.OpenSessionRequest(session="s", kind="gradient", planned_answers=7, sampling_rate=0.1)
    v1 = pb.OpenSessionRequest(
        session="s", algorithm="sgmcmc", planned_answers=7, sampling_rate=0.1
    )
    for sent in (msg, v2, v1):
        request = wire.session_request(sent, "client", None)
        assert request.single().planned_answers == 7 and request.single().sampling_rate == 0.1
        assert query_kind(request.single().kind) is KINDS["gradient"]
        assert request.client == "client" and request.secure is None
    both = pb.OpenSessionRequest(session="s", kind="log_ratio", algorithm="sgmcmc")
    with pytest.raises(InvalidRequest, match="two query kinds"):
        wire.session_request(both, None, None)


def test_a_session_asks_each_kind_once(tmp_path):
    # sessions of several kinds are admitted now (tests/test_multikind.py); a kind asked twice
    # (by its v2 and its ledger name) is still refused
    host = OwnerHost([make_node(tmp_path)])
    terms = (KindTerms("log_ratio", 10), KindTerms("penalty", 10))
    with pytest.raises(InvalidRequest, match="each query kind once"):
        host.open(SessionRequest("s", terms))


# --- one sensitivity: admission, refusal advice, charging ---------------------------------
def _figures(tmp_path, kind_name: str) -> tuple[float, float, float]:
    """(worst-case μ at admission, the noise refusal advice asks for, μ charged for one
    answer) for ``kind_name``, on a fresh node."""
    node = make_node(tmp_path)
    worst = node.worst_case_mu(kind_name)
    needs = plan_needs(kind_name, MODEL, POLICY, 10**7, {}, lattice=False)
    host = OwnerHost([node])
    host.open_session("s", kind_name, 1)
    theta = np.zeros((1, 2))
    if kind_name == "log_ratio":
        host.log_ratio("s", 0, np.array([0]), theta, theta + np.array([[0.03, 0.04]]))
    else:
        host.suff_stats("s", np.array([0]), 0, 1)
    charged = host.privacy_reports("s")[0].session.mu
    node.ledger.close()
    return worst, needs.sigma, charged


@pytest.mark.parametrize("kind_name", ["log_ratio", "suff_stats"])
def test_a_doubled_sensitivity_doubles_admission_advice_and_charge(
    tmp_path, monkeypatch, kind_name
):
    kind = KINDS[kind_name]
    before = _figures(tmp_path / "before", kind_name)
    original = type(kind).sensitivity
    monkeypatch.setattr(type(kind), "sensitivity", lambda self, *args: 2 * original(self, *args))
    after = _figures(tmp_path / "after", kind_name)
    assert after == pytest.approx(tuple(2 * x for x in before), rel=1e-12)
    assert all(x > 0 for x in before)


# --- OWNER.toml's noise level -----------------------------------------------------------------
@pytest.mark.parametrize("key", [k.noise_key for k in KINDS.values()])
def test_owner_toml_names_the_noise_level_for_its_kind(key):
    raw = {"privacy": {key: 550.0, "budget_epsilon": 9.0}}
    assert noise_level(raw) == key
    assert raw["privacy"] == {"sigma": 550.0, "budget_epsilon": 9.0}


def test_owner_toml_sigma_still_reads_with_a_message_naming_the_new_keys(caplog):
    raw = {"privacy": {"sigma": 2.0}}
    with caplog.at_level(logging.INFO, logger="fedpenalty.owner"):
        assert noise_level(raw) is None
    assert raw == {"privacy": {"sigma": 2.0}}
    for kind in KINDS.values():
        assert kind.noise_key in caplog.text


def test_owner_toml_noise_levels_that_disagree_are_each_kinds_own():
    # issue 22: they were refused while an owner had one level; each kind now has its own
    # (tests/test_noise_levels.py); names that agree still give the one level sigma
    raw = {"privacy": {"log_ratio_sd": 1.0, "stat_sd": 550.0}}
    assert noise_level(raw) is None
    assert raw["privacy"] == {"noise": {"penalty": 1.0, "penalty_expfam": 550.0}}
    with pytest.raises(ConfigError, match=r"privacy\.stat_sd must be a positive finite number"):
        noise_level({"privacy": {"log_ratio_sd": 1.0, "stat_sd": -550.0}})
    raw = {"privacy": {"log_ratio_sd": 1.0, "sigma": 1.0}}
    assert noise_level(raw) == "log_ratio_sd" and raw["privacy"] == {"sigma": 1.0}


def test_a_served_owner_reads_v1_and_v2_session_requests(tmp_path):
    """Over gRPC: a v1 client (``algorithm``), a v2 client (``kind``) and this coordinator
    (both) open sessions of the same kind; two names that disagree are INVALID_ARGUMENT."""
    import grpc

    from fedpenalty.owner.server import ServerThread
    from fedpenalty.proto import owner_pb2_grpc as pb_grpc

    host = OwnerHost([make_node(tmp_path)])
    with ServerThread(host) as server, grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.OwnerStub(channel)
        sent = {
            "v1": {"algorithm": "penalty"},
            "v2": {"kind": "log_ratio"},
            "both": {"kind": "log_ratio", "algorithm": "penalty"},
        }
        for session, names in sent.items():
            stub.OpenSession(pb.OpenSessionRequest(session=session, planned_answers=4, **names))
            assert host.nodes[0].require_session(session, "log_ratio").kind is KINDS["log_ratio"]
        with pytest.raises(grpc.RpcError) as caught:
            stub.OpenSession(
                pb.OpenSessionRequest(session="x", kind="gradient", algorithm="penalty")
            )
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "two query kinds" in caught.value.details()
