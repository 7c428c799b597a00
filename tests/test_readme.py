"""Every command and file the README shows runs as shown (docs/design.md §5). The README's code
blocks are parsed, so this fails when they drift:

* ```bash blocks: each `fedpenalty` command runs. Its plan is first opened, exactly as shown,
  at real owners (the owner's own budget check at session open, which needs no sampling); then
  the command runs with few iterations, few records and in-process owners (small settings,
  so the suite stays fast; Ray commands run with in-process owners, which give the same
  draws). Commands to fill in — `fedpenalty run` against owners at DNS names, a Ray cluster's
  HEAD address, any `<…>` or SCENARIO.toml placeholder — are parsed by the CLI here; real
  deployed and cluster runs are tests/test_grpc_deploy.py and the Ray tests. The install and
  test commands are the CI's. The block of "Try a deployment on one machine" runs as a whole,
  verbatim, in bash: real owners and a real coordinator on this machine (slow).
* ```toml blocks: the scenario file runs, and the OWNER.toml policy (with the certificates of
  the README's openssl commands) admits that scenario's plan.
* ```python blocks: run against the scenario file's run directory; the block of the Python API
  (``fedpenalty.sample``) runs with the same small settings as the commands.
* ```text blocks are synopses (placeholders in brackets) and are not run.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from owners import save_csv

from fedpenalty.cli import build_parser, main
from fedpenalty.config import load_scenario
from fedpenalty.coordinator.algorithms import ALGORITHMS
from fedpenalty.coordinator.base import ChainAlgorithm
from fedpenalty.coordinator.transport_base import OwnerSetup
from fedpenalty.coordinator.transports import TRANSPORTS
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger
from fedpenalty.owner.owner_config import build_node, load_owner_config
from fedpenalty.simulation import owner_policies

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
#: Small settings for running a command (after its own arguments, so these win); FEW_RECORDS
#: goes before them, so a command's own data.n_per_owner wins.
SMALL = [
    *("--set", "sampler.iterations=40", "--set", "sampler.warmup=10"),
    *("--set", "run.transport='inprocess'", "--set", "run.ray_address=''", "--no-progress"),
]
FEW_RECORDS = ["--set", "data.n_per_owner=2000"]
#: A placeholder the reader fills in: <…>, or a word in capitals (HEAD:6379, SCENARIO.toml).
PLACEHOLDER = re.compile(r"<[^>]*>|\b[A-Z]{3,}\b")


def blocks(language: str) -> list[str]:
    """The README's fenced code blocks in ``language`` (indented ones too), in order."""
    fence = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.MULTILINE | re.DOTALL)
    found = []
    for indent, lang, body in fence.findall(README):
        if lang == language:
            found.append("\n".join(line[len(indent) :] for line in body.splitlines()))
    return found


def commands(block: str) -> list[str]:
    """The shell commands of a block: continuation lines joined, comment lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    lines = [line.strip() for line in joined.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def one_machine_block() -> str:
    """The bash block of "Try a deployment on one machine" (run as a whole, verbatim)."""
    (block,) = [b for b in blocks("bash") if "fedpenalty init " in b]
    return block


def fedpenalty_commands() -> list[str]:
    """Every `fedpenalty ...` command of the bash blocks (also after `&&`), but those of the
    one-machine deployment, which run together (``test_the_one_machine_deployment_runs``)."""
    found = []
    for block in blocks("bash"):
        if block == one_machine_block():
            continue
        for command in commands(block):
            for part in command.split("&&"):
                part = part.strip()
                if part.startswith("fedpenalty "):
                    found.append(part)
    return found


def scenario_file(tmp_path: Path) -> Path:
    """The README's scenario file (its first ```toml block) as my-scenario.toml."""
    (text,) = [b for b in blocks("toml") if "[sampler]" in b]
    path = tmp_path / "my-scenario.toml"
    path.write_text(text)
    return path


