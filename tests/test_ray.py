"""The Ray transport beyond the oracle contract (tests/test_oracle_contract.py): a simulation
through Ray actors equals the in-process one for the same seed (records and noise are made in
the actors from the same per-owner streams), file owners are read by the actors, its keys are
checked, an actor that dies stops the run naming its owners and keeps the checkpoint, and a run
on a Ray cluster started separately, with token authentication, works through run.ray_address.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from ray_support import wait_until_dead

from fedpenalty.cluster.ray_hosts import HostSpec, OwnerSpec, RayHosts
from fedpenalty.common import Policy
from fedpenalty.config import load_scenario, resolve
from fedpenalty.coordinator import checkpoint
from fedpenalty.coordinator.inprocess import INPROCESS
from fedpenalty.coordinator.ray_oracle import RAY, RayOracle
from fedpenalty.coordinator.transport_base import OwnerSetup
from fedpenalty.data import FileRecords, OwnerRecords, synthetic_sources
from fedpenalty.errors import ConfigError, DataError, OwnerUnavailable
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger
from fedpenalty.simulation import resume_simulation, run_scenario

ROOT = Path(__file__).resolve().parents[1]
SMALL = [
    "data.owners=5",
    "data.n_per_owner=800",
    "sampler.iterations=150",
    "sampler.warmup=50",
    "run.progress=false",
]


def simulate(tmp_path: Path, name: str, *overrides: str):
    return run_scenario(load_scenario(None, [*SMALL, *overrides]), tmp_path / name)


def samples(out: Path) -> dict[str, np.ndarray]:
    with np.load(out / "samples.npz") as data:
        return {k: data[k] for k in data.files}


#: Secure aggregation (docs/design.md §2.6) with s = ``privacy.sigma`` of each kernel's settings
#: and t = 1 colluder.
SECURE = ["privacy.aggregation='secure'", "privacy.colluders=1"]


def secure(settings: list[str]) -> list[str]:
    """``settings`` with secure aggregation at s = their ``privacy.sigma`` (default 1)."""
    sigma = next((s.split("=")[1] for s in settings if s.startswith("privacy.sigma=")), "1.0")
    return [*settings, *SECURE, f"privacy.total_noise_sd={sigma}"]


@pytest.mark.parametrize(
    "algorithm, aggregation",
    [
        ("penalty", "none"),
        ("penalty_expfam", "none"),
        ("sgld", "none"),
        pytest.param("penalty", "secure", marks=pytest.mark.slow),
        pytest.param("penalty_expfam", "secure", marks=pytest.mark.slow),
        pytest.param("sgld", "secure", marks=pytest.mark.slow),
    ],
    ids=["penalty", "expfam", "sgld", "penalty-secure", "expfam-secure", "sgld-secure"],
)
def test_a_ray_run_equals_the_in_process_run_of_the_same_seed(
    tmp_path, ray_session, algorithm, aggregation
):
    """5 owners in 2 actors (3 + 2): the same records, noise, answers, draws and ledgers. With
    secure aggregation too: the owners' seeded lattice noise and keys are the same, the actors'
    masked sums add up mod 2⁶⁴ to the in-process host's, and the decoded sums are identical."""
    settings = {
        "penalty": [],
        "penalty_expfam": [
            "sampler.algorithm='penalty_expfam'",
            "sampler.block=5",
            "privacy.sigma=100.0",
        ],
        "sgld": [
            "sampler.algorithm='sgld'",
            "sampler.step=1e-5",
            "sampler.sampling_rate=0.05",
            "sampler.clip=4.0",
            "privacy.sigma=2.0",
        ],
    }[algorithm]
    if aggregation == "secure":
        settings = secure(settings)
    ray = simulate(tmp_path, "ray", "run.transport='ray'", *settings)
    local = simulate(tmp_path, "local", "run.transport='inprocess'", *settings)
    assert ray.stopped is None and local.stopped is None
    for key, value in samples(local.out).items():
        np.testing.assert_array_equal(samples(ray.out)[key], value)
    assert ray.privacy["owners"] == local.privacy["owners"]
    assert ray.diagnostics == local.diagnostics  # simulation_only counters included
    assert sorted(p.name for p in (ray.out / "owners").glob("*.sqlite")) == [
        "ray-0.sqlite",
        "ray-1.sqlite",
    ]
    assert ray.privacy["aggregation"] == aggregation
    if aggregation == "secure":
        assert all(o["owners_counted"] == 5 for o in ray.privacy["owners"])


