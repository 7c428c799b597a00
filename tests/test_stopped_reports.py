"""A run that stops because an owner host (a real ``owner serve`` process killed with SIGKILL)
or a Ray actor became unreachable writes privacy.json with the report of every owner that still
answers and, under ``unreported``, the unreachable ones: name, status, why, and the answers the
coordinator received from them — never an ε of its own making; the console names them."""

from __future__ import annotations

import json

import pytest
from ray_support import wait_until_dead
from test_grpc_deploy import deploy, report, run_and_kill_bob, scenario

from fedpenalty.cluster.ray_hosts import RayHosts
from fedpenalty.common import PrivacyReport
from fedpenalty.config import load_scenario
from fedpenalty.coordinator.oracle import Unreported
from fedpenalty.errors import OwnerUnavailable
from fedpenalty.owner import Ledger
from fedpenalty.simulation import run_scenario

CHAINS = 2  # scenario() of test_grpc_deploy: 2 chains, every proposal inside Θ


@pytest.mark.slow
def test_an_owner_killed_mid_run_is_reported_unreachable_and_the_others_report(tmp_path, procs):
    owners = deploy(tmp_path, procs, {"sigma": 1.0, "max_step": 0.02, "budget_epsilon": 1000.0})
    out = tmp_path / "run"
    log = run_and_kill_bob(
        tmp_path, procs, owners, scenario(tmp_path, 6000, checkpoint_every=50), out
    )  # retry_seconds = 2
    bob = owners["bob"]
    assert "Traceback" not in log, log

    privacy = json.loads((out / "privacy.json").read_text())
    assert [o["owner"] for o in privacy["owners"]] == ["alice", "carol"]
    for o in privacy["owners"]:  # still serving: their own ledgers' figures, as they report them
        offline = report(owners[o["owner"]], tmp_path)
        assert o["answers"] == offline["answers"] > 0
        assert o["epsilon"] == pytest.approx(offline["epsilon"], rel=1e-12)
    (gone,) = privacy["unreported"]
    assert gone["owner"] == "bob" and gone["status"] == "unreachable"
    assert "unreachable" in gone["error"] and f"127.0.0.1:{bob['port']}" in gone["error"]
    assert "epsilon" not in gone  # no figure the coordinator made up
    # bob's ledger (read offline) charged what the coordinator received, plus at most the one
    # request in flight when it died (charged, its reply lost): one answer per chain
    charged = report(bob, tmp_path)["answers"]
    assert 0 < gone["answers_received"] <= charged <= gone["answers_received"] + CHAINS
    # the other owners answered every iteration bob answered, and no more than one beyond
    assert gone["answers_received"] <= privacy["owners"][0]["answers"]

    said = log[log.index("No privacy report") :]
    assert "No privacy report from 1 owner" in said and "bob: unreachable" in said
    assert f"{gone['answers_received']} answers received before" in said
    assert "alice" in log and "carol" in log  # the reachable owners' table


def test_a_killed_ray_actor_leaves_the_other_actors_reports(tmp_path, ray_session, monkeypatch):
    """5 owners in 2 Ray actors (3 + 2); actor 1 is killed at iteration 60: owners 0–2 report
    (their ledger's figures), owners 3 and 4 are unreachable (Ray counts no answers)."""
    import ray

    answer = RayHosts.answer
    calls = {"log_ratio": 0}

    def killing(self, query):
        if query[0] == "log_ratio":  # (kind, session, iteration, chains, arrays)
            calls["log_ratio"] += 1
            if calls["log_ratio"] == 61:
                ray.kill(self.actors[1])
                wait_until_dead(self.actors[1])  # ray.kill is asynchronous
        return answer(self, query)

    monkeypatch.setattr(RayHosts, "answer", killing)
    settings = [
        "data.owners=5",
        "data.n_per_owner=800",
        "sampler.iterations=150",
        "sampler.warmup=50",
        "run.progress=false",
        "run.transport='ray'",
        "run.ray_actors=2",
    ]
    result = run_scenario(load_scenario(None, settings), tmp_path / "run")
    assert isinstance(result.stopped, OwnerUnavailable)
    privacy = json.loads((result.out / "privacy.json").read_text())
    assert privacy == result.privacy
    assert [o["owner"] for o in privacy["owners"]] == ["owner-0", "owner-1", "owner-2"]
    ledger = Ledger(result.out / "owners" / "ray-0.sqlite", read_only=True)
    try:
        for o in privacy["owners"]:
            assert o["answers"] == ledger.total(o["owner"]).answers == 4 * 61
    finally:
        ledger.close()
    assert [u["owner"] for u in privacy["unreported"]] == ["owner-3", "owner-4"]
    for u in privacy["unreported"]:
        assert u["status"] == "unreachable" and "Ray actor 1" in u["error"]
        assert u["answers_received"] is None and "epsilon" not in u


def test_unreported_owners_take_their_place_in_privacy_json_and_the_console():
    """privacy_summary keeps each reachable owner's report and lists the others apart."""
    from fedpenalty.cli import unreported_lines
    from fedpenalty.common import Policy, SpendReport
    from fedpenalty.coordinator.algorithms import ALGORITHMS
    from fedpenalty.simulation import privacy_summary

    spend = SpendReport(10, 0.5, 1.2, 3.0, "gdp")
    reported = PrivacyReport("a", 100, 1e-5, 10.0, "replace_one", spend, spend)
    lost = Unreported("b", "unreachable", "owner host x is unreachable", 42)
    scenario_ = load_scenario(None, [])
    summary = privacy_summary(
        [reported, lost], [Policy(sigma=1.0)] * 2, ALGORITHMS["penalty"], scenario_
    )
    assert [o["owner"] for o in summary["owners"]] == ["a"]
    assert summary["owners"][0]["epsilon"] == 1.2 and summary["delta"] == 1e-5
    assert summary["unreported"] == [
        {
            "owner": "b",
            "status": "unreachable",
            "error": "owner host x is unreachable",
            "answers_received": 42,
        }
    ]
    text = unreported_lines(summary["unreported"])
    assert "No privacy report from 1 owner " in text and "b: unreachable; 42 answers" in text