def assert_owners_admit(scenario) -> None:
    """Open the scenario's session at real in-process owners with its exact plan: the owners'
    own budget check at session open (the run is not sampled)."""
    algorithm = ALGORITHMS[scenario["sampler"]["algorithm"]]
    assert isinstance(algorithm, ChainAlgorithm) and algorithm.query is not None
    model = build_model(scenario["model"])
    owners = scenario["data"]["owners"]
    rng = np.random.default_rng(0)
    records = [model.simulate_records(rng, np.zeros(model.dim), 10) for _ in range(owners)]
    seeds = np.random.SeedSequence(0).spawn(owners)
    names = [f"owner-{k}" for k in range(owners)]
    policies = owner_policies(scenario, owners)
    with tempfile.TemporaryDirectory() as folder:
        setup = OwnerSetup(Path(folder), model, names, records, policies, seeds, scenario["run"])
        launched = TRANSPORTS["inprocess"].launch(setup)
        try:
            sampler = scenario["sampler"]
            rate = (
                {"sampling_rate": sampler["sampling_rate"]}
                if "sampling_rate" in algorithm.settings
                else {}
            )
            launched.oracle.open_session(
                algorithm.query, algorithm.planned_answers(sampler), **rate
            )
            launched.oracle.close()
        finally:
            launched.stop()


def test_the_install_and_test_commands_are_the_ci_script():
    first = blocks("bash")[0]
    install, check = commands(first)
    assert install.endswith("pip install -e . && fedpenalty simulate")
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = check.split("&& pip install", 1)[1]
    assert f"pip install{test_command}" in ci


def runnable(command: str) -> bool:
    """A command that runs as shown here: no placeholder, no deployed owners to reach."""
    return not command.startswith("fedpenalty run ") and not PLACEHOLDER.search(command)


