"""An owner restarted inside the coordinator's retry window (issue 21, item 5): the coordinator
re-opens the session at the restarted owner itself, as ``--resume`` would, and the run
completes — each (chain, iteration) charged once, and the chain the one the owners' stored
answers give (docs/design.md §3 invariants 2, 12). Also between two queries and before the
close (quick), and for an owner of a secure session (its masks still cancel)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import numpy as np
import pytest
from certificates import TestCA
from grpc_processes import Processes
from test_grpc_deploy import (
    MODEL,
    addresses,
    assert_the_uninterrupted_chain,
    deploy,
    report,
    scenario,
    start_run,
)

from fedpenalty.common import Policy
from fedpenalty.coordinator.grpc_oracle import GrpcOracle
from fedpenalty.coordinator.oracle import SecureAggregation
from fedpenalty.owner import Ledger, OwnerHost, OwnerNode
from fedpenalty.owner.noise.sources import NoiseKey
from fedpenalty.owner.peer_auth import PeerAuth
from fedpenalty.owner.server import ServerThread

TOTAL = 2000  # bob is killed at the first checkpoint (100): mid-run; no statistics rest on it
POLICY = {"sigma": 1.0, "max_step": 0.02, "budget_epsilon": 1000.0}


def restart(owner: dict, procs: Processes) -> None:
    """SIGKILL the owner's process, then serve it again on the same port and ledger."""
    owner["proc"].send_signal(signal.SIGKILL)
    owner["proc"].wait(timeout=30)
    owner["proc"] = procs.owner(owner["toml"], owner["port"])


def test_a_restarted_owner_is_re_opened_by_the_next_query_and_by_the_close(tmp_path, procs):
    owners = deploy(tmp_path, procs, POLICY, n=200)
    oracle = GrpcOracle(addresses(owners).split(","), MODEL, retry_seconds=60)
    theta = np.zeros((2, 1))
    try:
        session = oracle.open_session("penalty", 100)
        first = oracle.log_ratio(0, np.arange(2), theta, theta + 0.01)
        restart(owners["bob"], procs)
        # the same key again (a retry): bob re-admits the session and replays his answer
        again = oracle.log_ratio(0, np.arange(2), theta, theta + 0.01)
        np.testing.assert_array_equal(again.values, first.values)
        oracle.log_ratio(1, np.arange(2), theta, theta - 0.01)
        restart(owners["bob"], procs)
        oracle.close()  # bob restarted again: re-opened, then closed
    finally:
        oracle.disconnect()
    for name in owners:
        ledger = Ledger(tmp_path / f"{name}.sqlite", read_only=True)
        try:
            recorded = ledger.session(name, session)
        finally:
            ledger.close()
        assert recorded is not None and recorded.closed
        assert recorded.spend.answers == 4  # 2 chains × 2 iterations, each charged once


@pytest.mark.slow
def test_an_owner_killed_and_restarted_mid_run_is_re_opened_and_the_run_completes(
    tmp_path, procs: Processes
):
    owners = deploy(tmp_path, procs, POLICY)
    config = Path(scenario(tmp_path, TOTAL))
    # a retry window the restart fits in (an owner process starts in a few seconds)
    config.write_text(config.read_text().replace("retry_seconds = 2.0", "retry_seconds = 60.0"))
    out = tmp_path / "run"
    coordinator = start_run(procs, owners, str(config), out)
    bob = owners["bob"]
    bob["proc"].send_signal(signal.SIGKILL)
    bob["proc"].wait(timeout=30)
    at_kill = report(bob, tmp_path)
    bob["proc"] = procs.owner(bob["toml"], bob["port"])  # same port, same ledger

    assert coordinator.wait(timeout=120) == 0, (tmp_path / "coordinator.log").read_text()
    log = (tmp_path / "coordinator.log").read_text()
    assert "(bob) no longer knew session" in log and "re-opened it" in log, log
    assert 0 < at_kill["answers"] < 2 * TOTAL  # bob was killed mid-run
    privacy = json.loads((out / "privacy.json").read_text())
    assert [o["owner"] for o in privacy["owners"]] == ["alice", "bob", "carol"]
    for o in privacy["owners"]:
        ledger = report(owners[o["owner"]], tmp_path)
        # each (chain, iteration) answered and charged exactly once, by the run and the ledger
        assert o["answers"] == ledger["answers"] == 2 * TOTAL
        assert ledger["epsilon"] == pytest.approx(o["epsilon"], rel=1e-12)
    assert not (out / "checkpoint.npz").exists()

    # The chain is the one an uninterrupted run computes from the owners' stored answers.
    assert_the_uninterrupted_chain(out, owners, TOTAL)


def secure_node(tmp_path, name: str) -> OwnerNode:
    """A lattice owner of a secure session on its own ledger file (what a restart re-reads)."""
    records = MODEL.simulate_records(np.random.default_rng(len(name)), np.array([0.2]), 100)
    policy = Policy(budget_epsilon=1e9, total_noise_sd=1.0, colluders=1)
    ledger = Ledger(tmp_path / f"{name}.sqlite", synchronous="NORMAL")
    return OwnerNode(name, MODEL, records, policy, ledger, noise_key=NoiseKey.derive(b"p", name))


def test_a_restarted_owner_of_a_secure_session_is_re_opened_with_the_same_peers(tmp_path):
    """The re-open carries the keys of the first open: the restarted owner derives its own key
    again from its ledger, its recorded peers and terms match, and its masks still cancel."""
    ca = TestCA(tmp_path)
    auths = {}
    for n in ("alice", "bob", "carol"):
        cert, key = ca.leaf(n, n, dns=(f"{n}.example.org",), owners=(n,))
        auths[n] = PeerAuth.load(cert, key, ca.path, ("alice", "bob", "carol"))
    hosts = {n: OwnerHost([secure_node(tmp_path, n)]) for n in auths}
    servers = {n: ServerThread(hosts[n], peers=auths[n]) for n in auths}
    oracle = GrpcOracle([s.address for s in servers.values()], MODEL, retry_seconds=30)
    theta = np.zeros((3, 1))
    try:
        oracle.open_session("penalty", 100, session="s", secure=SecureAggregation(1.0, 1))
        first = oracle.log_ratio(0, np.arange(3), theta, theta + 0.01)
        stopped = servers.pop("bob")  # bob's server stops; restarted on its ledger and port
        stopped.close()
        hosts["bob"].nodes[0].ledger.close()
        hosts["bob"] = OwnerHost([secure_node(tmp_path, "bob")])
        servers["bob"] = ServerThread(hosts["bob"], f"127.0.0.1:{stopped.port}", peers=auths["bob"])
        again = oracle.log_ratio(0, np.arange(3), theta, theta + 0.01)  # replayed masked words
        np.testing.assert_array_equal(again.values, first.values)
        later = oracle.log_ratio(1, np.arange(3), theta, theta - 0.01)  # fresh keys still decode
        assert later.values.shape == (1, 3) and np.isfinite(later.values).all()
        oracle.close()
    finally:
        oracle.disconnect()
        for server in servers.values():
            server.close()
    recorded = hosts["bob"].nodes[0].ledger.session("bob", "s")
    assert recorded is not None and recorded.closed and recorded.spend.answers == 6
