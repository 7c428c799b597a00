"""Models users write (docs/design.md §6, "Writing a model"): selection by "module:Class" and by
entry point, the errors of bad names, the model code digest, and the refusal of a session
whose model differs from the owner's."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import numpy as np
import pytest

from fedpenalty.config import load_scenario
from fedpenalty.errors import ConfigError
from fedpenalty.models import GaussianMean, build_model, model_digest
from fedpenalty.models.registry import ENTRY_POINT_GROUP

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "user_model"
LAPLACE = "laplace_location:LaplaceLocation"

_MODEL_SOURCE = """
import numpy as np
from fedpenalty.models.api import Configured, Model, Param, as_theta, validate_raw


class Shift(Configured, Model):
    PARAMS = {"theta_bound": Param(3.0, "positive")}

    def _setup(self):
        self.dim, self.theta_bound = 1, self.params()["theta_bound"]

    @property
    def column_names(self):
        return ["x"]

    def prepare_records(self, raw):
        return np.clip(validate_raw(raw, self.column_names, self.name), -5, 5)

    def log_lik(self, records, theta):
        return -0.5 * (records[:, 0][None, :] - as_theta(theta, 1)) ** 2

    def grad_log_lik(self, records, theta):
        return (records[:, 0][None, :] - as_theta(theta, 1))[:, :, None]

    def log_prior(self, theta):
        return np.zeros(as_theta(theta, 1).shape[0])

    def grad_log_prior(self, theta):
        return np.zeros_like(as_theta(theta, 1))

NOT_A_MODEL = 3
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A fresh user module ``usermod_<n>`` in ``tmp_path`` (on sys.path): its name."""
    name = f"usermod_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(_MODEL_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_module_class_name_builds_the_user_model(user_module):
    model = build_model({"name": f"{user_module}:Shift", "theta_bound": 2.0})
    assert type(model).__name__ == "Shift" and model.name == f"{user_module}:Shift"
    assert model.params() == {"theta_bound": 2.0}
    assert model.lipschitz is None
    assert build_model({"name": model.name, **model.params()}) == model


def test_the_scenario_files_folder_is_searched(tmp_path, monkeypatch):
    """A model module next to the scenario file loads though neither it nor the working
    directory is on sys.path."""
    folder = tmp_path / "study"
    folder.mkdir()
    (folder / "nextdoor.py").write_text(_MODEL_SOURCE)
    (folder / "scenario.toml").write_text('[model]\nname = "nextdoor:Shift"\ntheta_bound = 1.5\n')
    monkeypatch.chdir(tmp_path)
    try:
        scenario = load_scenario(folder / "scenario.toml")
        assert scenario["model"] == {"name": "nextdoor:Shift", "theta_bound": 1.5}
    finally:
        sys.modules.pop("nextdoor", None)
    with pytest.raises(ConfigError, match="no module named 'nextdoor'"):
        build_model({"name": "nextdoor:Shift"})  # outside the scenario's folder


def test_the_example_model_loads_from_its_folder(monkeypatch):
    monkeypatch.chdir(EXAMPLE)
    try:
        model = build_model({"name": LAPLACE})
    finally:
        sys.modules.pop("laplace_location", None)
    assert model.name == LAPLACE and model.lipschitz is None
    x = model.prepare_records(np.array([[0.5], [20.0]]))
    assert x[1, 0] == model.params()["data_bound"]  # clipped into the data domain
    theta = np.array([[0.0], [0.3]])
    g = model.grad_log_lik(x, theta)
    eps = 1e-6
    fd = (model.log_lik(x, theta + eps) - model.log_lik(x, theta - eps)) / (2 * eps)
    np.testing.assert_allclose(g[:, :, 0], fd, atol=1e-6)


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("no_such_module_xyz:Model", ["no module named 'no_such_module_xyz'", "model.name"]),
        ("{mod}:Shfit", ["has no attribute 'Shfit'", "Shift", "model.name"]),
        ("{mod}:NOT_A_MODEL", ["not a subclass", "Model", "model.name"]),
        ("{mod}:", ["'package.module:Class'", "model.name"]),
        ("no_such_entry_point", ["unknown model name", "gaussian_mean", "package.module:Class"]),
    ],
)
def test_bad_names_are_clear_config_errors(user_module, name, words):
    with pytest.raises(ConfigError) as err:
        build_model({"name": name.format(mod=user_module)})
    for word in words:
        assert word in str(err.value)


def test_a_model_that_does_not_implement_the_interface_is_named(tmp_path, monkeypatch):
    (tmp_path / "halfmod.py").write_text(
        "from fedpenalty.models.api import Model\nclass Half(Model):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"does not implement: .*log_lik"):
        build_model({"name": "halfmod:Half"})
    sys.modules.pop("halfmod", None)


def test_bad_model_name_in_a_scenario_names_the_key():
    with pytest.raises(ConfigError, match=r"model\.name"):
        load_scenario(overrides=["model.name='no_such_module_xyz:Thing'"])


def test_entry_point_selects_a_model(user_module, monkeypatch):
    ep = importlib.metadata.EntryPoint("shift", f"{user_module}:Shift", ENTRY_POINT_GROUP)

    def entry_points(group=None, **kw):
        assert group == ENTRY_POINT_GROUP
        return importlib.metadata.EntryPoints([ep])

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    model = build_model({"name": "shift"})
    assert type(model).__name__ == "Shift" and model.name == "shift"
    scenario = load_scenario(overrides=["model.name='shift'", "data.source='synthetic'"])
    assert scenario["model"] == {"name": "shift", "theta_bound": 3.0}


def test_digest_changes_with_the_source(user_module, tmp_path):
    model = build_model({"name": f"{user_module}:Shift"})
    first = model_digest(model)
    assert first == model_digest(type(model)) and len(first) == 64
    path = tmp_path / f"{user_module}.py"
    path.write_text(path.read_text().replace("-0.5 *", "-0.25 *"))
    assert model_digest(model) != first
    assert model_digest(GaussianMean()) == model_digest(GaussianMean(dim=2))
    assert model_digest(GaussianMean()) != first