@pytest.mark.parametrize("command", [c for c in fedpenalty_commands() if runnable(c)])
def test_each_fedpenalty_command_runs(capsys, tmp_path, command):
    args = shlex.split(command)[1:]
    if args[0] != "simulate":
        assert main(args) == 0, capsys.readouterr().err
        return
    overrides = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    assert_owners_admit(load_scenario(None, overrides))
    code = main([args[0], *FEW_RECORDS, *args[1:], *SMALL, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 0, err
    assert (tmp_path / "run" / "posterior.nc").is_file()


def test_the_scenario_file_runs_and_the_python_blocks_read_it(capsys, tmp_path):
    """Each block that reads the run prints its summary and per-owner ε, or writes its plot."""
    path = scenario_file(tmp_path)
    assert_owners_admit(load_scenario(path))
    out = tmp_path / "runs" / "my-run"  # the file's run.out
    assert load_scenario(path)["run"]["out"] == "runs/my-run"
    code = main(["simulate", str(path), *FEW_RECORDS, *SMALL, "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    reading = [b for b in blocks("python") if "runs/my-run/" in b]
    assert len(reading) == 2 and any("savefig(" in b for b in reading)
    for block in reading:
        done = subprocess.run(
            [sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        for png in re.findall(r'savefig\("([^"]+)"\)', block):
            assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        if "print(" in block:
            assert "theta[mu]" in done.stdout and "owner-3" in done.stdout


def test_the_python_api_example_runs(capsys, monkeypatch, tmp_path):
    """The README's ``fedpenalty.sample`` block, as written, with the commands' small settings
    after its own overrides (so these win): it prints the summary and each owner's ε."""
    import fedpenalty

    (block,) = [b for b in blocks("python") if "fedpenalty.sample(" in b]
    real = fedpenalty.sample
    small = {"data.n_per_owner": 2000, "sampler.iterations": 40, "sampler.warmup": 10}
    small["run.transport"] = "inprocess"

    def sample_small(scenario=None, *, overrides=(), **options):
        assert isinstance(overrides, dict)  # the README passes a dict
        return real(scenario, overrides={**overrides, **small}, **{**options, "progress": False})

    monkeypatch.setattr(fedpenalty, "sample", sample_small)
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # 40 draws: the chains have not mixed
        exec(compile(block, "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "theta[mu]" in printed and "owner-3" in printed
    assert (tmp_path / "runs" / "notebook" / "posterior.nc").is_file()


@pytest.mark.skipif(
    shutil.which("openssl") is None, reason="the README's certificates need openssl"
)
def test_the_owner_file_admits_the_scenario_and_the_run_command_parses(tmp_path):
    (certificates,) = [b for b in blocks("bash") if "openssl req -x509" in b]
    done = subprocess.run(
        ["bash", "-e", "-c", certificates],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "a.example.org.crt: OK" in done.stdout
    (owner_text,) = [b for b in blocks("toml") if "[server]" in b]
    owner_file = tmp_path / "OWNER.toml"
    owner_file.write_text(owner_text)
    config = load_owner_config(owner_file)
    scenario = load_scenario(scenario_file(tmp_path))
    model = build_model(scenario["model"])
    assert config.model == model  # "must match the coordinator's scenario exactly"
    records = model.simulate_records(np.random.default_rng(0), np.zeros(1), 1000)
    save_csv(tmp_path / "records.csv", records, model)
    ledger = Ledger(config.ledger)
    try:
        node = build_node(config, ledger)  # a deployed owner: lattice answers, Rényi-DP budget
        algorithm = ALGORITHMS[scenario["sampler"]["algorithm"]]
        assert isinstance(algorithm, ChainAlgorithm) and algorithm.query is not None
        node.open_session("s", algorithm.query, algorithm.planned_answers(scenario["sampler"]))
    finally:
        ledger.close()
    (run,) = [c for c in fedpenalty_commands() if c.startswith("fedpenalty run ")]
    args = build_parser().parse_args(shlex.split(run)[1:])
    assert args.scenario == "my-scenario.toml" and len(args.owners.split(",")) == 3
    for flag in ("tls_cert", "tls_key", "tls_ca"):
        assert (tmp_path / getattr(args, flag)).is_file()  # the openssl commands made them


@pytest.mark.parametrize("command", [c for c in fedpenalty_commands() if not runnable(c)])
def test_commands_to_fill_in_parse(command):
    """Commands with placeholders (or deployed owners) are at least valid command lines."""
    filled = PLACEHOLDER.sub("x", command)
    build_parser().parse_args(shlex.split(filled)[1:])


@pytest.mark.skipif(
    shutil.which("openssl") is None, reason="the README's certificates need openssl"
)
def test_the_authenticated_secure_aggregation_set_up_runs(tmp_path, procs):
    """The README's deployment set-up, verbatim: its openssl commands make the CA and one
    certificate per owner naming its owner identity; its OWNER.toml (hospital-a, and hospital-b
    with the names swapped, both on loopback ports) serves under mutual TLS with peer_ca and
    allowed_peers; a coordinator with the README's certificate opens a secure session through
    both, the sum decodes and each owner says its ε rests on authenticated peers. A key the
    coordinator invents is refused."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_processes import FEDPENALTY, free_port, wait_for

    from fedpenalty.common import PEERS_AUTHENTICATED
    from fedpenalty.coordinator.oracle import SecureAggregation
    from fedpenalty.coordinator.secure_sum import combine, secure_open
    from fedpenalty.owner import wire
    from fedpenalty.owner.aggregation import PeerKey, public_bytes, session_private_key
    from fedpenalty.proto import owner_pb2 as pb
    from fedpenalty.proto import owner_pb2_grpc as pb_grpc

    (certificates,) = [b for b in blocks("bash") if "openssl req -x509" in b]
    done = subprocess.run(["bash", "-e", "-c", certificates], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (owner_text,) = [b for b in blocks("toml") if "[server]" in b]
    assert 'allowed_peers = ["hospital-b"]' in owner_text and 'peer_ca = "ca.crt"' in owner_text
    (tmp_path / "OWNER.toml").write_text(owner_text)
    model = load_owner_config(tmp_path / "OWNER.toml").model
    records = model.simulate_records(np.random.default_rng(0), np.zeros(1), 500)
    save_csv(tmp_path / "records.csv", records, model)
    swap = {"hospital-a": "hospital-b", "hospital-b": "hospital-a",
            "a.example.org": "b.example.org"}  # fmt: skip
    swapped = re.sub("|".join(map(re.escape, swap)), lambda m: swap[m.group(0)], owner_text)
    ca = (tmp_path / "ca.crt").read_bytes()
    client = [(tmp_path / f"coordinator.example.org.{x}").read_bytes() for x in ("key", "crt")]
    creds = grpc.ssl_channel_credentials(ca, *client)
    stubs, channels = [], []
    for owner, text in (("a", owner_text), ("b", swapped)):
        port = free_port()
        (tmp_path / f"{owner}.toml").write_text(text.replace("0.0.0.0:50051", f"127.0.0.1:{port}"))
        proc = procs.start(
            [*FEDPENALTY, "owner", "serve", str(tmp_path / f"{owner}.toml")], f"{owner}.log"
        )
        channel = grpc.secure_channel(f"127.0.0.1:{port}", creds, options=[
            ("grpc.ssl_target_name_override", f"{owner}.example.org")])  # fmt: skip
        channels.append(channel)
        health = health_pb2_grpc.HealthStub(channel)

        def serving(health=health, proc=proc, owner=owner) -> bool:
            assert proc.poll() is None, (tmp_path / f"{owner}.log").read_text()
            try:
                return health.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1
            except grpc.RpcError:
                return False

        wait_for(serving, f"owner {owner} serving")
        stubs.append(pb_grpc.OwnerStub(channel))

    def keys(session: str) -> list[PeerKey]:
        request = pb.SessionKeysRequest(session=session)
        return [wire.peer_key(k) for st in stubs for k in st.SessionKeys(request, timeout=30).keys]

    def opening(session: str, peers: list[PeerKey]) -> pb.OpenSessionRequest:
        request = pb.OpenSessionRequest(session=session, algorithm="penalty", planned_answers=10)
        request.secure.CopyFrom(wire.secure_message(secure_open(peers, SecureAggregation(1, 0))))
        return request

    try:
        request = opening("s", keys("s"))
        for stub in stubs:
            stub.OpenSession(request, timeout=30)
        ask = pb.LogRatioRequest(session="s", iteration=0, chains=[0], theta=[0.1],
                                 theta_prop=[0.101])  # fmt: skip
        answers = combine([wire.answers_reply(stub.LogRatio(ask, timeout=30)) for stub in stubs])
        assert answers.values.shape == (1, 1) and np.isfinite(answers.values).all()
        for stub in stubs:
            (report,) = stub.PrivacyReport(pb.PrivacyReportRequest(session="s"), timeout=30).owners
            own = wire.privacy_report(report).own_noise
            assert own is not None and own.peers == PEERS_AUTHENTICATED
        invented = PeerKey("hospital-c", public_bytes(session_private_key(bytes(32), "t")))
        with pytest.raises(grpc.RpcError) as info:
            stubs[0].OpenSession(opening("t", [*keys("t"), invented]), timeout=30)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "hospital-c" in info.value.details()
    finally:
        for channel in channels:
            channel.close()


@pytest.mark.slow
def test_the_one_machine_deployment_runs_verbatim(tmp_path):
    """The README's one-machine block, verbatim, in bash: `fedpenalty init` writes the
    deployment, three owners serve in the background under mutual TLS on the ports init gave
    them, the coordinator's run ends with every owner's privacy from its ledger and chains that
    mixed (no warning line), `owner report` reads a ledger, and the owners stop. The owners'
    noise comes from OS entropy, so the mixing is random: 8 seeds of the same scenario in
    process gave bulk ESS 1,190–1,740 (the warning needs < 400) and R-hat ≤ 1.003 (the warning
    needs > 1.01)."""
    import os
    import signal

    from grpc_processes import wait_for

    block = one_machine_block()
    ports = [int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)", block)]
    assert len(set(ports)) == 3
    for port in ports:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                pytest.fail(f"port {port}, which the README's owners serve on, is in use")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    assert shutil.which("fedpenalty", path=env["PATH"]), "the fedpenalty command is not installed"
    proc = subprocess.Popen(["bash", "-e", "-c", block], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=600)
        with contextlib.suppress(TimeoutError):
            wait_for(lambda: _group_gone(proc.pid), "the owners stopping by `kill`", 30)
    finally:
        with contextlib.suppress(ProcessLookupError):  # owners left behind by a failure
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, f"{out}\n{err}"
    box = tmp_path / "onebox"
    for name in ("hospital-a", "hospital-b", "hospital-c"):
        assert re.search(rf"^{name}\b.*\b23,?200\b", out, re.MULTILINE), out  # its answers
        assert "stopping (signal received)" in (box / f"{name}.log").read_text()
    assert "have not mixed" not in err and "warning:" not in err, err
    assert re.search(r"^owner 'hospital-a'.*\b23,?200 answers", out, re.MULTILINE), out
    assert (box / "runs" / "first" / "posterior.nc").is_file()


def _group_gone(group: int) -> bool:
    """No process of process group ``group`` is left."""
    import os

    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return True
    return False
