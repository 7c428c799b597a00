"""Commit, then reveal (docs/design.md §2.6): a sparse masking graph's seed hashes every owner's
share, each committed to with its session key before any share is revealed; an owner reveals
for one list of commitments a session (bound in its ledger) and opens only when every revealed
share matches its commitment and the commitments are those it revealed for."""

from __future__ import annotations

from dataclasses import replace

import grpc
import numpy as np
import pytest
from grpc_processes import free_port, write_owner
from owners import save_csv
from test_owner_floods import ledger_bytes

from fedpenalty.common import Policy, SecureTerms
from fedpenalty.coordinator.grpc_oracle import GrpcOracle
from fedpenalty.coordinator.inprocess import InProcessOracle
from fedpenalty.coordinator.oracle import SecureAggregation
from fedpenalty.coordinator.secure_sum import secure_open
from fedpenalty.errors import InvalidRequest, NotPermitted
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerHost, OwnerNode
from fedpenalty.owner.aggregation import (
    PeerKey,
    SecureOpen,
    graph_commitment,
    masking_graph,
    public_bytes,
    revealed_key,
    session_private_key,
)
from fedpenalty.owner.key_requests import KeyRequests
from fedpenalty.owner.mask_graph import COMPLETE_UP_TO, graph_degree
from fedpenalty.owner.noise.sources import NoiseKey
from fedpenalty.owner.server import ServerThread
from fedpenalty.proto import owner_pb2 as pb
from fedpenalty.proto import owner_pb2_grpc as pb_grpc

MODEL_TABLE = {"name": "gaussian_mean", "dim": 1, "data_bound": 4.0, "theta_bound": 3.0}
MODEL = build_model(MODEL_TABLE)
#: just above the complete graph: at t = 0 a ring (degree 2), whose order the seed decides
COUNT, T, S = COMPLETE_UP_TO + 2, 0, 1.0


def nodes_on(ledgers: list[Ledger], tag: str = "r") -> list[OwnerNode]:
    """``COUNT`` seeded lattice owners (the same for the same ``tag``), split in order over
    ``ledgers``, secure at (S, T); their peers are this test's own (``simulated_peers``)."""
    policy = Policy(total_noise_sd=S, colluders=T, budget_epsilon=1e9, max_step=0.2,
                    max_answers_per_request=10**6)  # fmt: skip
    rng = np.random.default_rng(7)
    blocks = np.array_split(np.arange(COUNT), len(ledgers))
    return [
        OwnerNode(f"o{k:02d}", MODEL, MODEL.simulate_records(rng, np.array([0.4]), 20), policy,
                  ledger, noise_key=NoiseKey.derive(tag.encode(), f"{k}"), simulated_peers=True)
        for ledger, block in zip(ledgers, blocks) for k in block
    ]  # fmt: skip


def hosts_on(ledgers: list[Ledger]) -> list[OwnerHost]:
    nodes = nodes_on(ledgers)
    return [OwnerHost([n for n in nodes if n.ledger is ledger]) for ledger in ledgers]


def committed(hosts: list[OwnerHost], session: str) -> tuple[PeerKey, ...]:
    return tuple(k for h in hosts for k in h.session_keys(session))


def reveal(hosts: list[OwnerHost], session: str, keys) -> tuple[PeerKey, ...]:
    """The coordinator's reveal round and the open request it builds (``secure_open``)."""
    request = secure_open(
        keys,
        SecureAggregation(S, T),
        lambda k: [x for h in hosts for x in h.reveal_shares(session, k)],
    )
    return request.peers


def refusal(hosts: list[OwnerHost], session: str, peers) -> str:
    """What the last host says to an open of ``session`` with ``peers`` (every host refuses; none
    records a session)."""
    messages = []
    for h in hosts:
        with pytest.raises(InvalidRequest) as info:
            h.open_session(session, "penalty", 10, secure=SecureOpen(tuple(peers), S, T))
        messages.append(str(info.value))
        assert all(n.ledger.session(n.name, session) is None for n in h.nodes)
    return messages[-1]


def colluder_key(name: str, session: str, seed: int) -> PeerKey:
    """A fresh key, commitment and matching share for owner ``name`` (a colluder grinding)."""
    return revealed_key(name, session_private_key(bytes([seed]) * 32, session), session)


