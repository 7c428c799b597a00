"""The Python API (``fedpenalty.sample``): a scenario run from a notebook as ``fedpenalty
simulate`` runs it — the same function, the same draws, the same files — returned as an
ArviZ DataTree with the posterior, each owner's privacy and the diagnostics."""

from __future__ import annotations

import json
import warnings

import arviz_base
import arviz_stats
import numpy as np
import pytest
import xarray as xr

import fedpenalty
from fedpenalty.cli import main
from fedpenalty.errors import ConfigError

#: A quick in-process run of the embedded default scenario.
SMALL = {
    "data.n_per_owner": 2000,
    "sampler.iterations": 60,
    "sampler.warmup": 20,
    "run.transport": "inprocess",
}


def test_sample_returns_the_run_as_arviz_data(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # 60 draws: the chains have not mixed
        tree = fedpenalty.sample(overrides=SMALL, out=tmp_path / "run", progress=False)
    assert isinstance(tree, xr.DataTree)
    groups = {"posterior", "sample_stats", "privacy_spend", "reference", "privacy", "diagnostics"}
    assert groups <= set(tree.children)
    run = tmp_path / "run"
    theta = np.load(run / "samples.npz")["theta"]
    np.testing.assert_array_equal(tree["posterior"]["theta"].values, theta)
    privacy = json.loads((run / "privacy.json").read_text())
    assert list(tree["privacy"]["owner"].values) == [o["owner"] for o in privacy["owners"]]
    for key in ("epsilon", "mu", "answers", "budget_left", "delta"):
        assert list(tree["privacy"][key].values) == [o[key] for o in privacy["owners"]], key
    assert tree["privacy"].attrs["algorithm"] == "penalty"
    diagnostics = json.loads((run / "diagnostics.json").read_text())
    for key in ("rhat", "ess_bulk", "posterior_mean", "posterior_sd"):
        np.testing.assert_allclose(tree["diagnostics"][key].values, diagnostics[key])
    assert float(tree["diagnostics"]["acceptance_rate"]) == diagnostics["acceptance_rate"]
    assert list(tree["diagnostics"]["warnings"].values) == diagnostics["warnings"]
    # the file holds the same tree, and ArviZ reads both
    saved = arviz_base.convert_to_datatree(str(run / "posterior.nc"))
    assert set(saved.children) == set(tree.children)
    xr.testing.assert_identical(saved["privacy"].to_dataset(), tree["privacy"].to_dataset())
    summary = arviz_stats.summary(tree, round_to="none")
    assert summary.loc["theta[mu]", "mean"] == pytest.approx(diagnostics["posterior_mean"][0])


def test_sample_is_the_command(capsys, tmp_path):
    """The same scenario file and overrides (as ``--set`` strings) through the command and the
    API: the same draws and the same per-owner ε."""
    path = tmp_path / "mine.toml"
    path.write_text('[model]\nname = "bernoulli"\n[sampler]\nstep = 0.01\nchains = 2\n')
    sets = ["data.n_per_owner=3000", "sampler.iterations=50", "sampler.warmup=10"]
    sets.append("run.transport='inprocess'")
    args = [a for s in sets for a in ("--set", s)]
    assert main(["simulate", str(path), *args, "--no-progress", "--out", str(tmp_path / "a")]) == 0
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        tree = fedpenalty.sample(path, overrides=sets, out=tmp_path / "b", progress=False)
    np.testing.assert_array_equal(
        tree["posterior"]["theta"].values, np.load(tmp_path / "a" / "samples.npz")["theta"]
    )
    privacy = json.loads((tmp_path / "a" / "privacy.json").read_text())
    assert list(tree["privacy"]["epsilon"].values) == [o["epsilon"] for o in privacy["owners"]]
    assert tree["posterior"].attrs["model"] == "bernoulli"


def test_a_dict_scenario_runs_as_its_file_does(tmp_path):
    scenario = {
        "model": {"name": "poisson"},
        "data": {"n_per_owner": 1000, "owners": 3},
        "privacy": {"budget_epsilon": 1000.0},
        "sampler": {"step": 0.01, "chains": 2, "iterations": 40, "warmup": 10},
        "run": {"transport": "inprocess"},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        tree = fedpenalty.sample(scenario, out=tmp_path / "run", progress=False)
    assert tree["posterior"]["theta"].shape == (2, 40, 1)
    assert list(tree["privacy"]["owner"].values) == ["owner-0", "owner-1", "owner-2"]
    assert scenario["model"] == {"name": "poisson"}  # the caller's dict is left as it was


def test_sample_warns_as_the_command_does(tmp_path):
    """Chains that have not mixed are a RuntimeWarning with the command's warning line."""
    with pytest.warns(RuntimeWarning, match="the chains have not mixed"):
        fedpenalty.sample(overrides=SMALL, out=tmp_path / "run", progress=False)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"sampler.iterations": -1}, "sampler.iterations"),
        ({"iterations": 10}, "'section.key'"),
        ({"sampler.iteratons": 10}, "iteratons"),
    ],
)
def test_bad_input_is_refused_and_makes_nothing(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        fedpenalty.sample(overrides=overrides, out=tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
