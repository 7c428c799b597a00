"""What ``fedpenalty simulate`` prints about the owners' privacy: a secure-aggregation run shows
what protects the owners (s, t, the K each counted, the noise each added and ε from its own
noise alone) instead of a per-owner σ it does not use."""

from __future__ import annotations

import json

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
    assert "s = 1 protects each owner while at most t = 1 owners collude" in out
    for o in privacy["owners"]:
        row = next(line for line in lines if line.startswith(o["owner"]))
        cells = row.split()
        assert cells[2:6] == ["1", "1", "3", f"{o['owner_noise_sd']:.4g}"]
        assert f"{o['epsilon']:.4g}" in cells and f"{o['epsilon_own_noise_only']:.4g}" in cells
        assert "n/a" not in cells[:8]  # only the paper's bound, which does not apply, is n/a
