"""Scenario files, OWNER.toml and Policy: every bad value is a one-line ConfigError that names
the dotted key and what is allowed; a resolved scenario reloads to itself."""

from __future__ import annotations

import math
import tomllib

import numpy as np
import pytest
import tomli_w

from fedpenalty.common import Policy
from fedpenalty.config import (
    SECTIONS,
    DataSection,
    PrivacySection,
    RunSection,
    SamplerSection,
    Scenario,
    load_scenario,
    parse_override,
    resolve,
)
from fedpenalty.coordinator.algorithms import ALGORITHMS
from fedpenalty.coordinator.transports import TRANSPORTS
from fedpenalty.errors import ConfigError
from fedpenalty.owner.owner_config import load_owner_config


def refused(raw: dict) -> str:
    with pytest.raises(ConfigError) as info:
        resolve(raw)
    message = str(info.value)
    assert "\n" not in message and "pydantic" not in message, message
    return message


@pytest.mark.parametrize(
    "raw,message",
    [
        # unknown sections and keys, sections that are not tables
        (
            {"modle": {}},
            "unknown section [modle]; allowed sections: model, data, privacy, sampler, run",
        ),
        ({"data": {"owner": 3}}, "unknown key data.owner; allowed keys in [data]: source, owners,"),
        (
            {"privacy": {"sigmas": 1.0}},
            "unknown key privacy.sigmas; allowed keys in [privacy]: delta,",
        ),
        (
            {"sampler": {"stepp": 0.1}},
            "unknown key sampler.stepp; allowed keys in [sampler]: algorithm,",
        ),
        ({"run": {"sed": 1}}, "unknown key run.sed; allowed keys in [run]: transport,"),
        ({"data": 3}, "[data] must be a table of keys, got 3"),
        ({"sampler": [1]}, "[sampler] must be a table of keys, got [1]"),
        # [model]: the name here, every other key by the model
        ({"model": {"name": "weibull"}}, "model.name must be one of 'gaussian_mean', "),
        ({"model": {"name": True}}, "model.name must be one of"),
        ({"model": {"name": "bernoulli", "dim": 2}}, "[model] bernoulli: unknown key 'dim'"),
        # [data]
        ({"data": {"owners": True}}, "data.owners must be a positive integer, got True"),
        ({"data": {"owners": 0}}, "data.owners must be a positive integer, got 0"),
        ({"data": {"owners": 2.0}}, "data.owners must be a positive integer, got 2.0"),
        (
            {"data": {"source": "http"}},
            "data.source must be one of 'synthetic', 'files', got 'http'",
        ),
        (
            {"data": {"n_per_owner": -5}},
            "data.n_per_owner must be a positive integer or a non-empty list of them, got -5",
        ),
        (
            {"data": {"n_per_owner": [10, True, 10, 10]}},
            "data.n_per_owner[1] must be a positive integer, got True",
        ),
        ({"data": {"n_per_owner": [10, 10]}}, "data.n_per_owner lists 2 values for 4 owners"),
        ({"data": {"n_per_owner": []}}, "data.n_per_owner must not be an empty list"),
        (
            {"data": {"true_theta": math.nan}},
            "data.true_theta must be a finite number or a non-empty list of them, got nan",
        ),
        (
            {"data": {"true_theta": [0.1, math.inf]}},
            "data.true_theta[1] must be a finite number, got inf",
        ),
        (
            {"data": {"true_theta": [0.1, 0.2]}},
            "data.true_theta has 2 values; the model has dimension 1",
        ),
        ({"data": {"true_theta": 99.0}}, "data.true_theta must lie inside"),
        (
            {"data": {"paths": "a.csv"}},
            "data.paths must be a list of file paths (CSV or NPZ, one per owner), got 'a.csv'",
        ),
        ({"data": {"paths": ["a.csv", ""]}}, "data.paths must be a list of file paths"),
        ({"data": {"source": "files"}}, "needs data.paths"),
        # [privacy]
        (
            {"privacy": {"sigma": True}},
            "privacy.sigma must be a positive finite number or a non-empty list of them, got True",
        ),
        ({"privacy": {"sigma": math.nan}}, "privacy.sigma must be a positive finite number"),
        ({"privacy": {"sigma": -1}}, "privacy.sigma must be a positive finite number"),
        (
            {"privacy": {"sigma": [1.0, 2.0, -3.0, 4.0]}},
            "privacy.sigma[2] must be a positive finite number, got -3.0",
        ),
        ({"privacy": {"sigma": [1.0, 2.0]}}, "privacy.sigma lists 2 values for 4 owners"),
        (
            {"privacy": {"delta": 1}},
            "privacy.delta must be a number strictly between 0 and 1, got 1",
        ),
        (
            {"privacy": {"delta": 0.0}},
            "privacy.delta must be a number strictly between 0 and 1, got 0.0",
        ),
        (
            {"privacy": {"delta": math.nan}},
            "privacy.delta must be a number strictly between 0 and 1",
        ),
        (
            {"privacy": {"budget_epsilon": math.inf}},
            "privacy.budget_epsilon must be a positive finite number, got inf",
        ),
        (
            {"privacy": {"max_step": False}},
            "privacy.max_step must be a positive finite number, got False",
        ),
        (
            {"privacy": {"neighbour": "swap"}},
            "privacy.neighbour must be one of 'replace_one', 'add_remove', got 'swap'",
        ),
        ({"privacy": {"mechanism": "exponential"}}, "privacy.mechanism must be one of 'laplace', "),
        (
            {"privacy": {"epsilon": "1"}},
            "privacy.epsilon must be a positive finite number, got '1'",
        ),
        # [sampler]
        ({"sampler": {"algorithm": "pnealty"}}, "sampler.algorithm must be one of 'penalty', "),
        (
            {"sampler": {"iterations": True}},
            "sampler.iterations must be a positive integer, got True",
        ),
        ({"sampler": {"warmup": -1}}, "sampler.warmup must be a non-negative integer, got -1"),
        ({"sampler": {"chains": 0}}, "sampler.chains must be a positive integer, got 0"),
        ({"sampler": {"step": -0.1}}, "sampler.step must be a positive finite number, got -0.1"),
        ({"sampler": {"step": math.nan}}, "sampler.step must be a positive finite number, got nan"),
        (
            {"sampler": {"sampling_rate": 1.5}},
            "sampler.sampling_rate must be a number in (0, 1], got 1.5",
        ),
        (
            {"sampler": {"sampling_rate": 0}},
            "sampler.sampling_rate must be a number in (0, 1], got 0",
        ),
        (
            {"sampler": {"step_schedule": "cosine"}},
            "sampler.step_schedule must be one of 'constant', ",
        ),
        ({"sampler": {"init_scale": 2.0}}, "sampler.init_scale must be at most 1"),
        # [run]
        ({"run": {"transport": "tcp"}}, "run.transport must be one of "),
        ({"run": {"seed": -1}}, "run.seed must be a non-negative integer, got -1"),
        (
            {"run": {"retry_seconds": True}},
            "run.retry_seconds must be a positive finite number, got True",
        ),
        ({"run": {"progress": 1}}, "run.progress must be true or false, got 1"),
        ({"run": {"out": ""}}, "run.out must be a non-empty string, got ''"),
    ],
)
def test_bad_scenario_values_name_the_key(raw, message):
    assert message in refused(raw)


def test_choices_are_the_registries():
    """sampler.algorithm and run.transport accept exactly the registered names."""
    algorithms = refused({"sampler": {"algorithm": "pnealty"}})
    assert algorithms.endswith(f"one of {', '.join(map(repr, ALGORITHMS))}, got 'pnealty'")
    transports = refused({"run": {"transport": "tcp"}})
    assert transports.endswith(f"one of {', '.join(map(repr, TRANSPORTS))}, got 'tcp'")
    for name in ALGORITHMS:
        assert SamplerSection(algorithm=name).algorithm == name
    for name in TRANSPORTS:
        assert RunSection(transport=name).transport == name


def test_unknown_keys_come_before_bad_values():
    assert "unknown key sampler.stepp" in refused({"sampler": {"chains": 0, "stepp": 1}})
    assert "unknown section [x]" in refused({"sampler": {"chains": 0}, "x": {}})


def test_every_key_is_documented():
    for section in (DataSection, PrivacySection, SamplerSection, RunSection):
        assert all(field.description for field in section.model_fields.values()), section


def test_values_come_back_as_plain_python():
    s = resolve(
        {
            "data": {"n_per_owner": [5, 6, 7, 8], "true_theta": 1},
            "privacy": {"sigma": [1, 2, 3, 4], "max_step": 1},
            "sampler": {"step": 1},
        }
    )
    assert s["data"]["n_per_owner"] == [5, 6, 7, 8] and s["data"]["true_theta"] == 1.0
    assert all(type(v) is float for v in s["privacy"]["sigma"])
    assert type(s["sampler"]["step"]) is float
    sections = ("model", "data", "privacy", "sampler", "run", "network")
    assert SECTIONS == tuple(s.sections) == sections
    assert all(type(keys) is dict for keys in s.sections.values())
    s["run"]["progress"] = False
    assert s["run"]["progress"] is False


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["sampler.algorithm='sgld'", "privacy.sigma=[1.0, 2, 3.5, 4]", "run.out='runs/x'"],
        ["sampler.algorithm='ops'", "privacy.max_step=0.5", "run.transport='inprocess'"],
    ],
)
def test_resolved_scenario_round_trips_through_toml(overrides):
    scenario = load_scenario(overrides=overrides)
    again = resolve(tomllib.loads(scenario.to_toml()))
    assert isinstance(again, Scenario) and again == scenario
    if scenario["run"]["out"] is None:
        assert "# run.out is unset" in scenario.to_toml()


def test_minimal_scenario_round_trips_with_every_default():
    scenario = resolve(
        {
            "model": {"name": "logistic", "dim": 2},
            "data": {"true_theta": [0.5, -0.5], "n_per_owner": [10, 20, 30, 40]},
            "sampler": {"algorithm": "exact_mh"},
        }
    )
    assert scenario["model"]["prior_sd"] == 2.0 and scenario["sampler"]["chains"] == 4
    assert scenario["privacy"]["max_step"] is None and scenario["run"]["out"] is None
    assert resolve(tomllib.loads(scenario.to_toml())) == scenario


def test_overrides():
    assert parse_override("sampler.step=0.1") == ("sampler", "step", 0.1)
    assert parse_override("run.out=runs/a") == ("run", "out", "runs/a")
    with pytest.raises(ConfigError, match=r"section\.key=value"):
        parse_override("step")
    with pytest.raises(ConfigError, match=r"sampler\.chains must be a positive integer, got 2\.5"):
        load_scenario(overrides=["sampler.chains=2.5"])
    with pytest.raises(ConfigError, match=r"unknown section \[smapler\]"):
        load_scenario(overrides=["smapler.chains=2"])


# ------------------------------------------------------------------ OWNER.toml

MODEL = {"name": "gaussian_mean", "dim": 1, "data_bound": 4.0, "theta_bound": 4.0}


def owner_refused(tmp_path, body: dict) -> str:
    path = tmp_path / "bank.toml"
    path.write_text(tomli_w.dumps(body))
    with pytest.raises(ConfigError) as info:
        load_owner_config(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: "), message
    return message


@pytest.mark.parametrize(
    "sections,message",
    [
        (
            {"sampler": {}},
            "unknown section [sampler]; allowed sections: model, data, privacy, server",
        ),
        (
            {"privacy": {"epsilon": 1.0}},
            "unknown key privacy.epsilon; allowed keys in [privacy]: sigma,",
        ),
        (
            {"server": {"port": 1}},
            "unknown key server.port; allowed keys in [server]: name, listen,",
        ),
        (
            {"data": {"path": "r.csv", "paths": []}},
            "unknown key data.paths; allowed keys in [data]: path",
        ),
        ({"data": {}}, "[data] needs path: one CSV or NPZ file"),
        ({"data": {"path": ""}}, "data.path must be a non-empty string, got ''"),
        ({"privacy": 1}, "[privacy] must be a table of keys, got 1"),
        ({"privacy": {"sigma": True}}, "privacy.sigma must be a positive finite number, got True"),
        (
            {"privacy": {"sigma": math.nan}},
            "privacy.sigma must be a positive finite number, got nan",
        ),
        (
            {"privacy": {"max_step": -1}},
            "privacy.max_step must be a positive finite number, got -1",
        ),
        (
            {"privacy": {"delta": 1.5}},
            "privacy.delta must be a number strictly between 0 and 1, got 1.5",
        ),
        (
            {"privacy": {"max_sampling_rate": 0.0}},
            "privacy.max_sampling_rate must be a number in (0, 1]",
        ),
        (
            {"privacy": {"max_answers_per_request": 1.0}},
            "privacy.max_answers_per_request must be a positive integer, got 1.0",
        ),
        ({"privacy": {"neighbour": "swap"}}, "privacy.neighbour must be one of 'replace_one', "),
        ({"server": {"listen": 50051}}, "server.listen must be a non-empty string, got 50051"),
        (
            {"server": {"synchronous": "OFF"}},
            "server.synchronous must be one of 'FULL', 'NORMAL', got 'OFF'",
        ),
        (
            {"server": {"max_message_bytes": True}},
            "server.max_message_bytes must be a positive integer",
        ),
        ({"server": {"tls_cert": "c.pem"}}, "TLS needs both server.tls_cert and server.tls_key"),
        ({"model": {"name": "gaussian_mean", "dim": 0}}, "[model] gaussian_mean: 'dim' must be"),
    ],
)
def test_bad_owner_files_name_the_key(tmp_path, sections, message):
    body = {"model": MODEL, "data": {"path": "r.csv"}, **sections}
    assert message in owner_refused(tmp_path, body)


def test_owner_file_needs_model_and_data(tmp_path):
    assert owner_refused(tmp_path, {"data": {"path": "r.csv"}}).endswith("needs a [model] table")
    assert owner_refused(tmp_path, {"model": MODEL}).endswith("needs a [data] table")


def test_owner_file_privacy_is_the_policy(tmp_path):
    path = tmp_path / "bank.toml"
    path.write_text(
        tomli_w.dumps(
            {
                "model": MODEL,
                "data": {"path": "r.csv"},
                "privacy": {"sigma": 2, "neighbour": "add_remove"},
                "server": {"tls_cert": "c.pem", "tls_key": "k.pem"},
            }
        )
    )
    config = load_owner_config(path)
    assert config.policy == Policy(sigma=2.0, neighbour="add_remove")
    assert type(config.policy.sigma) is float
    assert config.tls is not None and config.tls.ca is None
    assert config.tls.cert == tmp_path / "c.pem"


# ------------------------------------------------------------------ Policy


@pytest.mark.parametrize(
    "values,message",
    [
        ({"sigma": True}, "privacy.sigma must be a positive finite number, got True"),
        ({"sigma": math.nan}, "privacy.sigma must be a positive finite number, got nan"),
        ({"max_step": 0.0}, "privacy.max_step must be a positive finite number, got 0.0"),
        ({"budget_epsilon": -math.inf}, "privacy.budget_epsilon must be a positive finite number"),
        ({"delta": 0}, "privacy.delta must be a number strictly between 0 and 1, got 0"),
        (
            {"neighbour": "swap"},
            "privacy.neighbour must be one of 'replace_one', 'add_remove', got 'swap'",
        ),
        (
            {"max_answers_per_request": True},
            "privacy.max_answers_per_request must be a positive integer",
        ),
        (
            {"max_answers_per_request": 0},
            "privacy.max_answers_per_request must be a positive integer",
        ),
        (
            {"max_sampling_rate": 1.01},
            "privacy.max_sampling_rate must be a number in (0, 1], got 1.01",
        ),
        ({"max_clip": "1"}, "privacy.max_clip must be a positive finite number, got '1'"),
        (
            {"total_noise_sd": 0.0},
            "privacy.total_noise_sd must be a positive finite number, got 0.0",
        ),
        ({"colluders": -1}, "privacy.colluders must be a non-negative integer, got -1"),
        ({"min_peers": 1.5}, "privacy.min_peers must be a non-negative integer, got 1.5"),
    ],
)
def test_bad_policies_name_the_key(values, message):
    with pytest.raises(ConfigError) as info:
        Policy(**values)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_policy_is_a_frozen_hashable_dataclass_of_floats():
    policy = Policy(sigma=2, max_step=np.float64(0.1), max_clip=3)
    assert policy == Policy(sigma=2.0, max_step=0.1, max_clip=3.0)
    assert hash(policy) == hash(Policy(sigma=2.0, max_step=0.1, max_clip=3.0))
    assert type(policy.sigma) is float and type(policy.max_step) is float
    assert policy.to_dict() == {
        "sigma": 2.0,
        "max_step": 0.1,
        "budget_epsilon": 10.0,
        "delta": 1e-5,
        "neighbour": "replace_one",
        "max_answers_per_request": 512,
        "max_sampling_rate": 1.0,
        "max_clip": 3.0,
        "min_step": 1e-9,
        "min_clip": 1e-6,
        "max_record_evaluations": 50_000_000,
        "total_noise_sd": None,
        "colluders": 0,
        "min_peers": 0,
        "unauthenticated_peers": "refuse",
        "min_charged_step": None,
    }
    assert Policy(**policy.to_dict()) == policy
    with pytest.raises(AttributeError):
        policy.sigma = 3.0  # type: ignore[misc]


def test_keys_only_another_algorithm_or_transport_reads_are_named(tmp_path):
    """A user-set key of an algorithm or transport other than the selected one is named, with
    its readers; the selected entry's own keys, generic keys and the defaults tables' keys
    are not."""
    from fedpenalty.config import unread_keys

    sets = ["sampler.leapfrog_steps=3", "run.ray_address='head:6379'", "sampler.step=0.01"]
    lines = unread_keys(load_scenario(None, sets))
    assert len(lines) == 2, lines
    assert lines[0].startswith("sampler.leapfrog_steps (from --set) is read only by ")
    assert "dp_hmc" in lines[0] and "not by 'penalty'" in lines[0]
    assert "run.ray_address" in lines[1] and "run.transport = ray" in lines[1]
    path = tmp_path / "s.toml"
    path.write_text(
        "[sampler]\nalgorithm = 'dp_hmc'\nleapfrog_steps = 3\n[run]\ntransport = 'ray'\n"
    )
    assert unread_keys(load_scenario(path, ["run.ray_address='head:6379'"])) == []
    assert unread_keys(load_scenario(None, ["sampler.algorithm='dp_hmc'"])) == []  # its table's
    file_line = unread_keys(load_scenario(path, ["sampler.algorithm='penalty'"]))
    assert file_line == [
        "sampler.leapfrog_steps (from your file) is read only by sampler.algorithm = dp_hmc, "
        "not by 'penalty': it changes nothing in this run"
    ]