@pytest.fixture
def hosts() -> list[OwnerHost]:
    return hosts_on([Ledger(":memory:"), Ledger(":memory:")])


def test_keys_leave_with_a_commitment_and_no_share_and_the_open_needs_the_reveal(hosts):
    assert graph_degree(COUNT, T)[0] < COUNT - 1
    keys = committed(hosts, "s")
    assert all(len(k.commitment) == 32 and k.share == b"" for k in keys)
    assert "has no 32-byte graph commitment and revealed share" in refusal(hosts, "s", keys)
    peers = reveal(hosts, "s", keys)
    for h in hosts:
        h.open_session("s", "penalty", 10, secure=SecureOpen(peers, S, T))


@pytest.mark.parametrize("share", [bytes(32), b""], ids=["other", "missing"])
def test_an_owner_refuses_a_share_that_does_not_match_its_commitment(hosts, share):
    """The coordinator (or the colluder o07) changes o07's share after the reveal, or withholds
    it: every owner refuses the open, naming o07, and records nothing."""
    peers = list(reveal(hosts, "s", committed(hosts, "s")))
    peers[7] = replace(peers[7], share=share)
    message = refusal(hosts, "s", peers)
    assert "'o07'" in message
    assert ("does not match its commitment" if share else "no 32-byte graph commitment") in message


def test_commitments_swapped_or_withheld_after_the_reveal_are_refused(tmp_path):
    """After the owners revealed for one list of commitments, a coordinator that swaps a
    colluder's key and commitment (with a matching share: the colluder ground them after seeing
    the shares) or leaves an owner out is refused at the open by the honest host (hosts[1]; the
    colluder o03 is hosted by hosts[0]), and no owner reveals again for
    the changed list — also once restarted on its ledger file."""
    files = [Ledger(tmp_path / f"h{h}.sqlite") for h in range(2)]
    hosts = hosts_on(files)
    peers = list(reveal(hosts, "s", committed(hosts, "s")))
    ground = list(peers)
    ground[3] = colluder_key("o03", "s", 9)
    assert "other graph commitments than this owner revealed" in refusal(hosts, "s", ground)
    withheld = peers[:3] + peers[4:]  # o03 left out: K − 1 = 65 owners, still a sparse graph
    assert "other graph commitments than this owner revealed" in refusal(hosts, "s", withheld)
    others = [replace(k, share=b"") for k in ground]  # o03 is hosted by hosts[0], not hosts[1]
    with pytest.raises(InvalidRequest, match="revealed its graph share for other commitments"):
        hosts[1].reveal_shares("s", others)
    for ledger in files:
        ledger.close()
    restarted = hosts_on([Ledger(tmp_path / f"h{h}.sqlite") for h in range(2)])
    with pytest.raises(InvalidRequest, match="revealed its graph share for other commitments"):
        restarted[1].reveal_shares("s", others)
    assert reveal(restarted, "s", committed(restarted, "s")) == tuple(peers)  # the same list


def test_an_owner_reveals_only_for_a_list_holding_its_own_key_and_commitment(hosts):
    keys = list(committed(hosts, "s"))
    keys[0] = replace(keys[0], commitment=bytes(32))
    with pytest.raises(InvalidRequest, match="lacks this owner's own session key and commitment"):
        hosts[0].reveal_shares("s", keys)
    keys[0] = replace(keys[0], commitment=b"")
    with pytest.raises(InvalidRequest, match="peer 'o00' sent no graph commitment"):
        hosts[1].reveal_shares("s", keys)


def test_the_graph_is_a_function_of_the_revealed_shares(hosts):
    """The same keys and terms with one owner's share (and commitment) changed give another ring
    order: the seed hashes the shares, so no owner picks the graph once an honest share is
    unknown to it."""
    peers = list(reveal(hosts, "s", committed(hosts, "s")))
    terms = SecureTerms(COUNT, T, S)
    graph = masking_graph("s", terms, peers)
    assert np.array_equal(masking_graph("s", terms, list(peers)).place, graph.place)
    private = hosts[0].nodes[5].session_private_key("s")
    share = bytes(31) + b"\x01"
    changed = replace(
        peers[5], share=share, commitment=graph_commitment("s", "o05", public_bytes(private), share)
    )
    other = masking_graph("s", terms, [*peers[:5], changed, *peers[6:]])
    assert not np.array_equal(other.place, graph.place)


