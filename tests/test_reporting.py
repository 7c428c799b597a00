"""fedpenalty.reporting, what the scenario scripts share: runs, spread, distances and the two
files every scenario writes."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from scipy import stats

from fedpenalty import __version__, reporting
from fedpenalty.errors import InvalidRequest

TINY = {
    "model": {"name": "gaussian_mean"},
    "data": {"owners": 2, "n_per_owner": 200},
    "privacy": {"budget_epsilon": 1e6},
    "sampler": {"algorithm": "penalty", "chains": 2, "warmup": 5, "iterations": 20, "step": 0.05},
    "run": {"transport": "inprocess", "progress": False, "seed": 3},
}


def test_simulate_runs_the_library_simulation(tmp_path):
    sim = reporting.simulate(TINY, tmp_path / "run")
    assert sim.result.stopped is None and sim.stopped == ()
    assert sim.result.theta.shape == (2, 20, 1)
    assert sim.scenario["run"]["seed"] == 3 and sim.seconds > 0
    assert (tmp_path / "run" / "attempt-0" / "privacy.json").is_file()


def test_simulate_retries_a_stopped_run_and_gives_up_loudly(tmp_path, monkeypatch):
    """Every attempt that an owner stops (here: each run's result carries an owner's refusal)
    is retried with the next seed; when all stop, the error lists each seed and message."""
    real = reporting.run_scenario

    def stopped_run(scenario, out):
        result = real(scenario, out)
        return dataclasses.replace(result, stopped=InvalidRequest("refused on purpose", "o-0"))

    monkeypatch.setattr(reporting, "run_scenario", stopped_run)
    with pytest.raises(RuntimeError, match="refused on purpose") as info:
        reporting.simulate(TINY, tmp_path / "run", retries=1)
    assert "'seed': 3" in str(info.value)
    assert f"'seed': {3 + reporting.RETRY_SEED_STEP}" in str(info.value)


def test_spread_ignores_missing_values():
    s = reporting.spread([1.0, None, 3.0, math.nan])
    assert s == {"mean": 2.0, "sd": pytest.approx(math.sqrt(2.0)), "n": 2, "values": [1.0, 3.0]}
    assert reporting.spread([None])["mean"] is None
    assert reporting.spread([5.0])["sd"] == 0.0


def test_quantile_distance_is_small_for_draws_of_the_distribution_and_not_otherwise():
    """20,000 exact draws: W1 and KS of order 1/√m (limits at ~5× that); a shift by 0.5 sd
    shows up as W1 ≈ 0.5 and KS ≈ Φ(0.25) − Φ(−0.25) ≈ 0.197."""
    dist = stats.norm(1.0, 2.0)
    draws = dist.rvs(size=20_000, random_state=np.random.default_rng(0))
    d = reporting.quantile_distance(draws, dist)
    assert d["w1"] < 5 * 2.0 / math.sqrt(20_000) and d["ks"] < 5 / math.sqrt(20_000)
    shifted = reporting.quantile_distance(draws + 1.0, dist)
    assert shifted["w1"] == pytest.approx(1.0, abs=0.05)
    assert shifted["ks"] == pytest.approx(0.197, abs=0.02)


def test_write_report_writes_json_and_png(tmp_path):
    fig, axes = reporting.figure(1, 1)
    reporting.errorbar(axes[0, 0], [1.0, 2.0], [[1.0, 2.0], [None, None]], label="a")
    reporting.log_x(axes[0, 0], [1.0, 2.0])
    json_path, png_path = reporting.write_report(
        tmp_path / "out",
        "demo",
        argv=["--quick"],
        settings={"x": np.float64(1.5), "path": tmp_path},
        results={"values": np.array([1.0, np.inf]), "n": np.int64(3)},
        notes=["a note"],
        fig=fig,
    )
    report = json.loads(json_path.read_text())
    assert report["scenario"] == "demo" and report["fedpenalty_version"] == __version__
    assert report["command"] == ["python", "scenarios/demo.py", "--quick"]
    assert report["settings"] == {"x": 1.5, "path": str(tmp_path)}
    assert report["results"] == {"values": [1.0, None], "n": 3}
    assert report["notes"] == ["a note"]
    assert png_path.read_bytes()[:4] == b"\x89PNG"
