"""Authenticated peer keys for secure aggregation (docs/design.md §2.6, ``owner/peer_auth.py``):
owner servers sign their session keys with their TLS keys; an owner with ``allowed_peers``
accepts a secure session only when every other owner's key is signed under a certificate from
its peer CA that names *that owner* (SAN URI urn:fedpenalty:owner:<name>), an allowed one — so
a coordinator can neither invent owners nor swap keys, and one server cannot vouch for owners
its certificate does not name. OWNER.toml checks its keys."""

from __future__ import annotations

from dataclasses import replace

import grpc
import numpy as np
import pytest
from certificates import TestCA

from fedpenalty.common import Policy
from fedpenalty.coordinator.grpc_oracle import GrpcOracle
from fedpenalty.coordinator.oracle import SecureAggregation
from fedpenalty.errors import ConfigError, NotPermitted
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerHost, OwnerNode, wire
from fedpenalty.owner.aggregation import PeerKey, SecureOpen, public_bytes, session_private_key
from fedpenalty.owner.noise.sources import NoiseKey
from fedpenalty.owner.owner_config import load_owner_config
from fedpenalty.owner.peer_auth import PeerAuth
from fedpenalty.owner.server import ServerThread
from fedpenalty.proto import owner_pb2 as pb
from fedpenalty.proto import owner_pb2_grpc as pb_grpc

MODEL = build_model({"name": "gaussian_mean", "dim": 1})
NAMES = ("alice", "bob", "carol")


def node(name: str) -> OwnerNode:
    records = MODEL.simulate_records(np.random.default_rng(len(name)), np.array([0.2]), 100)
    policy = Policy(budget_epsilon=1e9, total_noise_sd=1.0, colluders=1)
    return OwnerNode(name, MODEL, records, policy, Ledger(":memory:"),
                     noise_key=NoiseKey.derive(b"p", name))  # fmt: skip


@pytest.fixture
def auths(tmp_path) -> dict[str, PeerAuth]:
    """Each owner's PeerAuth: its certificate from one CA, every owner allowed."""
    ca = TestCA(tmp_path)
    out = {}
    for n in NAMES:
        cert, key = ca.leaf(n, n, dns=(f"{n}.example.org",), owners=(n,))
        out[n] = PeerAuth.load(cert, key, ca.path, NAMES)
    return out


def signed_keys(auths, session="s") -> tuple[dict[str, OwnerNode], list[PeerKey]]:
    nodes = {n: node(n) for n in NAMES}
    keys = [OwnerHost([nodes[n]]).session_keys(session)[0] for n in NAMES]
    return nodes, [auths[n].sign(session, k) for n, k in zip(NAMES, keys)]


def test_signed_keys_from_allowed_peers_pass(auths):
    _, keys = signed_keys(auths)
    auths["alice"].check("s", keys, ["alice"])


def test_a_coordinator_can_neither_invent_nor_swap_nor_replay_peer_keys(auths, tmp_path):
    _, keys = signed_keys(auths)

    def refusal(peers, session="s") -> str:
        with pytest.raises(NotPermitted) as info:
            auths["alice"].check(session, peers, ["alice"])
        return str(info.value)

    invented = PeerKey("mallory", public_bytes(session_private_key(bytes(32), "s")))
    assert "'mallory' is not in this owner's server.allowed_peers" in refusal(
        [keys[0], invented, keys[2]]
    )
    impostor = replace(invented, owner="bob")  # an allowed name, but no certificate
    assert "no certificate issued" in refusal([keys[0], impostor, keys[2]])
    swapped = replace(keys[1], public_key=keys[2].public_key)
    assert "not signed" in refusal([keys[0], swapped, keys[2]])
    assert "not signed" in refusal(keys, session="t")  # keys signed for "s" replayed in "t"
    recommitted = replace(keys[1], commitment=bytes(32))  # a graph commitment swapped
    assert "not signed" in refusal([keys[0], recommitted, keys[2]])
    (tmp_path / "other").mkdir()
    other = TestCA(tmp_path / "other")
    cert, key = other.leaf("bob", "bob", dns=("bob.example.org",), owners=("bob",))
    foreign = PeerAuth.load(cert, key, other.path, ["alice"]).sign("s", keys[1])
    assert "no certificate issued" in refusal([keys[0], foreign, keys[2]])


