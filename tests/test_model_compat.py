"""The coordinator's check of a remote owner's described model (fedpenalty.models.compat): it
compares name and parameters with the scenario's model and never imports or looks up anything
the owner names."""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Any

import pytest

from fedpenalty.errors import ConfigError
from fedpenalty.models import build_model, check_owner_models
from fedpenalty.models.compat import check_owner_model

MODEL = build_model({"name": "gaussian_mean", "dim": 2, "data_bound": 3.0})


@dataclass(frozen=True)
class Described:
    """The fields of an OwnerDescription the check reads."""

    name: str
    model: Any
    model_params: Any
    model_digest: str = ""  # "": an older owner that sends none (not compared)


def test_an_owner_serving_the_scenarios_model_passes():
    check_owner_models([Described("alice", MODEL.name, MODEL.params())] * 2, MODEL)
    # the owner's JSON may carry an integer where the scenario has a float: resolved alike
    params = {**MODEL.params(), "data_bound": 3, "dim": 2.0}
    check_owner_model(Described("bob", "gaussian_mean", params), MODEL)


def test_a_hostile_module_path_is_refused_without_any_import(tmp_path, monkeypatch):
    """A description naming a module path (here one that would leave a mark when imported) is
    a different model: refused by name, nothing imported, no registry consulted."""
    mark = tmp_path / "imported"
    (tmp_path / "h5_hostile_probe.py").write_text(
        f"import pathlib\npathlib.Path({str(mark)!r}).write_text('imported')\n"
        "def system(*args):\n    raise SystemExit(1)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    def no_import(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"the check imported {args[0]!r}")

    monkeypatch.setattr(importlib, "import_module", no_import)
    for hostile in ("os:system", "h5_hostile_probe:system", "h5_hostile_probe", "GaussianMean"):
        with pytest.raises(ConfigError) as info:
            check_owner_models([Described("mallory", hostile, MODEL.params())], MODEL)
        assert str(info.value) == (
            f"owner 'mallory' serves model {hostile!r}, the scenario asks for 'gaussian_mean'"
        )
    assert not mark.exists() and "h5_hostile_probe" not in sys.modules


@pytest.mark.parametrize("name", [None, 3, ["gaussian_mean"], {"name": "gaussian_mean"}])
def test_a_model_name_that_is_not_a_string_is_refused(name):
    with pytest.raises(ConfigError, match="owner 'mallory' serves model"):
        check_owner_model(Described("mallory", name, MODEL.params()), MODEL)


@pytest.mark.parametrize(
    "params,message",
    [
        ({**MODEL.params(), "noise_sd": 2.0}, "different gaussian_mean parameters: noise_sd: "),
        ({"dim": 1}, "different gaussian_mean parameters: data_bound: owner 4.0 vs scenario 3.0"),
        ({**MODEL.params(), "__class__": "os:system"}, "cannot build: .*unknown key '__class__'"),
        ({**MODEL.params(), "dim": "os:system"}, "cannot build: .*'dim' must be an integer"),
        (["os:system"], "not a table of named keys"),
        ({1: 2.0}, "not a table of named keys"),
        ("os:system", "not a table of named keys"),
    ],
)
def test_different_or_malformed_parameters_are_refused_by_name(params, message):
    with pytest.raises(ConfigError, match=message):
        check_owner_models([Described("carol", "gaussian_mean", params)], MODEL)
