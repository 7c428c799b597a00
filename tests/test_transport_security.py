"""Who may ask an owner (issue 9): no unauthenticated server on a non-loopback address, an
allow-list of client certificate names under mutual TLS, and sessions bound to the client that
opened them. Real ``fedpenalty owner serve`` processes on 127.0.0.1; 0.0.0.0 is bound only by
servers that must refuse to start."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import pytest
from certificates import TestCA
from grpc_processes import FEDPENALTY, free_port, run_cli, wait_serving, write_owner
from owners import save_csv

from fedpenalty.coordinator.grpc_oracle import GrpcOracle
from fedpenalty.errors import ConfigError, NotPermitted
from fedpenalty.models import build_model
from fedpenalty.owner import wire
from fedpenalty.owner.owner_config import TlsFiles, load_owner_config
from fedpenalty.owner.server import check_exposure, is_loopback, server_credentials
from fedpenalty.proto import owner_pb2 as pb
from fedpenalty.proto import owner_pb2_grpc as pb_grpc

MODEL_TABLE = {"name": "gaussian_mean", "dim": 1, "data_bound": 4.0, "theta_bound": 4.0}
MODEL = build_model(MODEL_TABLE)
POLICY = {"sigma": 1.0, "max_step": 0.05, "budget_epsilon": 100.0, "max_sampling_rate": 0.5}
CLIENTS = ("coordinator-a", "coordinator-b", "intruder")  # all with certificates from the CA
ALLOWED = ["coordinator-a.example.org", "COORDINATOR-B.example.org"]  # names match any case
OWNER_RPCS = set(pb.DESCRIPTOR.services_by_name["Owner"].methods_by_name)
README = Path(__file__).parents[1] / "README.md"


def owner_toml(tmp_path: Path, **server) -> tuple[Path, int]:
    data = tmp_path / "alice.csv"
    save_csv(data, MODEL.simulate_records(np.random.default_rng(0), np.array([0.2]), 200), MODEL)
    port = free_port()
    return write_owner(tmp_path, "alice", data, port, POLICY, MODEL_TABLE, **server), port


def log_ratio(iteration: int, session: str = "s") -> pb.LogRatioRequest:
    return pb.LogRatioRequest(
        session=session, iteration=iteration, chains=[0], theta=[0.0], theta_prop=[0.01]
    )


def total_answers(stub) -> int:
    return stub.PrivacyReport(pb.PrivacyReportRequest(), timeout=10).owners[0].total.answers


@pytest.fixture
def mtls(tmp_path, procs):
    """An owner under mutual TLS allowing the two coordinators; coordinator-a has opened
    session "s" and has one answer. Yields each client's stub and its TLS files."""
    ca = TestCA(tmp_path)
    server_cert, server_key = ca.leaf("alice", "alice")
    files = {
        who: TlsFiles(*ca.leaf(who, who, dns=(f"{who}.example.org",)), ca.path) for who in CLIENTS
    }
    toml, port = owner_toml(
        tmp_path,
        tls_cert=str(server_cert),
        tls_key=str(server_key),
        tls_ca=str(ca.path),
        allowed_clients=ALLOWED,
    )
    creds = {
        who: grpc.ssl_channel_credentials(*(p.read_bytes() for p in (ca.path, f.key, f.cert)))
        for who, f in files.items()
    }
    procs.owner(toml, port, credentials=creds["coordinator-a"])
    channels = {who: grpc.secure_channel(f"127.0.0.1:{port}", c) for who, c in creds.items()}
    stubs = {who: pb_grpc.OwnerStub(channel) for who, channel in channels.items()}
    stubs["coordinator-a"].OpenSession(
        pb.OpenSessionRequest(session="s", algorithm="penalty", planned_answers=20), timeout=10
    )
    stubs["coordinator-a"].LogRatio(log_ratio(0), timeout=10)
    yield stubs, files, f"127.0.0.1:{port}"
    for channel in channels.values():
        channel.close()


