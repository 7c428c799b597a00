"""A real ``fedpenalty owner serve`` process against hostile and malformed requests, its
standard services (health, reflection), its session log, clean SIGTERM, and mutual TLS."""

from __future__ import annotations

import json
import re
import signal
import tomllib

import grpc
import numpy as np
import pytest
from certificates import issue, write
from cryptography.hazmat.primitives.asymmetric import ec
from grpc_processes import free_port, run_cli, write_owner
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from owners import save_csv

from fedpenalty.coordinator.grpc_oracle import GrpcOracle
from fedpenalty.errors import OwnerUnavailable
from fedpenalty.models import build_model
from fedpenalty.owner.owner_config import TlsFiles
from fedpenalty.proto import owner_pb2 as pb
from fedpenalty.proto import owner_pb2_grpc as pb_grpc

MODEL_TABLE = {"name": "gaussian_mean", "dim": 1, "data_bound": 4.0, "theta_bound": 4.0}
MODEL = build_model(MODEL_TABLE)
POLICY = {
    "sigma": 1.0,
    "max_step": 0.05,
    "budget_epsilon": 100.0,
    "max_sampling_rate": 0.5,
    "max_clip": 1.0,
}


def owner_files(tmp_path, **server) -> tuple:
    data = tmp_path / "alice.csv"
    save_csv(data, MODEL.simulate_records(np.random.default_rng(0), np.array([0.2]), 500), MODEL)
    port = free_port()
    return write_owner(tmp_path, "alice", data, port, POLICY, MODEL_TABLE, **server), port


@pytest.fixture
def served(tmp_path, procs):
    """One owner process with a 64 KiB message limit, no session open yet."""
    toml, port = owner_files(tmp_path, max_message_bytes=65536)
    proc = procs.owner(toml, port)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield pb_grpc.OwnerStub(channel), proc, toml


@pytest.fixture
def alice(served):
    """The owner process with an open session "s" with one answer."""
    stub, _, _ = served
    stub.OpenSession(
        pb.OpenSessionRequest(session="s", algorithm="penalty", planned_answers=20), timeout=10
    )
    stub.LogRatio(request(iteration=0), timeout=10)
    return served


def request(
    iteration=1, session="s", chains=(0, 1), theta=(0.0, 0.1), theta_prop=(0.01, 0.11)
) -> pb.LogRatioRequest:
    return pb.LogRatioRequest(
        session=session,
        iteration=iteration,
        chains=list(chains),
        theta=list(theta),
        theta_prop=list(theta_prop),
    )


def total_answers(stub) -> int:
    return stub.PrivacyReport(pb.PrivacyReportRequest(), timeout=10).owners[0].total.answers


