"""A new query kind is one module and one registry line (docs/design.md §6, "A query kind"):
a toy kind defined here — the noisy sum of a clipped per-record statistic — registered with one
line, answered end to end (noised, charged, replayed) over the in-process oracle and over gRPC
with no code of its own in the host, the server or the oracles."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
import numpy as np
import pytest

from fedpenalty.common import Policy
from fedpenalty.coordinator.grpc_oracle import GrpcOracle
from fedpenalty.coordinator.inprocess import InProcessOracle
from fedpenalty.errors import InvalidRequest, ReplayConflict
from fedpenalty.kinds import KINDS, GaussianKind
from fedpenalty.models import Model, build_model
from fedpenalty.owner import Ledger, OwnerHost, OwnerNode, wire
from fedpenalty.owner.compute.noisy import NoisyExact
from fedpenalty.owner.mechanism import HostNoise, Keys
from fedpenalty.owner.pipeline import Asked, Planned, Request
from fedpenalty.owner.server import ServerThread
from fedpenalty.proto import owner_pb2 as pb
from fedpenalty.proto import owner_pb2_grpc as pb_grpc

MODEL = build_model({"name": "gaussian_mean", "dim": 2, "data_bound": 3.0, "theta_bound": 2.0})
RECORDS = MODEL.simulate_records(np.random.default_rng(1), np.array([0.3, -0.2]), 200)
SIGMA = 2.0


# --- the toy kind: one module's worth of code -----------------------------------------------
class ClippedSum(GaussianKind):
    """``clipped_sum``: per owner and key, Σ_x clip(xᵀθ_c, ±1) + N(0, σ²). One record moves
    the sum by at most 2 (replace_one) or 1 (add_remove), whatever θ."""

    name = "clipped_sum"
    ledger_name = "toy_clipped_sum"
    sigma_meaning = "sd of the noisy clipped sum"
    noise_key = "clipped_sum_sd"
    arrays = ("theta",)
    spend_keys = ("sampler.chains", "sampler.iterations", "privacy.sigma")

    def width(self, model: Model) -> int:
        return 1

    def sensitivity(self, model: Model, neighbour: str, step: float) -> float:
        return 2.0 if neighbour == "replace_one" else 1.0

    def answer_path(self, nodes: Sequence[OwnerNode]) -> ClippedSumPath:
        return ClippedSumPath(self, nodes)


class ClippedSumCompute:
    """The exact clipped sums ``(K, C, 1)`` of every owner, noised by the session's noise."""

    kind = ClippedSum.ledger_name

    def __init__(self, nodes: Sequence[OwnerNode]):
        self.records = [n.records for n in nodes]

    def fresh(self, noise: HostNoise, keys: Keys, theta: np.ndarray) -> NoisyExact:
        def exact() -> np.ndarray:
            sums = [np.clip(r @ theta.T, -1.0, 1.0).sum(axis=0) for r in self.records]
            return np.stack(sums)[:, :, None]

        return NoisyExact(noise, keys, self.kind, exact)


class ClippedSumPath:
    """The toy kind's checks, digests and charge (μ = Δ/σ_k per answer) at one host."""

    def __init__(self, kind: ClippedSum, nodes: Sequence[OwnerNode]):
        self.tag = kind.digest_tag
        model = nodes[0].model
        self.delta = np.array([kind.sensitivity(model, n.policy.neighbour, 1.0) for n in nodes])
        self.compute = ClippedSumCompute(nodes)

    def plan(
        self, asked: Asked, iteration: int, chains: Any, arrays: Mapping[str, Any]
    ) -> Planned[np.ndarray]:
        checks = asked.checks
        iteration = checks.index("iteration", iteration)
        chains = checks.chains(chains)
        theta = checks.theta("theta", arrays["theta"], len(chains))
        digests = [hashlib.sha256(self.tag + row.astype("<f8").tobytes()).digest() for row in theta]
        keys = asked.keys(chains, np.full(len(chains), iteration))
        mechanism = asked.mechanism
        mus = mechanism.mus(self.delta, np.ones(len(chains)), 1)
        return Planned(
            Request(keys, digests, mechanism, 1, mus), self.compute, theta, (len(chains),)
        )


# --- the tests -------------------------------------------------------------------------------
@pytest.fixture
def registered(monkeypatch):
    """The toy kind, added to the registry with one line."""
    monkeypatch.setitem(KINDS, "clipped_sum", ClippedSum())


def owner(tmp_path, **node: Any) -> OwnerNode:
    policy = Policy(sigma=SIGMA, budget_epsilon=50.0, delta=1e-5)
    ledger = Ledger(tmp_path / "alice.sqlite", synchronous="NORMAL")
    return OwnerNode("alice", MODEL, RECORDS, policy, ledger, **node)


def exact_sums(theta: np.ndarray) -> np.ndarray:
    return np.clip(MODEL.prepare_records(RECORDS) @ theta.T, -1.0, 1.0).sum(axis=0)


def charged_mu_squared(owners: OwnerHost, session: str) -> float:
    [report] = owners.privacy_reports(session)
    assert report.session is not None
    return report.session.mu**2


THETA = np.array([[0.5, -0.2], [-0.3, 0.9], [1.0, 1.0]])