def test_file_owners_are_read_by_the_actors(tmp_path, ray_session):
    rng = np.random.default_rng(3)
    paths = []
    for k in range(3):
        path = tmp_path / f"owner-{k}.csv"
        values = rng.normal(0.2, 1.0, size=300 + 50 * k)
        path.write_text("x\n" + "\n".join(f"{v:.17g}" for v in values) + "\n")
        paths.append(str(path))
    files = [f"data.paths={json.dumps(paths)}"]
    ray = simulate(tmp_path, "ray", "run.transport='ray'", *files)
    local = simulate(tmp_path, "local", "run.transport='inprocess'", *files)
    np.testing.assert_array_equal(samples(ray.out)["theta"], samples(local.out)["theta"])
    assert [o["n"] for o in ray.privacy["owners"]] == [300, 350, 400]


def test_a_start_up_error_inside_an_actor_comes_back_with_its_class(tmp_path, ray_session):
    model = build_model({"name": "gaussian_mean"})
    spec = HostSpec(
        {"name": model.name, **model.params()},
        str(tmp_path / "ledger.sqlite"),
        [OwnerSpec("a", Policy(), np.random.default_rng(0), FileRecords(str(tmp_path / "no.csv")))],
    )
    with pytest.raises(DataError, match=r"data file .*no\.csv does not exist"):
        RayHosts.start([spec], cpus=0)
    Ledger(tmp_path / "ledger.sqlite").close()  # the actor released its ledger


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("run.ray_address='nohost'", r"run\.ray_address must be .*'host:port'.*got 'nohost'"),
        ("run.ray_address='ray://'", r"run\.ray_address must be"),
        ("run.ray_actors=-1", r"run\.ray_actors must be a non-negative integer"),
        ("run.ray_actor_cpus=0", r"run\.ray_actor_cpus must be a positive finite number"),
    ],
)
def test_ray_keys_are_checked(override, message):
    with pytest.raises(ConfigError, match=message):
        load_scenario(None, [override])


def test_more_actors_than_the_cluster_has_cpus_is_refused_naming_the_keys(tmp_path, ray_session):
    with pytest.raises(ConfigError, match=r"run\.ray_actors = 3 actors × run\.ray_actor_cpus = 1"):
        simulate(tmp_path, "run", "run.transport='ray'", "run.ray_actors=3")


def _setup(folder: Path, **run) -> OwnerSetup:
    """5 synthetic owners of the Ray transport (made in the actors), with ``run`` keys."""
    model = build_model({"name": "gaussian_mean", "dim": 2, "theta_bound": 2.0})
    records = OwnerRecords(
        model, synthetic_sources(np.random.SeedSequence(4), np.array([0.3, -0.2]), [300] * 5)
    )
    policies = [Policy(sigma=1.0, max_step=0.05, budget_epsilon=500.0)] * 5
    names = [f"owner-{k}" for k in range(5)]
    seeds = np.random.SeedSequence(5).spawn(5)
    sections = resolve({"run": {"transport": "ray", **run}})["run"]
    return OwnerSetup(folder, model, names, records, policies, seeds, sections)


def test_a_restarted_transport_hosts_every_owner_on_its_ledger_and_replays(tmp_path, ray_session):
    """Started again for the same run directory (a resumed run), the transport packs the owners
    as before — whatever run.ray_actors says now — so each owner finds its ledger: answered
    keys are replayed and charged once, and new keys get the answers an uninterrupted run
    would have had (the in-process owners of the same seeds)."""
    rng = np.random.default_rng(0)
    theta = rng.uniform(-1, 1, size=(3, 2))
    moves = rng.standard_normal((2, 3, 2))
    steps = [theta + 0.04 * m / np.linalg.norm(m, axis=1, keepdims=True) for m in moves]
    chains = np.arange(3)
    reference = INPROCESS.launch(_setup(tmp_path / "local"))
    reference.oracle.open_session("penalty", 100, session="s")
    expected = [reference.oracle.log_ratio(t, chains, theta, steps[t]).values for t in (0, 1)]
    reference.stop()

    first = RAY.launch(_setup(tmp_path / "run", ray_actors=2))
    try:
        first.oracle.open_session("penalty", 100, session="s")
        np.testing.assert_array_equal(
            first.oracle.log_ratio(0, chains, theta, steps[0]).values, expected[0]
        )
    finally:
        first.stop()  # the session stays open in the owners' ledgers
    second = RAY.launch(_setup(tmp_path / "run", ray_actors=1))
    try:
        oracle = second.oracle
        assert isinstance(oracle, RayOracle) and len(oracle.hosts.actors) == 2
        oracle.open_session("penalty", 100, session="s")
        for t in (0, 1):
            np.testing.assert_array_equal(
                oracle.log_ratio(t, chains, theta, steps[t]).values, expected[t]
            )
        assert [r.session.answers for r in oracle.privacy_reports()] == [6] * 5
    finally:
        second.stop()


