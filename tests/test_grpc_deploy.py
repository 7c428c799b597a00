"""Deployment with real processes on 127.0.0.1: three owners served from CSV files by
``fedpenalty owner serve``, a coordinator ``fedpenalty run`` against them; an owner killed with
SIGKILL mid-run and resumed; an owner whose budget runs out mid-run."""

from __future__ import annotations

import json
import math
import re
import signal

import grpc
import numpy as np
import pytest
from grpc_processes import FEDPENALTY, Processes, free_port, run_cli, wait_for, write_owner
from owners import kernel, save_csv

from fedpenalty.config import load_scenario
from fedpenalty.coordinator.driver import sample
from fedpenalty.coordinator.grpc_oracle import GrpcOracle
from fedpenalty.coordinator.oracle import Answers
from fedpenalty.errors import BudgetExhausted, InvalidRequest
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger
from fedpenalty.owner.noise.lattice import LATTICE_BITS
from fedpenalty.privacy import GaussianSpend
from fedpenalty.privacy.accountant import OwnerAccountant
from fedpenalty.proto import owner_pb2 as pb
from fedpenalty.proto import owner_pb2_grpc as pb_grpc
from fedpenalty.simulation import chain_start

MODEL_TABLE = {"name": "gaussian_mean", "dim": 1, "data_bound": 4.0, "theta_bound": 4.0}
MODEL = build_model(MODEL_TABLE)
NAMES = ("alice", "bob", "carol")


def deploy(tmp_path, procs: Processes, privacy: dict, n: int = 2000) -> dict[str, dict]:
    """Three owners from CSV files, each its own process: name → {toml, port, proc, data}."""
    owners = {}
    rng = np.random.default_rng(0)
    for name in NAMES:
        data = tmp_path / f"{name}.csv"
        save_csv(data, MODEL.simulate_records(rng, np.array([0.7]), n), MODEL)
        port = free_port()
        toml = write_owner(tmp_path, name, data, port, privacy, MODEL_TABLE)
        owners[name] = {"toml": toml, "port": port, "data": data, "proc": procs.owner(toml, port)}
    return owners


def scenario(
    tmp_path, iterations: int, warmup: int = 0, step: float = 0.01, checkpoint_every: int = 100
) -> str:
    path = tmp_path / "scenario.toml"
    path.write_text(f"""
[model]
name = "gaussian_mean"
dim = 1
data_bound = 4.0
theta_bound = 4.0

[sampler]
algorithm = "penalty"
chains = 2
iterations = {iterations}
warmup = {warmup}
step = {step}
init_scale = 0.1

[run]
seed = 3
checkpoint_every = {checkpoint_every}
retry_seconds = 2.0
""")
    return str(path)


def addresses(owners: dict) -> str:
    return ",".join(f"127.0.0.1:{o['port']}" for o in owners.values())


def start_run(procs: Processes, owners: dict, config: str, out):
    """``fedpenalty run`` of ``config`` against ``owners`` into ``out``, returned (the process)
    once its first checkpoint is written."""
    coordinator = procs.start(
        [
            *FEDPENALTY,
            "run",
            config,
            "--owners",
            addresses(owners),
            "--out",
            str(out),
            "--no-progress",
        ],
        "coordinator.log",
    )
    wait_for(lambda: (out / "checkpoint.npz").exists(), "the first checkpoint")
    return coordinator


def run_and_kill_bob(tmp_path, procs: Processes, owners: dict, config: str, out) -> str:
    """``start_run``; then bob's host is SIGKILLed, and the coordinator must stop resumably
    (exit 3: bob unreachable after retry_seconds). Its log."""
    coordinator = start_run(procs, owners, config, out)
    bob = owners["bob"]
    bob["proc"].send_signal(signal.SIGKILL)
    bob["proc"].wait(timeout=30)
    assert coordinator.wait(timeout=60) == 3
    return (tmp_path / "coordinator.log").read_text()


