"""OWNER.toml: resolved values, errors that name what is wrong, and one process serving
several owner files (one shared ledger: one transaction per request)."""

from __future__ import annotations

import numpy as np
import pytest
import tomli_w
from grpc_processes import FEDPENALTY, Processes, free_port, run_cli, wait_serving, write_owner
from owners import save_csv

from fedpenalty.common import Policy
from fedpenalty.coordinator.grpc_oracle import GrpcOracle
from fedpenalty.errors import ConfigError
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger
from fedpenalty.owner.owner_config import load_owner_config

MODEL_TABLE = {"name": "gaussian_mean", "dim": 1, "data_bound": 4.0, "theta_bound": 4.0}
MODEL = build_model(MODEL_TABLE)


def write(tmp_path, body: dict):
    path = tmp_path / "bank.toml"
    path.write_text(tomli_w.dumps(body))
    return path


def test_owner_file_resolves_paths_defaults_and_overrides(tmp_path):
    path = write(
        tmp_path,
        {
            "model": MODEL_TABLE,
            "data": {"path": "records.csv"},
            "privacy": {"sigma": 2.0, "max_step": 0.01, "budget_epsilon": 3.0},
        },
    )
    config = load_owner_config(path)
    assert config.name == "bank" and config.model == MODEL
    assert (
        config.data_path == tmp_path / "records.csv"
        and config.ledger == tmp_path / "bank-ledger.sqlite"
    )
    assert (config.policy.sigma, config.policy.delta, config.policy.neighbour) == (
        2.0,
        1e-5,
        "replace_one",
    )
    assert (config.policy.max_sampling_rate, config.policy.max_clip) == (
        Policy().max_sampling_rate,
        Policy().max_clip,
    )
    gradients = write(
        tmp_path,
        {
            "model": MODEL_TABLE,
            "data": {"path": "records.csv"},
            "privacy": {"max_sampling_rate": 0.01, "max_clip": 2},
        },
    )
    policy = load_owner_config(gradients).policy
    assert (policy.max_sampling_rate, policy.max_clip) == (0.01, 2.0)
    assert (
        config.synchronous == "FULL" and config.tls is None and config.listen == "127.0.0.1:50051"
    )
    other = load_owner_config(path, listen="127.0.0.1:6000", ledger=str(tmp_path / "x.sqlite"))
    assert other.listen == "127.0.0.1:6000" and other.ledger == tmp_path / "x.sqlite"


@pytest.mark.parametrize(
    "body,message",
    [
        (
            {"model": MODEL_TABLE, "data": {"path": "r.csv"}, "privacy": {"epsilon": 1.0}},
            "unknown key privacy.epsilon",
        ),
        (
            {"model": MODEL_TABLE, "data": {"path": "r.csv"}, "server": {"port": 1}},
            "unknown key server.port",
        ),
        (
            {"model": MODEL_TABLE, "data": {"path": "r.csv"}, "sampler": {}},
            r"unknown section \[sampler\]",
        ),
        ({"model": MODEL_TABLE, "data": {}}, r"\[data\] needs path"),
        ({"data": {"path": "r.csv"}}, r"needs a \[model\] table"),
        ({"model": {"name": "nope"}, "data": {"path": "r.csv"}}, "unknown model name"),
        (
            {"model": MODEL_TABLE, "data": {"path": "r.csv"}, "privacy": {"sigma": -1.0}},
            "privacy.sigma must be",
        ),
        (
            {
                "model": MODEL_TABLE,
                "data": {"path": "r.csv"},
                "privacy": {"max_sampling_rate": 1.5},
            },
            r"privacy.max_sampling_rate must be a number in \(0, 1\]",
        ),
        (
            {"model": MODEL_TABLE, "data": {"path": "r.csv"}, "privacy": {"max_clip": 0}},
            "privacy.max_clip must be",
        ),
        (
            {"model": MODEL_TABLE, "data": {"path": "r.csv"}, "server": {"tls_ca": "ca.pem"}},
            "TLS needs both",
        ),
        (
            {"model": MODEL_TABLE, "data": {"path": "r.csv"}, "server": {"synchronous": "OFF"}},
            "server.synchronous",
        ),
    ],
)
def test_bad_owner_files_are_refused_with_a_clear_message(tmp_path, body, message):
    with pytest.raises(ConfigError, match=message):
        load_owner_config(write(tmp_path, body))


def test_serve_refuses_a_bad_data_file_before_listening(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("x\n0.1\nnot-a-number\n")
    toml = write_owner(tmp_path, "bank", bad, free_port(), {}, MODEL_TABLE)
    done = run_cli("owner", "serve", str(toml), cwd=tmp_path)
    assert done.returncode == 2 and "not a number" in done.stderr


def test_one_process_serves_several_owner_files_on_one_ledger(tmp_path):
    port = free_port()
    tomls = []
    for k, name in enumerate(("north", "south")):
        data = tmp_path / f"{name}.csv"
        save_csv(
            data, MODEL.simulate_records(np.random.default_rng(k), np.array([0.1]), 300 + k), MODEL
        )
        tomls.append(
            write_owner(
                tmp_path, name, data, port, {"sigma": 1.0 + k, "budget_epsilon": 100.0}, MODEL_TABLE
            )
        )
    procs = Processes(tmp_path)
    try:
        proc = procs.start(
            [
                *FEDPENALTY,
                "owner",
                "serve",
                *map(str, tomls),
                "--ledger",
                str(tmp_path / "shared.sqlite"),
            ],
            "both.log",
        )
        wait_serving(f"127.0.0.1:{port}", proc, None, tmp_path / "both.log")
        oracle = GrpcOracle([f"127.0.0.1:{port}"], MODEL, retry_seconds=2)
        assert [(d.name, d.n, d.policy.sigma) for d in oracle.describe()] == [
            ("north", 300, 1.0),
            ("south", 301, 2.0),
        ]
        oracle.open_session("penalty", 10)
        answers = oracle.log_ratio(0, np.array([0]), np.zeros((1, 1)), np.full((1, 1), 0.01))
        assert answers.values.shape == (2, 1) and list(answers.noise_sd) == [1.0, 2.0]
        oracle.close()
    finally:
        procs.stop_all()
    ledger = Ledger(tmp_path / "shared.sqlite")
    assert [ledger.total(name).answers for name in ("north", "south")] == [1, 1]
    ledger.close()
