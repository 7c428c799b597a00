"""The scaling scenario (scenarios/scaling.py) at tiny settings: its rows have exactly the
promised keys, and at a fixed per-owner σ the penalty's acceptance does not increase with K
(the total noise variance Σσ_k² = Kσ² grows; docs/design.md §2.1).

Seeds are fixed, so the figures are deterministic. Tolerance: each acceptance rate is a mean of
4 chains × 300 decisions, whose binomial sd is at most 0.015 (more with the chains'
autocorrelation); 0.04 of slack between neighbouring K is about the noise of two such rates,
while the expected fall from K = 2 to K = 64 (s² = 0.125 → 4: the pure-noise acceptance
2Φ(−s/2) falls from 0.86 to 0.32) is far beyond the 0.15 asked for.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[1] / "scenarios" / "scaling.py"
_SPEC = importlib.util.spec_from_file_location("scaling", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
scaling = importlib.util.module_from_spec(_SPEC)
sys.modules["scaling"] = scaling
_SPEC.loader.exec_module(scaling)

KEYS = {
    "model",
    "owners",
    "transport",
    "iterations_per_second",
    "startup_seconds",
    "open_seconds",
    "peak_rss_bytes",
    "acceptance_rate",
    "epsilon_min",
    "epsilon_median",
    "epsilon_max",
    "error_in_sd",
}


def test_rows_have_the_keys_and_acceptance_does_not_grow_with_the_owners(tmp_path):
    out = tmp_path / "rows.json"
    flags = ["--owners=2,16,64", "--transports=inprocess", "--models=gaussian_mean"]
    tiny = ["--n-per-owner=200", "--sigma=0.25", "--iterations=300", "--warmup=50"]
    assert scaling.main([*flags, *tiny, "--json", str(out), "--plot", str(tmp_path / "s.png")]) == 0
    rows = json.loads(out.read_text())
    assert [r["owners"] for r in rows] == [2, 16, 64]
    for row in rows:
        assert set(row) == KEYS
        assert (row["model"], row["transport"]) == ("gaussian_mean", "inprocess")
        assert row["iterations_per_second"] > 0 and row["startup_seconds"] >= 0
        assert 0 <= row["open_seconds"] <= row["startup_seconds"]
        assert row["peak_rss_bytes"] > 0
        assert 0 < row["epsilon_min"] <= row["epsilon_median"] <= row["epsilon_max"]
        assert row["error_in_sd"] >= 0
    acceptance = [r["acceptance_rate"] for r in rows]
    assert all(later <= earlier + 0.04 for earlier, later in zip(acceptance, acceptance[1:]))
    assert acceptance[-1] <= acceptance[0] - 0.15
    assert (tmp_path / "s.png").stat().st_size > 0


def test_the_legend_covers_no_data():
    """Six lines (two models × three transports): the legend sat inside the acceptance panel,
    over its lines; now it is one legend below both panels, overlapping neither."""
    rows = [
        {"model": m, "transport": t, "owners": k, "iterations_per_second": 100 / k,
         "acceptance_rate": 0.5 - 0.05 * i}
        for m in ("gaussian_mean", "bernoulli")
        for t in ("inprocess", "grpc", "ray")
        for i, k in enumerate((10, 100, 1000, 10000))
    ]  # fmt: skip
    fig = scaling.figure(rows)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    assert len(legends) == 1 and len(legends[0].get_texts()) == 6
    box = legends[0].get_window_extent(renderer)
    for ax in fig.axes:
        assert not box.overlaps(ax.get_tightbbox(renderer)), "the legend overlaps a panel"


def test_footprint_adds_the_run_directory_and_the_ratio_to_the_numpy_floor(tmp_path):
    """``--footprint``: each row also has the owners' files in MB (their ledger: a few pages,
    non-zero) and its rate over the numpy floor (a positive ratio, below 1: the floor does no
    validation, ledger or transport)."""
    out = tmp_path / "rows.json"
    flags = ["--owners=4", "--transports=inprocess", "--models=gaussian_mean", "--footprint"]
    tiny = ["--n-per-owner=200", "--sigma=0.25", "--iterations=40", "--warmup=10"]
    assert scaling.main([*flags, *tiny, "--json", str(out)]) == 0
    [row] = json.loads(out.read_text())
    assert set(row) == KEYS | {"run_directory_mb", "ratio_to_numpy_floor"}
    assert 0 < row["run_directory_mb"] < 5 and 0 < row["ratio_to_numpy_floor"] < 1


def test_each_throughput_repetition_is_divided_by_its_own_floor(tmp_path, capsys, monkeypatch):
    """scenarios/throughput.py with ``--repeat`` and ``--clock cpu``: every measurement is
    divided by the floor of its own repetition (measured just before it), and the spread table
    lists each row's median and range."""
    monkeypatch.syspath_prepend(str(_PATH.parent))
    import throughput

    monkeypatch.setattr(throughput, "clock", throughput.clock)  # main sets it: restored after
    out = tmp_path / "rows.json"
    flags = ["--owners", "2", "--models", "gaussian_mean", "--seconds", "0.05"]
    flags += ["--transports", "numpy-floor,inprocess", "--clock", "cpu", "--repeat", "2"]
    assert throughput.main([*flags, "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["transport"], r["repeat"]) for r in rows] == [
        ("numpy-floor", 0), ("inprocess", 0), ("numpy-floor", 1), ("inprocess", 1)
    ]  # fmt: skip
    for floor, row in (rows[0:2], rows[2:4]):
        ratio = row["iterations_per_second"] / floor["iterations_per_second"]
        assert row["ratio_to_numpy_floor"] == ratio and row["clock"] == "cpu"
    printed = capsys.readouterr().out
    assert "median × floor" in printed and "inprocess" in printed.split("median × floor")[1]
