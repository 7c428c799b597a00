"""Sessions of several kinds, and the sub-step in the answer key (docs/design.md §4, "Sessions of
several kinds"): each kind of a session is keyed, replayed and charged apart, at any sub-step,
and the kinds' plans are admitted jointly."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from fedpenalty.common import Policy
from fedpenalty.coordinator.inprocess import InProcessOracle
from fedpenalty.errors import BudgetExhausted, InvalidRequest, NotPermitted, ReplayConflict
from fedpenalty.kinds import KindTerms
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerHost, OwnerNode
from fedpenalty.owner.session_request import SessionRequest

MODEL = build_model({"name": "gaussian_mean", "dim": 2, "data_bound": 3.0, "theta_bound": 2.0})
RECORDS = MODEL.simulate_records(np.random.default_rng(1), np.array([0.3, -0.2]), 500)
POLICY = Policy(sigma=2.0, max_step=0.05, budget_epsilon=500.0, delta=1e-5)
CHAINS = np.array([0, 1])
THETA = np.array([[0.1, 0.0], [0.0, 0.1]])
PROPOSED = THETA + 0.01


def oracle(tmp_path, name: str = "o", policy: Policy = POLICY) -> InProcessOracle:
    ledger = Ledger(tmp_path / f"{name}.sqlite", synchronous="NORMAL")
    nodes = [
        OwnerNode(f"{name}{k}", MODEL, RECORDS, policy, ledger, np.random.default_rng(7 + k))
        for k in range(2)
    ]
    return InProcessOracle(nodes)


def ask(o: InProcessOracle, kind: str, iteration: int, substep: int, shift: float = 0.0):
    """One query of ``kind`` (log_ratio or gradient) for both chains."""
    if kind == "log_ratio":
        arrays = {"theta": THETA, "theta_prop": PROPOSED + shift}
    else:
        arrays = {"theta": THETA + shift, "clip": 1.0}
    return o.query(kind, iteration, CHAINS, substep=substep, **arrays).values


def test_a_session_of_two_kinds_answers_both_at_several_substeps_and_replays_each(tmp_path):
    o = oracle(tmp_path)
    session = o.open_kinds([KindTerms("log_ratio", 20), KindTerms("gradient", 20, 0.1)])
    answers = {}
    for kind in ("log_ratio", "gradient"):
        for substep in range(3):
            answers[kind, substep] = ask(o, kind, 0, substep)
    for kind in ("log_ratio", "gradient"):
        assert not np.array_equal(answers[kind, 0], answers[kind, 1])  # fresh noise per key
        for substep in range(3):  # a replay releases exactly what was released
            np.testing.assert_array_equal(ask(o, kind, 0, substep), answers[kind, substep])
    ledger = o.host.nodes[0].ledger
    per_kind = ledger.kind_spend(["o0", "o1"], session)
    for spend in per_kind:
        assert set(spend) == {"penalty", "sgmcmc"}
        assert spend["penalty"][0].answers == 6 and spend["penalty"][1] == []
        assert spend["sgmcmc"][0].answers == 0
        assert [e.count for e in spend["sgmcmc"][1]] == [6]
    # the session's report is the sum of its kinds
    report = ledger.reports(["o0"], session)[0]
    assert report.session is not None and report.session[0].answers == 6
    assert report.session[1][0].count == 6


def test_each_kind_is_charged_at_its_own_event(tmp_path):
    """A session of two kinds charges each kind exactly what a session of that kind alone
    charges for the same keys."""
    both = oracle(tmp_path, "both")
    session = both.open_kinds([KindTerms("log_ratio", 20), KindTerms("gradient", 20, 0.1)])
    alone = {kind: oracle(tmp_path, kind) for kind in ("log_ratio", "gradient")}
    alone["log_ratio"].open_session("log_ratio", 20, session="a")
    alone["gradient"].open_session("gradient", 20, session="a", sampling_rate=0.1)
    for kind, single in alone.items():
        for substep in range(2):
            ask(both, kind, 3, substep)
            ask(single, kind, 3, substep)
    spend = both.host.nodes[0].ledger.kind_spend(["both0"], session)[0]
    for kind, ledger_name in (("log_ratio", "penalty"), ("gradient", "sgmcmc")):
        recorded = alone[kind].host.nodes[0].ledger.session(f"{kind}0", "a")
        assert recorded is not None
        assert spend[ledger_name] == (recorded.spend, recorded.sampled)


def test_a_repeated_key_with_a_different_request_is_refused(tmp_path):
    o = oracle(tmp_path)
    o.open_kinds([KindTerms("log_ratio", 20), KindTerms("gradient", 20, 0.1)])
    for kind in ("log_ratio", "gradient"):
        ask(o, kind, 5, 2)
        with pytest.raises(ReplayConflict, match="sub-step 2"):
            ask(o, kind, 5, 2, shift=0.001)
        ask(o, kind, 5, 3, shift=0.001)  # another sub-step is another key


def test_a_joint_plan_past_the_budget_is_refused_although_each_kind_fits(tmp_path):
    policy = Policy(sigma=2.0, max_step=0.05, budget_epsilon=200.0, delta=1e-5)
    o = oracle(tmp_path, policy=policy)
    node = o.host.nodes[0]
    plans = {}
    for kind in ("log_ratio", "suff_stats"):
        unit = node.worst_case_mu(kind)
        plans[kind] = int(0.6 * node.max_mu_squared / unit**2)
        assert plans[kind] > 0
    terms = [KindTerms(kind, n) for kind, n in plans.items()]
    with pytest.raises(BudgetExhausted, match=r"penalty answers and .* penalty_expfam answers"):
        o.open_kinds(terms, session="joint")
    assert node.ledger.kind_spend(["o0"], "joint") == [{}]  # nothing recorded
    for kind, n in plans.items():  # each alone fits
        o.open_session(kind, n, session=f"alone-{kind}")
        o.close()


def test_a_session_keeps_its_kinds(tmp_path):
    o = oracle(tmp_path)
    session = o.open_kinds([KindTerms("log_ratio", 20), KindTerms("gradient", 20, 0.1)])
    with pytest.raises(InvalidRequest, match="other query kinds"):
        o.open_session("log_ratio", 20, session=session)
    # resumed with the same kinds and terms
    assert (
        o.open_kinds([KindTerms("log_ratio", 20), KindTerms("gradient", 20, 0.1)], session=session)
        == session
    )
    ask(o, "log_ratio", 0, 1)
    o.close()
    with pytest.raises(Exception, match="closed"):
        o.open_kinds([KindTerms("log_ratio", 20), KindTerms("gradient", 20, 0.1)], session)


def test_substep_zero_is_the_key_and_noise_of_a_session_of_one_kind(tmp_path):
    a, b = oracle(tmp_path, "a"), oracle(tmp_path, "b")
    for o in (a, b):
        o.open_session("log_ratio", 20, session="s")
    first = a.log_ratio(4, CHAINS, THETA, PROPOSED).values
    np.testing.assert_array_equal(ask(b, "log_ratio", 4, 0), first)
    with pytest.raises(InvalidRequest, match="substep"):
        ask(a, "log_ratio", 4, -1)


def test_the_owner_report_lists_a_session_once_per_kind(tmp_path):
    o = oracle(tmp_path)
    session = o.open_kinds([KindTerms("log_ratio", 20), KindTerms("gradient", 20, 0.1)])
    ask(o, "log_ratio", 0, 0)
    rows = o.host.nodes[0].ledger.sessions("o0")
    assert [(r.session, r.algorithm, r.spend.answers) for r in rows] == [
        (session, "penalty", 2),
        (session, "sgmcmc", 0),
    ]


def test_a_ledger_of_release_0_1_0_reads_at_substep_0_and_takes_sessions_of_several_kinds(
    tmp_path,
):
    fixture = Path(__file__).resolve().parent / "fixtures" / "ledger_0.1.0.sqlite"
    copy = tmp_path / "old.sqlite"
    shutil.copy(fixture, copy)
    reader = Ledger(copy, read_only=True)  # no sub-step column: every stored answer is at 0
    try:
        assert not reader.store.substeps
        owner = reader.store.db.execute("SELECT owner FROM sessions LIMIT 1").fetchone()[0]
        sessions = {s.session for s in reader.sessions(owner)}
        assert sessions
        for session in sessions:
            at_zero = reader.stored([owner], session, 0, 10**6)
            assert reader.stored_at([owner], session, 0, 10**6, 0) == at_zero
            assert reader.stored_at([owner], session, 0, 10**6, 1) == {}
    finally:
        reader.close()
    ledger = Ledger(copy, synchronous="NORMAL")  # the writer's migration adds the column
    assert ledger.store.substeps
    node = OwnerNode("new", MODEL, RECORDS, POLICY, ledger, np.random.default_rng(3))
    o = InProcessOracle([node])
    o.open_kinds([KindTerms("log_ratio", 20), KindTerms("gradient", 20, 0.1)], "mk")
    first = ask(o, "log_ratio", 0, 1)
    np.testing.assert_array_equal(ask(o, "log_ratio", 0, 1), first)
    ledger.close()


def test_the_opener_of_a_session_of_several_kinds_is_recorded(tmp_path):
    ledger = Ledger(tmp_path / "l.sqlite", synchronous="NORMAL")
    node = OwnerNode("o", MODEL, RECORDS, POLICY, ledger, np.random.default_rng(3))
    host = OwnerHost([node])
    terms = (KindTerms("log_ratio", 20), KindTerms("gradient", 20, 0.1))
    host.open(SessionRequest("mk", terms, client="alice"))
    assert host.session_opener("mk") == "alice"
    with pytest.raises(NotPermitted, match="another client"):
        host.open(SessionRequest("mk", terms, client="mallory"))
    ledger.close()


def test_the_ledger_records_the_step_each_kind_declared(tmp_path):
    """As before sessions of several kinds: None when a session declares no max_step (the
    resume of a session recorded by an earlier release compares with it)."""
    o = oracle(tmp_path)
    o.open_session("log_ratio", 20, session="one")
    o.open_kinds([KindTerms("log_ratio", 20, None, 0.02), KindTerms("suff_stats", 20)], "two")
    db = o.host.nodes[0].ledger.store.db
    steps = dict(db.execute("SELECT session, max_step FROM sessions WHERE owner='o0'"))
    assert steps == {"one": None, "two\x1fpenalty": 0.02, "two\x1fpenalty_expfam": None}
