"""Per-owner privacy rows of a run with many owners (docs/design.md §5): past
``MAX_JSON_OWNERS`` owners every owner's entry is in privacy_owners.npz and privacy.json keeps
a summary (min/median/max ε, owners over budget, the worst entries); up to it, privacy.json is
written as before and no other file."""

from __future__ import annotations

import json

import numpy as np

from fedpenalty import cli_print, privacy_rows, run_cost
from fedpenalty.coordinator.cost import cost_line
from fedpenalty.privacy_rows import MAX_JSON_OWNERS, OWNERS_FILE, WORST_OWNERS, privacy_json
from fedpenalty.simulation import simulate


def entries(count: int) -> list[dict]:
    """``count`` owner entries with distinct ε (a permutation), owner 7 over its budget."""
    eps = np.random.default_rng(0).permutation(count) / 100.0
    return [
        {
            "owner": f"owner-{k}",
            "n": 100 + k,
            "epsilon": float(eps[k]),
            "mu": None if k == 3 else 0.5,
            "accountant": "gdp",
            "ledger_epsilon": 99.0 if k == 7 else float(eps[k]),
            "budget_epsilon": 20.0,
        }
        for k in range(count)
    ]


def test_up_to_the_threshold_privacy_json_is_unchanged_and_no_file_is_written(tmp_path):
    privacy = {"delta": 1e-5, "owners": entries(MAX_JSON_OWNERS)}
    assert privacy_json(privacy, tmp_path) is privacy
    assert not (tmp_path / OWNERS_FILE).exists()


def test_past_the_threshold_every_owner_is_in_the_columns_and_json_keeps_a_summary(tmp_path):
    owners = entries(MAX_JSON_OWNERS + 1)
    written = privacy_json({"delta": 1e-5, "owners": owners}, tmp_path)
    with np.load(tmp_path / OWNERS_FILE) as columns:  # plain arrays: no pickle needed
        assert columns["owner"].tolist() == [o["owner"] for o in owners]
        assert columns["n"].dtype == np.int64 and columns["n"].tolist() == [o["n"] for o in owners]
        np.testing.assert_array_equal(columns["epsilon"], [o["epsilon"] for o in owners])
        assert np.isnan(columns["mu"][3]) and columns["mu"][4] == 0.5
    eps = np.array([o["epsilon"] for o in owners])
    summary = written["owners_summary"]
    assert summary["owners"] == MAX_JSON_OWNERS + 1
    assert (summary["epsilon_min"], summary["epsilon_max"]) == (eps.min(), eps.max())
    assert summary["epsilon_median"] == float(np.median(eps))
    assert summary["over_budget"] == 1 and summary["over_budget_owners"] == ["owner-7"]
    shown = [o["epsilon"] for o in written["owners"]]
    assert shown == sorted(eps, reverse=True)[:WORST_OWNERS]
    assert written["owners_file"] == OWNERS_FILE and written["delta"] == 1e-5
    assert len(json.dumps(written)) < 5_000  # independent of the number of owners


def test_a_run_past_the_threshold_writes_the_columns_the_console_names(
    tmp_path, monkeypatch, capsys
):
    """A simulated run of 25 owners with the threshold at 21: privacy.json has the summary of
    the run's own reports, privacy_owners.npz every owner's, diagnostics.json's simulation
    counters are totals over the owners, and the console's summary names the file and says no
    owner is over its budget."""
    monkeypatch.setattr(privacy_rows, "MAX_JSON_OWNERS", 21)
    monkeypatch.setattr(cli_print, "MAX_JSON_OWNERS", 21)
    monkeypatch.setattr(run_cost, "MAX_JSON_OWNERS", 21)
    result = simulate(
        None,
        ["data.owners=25", "data.n_per_owner=200", "sampler.iterations=30", "sampler.warmup=10",
         "run.transport='inprocess'"],
        tmp_path / "run",
        progress=False,
    )  # fmt: skip
    on_disk = json.loads((result.out / "privacy.json").read_text())
    owners = result.privacy["owners"]
    assert len(owners) == 25 and on_disk["owners_summary"]["owners"] == 25
    with np.load(result.out / OWNERS_FILE) as columns:
        np.testing.assert_array_equal(columns["epsilon"], [o["epsilon"] for o in owners])
        assert columns["answers"].tolist() == [o["answers"] for o in owners]
    assert on_disk["owners_summary"]["epsilon_max"] == max(o["epsilon"] for o in owners)
    assert len(on_disk["owners"]) == WORST_OWNERS
    simulation_only = result.diagnostics["simulation_only"]  # totals, not per-owner lists
    assert simulation_only["per_owner"] is False and simulation_only["owners"] == 25
    assert simulation_only["answered_from_sufficient_statistics"] == 25
    said = cli_print.privacy_overview(result.privacy)
    assert f"(every owner's row is in {OWNERS_FILE})" in said and "over their budget" not in said
    cost = json.loads((result.out / "cost.json").read_text())  # cost rows likewise
    assert cost["owners"] == [] and cost["owners_summary"]["owners"] == 25
    with np.load(result.out / run_cost.COST_OWNERS_FILE) as columns:
        sent = [row["bytes_sent"] for row in result.cost["owners"]]
        assert columns["bytes_sent"].tolist() == sent
    assert cost["owners_summary"]["bytes_sent"]["max"] == max(sent)
    assert cost_line(cost) == cost_line(result.cost)  # the console's figures per owner
    capsys.readouterr()