def every_owner_rpc(stub) -> dict[str, Callable]:
    """One call of each Owner RPC, on coordinator-a's session "s" where it names a session."""
    query = pb.QueryRequest(id=1, log_ratio=log_ratio(1))
    return {
        "Describe": lambda: stub.Describe(pb.DescribeRequest(), timeout=10),
        "OpenSession": lambda: stub.OpenSession(
            pb.OpenSessionRequest(session="t", algorithm="penalty", planned_answers=5), timeout=10
        ),
        "CloseSession": lambda: stub.CloseSession(pb.CloseSessionRequest(session="s"), timeout=10),
        "LogRatio": lambda: stub.LogRatio(log_ratio(1), timeout=10),
        "SuffStats": lambda: stub.SuffStats(
            pb.SuffStatsRequest(session="s", chains=[0], start=0, block=1), timeout=10
        ),
        "Gradient": lambda: stub.Gradient(
            pb.GradientRequest(session="s", iteration=1, chains=[0], theta=[0.0], clip=0.5),
            timeout=10,
        ),
        "PrivacyReport": lambda: stub.PrivacyReport(pb.PrivacyReportRequest(), timeout=10),
        "SessionKeys": lambda: stub.SessionKeys(pb.SessionKeysRequest(session="s"), timeout=10),
        "RevealShares": lambda: stub.RevealShares(pb.RevealSharesRequest(session="s"), timeout=10),
        "Query": lambda: list(stub.Query(iter([query]), timeout=10)),
        "Ask": lambda: stub.Ask(
            wire.kind_query("log_ratio", "s", 1, [0], {"theta": [[0.0]], "theta_prop": [[0.01]]}),
            timeout=10,
        ),
    }


def test_plaintext_or_server_only_tls_on_a_non_loopback_address_is_refused(tmp_path):
    ca = TestCA(tmp_path)
    cert, key = ca.leaf("alice", "alice")
    for server, what in (({}, "plaintext"), ({"tls_cert": str(cert), "tls_key": str(key)}, "TLS")):
        toml, _ = owner_toml(tmp_path, listen=f"0.0.0.0:{free_port()}", **server)
        refused = run_cli("owner", "serve", str(toml), cwd=tmp_path)
        assert refused.returncode == 2, what
        assert refused.stderr.startswith(f"fedpenalty: error: refusing to serve {what}"), what
        assert "server.tls_cert, tls_key, tls_ca and allowed_clients" in refused.stderr, what
        assert "--insecure" in refused.stderr and len(refused.stderr.splitlines()) == 1, what
        assert not (tmp_path / "alice.sqlite").exists(), what  # refused before the ledger


def test_insecure_is_explicit_and_loopback_plaintext_stays_allowed(tmp_path, procs):
    check_exposure("0.0.0.0:50051", None, (), insecure=True)  # only with --insecure
    loopback = ("127.0.0.1", "127.3.2.1", "[::1]", "localhost")
    assert all(is_loopback(f"{host}:1") for host in loopback)
    assert not any(is_loopback(f"{h}:1") for h in ("0.0.0.0", "[::]", "", "10.1.2.3", "a.org"))
    toml, port = owner_toml(tmp_path)
    proc = procs.start([*FEDPENALTY, "owner", "serve", str(toml), "--insecure"], "alice.log")
    wait_serving(f"127.0.0.1:{port}", proc, None, tmp_path / "alice.log")
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        assert pb_grpc.OwnerStub(channel).Describe(pb.DescribeRequest(), timeout=10).owners


def test_mutual_tls_needs_an_allow_list_and_an_allow_list_needs_mutual_tls(tmp_path):
    ca = TestCA(tmp_path)
    cert, key = ca.leaf("alice", "alice")
    with pytest.raises(ConfigError, match=r"^mutual TLS needs server\.allowed_clients"):
        check_exposure("127.0.0.1:0", TlsFiles(cert, key, ca.path), ())
    with pytest.raises(ConfigError, match=r"^server\.allowed_clients needs mutual TLS"):
        check_exposure("127.0.0.1:0", TlsFiles(cert, key), ["coordinator.example.org"])
    toml, _ = owner_toml(tmp_path, allowed_clients="coordinator.example.org")
    with pytest.raises(ConfigError, match=r"server\.allowed_clients must be a list of client"):
        load_owner_config(toml)


def test_a_ca_signed_client_not_on_the_allow_list_is_refused_before_any_work(mtls):
    stubs, _, _ = mtls
    owner = stubs["coordinator-a"]
    calls = every_owner_rpc(stubs["intruder"])
    assert set(calls) == OWNER_RPCS  # a new RPC must be added here (and guarded)
    for name, call in calls.items():
        with pytest.raises(grpc.RpcError) as refused:
            call()
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, name
        assert "(intruder.example.org, intruder) are not in this owner's" in str(
            refused.value.details()
        ), name
    assert total_answers(owner) == 1  # nothing charged, and "s" was neither used nor closed
    owner.LogRatio(log_ratio(1), timeout=10)
    assert total_answers(owner) == 2


