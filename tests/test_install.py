"""A slim install: the core (``pip install -e .``) has neither Ray nor scikit-learn; the
extras ``[ray]`` and ``[scenarios]`` bring them, ``[test]`` brings both. Without them the
command line, ``owner serve`` and ``simulate`` work, and asking for what they provide is a
one-line error naming the extra. A missing package is simulated by ``sys.modules[name] =
None``, which makes every ``import name`` fail as an uninstalled package does."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from fedpenalty.cli import main

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
#: A quick in-process simulation (the embedded default scenario, fewer records and draws).
QUICK = [
    *("--set", "data.n_per_owner=2000", "--set", "sampler.iterations=40"),
    *("--set", "sampler.warmup=10", "--set", "run.transport='inprocess'", "--no-progress"),
]


def _names(requirements: list[str]) -> set[str]:
    return {r.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip() for r in requirements}


def test_the_core_install_leaves_out_ray_and_scikit_learn_and_the_extras_bring_them():
    core = _names(PYPROJECT["dependencies"])
    extras = PYPROJECT["optional-dependencies"]
    assert not {"ray", "scikit-learn"} & core
    assert "ray" in _names(extras["ray"]) and "scikit-learn" in _names(extras["scenarios"])
    assert "fedpenalty[ray,scenarios]" in extras["test"]  # the README's test command gets both


def test_the_command_line_simulate_and_owner_serve_import_neither():
    """What an owner machine and the default simulation load: no Ray, no scikit-learn."""
    code = (
        "import sys\n"
        "import fedpenalty.cli, fedpenalty.simulation, fedpenalty.owner.server\n"
        "import fedpenalty.owner.owner_config, fedpenalty.coordinator.transports\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'ray', 'sklearn'}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.fixture
def without_ray_and_sklearn(monkeypatch):
    for name in ("ray", "sklearn"):
        monkeypatch.setitem(sys.modules, name, None)


def test_simulate_runs_without_ray_and_the_ray_transport_names_its_extra(
    without_ray_and_sklearn, capsys, tmp_path
):
    assert main(["simulate", *QUICK, "--out", str(tmp_path / "core")]) == 0, capsys.readouterr()
    assert (tmp_path / "core" / "posterior.nc").is_file()
    capsys.readouterr()
    out = tmp_path / "ray"
    code = main(["simulate", *QUICK, "--set", "run.transport='ray'", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("fedpenalty: error: run.transport = 'ray'")
    assert "pip install 'fedpenalty[ray]'" in err and "run.transport" in err
    assert not out.exists()  # refused before anything was made


def test_connecting_to_ray_without_it_names_the_extra(without_ray_and_sklearn):
    """Scenario scripts reach Ray through ``connect_ray`` directly."""
    from fedpenalty.cluster.ray_hosts import connect_ray
    from fedpenalty.errors import ConfigError

    with pytest.raises(ConfigError, match=r"pip install 'fedpenalty\[ray\]'"):
        connect_ray("")


def test_the_scikit_learn_scenario_names_its_extra(without_ray_and_sklearn, capsys, tmp_path):
    from test_scenarios import load

    assert load("wang_logistic").main(["--quick", "--no-progress", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'fedpenalty[scenarios]'" in err
    assert not any(tmp_path.iterdir())