@pytest.mark.parametrize("aggregation", ["none", pytest.param("secure", marks=pytest.mark.slow)])
def test_a_killed_actor_stops_the_run_naming_its_owners_and_the_resumed_run_is_exact(
    tmp_path, ray_session, monkeypatch, aggregation
):
    """The run stops naming the owners actor 1 hosted and keeps its checkpoint; ``simulate
    --resume`` restarts the actors on their ledgers (the recorded packing) and finishes with
    the draws of an uninterrupted run, charging no answered key twice. With secure
    aggregation the other actor's masked sum of that iteration is never decoded; the resumed
    run re-opens the session with the same keys, that actor replays its stored masked words
    and the restarted one answers afresh, and the sums decode to the uninterrupted run's."""
    import ray

    settings = secure([]) if aggregation == "secure" else []

    calls = {"log_ratio": 0}
    answer = RayHosts.answer

    def killing(self, query):
        if query[0] == "log_ratio":  # (kind, session, iteration, chains, arrays, substep)
            calls["log_ratio"] += 1
            if calls["log_ratio"] == 120:  # iteration 119 (0-based) finds actor 1 dead
                ray.kill(self.actors[1])
                wait_until_dead(self.actors[1])
        return answer(self, query)

    monkeypatch.setattr(RayHosts, "answer", killing)
    result = simulate(tmp_path, "run", "run.transport='ray'", "run.checkpoint_every=50", *settings)
    assert isinstance(result.stopped, OwnerUnavailable)
    message = str(result.stopped)
    assert "Ray actor 1 (owners owner-3, owner-4; 2 owners) stopped" in message
    progress = checkpoint.load(result.out / "checkpoint.npz")
    assert progress.done == 119 and result.theta.shape[1] == 119 - 50
    info = json.loads((result.out / "run.json").read_text())
    assert info["session"] and not info.get("complete")
    # what the killed actor charged before it died is in its ledger: 4 chains × 119 iterations
    ledger = Ledger(result.out / "owners" / "ray-1.sqlite", read_only=True)
    assert [ledger.total(f"owner-{k}").answers for k in (3, 4)] == [476, 476]

    monkeypatch.undo()
    resumed = resume_simulation(result.out)
    assert resumed.stopped is None and not (result.out / "checkpoint.npz").exists()
    uninterrupted = simulate(tmp_path, "local", "run.transport='inprocess'", *settings)
    for key, value in samples(uninterrupted.out).items():
        np.testing.assert_array_equal(samples(result.out)[key], value)
    assert resumed.privacy["owners"] == uninterrupted.privacy["owners"]  # nothing charged twice
    assert ledger.total("owner-3").answers == 4 * 200


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_run_on_a_separately_started_ray_cluster_with_token_authentication(tmp_path):
    """``ray start --head --block`` with RAY_AUTH_MODE=token, stopped by its process id; the
    coordinator connects with the cluster's token, and is refused without it."""
    token, port = secrets.token_hex(32), _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": token,
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
    }
    ray_cli = Path(sys.executable).parent / "ray"
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths have a limit
    log = (tmp_path / "head.log").open("wb")
    head = subprocess.Popen(
        [str(ray_cli), "start", "--head", f"--port={port}", "--block", "--num-cpus=2",
         "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}"],
        env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while b"Ray runtime started" not in (tmp_path / "head.log").read_bytes():
            assert head.poll() is None, (tmp_path / "head.log").read_text()
            assert time.monotonic() < deadline, "the Ray head did not start in time"
            time.sleep(0.5)
        command = [
            sys.executable, "-m", "fedpenalty.cli", "simulate", *[f"--set={s}" for s in SMALL],
            "--set=run.transport='ray'", f"--set=run.ray_address='127.0.0.1:{port}'",
        ]  # fmt: skip
        done = subprocess.run(
            [*command, "--out", str(tmp_path / "cluster")], env=env, capture_output=True,
            text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        local = simulate(tmp_path, "local", "run.transport='inprocess'")
        for key, value in samples(local.out).items():
            np.testing.assert_array_equal(samples(tmp_path / "cluster")[key], value)
        cluster = json.loads((tmp_path / "cluster" / "privacy.json").read_text())
        assert cluster["owners"] == local.privacy["owners"]
        wrong = {**env, "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        refused = subprocess.run(
            [*command, "--out", str(tmp_path / "refused")], env=wrong, capture_output=True,
            text=True, timeout=600,
        )  # fmt: skip
        assert refused.returncode != 0
        assert f"cannot connect to the Ray cluster at run.ray_address = '127.0.0.1:{port}'" in (
            refused.stderr
        )
        assert "RAY_AUTH_TOKEN" in refused.stderr
    finally:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=90)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()
        log.close()
    assert head.returncode is not None
