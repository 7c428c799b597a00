"""Simulated owners' ledgers store spend, not answers (docs/design.md §4, "The ledger's parts"):
every charge, key and digest is recorded in one transaction per charge, but the float answers
are not; a re-asked key gets its answer recomputed from the seeded noise — the answer a ledger
that stores it replays —, is not charged again, and a different query at it is still refused.
"""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from fedpenalty.cluster.local import LocalCluster
from fedpenalty.common import Policy
from fedpenalty.coordinator.grpc_oracle import GrpcOracle
from fedpenalty.coordinator.inprocess import InProcessOracle
from fedpenalty.errors import ReplayConflict
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerNode

MODEL = build_model({"name": "gaussian_mean"})
RECORDS = [MODEL.simulate_records(np.random.default_rng(k), np.array([0.2]), 300) for k in range(4)]
CHAINS = np.arange(3)
THETA = np.array([[0.0], [0.1], [-0.1]])
STEPS = [THETA + 0.05, THETA - 0.04, THETA + 0.03]


def owners(path, simulated: bool) -> tuple[InProcessOracle, Ledger]:
    """Four owners of the same seeds on one ledger at ``path``."""
    ledger = Ledger.simulation(path) if simulated else Ledger(path, synchronous="NORMAL")
    seeds = np.random.SeedSequence(5).spawn(len(RECORDS))
    nodes = [
        OwnerNode(
            f"o{k}",
            MODEL,
            r,
            Policy(sigma=1.5, max_step=0.2, budget_epsilon=1e6),
            ledger,
            np.random.default_rng(s),
        )
        for k, (r, s) in enumerate(zip(RECORDS, seeds))
    ]
    return InProcessOracle(nodes), ledger


def ask(oracle: InProcessOracle, t: int, chains: np.ndarray = CHAINS) -> np.ndarray:
    return oracle.log_ratio(t, chains, THETA[chains], STEPS[t][chains]).values


def stored_bytes(path) -> int:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT SUM(length(payload)) FROM answer_blocks").fetchone()[0]


def test_a_simulated_ledger_recomputes_what_a_storing_ledger_replays(tmp_path):
    """Same seeds, one ledger storing answers and one not: the same answers, fresh and re-asked
    (after the owners restart on their ledgers), the same charges, and no answer bytes on the
    simulated ledger's file (the storing one holds 4 owners × 3 chains × 2 iterations × 8)."""
    runs = {}
    for simulated in (False, True):
        path = tmp_path / f"{simulated}.sqlite"
        oracle, ledger = owners(path, simulated)
        oracle.open_session("penalty", 10, session="s")
        first = [ask(oracle, t) for t in (0, 1)]
        ledger.close()
        oracle, ledger = owners(path, simulated)  # restarted on the same ledger
        oracle.open_session("penalty", 10, session="s")
        again = [ask(oracle, t) for t in (0, 1, 2)]
        reports = [(r.session.answers, r.session.epsilon) for r in oracle.privacy_reports()]
        ledger.close()
        runs[simulated] = first, again, reports, stored_bytes(path)
    for k in range(2):
        np.testing.assert_array_equal(runs[True][0][k], runs[False][0][k])
        np.testing.assert_array_equal(runs[True][1][k], runs[True][0][k])  # replay = answer
    np.testing.assert_array_equal(runs[True][1][2], runs[False][1][2])
    assert runs[True][2] == runs[False][2]  # charged once: 3 chains × 3 iterations each
    assert [answers for answers, _ in runs[True][2]] == [9] * 4
    assert runs[True][3] == 0 and runs[False][3] == 4 * 3 * 3 * 8


def test_a_partly_answered_request_charges_only_its_new_keys(tmp_path):
    """Chains 0 and 1 answered at iteration 0, then all three asked: the two are recomputed
    (equal to the first answers) and uncharged, chain 2 is new and charged."""
    oracle, ledger = owners(tmp_path / "l.sqlite", True)
    oracle.open_session("penalty", 10, session="s")
    two = ask(oracle, 0, np.arange(2))
    three = ask(oracle, 0)
    np.testing.assert_array_equal(three[:, :2], two)
    assert [r.session.answers for r in oracle.privacy_reports()] == [3] * 4
    ledger.close()


def test_a_different_query_at_an_answered_key_is_still_refused(tmp_path):
    """The ledger keeps the digests: a re-asked key with another θ' is a ReplayConflict."""
    oracle, ledger = owners(tmp_path / "l.sqlite", True)
    oracle.open_session("penalty", 10, session="s")
    ask(oracle, 0)
    with pytest.raises(ReplayConflict):
        oracle.log_ratio(0, CHAINS, THETA, STEPS[1])
    assert [r.session.answers for r in oracle.privacy_reports()] == [3] * 4
    ledger.close()


def test_local_grpc_owner_hosts_keep_simulated_ledgers(tmp_path):
    """A local gRPC simulation's owner hosts hold simulated owners: their ledgers record every
    charge and key but no answer bytes (they stored every answer before: 8 bytes each)."""
    policies = [Policy(sigma=1.5, max_step=0.2, budget_epsilon=1e6)] * len(RECORDS)
    seeds = np.random.SeedSequence(5).spawn(len(RECORDS))
    with LocalCluster.start(tmp_path, MODEL, RECORDS, policies, seeds, hosts=1) as cluster:
        oracle = GrpcOracle(cluster.addresses, MODEL)
        try:
            oracle.open_session("penalty", 10, session="s")
            for t in (0, 1):
                oracle.log_ratio(t, CHAINS, THETA, STEPS[t])
            answers = [r.session.answers for r in oracle.privacy_reports()]
        finally:
            oracle.close()
    (ledger,) = tmp_path.glob("*.sqlite")
    assert answers == [6] * len(RECORDS)
    assert stored_bytes(ledger) == 0
