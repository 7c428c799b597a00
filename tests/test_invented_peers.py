"""Invented peers in a secure session (issue 20, row 3; docs/design.md §2.6, §3 invariant 13).

A coordinator that opens a secure session with one real owner and K − 1 owners it invents (it
holds their keys) removes its own answers from the sum and reads the real owner's answer with
noise s/√(K − t). A deployed owner must therefore never charge at s for peers it cannot
authenticate: by default it refuses, and with ``privacy.unauthenticated_peers =
"charge_own_noise"`` it is charged — and its budget enforced — at its own noise. The attack
here is a raw gRPC client against a real ``fedpenalty owner serve``.
"""

from __future__ import annotations

import math
import subprocess
from dataclasses import replace

import grpc
import numpy as np
import pytest
from certificates import TestCA
from grpc_processes import FEDPENALTY, TIMEOUT, free_port, write_owner
from owners import save_csv

from fedpenalty.common import Policy, SecureTerms
from fedpenalty.errors import BudgetExhausted, NotPermitted
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerHost, OwnerNode, wire
from fedpenalty.owner.aggregation import (
    PeerKey,
    SecureOpen,
    lattice_step,
    public_bytes,
    revealed_key,
    session_private_key,
)
from fedpenalty.owner.noise.lattice import lattice_sensitivity
from fedpenalty.owner.noise.sources import NoiseKey
from fedpenalty.owner.peer_auth import PeerAuth
from fedpenalty.privacy import GaussianSpend
from fedpenalty.privacy.owner_epsilon import owner_epsilon
from fedpenalty.proto import owner_pb2 as pb
from fedpenalty.proto import owner_pb2_grpc as pb_grpc

MODEL_TABLE = {"name": "gaussian_mean", "dim": 1, "data_bound": 3.0, "theta_bound": 2.0}
MODEL = build_model(MODEL_TABLE)
S, T, K = 1.0, 0, 100  # the coordinator invents K − 1 = 99 peers
STEP = 0.01
ANSWERS = 20
POLICY = {"sigma": 1.0, "max_step": 0.05, "budget_epsilon": 1e6, "total_noise_sd": S}


def invented_key(name: str, session: str, k: int) -> PeerKey:
    """A key the coordinator holds, with its graph commitment and share (K > 64: a sparse
    graph, whose seed the owners commit to and reveal, docs/design.md §2.6)."""
    return revealed_key(name, session_private_key(bytes([k]) * 32, session), session)


def invented_open(stub, session: str, own: PeerKey) -> pb.OpenSessionRequest:
    """The coordinator's open of ``session``: the real owner's key and 99 keys it holds, after
    the reveal round (the owner reveals its share for the list)."""
    invented = [invented_key(f"invented-{k:02d}", session, k) for k in range(1, K)]
    listed = [own, *(replace(k, share=b"") for k in invented)]
    reveal = pb.RevealSharesRequest(session=session)
    reveal.peers.extend(wire.peer_key_message(k) for k in listed)
    (revealed,) = stub.RevealShares(reveal, timeout=30).shares
    peers = (wire.peer_key(revealed), *invented)
    request = pb.OpenSessionRequest(session=session, algorithm="penalty", planned_answers=ANSWERS)
    request.secure.CopyFrom(wire.secure_message(SecureOpen(peers, S, T)))
    return request


def serve_alice(tmp_path, procs, **privacy):
    port = free_port()
    data = tmp_path / "alice.csv"
    save_csv(data, MODEL.simulate_records(np.random.default_rng(0), np.array([0.2]), 200), MODEL)
    toml = write_owner(tmp_path, "alice", data, port, {**POLICY, **privacy}, MODEL_TABLE)
    procs.owner(toml, port)
    return grpc.insecure_channel(f"127.0.0.1:{port}")


def own_key(stub, session: str) -> PeerKey:
    (key,) = stub.SessionKeys(pb.SessionKeysRequest(session=session), timeout=30).keys
    return wire.peer_key(key)


