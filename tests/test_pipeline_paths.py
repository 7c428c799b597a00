"""The answer pipeline's two paths (docs/design.md §4): a host whose owners share one ledger
file answers the usual request (nothing answered before) in one charging transaction; a host
over several ledger files, or a request with answered keys, takes the general path. Both must
give the same answers, charges and replays for the same owners, seeds and questions; and the
host's chain-id check refuses alike by either of its paths (few chains, many)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from fedpenalty.common import Policy
from fedpenalty.coordinator.inprocess import InProcessOracle
from fedpenalty.errors import InvalidRequest
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerNode

MODEL = build_model({"name": "gaussian_mean"})
RECORDS = [MODEL.simulate_records(np.random.default_rng(k), np.array([0.2]), 200) for k in range(4)]
THETA = np.array([[0.0], [0.1], [-0.1]])
PROPOSALS = [THETA + 0.05, THETA - 0.04]


def host(tmp_path, files: int) -> tuple[InProcessOracle, list[Ledger]]:
    """Four owners of fixed seeds, spread over ``files`` simulated ledger files."""
    ledgers = [Ledger.simulation(tmp_path / f"{files}-{j}.sqlite") for j in range(files)]
    seeds = np.random.SeedSequence(11).spawn(len(RECORDS))
    nodes = [
        OwnerNode(
            f"o{k}",
            MODEL,
            r,
            Policy(sigma=1.5, max_step=0.2, budget_epsilon=1e6),
            ledgers[k % files],
            np.random.default_rng(s),
        )
        for k, (r, s) in enumerate(zip(RECORDS, seeds))
    ]
    oracle = InProcessOracle(nodes)
    oracle.open_session("penalty", 100, session="s")
    return oracle, ledgers


def test_one_ledger_file_answers_and_charges_as_several_do(tmp_path):
    """Exact equality (same seeded noise, same charges): fresh answers at two iterations, a
    re-asked key replayed (recomputed) uncharged, and a request mixing an answered chain with
    new ones. A fast path that drew other noise, stored other rows or charged otherwise fails."""
    runs = {}
    for files in (1, 2):
        oracle, ledgers = host(tmp_path, files)
        assert len(oracle.host._pipeline.parts) == files
        fresh = [oracle.log_ratio(t, np.arange(3), THETA, PROPOSALS[t]).values for t in (0, 1)]
        spent = [r.session.epsilon for r in oracle.privacy_reports()]
        again = oracle.log_ratio(1, np.arange(3), THETA, PROPOSALS[1]).values
        assert [r.session.epsilon for r in oracle.privacy_reports()] == spent  # nothing charged
        # chain 2 asked again as at iteration 0, chains 3 and 4 new
        theta = np.vstack([THETA[2:], [[0.0], [0.05]]])
        proposal = np.vstack([PROPOSALS[0][2:], [[0.03], [0.02]]])
        mixed = oracle.log_ratio(0, np.arange(2, 5), theta, proposal)
        runs[files] = (fresh, again, mixed.values, [r.session for r in oracle.privacy_reports()])
        oracle.close()
        for ledger in ledgers:
            ledger.close()
    (fresh1, again1, mixed1, spend1), (fresh2, again2, mixed2, spend2) = runs[1], runs[2]
    np.testing.assert_array_equal(np.stack(fresh1), np.stack(fresh2))
    np.testing.assert_array_equal(again1, fresh1[1])
    np.testing.assert_array_equal(again2, fresh2[1])
    np.testing.assert_array_equal(mixed1, mixed2)
    np.testing.assert_array_equal(mixed1[:, 0], fresh1[0][:, 2])
    assert spend1 == spend2
    assert all(s.epsilon > 0 for s in spend1)


@pytest.mark.parametrize("size", [3, 40])  # Python ints below 17 chains, numpy's sort above
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda ids: np.r_[ids, ids[-1]], "distinct non-negative"),
        (lambda ids: np.r_[ids, -1], "distinct non-negative"),
        (lambda ids: np.r_[ids, 2**29], "below 2^29 = 536870912, got 536870912"),
    ],
)
def test_chain_ids_are_checked_alike_for_few_and_many_chains(tmp_path, size, change, message):
    """A repeated, negative or too large chain id is refused whatever the number of chains,
    and the same ids without it are accepted (``RequestChecks.chains``)."""
    oracle, ledgers = host(tmp_path, 1)
    checks = oracle.host._checks
    ids = np.arange(size)[::-1]
    np.testing.assert_array_equal(checks.chains(ids), ids)
    with pytest.raises(InvalidRequest, match=re.escape(message)):
        checks.chains(change(ids))
    oracle.close()
    ledgers[0].close()


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"theta_prop": THETA + 5.0}, "theta_prop lies outside Θ"),
        ({"theta": np.where(THETA == 0.0, np.nan, THETA)}, "theta contains NaN or inf"),
        ({"theta_prop": PROPOSALS[0][:2]}, r"theta_prop must have shape (3, 1), got (2, 1)"),
        ({"theta": [["a"], ["b"], ["c"]]}, "theta must have shape (3, 1), got None"),
    ],
)
def test_one_check_of_both_thetas_refuses_as_each_check_does(tmp_path, arrays, message):
    """``RequestChecks.moves`` checks θ and θ′ in one pass when both are fine, and otherwise
    refuses with what ``RequestChecks.theta`` says of the first bad one; accepted, it gives
    both arrays and their rows side by side."""
    oracle, ledgers = host(tmp_path, 1)
    checks = oracle.host._checks
    good = {"theta": THETA, "theta_prop": PROPOSALS[0]}
    theta, theta_prop, pairs = checks.moves(good, 3)
    np.testing.assert_array_equal(theta, THETA)
    np.testing.assert_array_equal(theta_prop, PROPOSALS[0])
    np.testing.assert_array_equal(pairs, np.hstack([THETA, PROPOSALS[0]]))
    with pytest.raises(InvalidRequest, match=re.escape(message)):
        checks.moves({**good, **arrays}, 3)
    oracle.close()
    ledgers[0].close()


def test_the_stored_answer_read_is_skipped_only_past_the_answered_iterations(tmp_path):
    """``SpendBook.unanswered_from``: unknown before the session's first charge (the pipeline
    reads the ledger), then true only for iterations past the highest answered — so a re-asked
    iteration is still replayed (same answer, nothing charged)."""
    oracle, ledgers = host(tmp_path, 1)
    book = ledgers[0].book
    assert not book.unanswered_from("s", 0, 0)
    first = oracle.log_ratio(4, np.arange(3), THETA, PROPOSALS[0]).values
    assert book.unanswered_from("s", 5, 0)
    assert not book.unanswered_from("s", 4, 0) and not book.unanswered_from("s", 0, 0)
    assert not book.unanswered_from("s", 5, 1)  # another sub-step: nothing known
    spent = [r.session.epsilon for r in oracle.privacy_reports()]
    np.testing.assert_array_equal(
        oracle.log_ratio(4, np.arange(3), THETA, PROPOSALS[0]).values, first
    )
    assert [r.session.epsilon for r in oracle.privacy_reports()] == spent
    oracle.close()
    ledgers[0].close()