HOSTILE = {
    "NaN θ": (request(theta=(float("nan"), 0.1)), grpc.StatusCode.INVALID_ARGUMENT, "NaN"),
    "wrong dimension": (
        request(theta=(0.0, 0.1, 0.2, 0.3), theta_prop=(0.0, 0.1, 0.2, 0.3)),
        grpc.StatusCode.INVALID_ARGUMENT,
        r"shape \(2, 1\)",
    ),
    "ragged θ": (request(theta=(0.0, 0.1, 0.2)), grpc.StatusCode.INVALID_ARGUMENT, "not 2 rows"),
    "step larger than the policy": (
        request(theta_prop=(0.5, 0.1)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "max_step",
    ),
    "θ outside Θ": (
        request(theta=(5.0, 0.1), theta_prop=(5.01, 0.11)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "outside",
    ),
    "negative iteration": (request(iteration=-3), grpc.StatusCode.INVALID_ARGUMENT, "iteration"),
    "no chains": (
        request(chains=(), theta=(), theta_prop=()),
        grpc.StatusCode.INVALID_ARGUMENT,
        "chains",
    ),
    "oversized message": (
        request(chains=range(5000), theta=[0.0] * 5000, theta_prop=[0.01] * 5000),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "larger than max",
    ),
    "unknown session": (
        request(session="nope"),
        grpc.StatusCode.NOT_FOUND,
        "unknown or closed session",
    ),
    "replayed iteration with a different θ": (
        request(iteration=0, theta_prop=(0.02, 0.11)),
        grpc.StatusCode.FAILED_PRECONDITION,
        "different query",
    ),
}


def test_hostile_requests_get_a_clear_status_and_leave_the_ledger_untouched(alice, tmp_path):
    stub, _, toml = alice
    for name, (bad, code, message) in HOSTILE.items():
        with pytest.raises(grpc.RpcError) as refused:
            stub.LogRatio(bad, timeout=10)
        assert refused.value.code() == code, name
        assert re.search(message, refused.value.details()), name
        assert total_answers(stub) == 2, name
    done = run_cli("owner", "report", str(toml), "--json", cwd=tmp_path)
    assert json.loads(done.stdout)["answers"] == 2  # read offline from the ledger file


def gradient(
    iteration=1, session="g", chains=(0, 1), theta=(0.0, 0.1), clip=0.5
) -> pb.GradientRequest:
    return pb.GradientRequest(
        session=session, iteration=iteration, chains=list(chains), theta=list(theta), clip=clip
    )


HOSTILE_GRADIENTS = {
    "NaN θ": (gradient(theta=(float("nan"), 0.1)), grpc.StatusCode.INVALID_ARGUMENT, "NaN"),
    "wrong dimension": (
        gradient(theta=(0.0, 0.1, 0.2, 0.3)),
        grpc.StatusCode.INVALID_ARGUMENT,
        r"shape \(2, 1\)",
    ),
    "ragged θ": (gradient(theta=(0.0, 0.1, 0.2)), grpc.StatusCode.INVALID_ARGUMENT, "not 2 rows"),
    "θ outside Θ": (gradient(theta=(5.0, 0.1)), grpc.StatusCode.INVALID_ARGUMENT, "outside"),
    "clip larger than the policy": (
        gradient(clip=1.5),
        grpc.StatusCode.INVALID_ARGUMENT,
        "max_clip 1",
    ),
    "no clip": (gradient(clip=0.0), grpc.StatusCode.INVALID_ARGUMENT, "clip must be a positive"),
    "infinite clip": (
        gradient(clip=float("inf")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "clip must be a positive",
    ),
    "oversized message": (
        gradient(chains=range(8000), theta=[0.0] * 8000),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "larger than max",
    ),
    "unknown session": (
        gradient(session="nope"),
        grpc.StatusCode.NOT_FOUND,
        "unknown or closed session",
    ),
    "replayed iteration with a different θ": (
        gradient(iteration=0, theta=(0.0, 0.2)),
        grpc.StatusCode.FAILED_PRECONDITION,
        "different query",
    ),
    "replayed iteration with a different clip": (
        gradient(iteration=0, clip=0.4),
        grpc.StatusCode.FAILED_PRECONDITION,
        "different query",
    ),
}


def test_hostile_gradient_requests_get_a_clear_status_and_leave_the_ledger_untouched(served):
    """Unary and in-stream. The ledger's counts only grow, so one look at the end shows that no
    refusal charged. (No log-ratio session is open: with one, opening a gradient session costs
    the owner seconds of PLD bisection for its Gaussian-answer limit.)"""
    stub, _, _ = served
    owner = stub.Describe(pb.DescribeRequest(), timeout=10).owners[0]
    assert (owner.policy.max_sampling_rate, owner.policy.max_clip) == (
        0.5,
        1.0,
    )  # read from OWNER.toml
    with pytest.raises(grpc.RpcError) as refused:
        stub.OpenSession(
            pb.OpenSessionRequest(
                session="g", algorithm="sgmcmc", planned_answers=20, sampling_rate=0.6
            ),
            timeout=10,
        )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_sampling_rate" in refused.value.details()
    stub.OpenSession(
        pb.OpenSessionRequest(
            session="g", algorithm="sgmcmc", planned_answers=20, sampling_rate=0.1
        ),
        timeout=10,
    )
    first = stub.Gradient(gradient(iteration=0), timeout=10)
    assert list(first.shape) == [1, 2, 1] and list(first.noise_sd) == [0.5]
    assert (
        stub.Gradient(gradient(iteration=0), timeout=10) == first
    )  # a retry: the stored answer, no charge
    for name, (bad, code, message) in HOSTILE_GRADIENTS.items():
        with pytest.raises(grpc.RpcError) as refused:
            stub.Gradient(bad, timeout=10)
        assert refused.value.code() == code, name
        assert re.search(message, refused.value.details()), name
    with pytest.raises(grpc.RpcError) as refused:
        stub.LogRatio(request(session="g"), timeout=10)
    assert (
        refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        and "not 'penalty'" in refused.value.details()
    )
    queries = [
        pb.QueryRequest(id=1, gradient=gradient(clip=2.0)),
        pb.QueryRequest(id=2, gradient=gradient(iteration=0)),
        pb.QueryRequest(id=3, gradient=gradient(iteration=0, clip=0.4)),
    ]
    replies = list(stub.Query(iter(queries), timeout=10))
    assert (
        replies[0].refusal.code == "INVALID_ARGUMENT" and "max_clip" in replies[0].refusal.message
    )
    assert replies[1].answers == first
    assert (replies[2].refusal.code, replies[2].refusal.error) == (
        "FAILED_PRECONDITION",
        "ReplayConflict",
    )
    stub.Gradient(
        gradient(), timeout=10
    )  # no refusal consumed the key (session, chain, iteration 1)
    report = stub.PrivacyReport(pb.PrivacyReportRequest(session="g"), timeout=10).owners[0]
    assert (report.total.answers, report.session.answers) == (4, 4)
    # a served owner's gradients are lattice answers: general subsampled-RDP bounds
    assert (report.session.accountant, report.total.accountant) == ("rdp", "rdp")


def test_stream_refusals_are_in_band_and_the_stream_stays_open(alice):
    stub, _, _ = alice
    queries = [
        pb.QueryRequest(id=1, log_ratio=request(theta=(float("inf"), 0.1))),
        pb.QueryRequest(id=2),
        pb.QueryRequest(id=3, log_ratio=request(iteration=5)),
    ]
    replies = list(stub.Query(iter(queries), timeout=10))
    assert [r.id for r in replies] == [1, 2, 3]
    assert replies[0].refusal.code == "INVALID_ARGUMENT" and replies[0].refusal.owner == "alice"
    assert replies[1].refusal.error == "InvalidRequest"
    assert list(replies[2].answers.shape) == [1, 2] and list(replies[2].answers.noise_sd) == [1.0]
    assert total_answers(stub) == 4


def test_health_reflection_session_log_and_clean_sigterm(alice, tmp_path):
    _, proc, toml = alice
    port = tomllib.loads(toml.read_text())["server"]["listen"].rsplit(":", 1)[1]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        reflection = reflection_pb2_grpc.ServerReflectionStub(ch)
        reply = next(
            reflection.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
            )
        )
        services = {s.name for s in reply.list_services_response.service}
        assert {"fedpenalty.v1.Owner", "grpc.health.v1.Health"} <= services
        description = pb_grpc.OwnerStub(ch).Describe(pb.DescribeRequest(), timeout=10).owners[0]
        assert (description.name, description.model, description.n) == (
            "alice",
            "gaussian_mean",
            500,
        )
        assert json.loads(description.model_params_json) == MODEL.params()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    log = (tmp_path / "alice.log").read_text()
    assert len([line for line in log.splitlines() if "session s:" in line]) == 1
    assert "stopping" in log


def test_mutual_tls_rejects_clients_without_a_certificate_from_the_ca(tmp_path, procs):
    keys = {
        k: ec.generate_private_key(ec.SECP256R1())
        for k in ("ca", "server", "client", "rogue_ca", "rogue")
    }
    ca = issue("fedpenalty test CA", keys["ca"], ca=True)
    rogue_ca = issue("someone else's CA", keys["rogue_ca"], ca=True)
    ca_path, _ = write(tmp_path, "ca", ca, keys["ca"])
    server_cert, server_key = write(
        tmp_path, "server", issue("alice", keys["server"], ca, keys["ca"]), keys["server"]
    )
    client_cert, client_key = write(
        tmp_path, "client", issue("coordinator", keys["client"], ca, keys["ca"]), keys["client"]
    )
    rogue_cert, rogue_key = write(
        tmp_path,
        "rogue",
        issue("intruder", keys["rogue"], rogue_ca, keys["rogue_ca"]),
        keys["rogue"],
    )
    toml, port = owner_files(
        tmp_path,
        tls_cert=str(server_cert),
        tls_key=str(server_key),
        tls_ca=str(ca_path),
        allowed_clients=["coordinator"],
    )
    good = grpc.ssl_channel_credentials(
        ca_path.read_bytes(), client_key.read_bytes(), client_cert.read_bytes()
    )
    procs.owner(toml, port, credentials=good)
    address = f"127.0.0.1:{port}"

    oracle = GrpcOracle(
        [address], MODEL, TlsFiles(client_cert, client_key, ca_path), retry_seconds=2
    )
    assert [d.name for d in oracle.describe()] == ["alice"]
    oracle.disconnect()
    anonymous = grpc.ssl_channel_credentials(
        ca_path.read_bytes()
    )  # verifies the server, presents nothing
    with grpc.secure_channel(address, anonymous) as channel:
        with pytest.raises(grpc.RpcError) as rejected:
            pb_grpc.OwnerStub(channel).Describe(pb.DescribeRequest(), timeout=10)
    assert rejected.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(OwnerUnavailable, match="unreachable"):
        GrpcOracle([address], MODEL, TlsFiles(rogue_cert, rogue_key, ca_path), retry_seconds=1)
    with grpc.insecure_channel(address) as channel:  # plaintext is not even TLS
        with pytest.raises(grpc.RpcError):
            pb_grpc.OwnerStub(channel).Describe(pb.DescribeRequest(), timeout=10)