def test_a_second_allowed_client_cannot_use_or_close_the_first_clients_session(mtls):
    stubs, files, address = mtls
    first, second = stubs["coordinator-a"], stubs["coordinator-b"]
    calls = every_owner_rpc(second)
    for name in ("CloseSession", "LogRatio", "SuffStats", "Gradient", "SessionKeys", "Ask",
                 "RevealShares"):  # fmt: skip
        with pytest.raises(grpc.RpcError) as refused:
            calls[name]()
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, name
        assert "session 's' was opened by another client" in str(refused.value.details()), name
    with pytest.raises(grpc.RpcError) as refused:
        second.PrivacyReport(pb.PrivacyReportRequest(session="s"), timeout=10)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    [reply] = calls["Query"]()
    assert reply.refusal.code == "PERMISSION_DENIED"  # in-band, the stream stays usable
    oracle = GrpcOracle([address], MODEL, files["coordinator-b"], retry_seconds=1)
    with pytest.raises(NotPermitted, match="session 's' was opened by another client"):
        oracle.open_session("penalty", 20, session="s")  # re-opening does not take it over
    assert total_answers(first) == 1
    first.LogRatio(log_ratio(1), timeout=10)
    first.CloseSession(pb.CloseSessionRequest(session="s"), timeout=10)
    with pytest.raises(NotPermitted, match="opened by another client"):
        oracle.open_session("penalty", 20, session="s")  # still the first client's once closed
    oracle.open_session("penalty", 20, session="u")  # an allowed client, in its own session
    answers = oracle.log_ratio(0, np.array([0]), np.zeros((1, 1)), np.full((1, 1), 0.01))
    assert answers.values.shape == (1, 1)
    oracle.close()
    assert total_answers(first) == 3


@pytest.mark.slow
def test_after_a_restart_another_client_cannot_read_the_sessions_report(mtls, tmp_path, procs):
    """Until the opener re-opened its session after a restart, another allowed client could
    read that session's PrivacyReport (the binding was in the server's memory only): the
    server now takes the session's opener from its ledger."""
    stubs, files, address = mtls
    server = procs.running[-1]
    server.terminate()
    server.wait(timeout=60)
    a = files["coordinator-a"]
    creds = grpc.ssl_channel_credentials(*(p.read_bytes() for p in (a.ca, a.key, a.cert)))
    procs.owner(tmp_path / "alice.toml", int(address.rsplit(":", 1)[1]), credentials=creds)
    second = stubs["coordinator-b"]
    calls = every_owner_rpc(second)
    calls["PrivacyReport"] = lambda: second.PrivacyReport(
        pb.PrivacyReportRequest(session="s"), timeout=10
    )
    for name in ("PrivacyReport", "LogRatio", "CloseSession"):
        with pytest.raises(grpc.RpcError) as refused:
            calls[name]()
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, name
        assert "session 's' was opened by another client" in str(refused.value.details())
    report = stubs["coordinator-a"].PrivacyReport(pb.PrivacyReportRequest(session="s"), timeout=10)
    assert report.owners[0].session.answers == 1


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_the_readme_certificates_and_owner_file_work_as_shown(tmp_path):
    """README's deployment section: its openssl commands and its OWNER.toml, verbatim."""
    section = README.read_text().split("## Deploying owners on separate machines")[1]
    commands = re.findall(r"```bash\n(.*?)```", section, re.S)[0]
    subprocess.run(["bash", "-ec", commands], cwd=tmp_path, check=True, capture_output=True)
    (tmp_path / "OWNER.toml").write_text(re.findall(r"```toml\n(.*?)```", section, re.S)[0])
    config = load_owner_config(tmp_path / "OWNER.toml")
    assert config.tls is not None and config.allowed_clients == ("coordinator.example.org",)
    check_exposure(config.listen, config.tls, config.allowed_clients)  # 0.0.0.0 under mTLS
    server_credentials(config.tls)  # the certificate, key and CA files are where it says


def test_a_session_stays_bound_to_its_client_after_the_owner_restarts(tmp_path):
    """The binding lives in the ledger (``sessions.client``), not only in the server's memory:
    after a restart another client still cannot re-open (take over) the session."""
    from fedpenalty.common import Policy
    from fedpenalty.owner import Ledger, OwnerHost, OwnerNode

    records = MODEL.simulate_records(np.random.default_rng(0), np.array([0.1]), 50)

    def host() -> OwnerHost:
        node = OwnerNode("o", MODEL, records, Policy(**POLICY), Ledger(tmp_path / "l.sqlite"))
        return OwnerHost([node])

    first = host()
    first.open_session("s", "penalty", 10, client="coordinator-a")
    first.nodes[0].ledger.close()
    restarted = host()
    with pytest.raises(NotPermitted, match="session 's' was opened by another client"):
        restarted.open_session("s", "penalty", 10, client="coordinator-b")
    restarted.open_session("s", "penalty", 10, client="coordinator-a")
    restarted.open_session("t", "penalty", 10, client="coordinator-b")
    restarted.nodes[0].ledger.close()