def test_a_certificate_naming_one_owner_cannot_vouch_for_another(auths):
    """Bob's server signs a key in carol's name (its certificate names bob only): refused, as is
    bob's own signed key relabelled as carol's."""
    _, keys = signed_keys(auths)
    fake = PeerKey("carol", public_bytes(session_private_key(bytes(range(32)), "s")))
    forged = auths["bob"].sign("s", fake)
    relabelled = replace(keys[1], owner="carol")
    for carol in (forged, relabelled):
        with pytest.raises(NotPermitted, match=r"naming the owners \['bob'\].*not 'carol'"):
            auths["alice"].check("s", [keys[0], keys[1], carol], ["alice"])


def test_a_peer_whose_certificate_names_no_allowed_peer_is_refused(auths):
    only = replace(auths["alice"], allowed=("alice", "bob"))
    _, keys = signed_keys(auths)
    with pytest.raises(NotPermitted, match=r"'carol' is not in this owner's server\.allowed_peers"):
        only.check("s", keys, ["alice"])


def test_authenticated_secure_session_over_grpc(auths):
    """Three owner servers with peer authentication: the coordinator relays their signed keys,
    the session opens and decodes; an invented owner's key is refused by every owner."""
    nodes = {n: node(n) for n in NAMES}
    servers = [ServerThread(OwnerHost([nodes[n]]), peers=auths[n]) for n in NAMES]
    oracle = GrpcOracle([s.address for s in servers], model=MODEL, deadline=10, retry_seconds=2)
    try:
        oracle.open_session("penalty", 100, session="s", secure=SecureAggregation(1.0, 1))
        theta = np.zeros((3, 1))
        answers = oracle.log_ratio(0, np.arange(3), theta, theta + 0.01)
        assert answers.values.shape == (1, 3)
        keys = oracle._session_keys("t")
        assert all(k.signature and k.certificate for k in keys)
        invented = PeerKey("mallory", public_bytes(session_private_key(bytes(32), "t")))
        request = pb.OpenSessionRequest(session="t", algorithm="penalty", planned_answers=10)
        request.secure.CopyFrom(wire.secure_message(SecureOpen((*keys, invented), 1.0, 1)))
        with grpc.insecure_channel(servers[0].address) as channel:
            with pytest.raises(grpc.RpcError) as info:
                pb_grpc.OwnerStub(channel).OpenSession(request, timeout=10)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "mallory" in info.value.details()
        assert nodes["alice"].ledger.session("alice", "t") is None
    finally:
        oracle.close()
        for s in servers:
            s.close()


def test_owner_file_needs_peer_ca_allowed_peers_and_tls_together(tmp_path):
    ca = TestCA(tmp_path)
    cert, key = ca.leaf("alice", "alice")
    (tmp_path / "x.csv").write_text("x\n0.1\n")
    base = '[model]\nname = "gaussian_mean"\n[data]\npath = "x.csv"\n[server]\n'
    toml = tmp_path / "alice.toml"
    toml.write_text(base + 'allowed_peers = ["bob"]\n')
    with pytest.raises(ConfigError, match="peer authentication needs"):
        load_owner_config(toml)
    toml.write_text(
        base + f'allowed_peers = ["bob"]\npeer_ca = "{ca.path}"\n'
        f'tls_cert = "{cert}"\ntls_key = "{key}"\n'
    )
    config = load_owner_config(toml)
    auth = config.peer_auth()
    assert auth is not None and auth.allowed == ("bob",)