def report(owner: dict, tmp_path) -> dict:
    done = run_cli("owner", "report", str(owner["toml"]), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow
def test_three_owners_from_csv_and_a_coordinator_run(tmp_path, procs):
    owners = deploy(tmp_path, procs, {"sigma": 1.0, "max_step": 0.02, "budget_epsilon": 500.0})
    out = tmp_path / "run"
    done = run_cli(
        "run",
        scenario(tmp_path, iterations=300, warmup=300, step=0.02),
        "--owners",
        addresses(owners),
        "--out",
        str(out),
        "--no-progress",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "alice" in done.stdout and "eps@1e-05" in done.stdout
    privacy = json.loads((out / "privacy.json").read_text())
    assert [o["owner"] for o in privacy["owners"]] == list(NAMES)
    for o in privacy["owners"]:
        assert (
            o["answers"] == 2 * 600
        )  # every proposal stays inside Θ: one answer per chain and iteration
        assert o["ledger_epsilon"] == pytest.approx(
            o["epsilon"]
        )  # a fresh ledger: this session is all it spent
        offline = report(owners[o["owner"]], tmp_path)
        assert offline["answers"] == o["answers"] and offline["epsilon"] == pytest.approx(
            o["epsilon"]
        )
        assert set(offline) >= {"answers", "mu", "epsilon", "delta", "budget_epsilon"}
    samples = np.load(out / "samples.npz")
    assert samples["theta"].shape == (2, 300, 1)
    pooled_mean = np.mean(
        [np.loadtxt(o["data"], delimiter=",", skiprows=1).mean() for o in owners.values()]
    )
    assert (
        abs(samples["theta"][:, 100:].mean() - pooled_mean) < 0.1
    )  # posterior sd ≈ 0.013; a loose sanity bound
    assert not (out / "checkpoint.npz").exists()  # a finished run leaves no checkpoint
    done = run_cli("run", "--resume", str(out), cwd=tmp_path)
    assert done.returncode == 2 and "finished run" in done.stderr


class LedgerReplay:
    """An oracle that only reads the owners' ledgers: a query never answered is an error."""

    def __init__(self, owners: dict, session: str):
        self.ledgers = [
            (Ledger(o["toml"].parent / f"{name}.sqlite", read_only=True), name)
            for name, o in owners.items()
        ]
        self.session = session
        live = GrpcOracle(addresses(owners).split(","), MODEL)
        try:  # the owners' policies (min_step), which the penalty kernel reads
            self.descriptions = live.describe()
        finally:
            live.close()

    def describe(self):
        return self.descriptions

    def log_ratio(self, iteration, chains, theta, theta_prop) -> Answers:
        values = []
        for ledger, name in self.ledgers:
            stored = ledger.stored([name], self.session, iteration, iteration)
            values.append(
                [
                    np.frombuffer(stored[(name, int(c), iteration)][1], dtype="<f8")[0]
                    for c in chains
                ]
            )
        return Answers(np.array(values), np.ones(len(self.ledgers)))

    def close(self):
        for ledger, _ in self.ledgers:
            ledger.close()


@pytest.mark.slow
def test_kill_9_of_an_owner_then_resume_charges_nothing_twice_and_gives_the_same_chain(
    tmp_path, procs
):
    owners = deploy(tmp_path, procs, {"sigma": 1.0, "max_step": 0.02, "budget_epsilon": 1000.0})
    out = tmp_path / "run"
    # draw-for-draw equality needs no statistical power: long enough only that bob is killed
    # mid-run (right after the first checkpoint, at iteration 100 of 2,000)
    total = 2000
    log = run_and_kill_bob(tmp_path, procs, owners, scenario(tmp_path, total), out)
    bob = owners["bob"]
    assert "unreachable" in log and "--resume" in log
    at_kill = report(bob, tmp_path)
    assert 0 < at_kill["answers"] < 2 * total

    bob["proc"] = procs.owner(bob["toml"], bob["port"])  # same port, same ledger
    assert report(bob, tmp_path) == at_kill  # the spend survived SIGKILL

    done = run_cli("run", "--resume", str(out), "--no-progress", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    privacy = json.loads((out / "privacy.json").read_text())
    for o in privacy["owners"]:
        assert o["answers"] == 2 * total  # each (chain, iteration) charged exactly once
        assert report(owners[o["owner"]], tmp_path)["answers"] == 2 * total

    # The resumed chain is the one an uninterrupted run computes from the owners' answers.
    assert_the_uninterrupted_chain(out, owners, total)


def assert_the_uninterrupted_chain(out, owners, total: int) -> None:
    """The run's draws in ``out`` are those an uninterrupted run of ``total`` iterations
    computes from the owners' stored answers (their ledgers)."""
    replay = LedgerReplay(owners, json.loads((out / "run.json").read_text())["session"])
    try:
        rng, theta0 = chain_start(load_scenario(out / "config.toml"), MODEL)
        uninterrupted = sample(
            kernel("penalty", MODEL, oracle=replay, step=0.01),
            rng,
            theta0,
            iterations=total,
            warmup=0,
            progress=False,
        )
    finally:
        replay.close()
    samples = np.load(out / "samples.npz")
    np.testing.assert_array_equal(samples["theta"], uninterrupted.theta)
    np.testing.assert_array_equal(samples["accepted"], uninterrupted.accepted)


@pytest.mark.slow
def test_an_owner_past_its_budget_refuses_and_the_run_stops_resumably(tmp_path, procs):
    # Worst-case answers cost μ_w = 2·L·max_step/σ + 2^-20 (lattice rounding) each, accounted by
    # Rényi DP; the budget covers 40,000 of them, so the run's session (10,000 answers) and a
    # second session (40,000) each fit alone, not together.
    mu_w = 2 * MODEL.lipschitz * 0.02 / 100.0 + 2.0**-LATTICE_BITS
    mu = math.sqrt(40_000) * mu_w * (1 + 1e-9)  # 40,000 fit despite rounding
    budget = OwnerAccountant("replace_one", GaussianSpend(1, mu * mu, mu), lattice=True).epsilon(
        1e-5
    )
    owners = deploy(
        tmp_path,
        procs,
        {
            "sigma": 100.0,
            "max_step": 0.02,
            "budget_epsilon": budget,
            "max_answers_per_request": 4000,
        },
    )
    carol = owners["carol"]
    out = tmp_path / "run"
    other = GrpcOracle([f"127.0.0.1:{carol['port']}"], MODEL, retry_seconds=2)
    try:
        other.open_session("penalty", 40_000)
        config = scenario(tmp_path, 5000, step=0.005, checkpoint_every=50)
        coordinator = start_run(procs, owners, config, out)
        t = 0
        for chunk in (4000, 400, 40, 4, 1):  # the other session spends what carol has left
            with pytest.raises(BudgetExhausted):
                while True:
                    other.log_ratio(
                        t, np.arange(chunk), np.zeros((chunk, 1)), np.full((chunk, 1), 0.02)
                    )
                    t += 1
            t += 1
        assert coordinator.wait(timeout=60) == 3
    finally:
        other.disconnect()
    log = (tmp_path / "coordinator.log").read_text()
    stop_lines = [line for line in log.splitlines() if line.startswith("stopped:")]
    assert len(stop_lines) == 1, log
    assert "budget" in stop_lines[0] and "'carol'" in stop_lines[0] and "ε left" in stop_lines[0]
    kept = np.load(out / "samples.npz")["theta"]
    assert 0 < kept.shape[1] < 5000  # what was sampled is kept
    assert (out / "checkpoint.npz").exists()

    # carol's own status for a request past its budget is RESOURCE_EXHAUSTED, naming her.
    with grpc.insecure_channel(f"127.0.0.1:{carol['port']}") as channel:
        with pytest.raises(grpc.RpcError) as refused:
            pb_grpc.OwnerStub(channel).LogRatio(
                pb.LogRatioRequest(
                    session=json.loads((out / "run.json").read_text())["session"],
                    iteration=10**6,
                    chains=[0],
                    theta=[0.0],
                    theta_prop=[0.005],  # the run's session declared max_step 0.005
                ),
                timeout=30,
            )
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert dict(refused.value.trailing_metadata())["fedpenalty-owner"] == "carol"

    # The checkpoint is resumable: once carol's policy allows more, the run completes.
    carol["proc"].send_signal(signal.SIGTERM)
    assert carol["proc"].wait(timeout=30) == 0
    write_owner(
        tmp_path,
        "carol",
        carol["data"],
        carol["port"],
        {"sigma": 100.0, "max_step": 0.02, "budget_epsilon": 10 * budget},
        MODEL_TABLE,
    )
    carol["proc"] = procs.owner(carol["toml"], carol["port"])
    done = run_cli("run", "--resume", str(out), "--no-progress", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    resumed = np.load(out / "samples.npz")["theta"]
    assert resumed.shape == (2, 5000, 1)
    np.testing.assert_array_equal(resumed[:, : kept.shape[1]], kept)


def test_deployed_owners_check_a_plan_at_the_step_the_session_declares(tmp_path, procs):
    """Owners with max_step 0.05 and budget ε = 200: 3,400 planned penalty answers are refused
    at the policy's step (ε 0 → ≈ 1,000) but admitted when the session declares step 0.01
    (worst case ε ≈ 88); the owners then hold every request to 0.01."""
    owners = deploy(tmp_path, procs, {"sigma": 1.0, "max_step": 0.05, "budget_epsilon": 200.0})
    oracle = GrpcOracle([f"127.0.0.1:{o['port']}" for o in owners.values()], MODEL)
    try:
        for declared in (None, 0.05):
            with pytest.raises(BudgetExhausted, match=re.escape("every step at max_step 0.05")):
                oracle.open_session("penalty", 3400, session="wide", max_step=declared)
        oracle.open_session("penalty", 3400, session="narrow", max_step=0.01)
        theta = np.zeros((2, 1))
        answers = oracle.log_ratio(0, np.arange(2), theta, theta + 0.01)
        assert answers.values.shape == (3, 2)
        with pytest.raises(
            InvalidRequest, match=re.escape("exceeds the session's declared max_step 0.01")
        ):
            oracle.log_ratio(1, np.arange(2), theta, theta + 0.02)
        with pytest.raises(InvalidRequest, match="resumed session keeps its terms"):
            oracle.open_session("penalty", 3400, session="narrow", max_step=0.02)
        oracle.open_session("penalty", 3400, session="narrow", max_step=0.01)  # a resume
    finally:
        oracle.close()