def test_a_deployed_owner_refuses_a_session_of_invented_peers(tmp_path, procs):
    """The default for ``owner serve`` with total_noise_sd and no peer_ca: refused with one line
    naming the OWNER.toml keys to set, nothing recorded."""
    with serve_alice(tmp_path, procs) as channel:
        stub = pb_grpc.OwnerStub(channel)
        request = invented_open(stub, "attack", own_key(stub, "attack"))
        with pytest.raises(grpc.RpcError) as info:
            stub.OpenSession(request, timeout=30)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        message = info.value.details()
        assert "\n" not in message
        for key in ("server.peer_ca", "server.allowed_peers", "privacy.unauthenticated_peers"):
            assert key in message
        with pytest.raises(grpc.RpcError) as unknown:
            stub.PrivacyReport(pb.PrivacyReportRequest(session="attack"), timeout=30)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND  # nothing was recorded


def test_charge_own_noise_makes_the_ledger_true_against_invented_peers(tmp_path, procs):
    """With ``unauthenticated_peers = "charge_own_noise"`` the owner answers the attack, but its
    ledger charges each answer μ = (Δ + γ)/(s/√(K − t)): the ε the coordinator can get."""
    with serve_alice(tmp_path, procs, unauthenticated_peers="charge_own_noise") as channel:
        stub = pb_grpc.OwnerStub(channel)
        stub.OpenSession(invented_open(stub, "attack", own_key(stub, "attack")), timeout=30)
        for i in range(ANSWERS):
            theta = [0.1]
            stub.LogRatio(
                pb.LogRatioRequest(
                    session="attack", iteration=i, chains=[0], theta=theta,
                    theta_prop=[theta[0] + STEP],
                ),
                timeout=30,
            )  # fmt: skip
        (report,) = stub.PrivacyReport(pb.PrivacyReportRequest(session="attack"), timeout=30).owners
    report = wire.privacy_report(report)
    own_sd = S / math.sqrt(K - T)
    gamma = lattice_step(SecureTerms(K, T, S))
    delta = float(MODEL.log_ratio_sensitivity(STEP, "replace_one"))
    mu = (delta + lattice_sensitivity(0.0, gamma, 1)) / own_sd
    expected, _ = owner_epsilon(
        GaussianSpend(ANSWERS, ANSWERS * mu**2, mu), [], 1e-5, "replace_one", True
    )
    at_s, _ = owner_epsilon(
        GaussianSpend(ANSWERS, ANSWERS * (mu * own_sd / S) ** 2, mu * own_sd / S),
        [],
        1e-5,
        "replace_one",
        True,
    )
    assert report.session is not None and report.own_noise is not None
    assert report.session.answers == ANSWERS
    assert report.session.mu == pytest.approx(math.sqrt(ANSWERS) * mu, rel=1e-9)
    assert report.session.epsilon == pytest.approx(expected, rel=1e-9)
    assert report.own_noise.session is not None
    assert report.own_noise.session.epsilon == pytest.approx(report.session.epsilon, rel=1e-9)
    assert report.own_noise.peers == "own_noise"
    assert report.session.epsilon > 5 * at_s  # what today's charge at s would have said


# --- in process: the plan check, identities and duplicates ------------------------------------
def deployed(name: str, **policy) -> OwnerNode:
    records = MODEL.simulate_records(np.random.default_rng(len(name)), np.array([0.2]), 100)
    settings = {"budget_epsilon": 1e9, "total_noise_sd": S, **policy}
    return OwnerNode(name, MODEL, records, Policy(**settings), Ledger(":memory:"),
                     noise_key=NoiseKey.derive(b"i", name))  # fmt: skip


