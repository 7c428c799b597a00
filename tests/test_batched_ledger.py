"""A batched simulated ledger (``Ledger.simulation(batched=True)``, the in-process transport's)
commits its Gaussian charges in groups, at ``flush`` at the latest (docs/design.md §4, "The
ledger's parts"): the same answers and charges as a ledger that commits each charge, nothing in
the file before a flush, and a run that loses its unflushed charges (a crash after its last
checkpoint) charges each re-asked key exactly once when it resumes.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedpenalty import run_session
from fedpenalty.common import Policy
from fedpenalty.coordinator.inprocess import InProcessOracle
from fedpenalty.errors import ReplayConflict
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerNode
from fedpenalty.simulation import simulate

MODEL = build_model({"name": "gaussian_mean"})
RECORDS = [MODEL.simulate_records(np.random.default_rng(k), np.array([0.2]), 200) for k in range(3)]
CHAINS = np.arange(2)
THETA = np.array([[0.0], [0.1]])


def owners(path, batched: bool) -> tuple[InProcessOracle, Ledger]:
    """Three simulated owners of fixed seeds on one simulated ledger at ``path``."""
    ledger = Ledger.simulation(path, batched=batched)
    seeds = np.random.SeedSequence(7).spawn(len(RECORDS))
    nodes = [
        OwnerNode.simulated(
            f"o{k}", MODEL, r, Policy(sigma=1.5, max_step=0.2, budget_epsilon=1e6), ledger, s
        )
        for k, (r, s) in enumerate(zip(RECORDS, seeds))
    ]
    oracle = InProcessOracle(nodes)
    oracle.open_session("penalty", 40, session="s")
    return oracle, ledger


def ask(oracle: InProcessOracle, t: int, shift: float = 0.0) -> np.ndarray:
    """Iteration ``t``'s log-ratios at a step that depends on ``t`` (and ``shift``)."""
    return oracle.log_ratio(t, CHAINS, THETA, THETA + 0.01 * (t % 5 + 1) + shift).values


def committed(path) -> list[int]:
    """Each owner's answers as a reader of the file sees them."""
    reader = Ledger(path, read_only=True)
    try:
        return [r.total.answers for r in reader.reports(["o0", "o1", "o2"], None)]
    finally:
        reader.close()


def test_batched_charges_equal_per_charge_ones_and_reach_the_file_at_flush(tmp_path):
    """Ten iterations each way: equal answers and reports; the batched file holds none of
    them until ``persist`` (which a checkpoint calls), then all 2 chains × 10 per owner."""
    plain, plain_ledger = owners(tmp_path / "plain.sqlite", batched=False)
    batched, batched_ledger = owners(tmp_path / "batched.sqlite", batched=True)
    for t in range(10):
        np.testing.assert_array_equal(ask(batched, t), ask(plain, t))
    assert committed(tmp_path / "plain.sqlite") == [20] * 3
    assert committed(tmp_path / "batched.sqlite") == [0] * 3
    batched.persist()
    assert committed(tmp_path / "batched.sqlite") == [20] * 3
    reports = [(r.session.answers, r.session.epsilon) for r in batched.privacy_reports()]
    assert reports == [(r.session.answers, r.session.epsilon) for r in plain.privacy_reports()]
    plain_ledger.close()
    batched_ledger.close()


def test_charges_lost_after_the_last_flush_are_charged_once_on_resume(tmp_path):
    """Iterations 0–5 flushed (a checkpoint at 6), 6–8 lost (a crash: their pending blocks
    never reach the file); resumed from the checkpoint, the owners answer 6–9 with the same
    noise as before and charge them once: 2 chains × 10 iterations per owner, as an
    uninterrupted run."""
    path = tmp_path / "l.sqlite"
    oracle, ledger = owners(path, batched=True)
    first = [ask(oracle, t) for t in range(6)]
    oracle.persist()
    first += [ask(oracle, t) for t in range(6, 9)]
    ledger.store._pending.clear()  # the crash: what was pending never reaches the file
    ledger.close()
    oracle, ledger = owners(path, batched=True)
    assert [r.session.answers for r in oracle.privacy_reports()] == [12] * 3
    for t in range(6, 9):
        np.testing.assert_array_equal(ask(oracle, t), first[t])
    ask(oracle, 9)
    assert [r.session.answers for r in oracle.privacy_reports()] == [20] * 3
    ledger.close()


def test_a_pending_key_is_replayed_uncharged_and_a_different_query_at_it_refused(tmp_path):
    """An answered key whose block is still pending: the same query is recomputed and not
    charged again; another θ′ at it is a ReplayConflict."""
    oracle, ledger = owners(tmp_path / "l.sqlite", batched=True)
    answer = ask(oracle, 0)
    np.testing.assert_array_equal(ask(oracle, 0), answer)
    with pytest.raises(ReplayConflict):
        ask(oracle, 0, shift=0.02)
    assert [r.session.answers for r in oracle.privacy_reports()] == [2] * 3
    ledger.close()


def test_every_checkpoint_of_a_simulation_is_backed_by_its_committed_ledger(tmp_path, monkeypatch):
    """An in-process ``simulate`` checkpointing every 10 iterations: whenever a checkpoint is
    written, the ledger file (read by another connection, as after a crash) already holds
    every owner's 4 chains × the iterations done — a resume from it charges nothing less."""
    seen = []
    save = run_session.checkpoint.save

    def checked(path, progress):
        (ledger,) = (tmp_path / "run").rglob("ledger.sqlite")
        seen.append((progress.done, committed_of(ledger)))
        save(path, progress)

    monkeypatch.setattr(run_session.checkpoint, "save", checked)
    simulate(
        None,
        {
            "run.transport": "inprocess",
            "sampler.algorithm": "penalty",
            "sampler.chains": 4,
            "sampler.iterations": 30,
            "sampler.warmup": 10,
            "run.checkpoint_every": 10,
        },
        out=tmp_path / "run",
        progress=False,
    )
    assert [done for done, _ in seen] == [10, 20, 30, 40]
    for done, answers in seen:
        assert len(answers) == 4 and all(a >= 4 * done for a in answers), (done, answers)


def committed_of(path) -> list[int]:
    """Every owner's answers in the ledger file at ``path`` as another reader sees them."""
    reader = Ledger(path, read_only=True)
    try:
        names = [row[0] for row in reader.store.db.execute("SELECT DISTINCT owner FROM sessions")]
        return [r.total.answers for r in reader.reports(names, None)]
    finally:
        reader.close()