def test_a_registered_toy_kind_is_noised_charged_and_replayed_in_process(tmp_path, registered):
    oracle = InProcessOracle([owner(tmp_path, rng=np.random.default_rng(3))])
    owners = oracle.host
    oracle.open_session("clipped_sum", 20, session="s")
    first = oracle.query("clipped_sum", 0, np.arange(3), theta=THETA)
    assert first.values.shape == (1, 3) and list(first.noise_sd) == [SIGMA]
    noise = first.values[0] - exact_sums(THETA)
    assert np.all(noise != 0) and np.all(np.abs(noise) < 6 * SIGMA)
    # charged μ = Δ/σ per answer, Δ = 2 (replace_one)
    assert charged_mu_squared(owners, "s") == pytest.approx(3 * (2.0 / SIGMA) ** 2, rel=1e-12)
    again = oracle.query("clipped_sum", 0, np.arange(3), theta=THETA)
    np.testing.assert_array_equal(again.values, first.values)  # replayed, not charged again
    assert charged_mu_squared(owners, "s") == pytest.approx(3 * (2.0 / SIGMA) ** 2, rel=1e-12)
    with pytest.raises(ReplayConflict):
        oracle.query("clipped_sum", 0, np.arange(3), theta=THETA * 0.5)
    with pytest.raises(InvalidRequest, match="a clipped_sum query carries theta, not clip"):
        oracle.query("clipped_sum", 1, np.arange(3), clip=1.0)
    with pytest.raises(InvalidRequest, match=r"theta must have shape \(3, 2\)"):
        oracle.query("clipped_sum", 1, np.arange(3), theta=THETA[:2])
    with pytest.raises(InvalidRequest, match="is a 'toy_clipped_sum' session, not 'penalty'"):
        oracle.log_ratio(1, np.arange(3), THETA, THETA + 0.01)


def test_an_unregistered_kind_is_refused(tmp_path):
    oracle = InProcessOracle([owner(tmp_path, rng=np.random.default_rng(3))])
    owners = oracle.host
    with pytest.raises(InvalidRequest, match="unknown algorithm"):
        oracle.open_session("clipped_sum", 20, session="s")
    oracle.open_session("penalty", 20, session="p")
    with pytest.raises(InvalidRequest, match="unknown algorithm"):
        owners.answer("clipped_sum", "p", 0, np.arange(3), theta=THETA)


def test_a_registered_toy_kind_is_answered_over_grpc(tmp_path, registered):
    owners = OwnerHost(
        [owner(tmp_path)]
    )  # a deployed owner: exact lattice noise, fresh per attempt
    with ServerThread(owners) as server:
        oracle = GrpcOracle([server.address], MODEL, retry_seconds=2)
        oracle.open_session("clipped_sum", 20, session="s")
        first = oracle.query("clipped_sum", 0, np.arange(3), theta=THETA)
        assert first.values.shape == (1, 3) and list(first.noise_sd) == [SIGMA]
        assert np.all(np.abs(first.values[0] - exact_sums(THETA)) < 6 * SIGMA)
        mu_squared = charged_mu_squared(owners, "s")
        assert mu_squared >= 3 * (2.0 / SIGMA) ** 2  # Δ/σ, plus the lattice's rounding term
        assert mu_squared == pytest.approx(3 * (2.0 / SIGMA) ** 2, rel=1e-5)
        again = oracle.query("clipped_sum", 0, np.arange(3), theta=THETA)
        np.testing.assert_array_equal(again.values, first.values)
        assert charged_mu_squared(owners, "s") == mu_squared
        with grpc.insecure_channel(server.address) as channel:  # unary, and on the stream
            stub = pb_grpc.OwnerStub(channel)
            ask = wire.kind_query("clipped_sum", "s", 0, [0, 1, 2], {"theta": THETA})
            np.testing.assert_array_equal(wire.answers_reply(stub.Ask(ask)).values, first.values)
            unknown = wire.kind_query("no_such_kind", "s", 1, [0], {"theta": THETA[:1]})
            [reply] = stub.Query(iter([pb.QueryRequest(id=1, kind_query=unknown)]), timeout=10)
            assert reply.refusal.error == "InvalidRequest"
            assert "unknown algorithm" in reply.refusal.message
            v1 = pb.LogRatioRequest(session="s", iteration=1, chains=[0], theta=[0, 0])
            both = pb.QueryRequest(id=2, log_ratio=v1, kind_query=ask)
            [reply] = stub.Query(iter([both]), timeout=10)
            assert reply.refusal.error == "InvalidRequest" and "only one" in reply.refusal.message
        oracle.close()


def test_a_kind_query_round_trips_its_named_arrays_and_refuses_malformed_ones():
    arrays = {"theta": THETA, "clip": 0.5, "block": np.int64(3)}
    msg = wire.kind_query("any", "s", 4, np.arange(3), arrays)
    decoded = wire.kind_query_arrays(msg)
    np.testing.assert_array_equal(decoded["theta"], THETA)
    assert decoded["clip"] == 0.5 and type(decoded["clip"]) is float
    assert decoded["block"] == 3 and type(decoded["block"]) is int
    malformed = {
        "twice": [pb.NamedArray(name="a", values=[1.0]), pb.NamedArray(name="a", values=[1.0])],
        "both values and integers": [pb.NamedArray(name="a", values=[1.0], integers=[1])],
        r"not the \(2, 2\)": [pb.NamedArray(name="a", shape=[2, 2], values=[1.0, 2.0])],
        "not the": [pb.NamedArray(name="a", shape=[1] * 40, values=[1.0])],
    }
    for match, named in malformed.items():
        with pytest.raises(InvalidRequest, match=match):
            wire.kind_query_arrays(pb.KindQuery(kind="log_ratio", arrays=named))
