"""What a deployed owner is told about itself, and only itself: ``fedpenalty owner report``
breaks its spend down by session (each session's ε alone, from the accountant the serving
owner uses, and the total), and both its log and its report say how many of its records were
clipped into the model's data domain when loaded — which the coordinator never learns
(docs/design.md §3, invariant 4)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from grpc_processes import free_port, run_cli, write_owner
from owners import save_csv
from test_outputs import files_not_in_readme

from fedpenalty.models import build_model

MODEL_TABLE = {"name": "gaussian_mean", "dim": 1, "data_bound": 4.0, "theta_bound": 4.0}
MODEL = build_model(MODEL_TABLE)
SCENARIO = """
[model]
name = "gaussian_mean"
dim = 1
data_bound = 4.0
theta_bound = 4.0

[sampler]
algorithm = "penalty"
chains = 2
iterations = {iterations}
warmup = 0
step = 0.02
init_scale = 0.1

[run]
seed = {seed}
retry_seconds = 2.0
"""


@pytest.mark.slow
def test_owner_report_gives_each_session_and_the_clipped_records(tmp_path, procs):
    records = MODEL.simulate_records(np.random.default_rng(0), np.array([0.7]), 2000)
    records[:7, 0] = 10.0  # seven records outside the data domain |x| ≤ 4: clipped on load
    clipped = int(np.sum(np.abs(records[:, 0]) > 4.0))
    assert clipped >= 7
    data = tmp_path / "alice.csv"
    save_csv(data, records, MODEL)
    port = free_port()
    privacy = {"sigma": 1.0, "max_step": 0.02, "budget_epsilon": 500.0}
    toml = write_owner(tmp_path, "alice", data, port, privacy, MODEL_TABLE)
    procs.owner(toml, port)

    said, runs = [], []
    for seed, iterations in ((1, 100), (2, 250)):  # two studies against the same owner
        (tmp_path / f"s{seed}.toml").write_text(SCENARIO.format(iterations=iterations, seed=seed))
        out = tmp_path / f"run{seed}"
        done = run_cli(
            "run", f"s{seed}.toml", "--owners", f"127.0.0.1:{port}", "--out", str(out),
            "--no-progress", cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        said.append(done.stdout + done.stderr)
        runs.append(json.loads((out / "privacy.json").read_text())["owners"][0])

    done = run_cli("owner", "report", str(toml), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    sessions = report["sessions"]
    assert len(sessions) == 2
    for row, run in zip(sessions, runs):
        # each session's own ε is the figure the owner reported to that run
        assert row["kind"] == "penalty" and row["closed"]
        assert row["answers"] == run["answers"] == 2 * (100 if row is sessions[0] else 250)
        assert row["epsilon"] == pytest.approx(run["epsilon"], rel=1e-9)
        assert row["accountant"] == run["accountant"] == "rdp"
    # the total composes both sessions: more than either, less than their sum (μ² adds)
    assert report["epsilon"] == pytest.approx(runs[1]["ledger_epsilon"], rel=1e-9)
    assert (
        max(r["epsilon"] for r in sessions)
        < report["epsilon"]
        < sum(r["epsilon"] for r in sessions)
    )
    assert report["answers"] == sum(r["answers"] for r in sessions)
    assert (report["records"], report["records_clipped"]) == (2000, clipped)

    done = run_cli("owner", "report", str(toml), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    line = f"{clipped} of 2000 records in {data} were clipped into the gaussian_mean model's"
    assert line in done.stdout
    assert "spend by session" in done.stdout
    table = done.stdout.split("spend by session")[1]
    assert all(s["session"] in table for s in sessions) and "total" in table
    assert line in (tmp_path / "alice.log").read_text()  # the owner's own log says it at start
    for text in said:  # ... and the coordinator is never told
        assert "clipped" not in text
    for out in ("run1", "run2"):
        for name in ("privacy.json", "diagnostics.json"):
            assert "clipped" not in (tmp_path / out / name).read_text()
        assert files_not_in_readme(tmp_path / out) == []  # a deployed run's files are listed