def test_the_plan_check_uses_the_own_noise_too():
    """A plan that fits the budget at s but not at the owner's own noise is refused."""
    plan, step = 50, 0.01
    node = deployed("alice", budget_epsilon=10.0, unauthenticated_peers="charge_own_noise")
    host = OwnerHost([node])
    terms = SecureTerms(K, T, S)
    mu_s = node.worst_case_mu("penalty", step, terms)
    mu_own = node.worst_case_mu("penalty", step, terms.own_noise_only())
    fits = owner_epsilon(GaussianSpend(plan, plan * mu_s**2, mu_s), [], 1e-5, "replace_one", True)
    passes = owner_epsilon(
        GaussianSpend(plan, plan * mu_own**2, mu_own), [], 1e-5, "replace_one", True
    )
    assert fits[0] < 10.0 < passes[0]
    invented = [invented_key(f"x{k}", "s", k) for k in range(1, K)]
    listed = [*host.session_keys("s"), *(replace(k, share=b"") for k in invented)]
    keys = [*host.reveal_shares("s", listed), *invented]  # the reveal round (K > 64)
    with pytest.raises(BudgetExhausted):
        host.open_session("s", "penalty", plan, max_step=step, secure=SecureOpen(tuple(keys), S, T))
    assert node.ledger.session("alice", "s") is None


@pytest.fixture
def auths(tmp_path) -> dict[str, PeerAuth]:
    ca = TestCA(tmp_path)
    out = {}
    for n in ("alice", "bob"):
        cert, key = ca.leaf(n, n, dns=(f"{n}.example.org",), owners=(n,))
        out[n] = PeerAuth.load(cert, key, ca.path, ["alice", "bob", "bob-2", "bob-3"])
    return out


def test_one_server_cannot_vouch_for_more_owners_than_its_certificate_names(auths):
    """Bob's server (certificate naming owner bob) signs keys for bob-2 and bob-3 as well: each
    extra name is refused, so K counts distinct owner identities only; a name twice is refused
    by the owner's count."""
    alice = deployed("alice")
    bob = auths["bob"].sign("s", PeerKey("bob", public_bytes(session_private_key(b"b" * 32, "s"))))
    for extra in ("bob-2", "bob-3"):
        key = PeerKey(extra, public_bytes(session_private_key(extra.encode() * 8, "s")))
        with pytest.raises(NotPermitted, match=rf"naming the owners \['bob'\].*not '{extra}'"):
            auths["alice"].check("s", [alice.session_key("s"), bob, auths["bob"].sign("s", key)],
                                 ["alice"])  # fmt: skip
    twice = auths["bob"].sign(
        "s", PeerKey("bob", public_bytes(session_private_key(b"c" * 32, "s")))
    )
    peers = (alice.session_key("s"), bob, twice)
    auths["alice"].check("s", peers, ["alice"])  # each key is bob's, signed by bob's server ...
    with pytest.raises(Exception, match="name some owner twice"):  # ... but bob counts once
        OwnerHost([alice]).open_session(
            "s", "penalty", 10, secure=SecureOpen(peers, S, T, authenticated=True)
        )


def test_a_server_whose_certificate_does_not_name_its_owner_refuses_to_start(tmp_path):
    ca = TestCA(tmp_path)
    cert, key = ca.leaf("server", "a.example.org", dns=("a.example.org",), owners=("bob",))
    data = tmp_path / "alice.csv"
    save_csv(data, MODEL.simulate_records(np.random.default_rng(0), np.array([0.2]), 50), MODEL)
    server = {"tls_cert": str(cert), "tls_key": str(key), "peer_ca": str(ca.path),
              "allowed_peers": ["bob"]}  # fmt: skip
    toml = write_owner(tmp_path, "alice", data, free_port(), POLICY, MODEL_TABLE, **server)
    done = subprocess.run(
        [*FEDPENALTY, "owner", "serve", str(toml)], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert done.returncode != 0
    assert "server.tls_cert names the owners ['bob']" in done.stderr
    assert "'alice'" in done.stderr and "urn:fedpenalty:owner:" in done.stderr