@pytest.mark.parametrize("transport", ["inprocess", "grpc"])
def test_a_sparse_secure_session_opens_and_decodes_the_same_over_every_transport(transport):
    """66 owners (ring) as two hosts, through the transport's reveal round, decode the same sum as
    one in-process host of the same owners (seeded noise; masks cancel either way)."""
    local = InProcessOracle(nodes_on([Ledger(":memory:")]))
    nodes = nodes_on([Ledger(":memory:"), Ledger(":memory:")])
    servers: list[ServerThread] = []
    if transport == "inprocess":
        oracle = InProcessOracle(nodes)
    else:
        half = COUNT // 2
        servers = [ServerThread(OwnerHost(nodes[:half])), ServerThread(OwnerHost(nodes[half:]))]
        oracle = GrpcOracle([x.address for x in servers], model=MODEL, deadline=20, retry_seconds=2)
    try:
        theta = np.zeros((3, 1))
        sums = []
        for o in (local, oracle):
            o.open_session("penalty", 10, session="g", secure=SecureAggregation(S, T))
            sums.append(o.log_ratio(0, np.arange(3), theta, theta + 0.01))
        np.testing.assert_array_equal(sums[0].values, sums[1].values)
        assert sums[1].values.shape == (1, 3)
    finally:
        oracle.close()
        local.close()
        for x in servers:
            x.close()


# --------------------------------------------------------------------------- counting key requests


def test_key_requests_admit_a_bounded_number_of_new_sessions_per_client_and_window():
    """3 new sessions per client in a 100 s window (fake clock): a 4th is refused naming the
    key; asking again for an admitted session is free; another client has its own count; once
    the window has passed, new sessions are admitted again."""
    now = [0.0]
    requests = KeyRequests(3, window=100.0, clock=lambda: now[0])
    for k in range(3):
        requests.admit("a", f"s{k}")
    with pytest.raises(NotPermitted, match=r"server\.secure_sessions_per_day"):
        requests.admit("a", "s3")
    requests.admit("a", "s1")  # a retry, the reveal, a resume
    requests.admit("b", "s3")
    now[0] = 100.0
    requests.admit("a", "s3")


def keys_request(k: int) -> pb.SessionKeysRequest:
    return pb.SessionKeysRequest(session=f"s{k}")


def test_an_owner_server_refuses_a_flood_of_new_sessions_cheaply_and_writes_nothing(
    tmp_path, procs
):
    """A real ``owner serve`` with secure_sessions_per_day = 3 (in the style of
    test_owner_floods.py): a client asks SessionKeys for 3 sessions (answered), then for 200
    more (each refused, PERMISSION_DENIED naming the key, the ledger file unchanged to the byte)
    and RevealShares for another (refused too); the 3 admitted sessions still get their keys,
    the same as before."""
    data = tmp_path / "alice.csv"
    save_csv(data, MODEL.simulate_records(np.random.default_rng(0), np.array([0.2]), 50), MODEL)
    port = free_port()
    policy = {"sigma": 1.0, "total_noise_sd": S}
    toml = write_owner(tmp_path, "alice", data, port, policy, MODEL_TABLE,
                       secure_sessions_per_day=3)  # fmt: skip
    procs.owner(toml, port)
    ledger = tmp_path / "alice.sqlite"
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.OwnerStub(channel)
        keys = [
            stub.SessionKeys(pb.SessionKeysRequest(session=f"s{k}"), timeout=30) for k in range(3)
        ]
        before = ledger_bytes(ledger)
        for k in range(3, 203):
            with pytest.raises(grpc.RpcError) as refused:
                stub.SessionKeys(keys_request(k), timeout=30)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "server.secure_sessions_per_day" in refused.value.details()
        with pytest.raises(grpc.RpcError) as refused:
            stub.RevealShares(pb.RevealSharesRequest(session="other"), timeout=30)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert ledger_bytes(ledger) == before
        again = [
            stub.SessionKeys(pb.SessionKeysRequest(session=f"s{k}"), timeout=30) for k in range(3)
        ]
        assert again == keys
