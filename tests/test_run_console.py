"""What the commands print: a secure-aggregation run shows what protects the owners (s, t, the K
each counted, the noise each added and ε from its own noise alone) instead of a per-owner σ it
does not use; the README's commands with a plausible mistake each fail in one line that names
what to change (and an owner that cannot serve leaves no ledger behind)."""

from __future__ import annotations

import json

import pytest
import tomli_w

from fedpenalty.cli import main

SECURE = [
    "--set", "run.transport='inprocess'", "--set", "privacy.aggregation='secure'",
    "--set", "privacy.total_noise_sd=1.0", "--set", "privacy.colluders=1",
    "--set", "data.owners=3", "--set", "data.n_per_owner=2000",
    "--set", "sampler.iterations=100", "--set", "sampler.warmup=20", "--set", "sampler.chains=2",
    "--set", "sampler.step=0.02", "--set", "privacy.budget_epsilon=100.0", "--no-progress",
]  # fmt: skip


def test_a_secure_run_prints_s_t_and_the_own_noise_epsilon(capsys, tmp_path):
    code = main(["simulate", *SECURE, "--out", str(tmp_path / "run")])
    out, err = capsys.readouterr()
    assert code == 0, err
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    lines = out.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("owner"))
    assert header.split()[:6] == ["owner", "n", "s", "t", "K", "own"]  # "own sd"
    assert "sigma" not in header and "eps own noise" in header
    assert "simulated peers its noise sd s = 1 protects each while at most t = 1 owners" in out
    assert all(o["peers"] == "simulated" for o in privacy["owners"])
    assert "3 owner(s) on simulated peers" in privacy["assumption"]
    for o in privacy["owners"]:
        row = next(line for line in lines if line.startswith(o["owner"]))
        cells = row.split()
        assert cells[2:6] == ["1", "1", "3", f"{o['owner_noise_sd']:.4g}"]
        assert f"{o['epsilon']:.4g}" in cells and f"{o['epsilon_own_noise_only']:.4g}" in cells
        assert "n/a" not in cells[:8]  # only the paper's bound, which does not apply, is n/a


def _owner_file(tmp_path, **server) -> str:
    """The README's OWNER.toml without TLS on loopback, its records beside it."""
    (tmp_path / "records.csv").write_text("x\n0.1\n0.2\n")
    owner = {
        "model": {"name": "gaussian_mean", "dim": 1, "data_bound": 3.0, "theta_bound": 2.0},
        "data": {"path": "records.csv"},
        "privacy": {"sigma": 1.0, "max_step": 0.00125, "budget_epsilon": 10.0},
        "server": {"name": "hospital-a", "listen": "127.0.0.1:50051", **server},
    }
    path = tmp_path / "OWNER.toml"
    path.write_text(tomli_w.dumps(owner))
    return str(path)


@pytest.mark.parametrize(
    "mistake,args,message",
    [
        ("no records", [], "data.path: no file at {tmp}/records.csv"),
        ("a port alone", ["--listen", "50051"], "server.listen (or --listen): '50051' is not "
         "HOST:PORT"),
        ("a port out of range", ["--listen", "localhost:99999"], "'localhost:99999' is not "
         "HOST:PORT with a port from 0 to 65535"),
        ("no certificate", ["tls"], "server.tls_cert: no file at {tmp}/a.example.org.crt"),
    ],
)  # fmt: skip
def test_owner_serve_mistakes_name_the_key_and_leave_no_ledger(
    capsys, tmp_path, mistake, args, message
):
    tls = {"tls_cert": "a.example.org.crt", "tls_key": "a.example.org.key"}
    path = _owner_file(tmp_path, **(tls if args == ["tls"] else {}))
    if mistake == "no records":
        (tmp_path / "records.csv").unlink()
    code = main(["owner", "serve", path, *(a for a in args if a != "tls")])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1, err
    assert message.format(tmp=tmp_path.resolve()) in err
    assert not list(tmp_path.glob("*.sqlite*"))  # refused before any ledger was made


def test_coordinator_mistakes_name_the_flag(capsys, tmp_path):
    scenario = tmp_path / "s.toml"
    scenario.write_text("[sampler]\niterations = 10\n")
    code = main(["run", str(scenario), "--owners", "a.example.org", "--out", str(tmp_path / "r")])
    _, err = capsys.readouterr()
    assert code == 2 and "--owners: 'a.example.org' is not HOST:PORT" in err
    tls = ["--tls-cert", "c.crt", "--tls-key", "c.key", "--tls-ca", "ca.crt"]
    code = main(["run", str(scenario), "--owners", "a:1", *tls])
    _, err = capsys.readouterr()
    assert code == 2 and "--tls-cert c.crt: no such file" in err
    assert not (tmp_path / "r").exists()


def test_a_plan_no_answer_of_which_fits_does_not_suggest_zero_iterations(capsys, tmp_path):
    """penalty_expfam at σ = 1 (its default is 550): one answer already passes the budget, so
    the refusal suggests a budget or σ, not "at most 0" iterations."""
    code = main(
        ["simulate", "--set", "sampler.algorithm='penalty_expfam'", "--set", "privacy.sigma=1.0",
         "--set", "run.transport='inprocess'", "--out", str(tmp_path / "r"), "--no-progress"]
    )  # fmt: skip
    _, err = capsys.readouterr()
    assert code == 2 and "privacy.sigma ≥" in err and "privacy.budget_epsilon ≥" in err
    assert "fewer answers" not in err and "≤ 0" not in err
