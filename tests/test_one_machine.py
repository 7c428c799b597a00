"""A deployment on one machine (``fedpenalty init``) and the mistake a user makes when trying
the multi-host one there: dialling 127.0.0.1 at an owner whose certificate names only its DNS
name. The README's one-machine commands run verbatim in tests/test_readme.py."""

from __future__ import annotations

import asyncio
import stat
import time

import numpy as np
from certificates import TestCA
from cryptography import x509
from grpc_processes import FEDPENALTY, free_port, wait_for, write_owner

from fedpenalty import deployment
from fedpenalty.cli import main
from fedpenalty.config import load_scenario
from fedpenalty.coordinator.tls_names import mismatch_message, names
from fedpenalty.data import load_records, save_csv
from fedpenalty.models import build_model
from fedpenalty.owner.owner_config import TlsFiles, load_owner_config
from fedpenalty.owner.peer_auth import PeerAuth


def sans(path) -> set[str]:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(getattr(n, "value", n)) for n in names}


def test_init_writes_a_servable_deployment(tmp_path, capsys, monkeypatch):
    """What `fedpenalty init DIR` writes serves as it says: each OWNER.toml loads and names
    existing files, its certificate names localhost, 127.0.0.1 and its owner identity (its peer
    authentication loads), keys are 0600, ports are distinct, and the scenario's model is the
    owners' (records made smaller here; the README test runs the full size)."""
    monkeypatch.setattr(deployment, "RECORDS", 500)
    assert main(["init", str(tmp_path / "box"), "--port", "40000"]) == 0
    out = capsys.readouterr().out
    box = tmp_path / "box"
    scenario = load_scenario(box / "scenario.toml")
    listens = set()
    for name in deployment.OWNERS:
        config = load_owner_config(box / f"{name}.toml")
        config.check_servable()
        assert config.model == build_model(scenario["model"])
        assert config.policy.max_step == scenario["sampler"]["step"]
        assert len(load_records(config.data_path, config.model)) == 500
        assert sans(box / f"{name}.crt") == {
            "localhost",
            "127.0.0.1",
            f"urn:fedpenalty:owner:{name}",
        }
        assert config.peer_auth() is not None  # the certificate names it, issued by peer_ca
        assert config.allowed_clients == (deployment.COORDINATOR,)
        listens.add(config.listen)
        assert f"fedpenalty owner serve {name}.toml" in out
    assert listens == {"127.0.0.1:40000", "127.0.0.1:40001", "127.0.0.1:40002"}
    assert "--owners 127.0.0.1:40000,127.0.0.1:40001,127.0.0.1:40002" in out
    assert sans(box / "coordinator.crt") == {deployment.COORDINATOR}
    for key in box.glob("*.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    assert {p.name for p in box.glob("*.key")} == {
        "ca.key",
        "coordinator.key",
        *(f"{n}.key" for n in deployment.OWNERS),
    }
    PeerAuth.load(box / "hospital-a.crt", box / "hospital-a.key", box / "ca.crt", ["hospital-b"])


def test_init_refuses_a_non_empty_folder_unless_forced_and_keeps_ledgers(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(deployment, "RECORDS", 50)
    box = tmp_path / "box"
    box.mkdir()
    (box / "hospital-a-ledger.sqlite").write_bytes(b"spend")
    assert main(["init", str(box)]) == 2
    err = capsys.readouterr().err
    assert "is not empty" in err and "--force" in err
    assert [p.name for p in box.iterdir()] == ["hospital-a-ledger.sqlite"]  # nothing written
    assert main(["init", str(box), "--force"]) == 0
    assert "kept hospital-a-ledger.sqlite" in capsys.readouterr().out
    assert (box / "hospital-a-ledger.sqlite").read_bytes() == b"spend"
    assert (box / "scenario.toml").is_file()
    assert main(["init", str(tmp_path / "other"), "--port", "65535"]) == 2
    assert "--port 65535" in capsys.readouterr().err


def test_dialling_an_address_the_certificate_does_not_name_is_said_at_once(tmp_path, procs, capsys):
    """The README's multi-host set-up tried on one machine: the owner's certificate names
    a.example.org only, the coordinator dials 127.0.0.1. It stops at once with what the
    certificate names and what to change, not after retry_seconds (60 here) of retries as
    "unreachable" (before: 60 s, "unreachable after 64 attempts … Hostname Verification Check
    failed"). 15 s is a generous bound for one handshake and a certificate read on a busy
    machine, a quarter of the retry window."""
    ca = TestCA(tmp_path)
    cert, key = ca.leaf("a", "a.example.org", dns=("a.example.org",), ips=())
    client_cert, client_key = ca.leaf("coordinator", "coordinator", dns=("coordinator",))
    model = build_model({"name": "gaussian_mean"})
    save_csv(
        tmp_path / "a.csv", model.simulate_records(np.random.default_rng(0), [0.0], 100), model
    )
    port = free_port()
    server = {"tls_cert": str(cert), "tls_key": str(key), "tls_ca": str(ca.path)}
    owner = write_owner(
        tmp_path, "hospital-a", tmp_path / "a.csv", port, {"sigma": 1.0}, {"name": "gaussian_mean"},
        **server, allowed_clients=["coordinator"],
    )  # fmt: skip
    proc = procs.start([*FEDPENALTY, "owner", "serve", str(owner)], "owner.log")
    address = f"127.0.0.1:{port}"

    def serving() -> bool:
        assert proc.poll() is None, (tmp_path / "owner.log").read_text()
        return _serving(address, ca, client_cert, client_key, "a.example.org")

    wait_for(serving, "the owner serving")
    (tmp_path / "s.toml").write_text("[run]\nretry_seconds = 60.0\n")
    tls = ["--tls-cert", str(client_cert), "--tls-key", str(client_key), "--tls-ca", str(ca.path)]
    start = time.monotonic()
    code = main(["run", str(tmp_path / "s.toml"), "--owners", f"127.0.0.1:{port}", *tls,
                 "--out", str(tmp_path / "run"), "--no-progress"])  # fmt: skip
    took = time.monotonic() - start
    err = capsys.readouterr().err
    assert code == 2, err
    assert (
        f"owner host 127.0.0.1:{port}: its certificate is for a.example.org, not 127.0.0.1" in err
    )
    assert f"--owners a.example.org:{port}" in err and "unreachable" not in err
    assert took < 15, took
    assert not (tmp_path / "run").exists()


def test_the_mismatch_message_without_the_certificate_still_says_what_to_change(tmp_path):
    """When the names cannot be read (the owner went away meanwhile), the message still says
    the certificate does not name the address; a certificate without SANs is named by its
    common name."""
    ca = TestCA(tmp_path)
    cert, key = ca.leaf("coordinator", "coordinator")
    address = f"127.0.0.1:{free_port()}"  # nobody listens
    message = asyncio.run(mismatch_message(address, TlsFiles(cert, key, ca.path)))
    assert message.startswith(f"owner host {address}: its certificate does not name 127.0.0.1")
    assert "could not be read" in message and "a SAN DNS name or IP address" in message
    assert names(ca.cert) == ["fedpenalty test CA"]


def _serving(address: str, ca: TestCA, cert, key, name: str) -> bool:
    """The owner at ``address`` answers its health check, dialled as ``name``."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    creds = grpc.ssl_channel_credentials(ca.path.read_bytes(), key.read_bytes(), cert.read_bytes())
    options = [("grpc.ssl_target_name_override", name)]
    with grpc.secure_channel(address, creds, options=options) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=1
            )
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING
