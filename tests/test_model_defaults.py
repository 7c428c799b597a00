"""`--set model.name=...` switches the model of the embedded default (and of a scenario file):
the model-sized keys follow the chosen model (fedpenalty/model_defaults.toml; the layers
themselves: tests/test_scenario_defaults.py)."""

from __future__ import annotations

import math
import tomllib

import pytest

from fedpenalty.cli import main
from fedpenalty.config import load_scenario, model_defaults
from fedpenalty.models import MODELS, build_model
from fedpenalty.privacy import epsilon_for_delta

SMALL = [
    "--set",
    "run.transport='inprocess'",
    "--set",
    "data.n_per_owner=300",
    "--set",
    "sampler.iterations=40",
    "--set",
    "sampler.warmup=10",
    "--no-progress",
]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_default_plan_fits_the_owners_budget(name):
    """The worst case the owners check at session open (every answer at the full step) stays
    within budget_epsilon, by the same exact GDP accountant the simulated owners use."""
    s = load_scenario(None, [f"model.name={name}"])
    model = build_model(s["model"])
    sampler, privacy = s["sampler"], s["privacy"]
    answers = sampler["chains"] * (sampler["warmup"] + sampler["iterations"])
    per_answer = float(model.log_ratio_sensitivity(sampler["step"], privacy["neighbour"]))
    mu = per_answer / privacy["sigma"] * math.sqrt(answers)
    assert epsilon_for_delta(mu, privacy["delta"]) < privacy["budget_epsilon"]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_simulate_switches_model_on_the_embedded_default(tmp_path, capsys, name):
    out = tmp_path / "run"
    code = main(["simulate", "--set", f"model.name='{name}'", *SMALL, "--out", str(out)])
    _, err = capsys.readouterr()
    assert code == 0, err
    resolved = tomllib.loads((out / "config.toml").read_text())
    assert resolved["model"]["name"] == name
    assert resolved["sampler"]["step"] == model_defaults()[name]["penalty"]["sampler"]["step"]
    assert (out / "posterior.nc").is_file()


def test_switching_the_model_of_a_file_drops_the_old_models_keys(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[model]\nname = "gaussian_mean"\ndim = 3\nnoise_sd = 2.0\n')
    s = load_scenario(path, ["model.name=bernoulli", "model.theta_bound=3.0"])
    assert s["model"] == {"name": "bernoulli", **MODELS["bernoulli"].defaults(), "theta_bound": 3.0}
    # the same name keeps the file's keys
    assert load_scenario(path, ["model.name=gaussian_mean"])["model"]["dim"] == 3
