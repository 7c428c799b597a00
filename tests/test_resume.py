"""A run that crashes and resumes from its checkpoint gives exactly the chain of an
uninterrupted run, and no owner answer is charged twice (docs/design.md §3 invariant 2, §4).

The owners crash too: the resumed run talks to owners rebuilt from the same seeds on the same
ledger files. The iterations between the checkpoint and the crash are answered from the
ledgers' replay cache; later keys get fresh noise, which simulated owners address by
(session, chain, iteration) (``SeededNormals``), so it is what the uninterrupted run drew.
"""

from __future__ import annotations

import numpy as np
import pytest
from owners import kernel

from fedpenalty.common import Policy
from fedpenalty.coordinator import checkpoint
from fedpenalty.coordinator.driver import sample
from fedpenalty.coordinator.inprocess import InProcessOracle
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerNode

MODEL = build_model({"name": "bernoulli", "theta_bound": 4.0})
RECORDS = [MODEL.simulate_records(np.random.default_rng(k), np.array([0.3]), 500) for k in range(3)]
ITERATIONS, WARMUP = 120, 30


class Crash(Exception):
    pass


class CrashingOracle:
    """Forwards to ``oracle`` and raises after ``calls`` queries (a coordinator crash)."""

    def __init__(self, oracle, calls: int):
        self.oracle, self.left = oracle, calls

    def __getattr__(self, name):
        return getattr(self.oracle, name)

    def _count(self):
        self.left -= 1
        if self.left < 0:
            raise Crash

    def log_ratio(self, *args):
        self._count()
        return self.oracle.log_ratio(*args)

    def suff_stats(self, *args):
        self._count()
        return self.oracle.suff_stats(*args)


def owners(tmp_path, name: str) -> InProcessOracle:
    ledger = Ledger(tmp_path / f"{name}.sqlite", synchronous="NORMAL")
    seeds = np.random.SeedSequence(11).spawn(len(RECORDS))
    return InProcessOracle(
        [
            OwnerNode(
                f"o{k}",
                MODEL,
                r,
                Policy(sigma=2.0, max_step=0.2, budget_epsilon=1e6),
                ledger,
                np.random.default_rng(s),
            )
            for k, (r, s) in enumerate(zip(RECORDS, seeds))
        ]
    )


def run(oracle, algorithm: str, **kwargs):
    theta0 = np.random.default_rng(3).uniform(-0.5, 0.5, (3, 1))
    algo = kernel(
        algorithm,
        MODEL,
        oracle=oracle,
        n_total=1500,
        step=0.2,
        block=4 if algorithm == "penalty_expfam" else 1,
    )
    return sample(
        algo,
        np.random.default_rng(5),
        theta0,
        iterations=ITERATIONS,
        warmup=WARMUP,
        progress=False,
        **kwargs,
    )


@pytest.mark.parametrize("algorithm", ["penalty", "penalty_expfam"])
def test_resumed_chain_equals_uninterrupted_chain(tmp_path, algorithm):
    reference_oracle = owners(tmp_path, "reference")
    reference_oracle.open_session(algorithm, 10**5, session="run")
    reference = run(reference_oracle, algorithm)
    reference_answers = [r.session.answers for r in reference_oracle.privacy_reports()]

    crashed = owners(tmp_path, "crashed")
    session = crashed.open_session(algorithm, 10**5, session="run")
    path = tmp_path / "checkpoint.npz"
    with pytest.raises(Crash):  # checkpoints every 25 iterations, crash between two of them
        run(
            CrashingOracle(crashed, calls=100 if algorithm == "penalty" else 20),
            algorithm,
            checkpoint=lambda p: checkpoint.save(path, p),
            checkpoint_every=25,
        )
    saved = checkpoint.load(path)
    assert 0 < saved.done < ITERATIONS + WARMUP
    crashed.host.nodes[0].ledger.close()  # the owners' process ends with the coordinator's
    oracle = owners(tmp_path, "crashed")  # restarted owners: same seeds, same ledger file
    oracle.open_session(algorithm, 10**5, session=session)  # the resumed coordinator re-opens it
    resumed = run(oracle, algorithm, resume=saved)

    np.testing.assert_array_equal(resumed.theta, reference.theta)
    np.testing.assert_array_equal(resumed.accepted, reference.accepted)
    assert [r.session.answers for r in oracle.privacy_reports()] == reference_answers


@pytest.mark.parametrize("algorithm", ["penalty", "penalty_expfam"])
def test_a_run_interrupted_during_warmup_adapts_on_exactly(tmp_path, algorithm):
    """A crash in the middle of warmup, while the step is still adapting: the checkpoint holds
    the adaptation state, and the resumed run adapts to the very step of the uninterrupted one
    and then draws its chain, answer for answer, with nothing charged twice."""
    reference_oracle = owners(tmp_path, "reference")
    reference_oracle.open_session(algorithm, 10**5, session="run")
    reference = run(reference_oracle, algorithm)
    reference_answers = [r.session.answers for r in reference_oracle.privacy_reports()]
    assert reference.state.tuning.count == WARMUP and reference.state.tuning.step < 0.2

    crashed = owners(tmp_path, "crashed")
    session = crashed.open_session(algorithm, 10**5, session="run")
    path = tmp_path / "checkpoint.npz"
    with pytest.raises(Crash):  # checkpoints every 10 iterations, crash inside the warmup
        run(
            CrashingOracle(crashed, calls=25 if algorithm == "penalty" else 5),
            algorithm,
            checkpoint=lambda p: checkpoint.save(path, p),
            checkpoint_every=10,
        )
    saved = checkpoint.load(path)
    assert 0 < saved.done < WARMUP and saved.state.tuning.count == saved.done
    assert saved.state.tuning.h_avg != 0.0  # the adaptation is under way
    crashed.host.nodes[0].ledger.close()
    oracle = owners(tmp_path, "crashed")
    oracle.open_session(algorithm, 10**5, session=session)
    resumed = run(oracle, algorithm, resume=saved)

    assert resumed.state.tuning == reference.state.tuning
    np.testing.assert_array_equal(resumed.theta, reference.theta)
    np.testing.assert_array_equal(resumed.accepted, reference.accepted)
    assert [r.session.answers for r in oracle.privacy_reports()] == reference_answers
