"""What an operator reads when an owner is stopped mid-run, its port is taken, or a client
speaks plaintext to a TLS owner: one clear line each, never a traceback."""

from __future__ import annotations

import signal
import socket

import numpy as np
import pytest
from certificates import TestCA
from grpc_processes import Processes, free_port, write_owner
from owners import save_csv

from fedpenalty.common import Policy
from fedpenalty.coordinator.grpc_oracle import GrpcOracle
from fedpenalty.errors import ConfigError, OwnerUnavailable
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerHost, OwnerNode
from fedpenalty.owner.owner_config import TlsFiles
from fedpenalty.owner.server import ServerThread

MODEL_TABLE = {"name": "gaussian_mean", "dim": 1, "data_bound": 4.0, "theta_bound": 4.0}
MODEL = build_model(MODEL_TABLE)
RECORDS = MODEL.simulate_records(np.random.default_rng(0), np.array([0.1]), 50)


def host() -> OwnerHost:
    return OwnerHost([OwnerNode("o", MODEL, RECORDS, Policy(), Ledger(":memory:"))])


def test_a_taken_port_says_port_in_use_and_how_to_choose_another():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=r"^port in use: 127\.0\.0\.1:\d+ is taken") as e:
            ServerThread(host(), f"127.0.0.1:{port}")
    assert "--listen" in str(e.value)


def test_a_plaintext_client_of_a_tls_owner_is_told_about_tls(tmp_path):
    ca = TestCA(tmp_path)
    cert, key = ca.leaf("owner", "localhost", dns=("localhost",))
    tls = TlsFiles(cert, key, ca.path)
    server = ServerThread(host(), "127.0.0.1:0", tls, allowed_clients=["coordinator"])
    try:
        with pytest.raises(OwnerUnavailable, match="--tls-cert, --tls-key and --tls-ca"):
            GrpcOracle([server.address], MODEL, retry_seconds=0.5)
    finally:
        server.close()


def test_an_owner_stopped_mid_run_is_unreachable_and_logs_no_traceback(tmp_path):
    """SIGTERM to a real ``owner serve`` with a query stream open: the coordinator's next query
    fails as OwnerUnavailable (not a refusal: gRPC's INTERNAL from the stopping server is a
    transport failure), and the owner's log has no traceback (it had a CancelledError one)."""
    data = tmp_path / "a.csv"
    save_csv(data, RECORDS, MODEL)
    port = free_port()
    privacy = {"sigma": 1.0, "max_step": 0.05, "budget_epsilon": 1e6}
    toml = write_owner(tmp_path, "alice", data, port, privacy, MODEL_TABLE)
    processes = Processes(tmp_path)
    try:
        proc = processes.owner(toml, port)
        oracle = GrpcOracle([f"127.0.0.1:{port}"], MODEL, retry_seconds=1)
        oracle.open_session("penalty", 100)
        theta = np.zeros((2, 1))
        oracle.log_ratio(0, np.arange(2), theta, theta + 0.01)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        with pytest.raises(OwnerUnavailable, match="unreachable"):
            oracle.log_ratio(1, np.arange(2), theta, theta + 0.01)
        oracle.disconnect()
    finally:
        processes.stop_all()
    log = (tmp_path / "alice.log").read_text()
    assert "stopping (signal received)" in log and "Traceback" not in log, log
