"""The command line and scenario files: outputs, reference numbers, and clear errors."""

from __future__ import annotations

import json
import sqlite3
import tomllib

import numpy as np
import pytest
from owners import save_csv

from fedpenalty.cli import main
from fedpenalty.config import load_scenario, resolve
from fedpenalty.models import build_model

SMALL = [
    "--set",
    "run.transport='inprocess'",
    "--set",
    "data.n_per_owner=2000",
    "--set",
    "sampler.iterations=300",
    "--set",
    "sampler.warmup=50",
    "--set",
    "sampler.step=0.02",
    "--set",
    "privacy.budget_epsilon=1000",
    "--no-progress",
]


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "sigma,queries,delta,expected",
    [
        (1.0, 1, 1e-5, 4.3771780957),
        (2.0, 1, 1e-5, 1.9930914044),
        (10.0, 1, 1e-5, 0.3406693647),
        (5.0, 1, 1e-6, 0.8341175486),
        (10.0, 100, 1e-5, 4.3771780957),
    ],
)
def test_account_reference_values(capsys, sigma, queries, delta, expected):
    code, out, _ = run_cli(
        capsys,
        "account",
        "--sigma",
        str(sigma),
        "--sensitivity",
        "1",
        "--queries",
        str(queries),
        "--delta",
        str(delta),
        "--json",
    )
    assert code == 0
    result = json.loads(out)
    assert result["epsilon"] == pytest.approx(expected, rel=1e-9)
    assert (
        result["epsilon_paper_bound"] is None or result["epsilon_paper_bound"] > result["epsilon"]
    )


def test_account_calibrates_sigma(capsys):
    code, out, _ = run_cli(
        capsys,
        "account",
        "--epsilon",
        "1",
        "--sensitivity",
        "1",
        "--queries",
        "1",
        "--delta",
        "1e-5",
        "--json",
    )
    assert code == 0 and json.loads(out)["sigma"] == pytest.approx(3.73063163, rel=1e-8)


def test_account_text_shows_both_accountings(capsys):
    code, out, _ = run_cli(
        capsys,
        "account",
        "--sigma",
        "50",
        "--sensitivity",
        "1",
        "--queries",
        "10000",
        "--delta",
        "1e-5",
    )
    assert code == 0 and "exact" in out and "paper's bound" in out


@pytest.mark.parametrize(
    "args,message",
    [
        (["--sensitivity", "1", "--queries", "1", "--delta", "1e-5"], "exactly one of --sigma"),
        (["--sigma", "1", "--epsilon", "1"], "exactly one of --sigma"),
        (["--sigma", "1", "--delta", "0"], "--delta"),
        (["--sigma", "1", "--queries", "0"], "--queries"),
        (["--sigma", "-1"], "sigma"),
    ],
)
def test_account_errors(capsys, args, message):
    code, _, err = run_cli(capsys, "account", *args)
    assert code == 2 and message in err


def test_simulate_writes_the_run_directory(capsys, tmp_path):
    out = tmp_path / "run"
    code, stdout, _ = run_cli(capsys, "simulate", *SMALL, "--out", str(out))
    assert code == 0, stdout
    assert "owner-3" in stdout and "eps@1e-05" in stdout and "ess_bulk" in stdout
    with np.load(out / "samples.npz") as samples:
        assert samples["theta"].shape == (4, 300, 1)
    privacy = json.loads((out / "privacy.json").read_text())
    assert privacy["delta"] == 1e-5 and len(privacy["owners"]) == 4
    for owner in privacy["owners"]:
        assert {
            "owner",
            "n",
            "answers",
            "mu",
            "epsilon",
            "epsilon_paper_bound",
            "budget_epsilon",
        } <= set(owner)
        assert 0 < owner["answers"] <= 4 * 350 and owner["epsilon"] > 0
    diagnostics = json.loads((out / "diagnostics.json").read_text())
    for key in ("acceptance_rate", "ess_bulk", "rhat", "posterior_mean", "posterior_sd"):
        assert key in diagnostics
    assert set(diagnostics["reference"]) >= {"mean", "sd"}
    config = tomllib.loads((out / "config.toml").read_text())
    assert config["sampler"]["iterations"] == 300 and config["model"]["name"] == "gaussian_mean"
    assert resolve(config)["data"]["n_per_owner"] == 2000  # the resolved config reloads
    assert (out / "trace.png").stat().st_size > 0


def test_simulate_refuses_a_non_empty_run_directory(capsys, tmp_path):
    (tmp_path / "keep.txt").write_text("x")
    code, _, err = run_cli(capsys, "simulate", *SMALL, "--out", str(tmp_path))
    assert code == 2 and "not empty" in err
    assert (tmp_path / "keep.txt").read_text() == "x"


def test_simulate_from_csv_files(capsys, tmp_path):
    model = build_model({"name": "logistic", "dim": 2})
    rng = np.random.default_rng(0)
    paths = []
    for k in range(3):
        path = tmp_path / f"owner{k}.csv"
        save_csv(path, model.simulate_records(rng, np.array([1.0, -1.0]), 300), model)
        paths.append(str(path))
    scenario = tmp_path / "s.toml"
    scenario.write_text(
        f'[model]\nname = "logistic"\ndim = 2\n[data]\npaths = {json.dumps(paths)}\n'
        "[privacy]\nsigma = [1.0, 2.0, 3.0]\nbudget_epsilon = 1e6\n"
        '[sampler]\niterations = 200\nwarmup = 20\nstep = 0.2\n[run]\ntransport = "inprocess"\n'
    )
    code, stdout, _ = run_cli(
        capsys, "simulate", str(scenario), "--out", str(tmp_path / "run"), "--no-progress"
    )
    assert code == 0, stdout
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert [o["n"] for o in privacy["owners"]] == [300, 300, 300]
    assert [o["sigma"] for o in privacy["owners"]] == [1.0, 2.0, 3.0]
    diagnostics = json.loads((tmp_path / "run" / "diagnostics.json").read_text())
    assert diagnostics["reference"]["source"] == "importance_sampling"


@pytest.mark.parametrize(
    "text,message",
    [
        ("[modle]\nname='bernoulli'", "unknown section [modle]"),
        ("[sampler]\nsteps = 3", "unknown key sampler.steps"),
        ("[sampler]\nchains = 0", "sampler.chains must be a positive integer"),
        ("[sampler]\nalgorithm = 'gibbs'", "sampler.algorithm must be one of"),
        ("[privacy]\ndelta = 2", "privacy.delta must be a number strictly between 0 and 1"),
        ("[privacy]\nsigma = [1.0, 2.0]", "privacy.sigma lists 2 values for 4 owners"),
        ("[privacy]\nsigma = -1.0", "privacy.sigma must be a positive finite number"),
        ("[privacy]\nneighbour = 'swap'", "privacy.neighbour must be one of"),
        ("[model]\nname = 'weibull'", "model.name must be one of"),
        ("[model]\nname = 'bernoulli'\ndim = 2", "dim"),
        (
            "[model]\nname = 'logistic'\n[sampler]\nalgorithm = 'penalty_expfam'",
            "exponential-family",
        ),
        ("[data]\ntrue_theta = 99.0", "true_theta must lie inside"),
        ("[data]\nsource = 'files'", "needs data.paths"),
        ("[sampler]\nstep = 0.5\n[privacy]\nmax_step = 0.1", "exceeds privacy.max_step"),
        ("[sampler\nchains = 2", "not valid TOML"),
    ],
)
def test_scenario_errors_name_the_problem(capsys, tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    code, _, err = run_cli(
        capsys, "simulate", str(path), "--out", str(tmp_path / "run"), "--no-progress"
    )
    assert code == 2 and message in err, err
    assert not (tmp_path / "run").exists()


def test_override_errors_and_missing_files(capsys, tmp_path):
    code, _, err = run_cli(
        capsys, "simulate", "--set", "sampler.chain=3", "--out", str(tmp_path / "r")
    )
    assert code == 2 and "unknown key sampler.chain" in err
    code, _, err = run_cli(capsys, "simulate", "--set", "nonsense", "--out", str(tmp_path / "r"))
    assert code == 2 and "section.key=value" in err
    code, _, err = run_cli(capsys, "simulate", str(tmp_path / "missing.toml"))
    assert code == 2 and "cannot read scenario" in err


def test_a_binary_file_given_for_a_toml_file_is_named(capsys, tmp_path):
    """A ledger (SQLite) or another binary file passed where a scenario or owner file belongs
    is refused in one line that says what it is and, for the owner's report, where a ledger
    goes — not a UTF-8 decoding error."""
    ledger = tmp_path / "owner.sqlite"
    sqlite3.connect(ledger).execute("CREATE TABLE t (x)").connection.commit()
    binary = tmp_path / "posterior.nc"
    binary.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(range(256)))
    code, _, err = run_cli(capsys, "simulate", str(ledger), "--out", str(tmp_path / "r"))
    assert code == 2 and "is an SQLite database (an owner's ledger?), not a TOML scenario" in err
    code, _, err = run_cli(capsys, "simulate", str(binary), "--out", str(tmp_path / "r"))
    assert code == 2 and "is not a text file (a scenario is TOML)" in err, err
    code, _, err = run_cli(capsys, "owner", "report", str(ledger))
    assert code == 2 and "not a TOML owner file" in err and "with --ledger" in err, err
    assert not (tmp_path / "r").exists()


def test_malformed_data_files_are_reported(capsys, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("x\n1.0\nnot-a-number\n")
    code, _, err = run_cli(
        capsys,
        "simulate",
        "--set",
        f"data.paths=['{bad}']",
        "--set",
        "privacy.sigma=1.0",
        "--out",
        str(tmp_path / "r"),
        "--no-progress",
    )
    assert code == 2 and "bad.csv:3" in err and "not a number" in err
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("z\n1.0\n")
    code, _, err = run_cli(
        capsys, "simulate", "--set", f"data.paths=['{wrong}']", "--out", str(tmp_path / "r2")
    )
    assert code == 2 and "missing column(s) x" in err


def test_embedded_default_is_sized_for_single_digit_epsilon():
    """The default scenario's worst-case plan must fit each owner's budget and its typical
    spend must be single-digit ε (checked by running it in the simulate test of the README)."""
    s = load_scenario()
    assert (
        s["data"]["owners"] >= 4
        and s["sampler"]["chains"] >= 2
        and s["sampler"]["algorithm"] == "penalty"
    )
    assert s["privacy"]["delta"] == 1e-5 and s["privacy"]["budget_epsilon"] < 10.0 + 1e-9


def test_simulate_warns_before_the_run_of_a_key_this_run_does_not_read(monkeypatch, capsys):
    """``--set sampler.leapfrog_steps=3`` under penalty is named on stderr before anything
    runs (here the run itself is replaced by an error, so only the warning can precede it)."""
    import fedpenalty.simulation

    def refuse(*args, **kwargs):
        raise ValueError("not run in this test")

    monkeypatch.setattr(fedpenalty.simulation, "simulate", refuse)
    assert main(["simulate", "--set", "sampler.leapfrog_steps=3"]) == 2
    err = capsys.readouterr().err
    assert err.index("warning: sampler.leapfrog_steps (from --set) is read only by") < err.index(
        "fedpenalty: error: not run in this test"
    )
