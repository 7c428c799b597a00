"""The ledger's rows (docs/design.md §4): answer blocks, spend lines from step sums, the
pending bound that admits a charge in a few float operations, and ledgers in the earlier
per-key format."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
from contextlib import closing

import numpy as np
import pytest

from fedpenalty.common import LOG_RATIO, Policy
from fedpenalty.errors import BudgetExhausted, ReplayConflict
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerHost, OwnerNode
from fedpenalty.owner.ledger import Charge
from fedpenalty.owner.ledger_rows import AffineMus, PendingLine, StepSums

MODEL = build_model({"name": "gaussian_mean", "dim": 2, "data_bound": 3.0, "theta_bound": 2.0})
RECORDS = MODEL.simulate_records(np.random.default_rng(1), np.array([0.3, -0.2]), 200)
SIGMAS = (0.8, 1.0, 1.7, 3.0)


def make_host(tmp_path, budget: float, sigmas=SIGMAS) -> tuple[OwnerHost, Ledger]:
    ledger = Ledger(tmp_path / "ledger.sqlite", synchronous="NORMAL")
    nodes = [
        OwnerNode(
            f"o{k}",
            MODEL,
            RECORDS,
            Policy(sigma=s, max_step=0.01, budget_epsilon=budget),
            ledger,
            np.random.default_rng(k),
        )
        for k, s in enumerate(sigmas)
    ]
    return OwnerHost(nodes), ledger


def request(rng: np.random.Generator, chains: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """θ, θ' with steps spread over [0.001, 0.01] (so the pending bound is not one number)."""
    theta = rng.uniform(-1, 1, size=(chains, 2))
    u = rng.normal(size=(chains, 2))
    u *= rng.uniform(0.001, 0.01, size=(chains, 1)) / np.linalg.norm(u, axis=1, keepdims=True)
    return theta, theta + u


def brute_mu_squared(steps: list[np.ndarray], sigmas=SIGMAS) -> np.ndarray:
    """Each owner's Σμ² over every answered step, answer by answer: μ = 2L·step/σ_k."""
    delta = MODEL.log_ratio_sensitivity(1.0, "replace_one")
    return np.array([sum(float(((delta * s / sd) ** 2).sum()) for s in steps) for sd in sigmas])


def test_the_pending_bound_refuses_exactly_where_answer_by_answer_accounting_does(tmp_path):
    """Charges on a pending line are admitted by one scalar bound; the run must still stop at
    the first request that takes some owner past its cap — no earlier (the bound falls back to
    the exact check) and no later (no owner ever passes its cap). Fails if the bound's weights
    are too small (an owner overshoots) or a refusal is spurious."""
    host, ledger = make_host(tmp_path, budget=4.0)
    host.open_session("s", "penalty", 5)  # a plan that fits; the run goes on past it
    caps = np.array([n.max_mu_squared for n in host.nodes])
    rng = np.random.default_rng(3)
    answered: list[np.ndarray] = []
    with pytest.raises(BudgetExhausted):
        for t in range(10_000):
            theta, prop = request(rng)
            host.log_ratio("s", t, np.arange(3), theta, prop)
            answered.append(np.linalg.norm(prop - theta, axis=1))
    refused = np.linalg.norm(prop - theta, axis=1)
    spent = brute_mu_squared(answered)
    assert len(answered) > 20  # many charges went through the pending line
    assert (spent <= caps).all()
    assert (brute_mu_squared([*answered, refused]) > caps).any()
    totals = [ledger.total(n.name) for n in host.nodes]
    np.testing.assert_allclose([t.mu_squared for t in totals], spent, rtol=1e-12)
    assert {t.answers for t in totals} == {3 * len(answered)}


def test_spend_lines_give_each_owner_its_exact_spend_after_a_restart(tmp_path):
    """Σμ², answers and max μ of every owner, read back from the file by a new writer, equal
    the answer-by-answer figures; a resumed session adds to the same line."""
    host, ledger = make_host(tmp_path, budget=1e6)
    host.open_session("s", "penalty", 10**4)
    rng = np.random.default_rng(4)
    steps = []
    for t in range(30):
        theta, prop = request(rng)
        host.log_ratio("s", t, np.arange(3), theta, prop)
        steps.append(np.linalg.norm(prop - theta, axis=1))
    ledger.close()
    host, ledger = make_host(tmp_path, budget=1e6)
    host.open_session("s", "penalty", 10**4)
    theta, prop = request(rng)
    host.log_ratio("s", 30, np.arange(3), theta, prop)
    steps.append(np.linalg.norm(prop - theta, axis=1))
    delta = MODEL.log_ratio_sensitivity(1.0, "replace_one")
    largest = max(float(s.max()) for s in steps)
    for node, sd, mu2 in zip(host.nodes, SIGMAS, brute_mu_squared(steps)):
        total = ledger.total(node.name)
        assert total.answers == 3 * len(steps)
        assert total.mu_squared == pytest.approx(mu2, rel=1e-12)
        assert total.max_mu == pytest.approx(delta * largest / sd, rel=1e-12)
    assert ledger._db.execute("SELECT COUNT(*) FROM spend_lines").fetchone()[0] == 1


def test_a_second_answer_to_a_stored_key_is_refused_by_the_ledger_itself(tmp_path):
    """The host replays stored keys; should a charge for one reach the ledger anyway (a bug,
    a second host on the file), the ledger refuses it and writes nothing."""
    ledger = Ledger(tmp_path / "ledger.sqlite", synchronous="NORMAL")
    owners = ["a", "b"]

    def charge(iteration: int, new: np.ndarray) -> Charge:
        return Charge(
            "s",
            owners,
            np.array([0, 1]),
            np.full(2, iteration),
            [bytes(32), bytes(32)],
            np.zeros((2, 2, 1)),
            AffineMus(np.ones(2), np.zeros(2), np.full(2, 0.1)),
            new,
            np.full(2, np.inf),
            np.full(2, 10.0),
            np.full(2, 1e-5),
        )

    ledger.charge(charge(5, np.ones((2, 2), bool)))
    ledger.charge(charge(7, np.ones((2, 2), bool)))
    before = ledger.total("a")
    partly = np.array([[False, True], [False, False]])  # owner a, chain 1, iteration 5
    with pytest.raises(ReplayConflict, match="answered before"):
        ledger.charge(charge(5, partly))
    assert ledger.total("a") == before
    ledger.charge(charge(6, partly))  # below the frontier but never answered: fine
    assert ledger.total("a").answers == before.answers + 1


def test_the_pending_bound_proves_each_member_within_its_cap():
    """PendingLine: used ≤ 1 implies every member's pending Σμ² ≤ its headroom."""
    rng = np.random.default_rng(0)
    slope, offset = rng.uniform(0.1, 5, 50), rng.uniform(0, 0.02, 50)
    headroom = rng.uniform(0.5, 100, 50)
    mus = AffineMus(slope, offset, np.zeros(0))
    line = PendingLine.start(1, np.arange(50), mus, headroom, np.zeros(0), 0)
    used = 0.0
    while True:
        sums = StepSums.of(rng.uniform(0, 0.01, 4))
        if used + line.cost(sums) > 1.0:
            break
        used += line.cost(sums)
        line.add(sums, used)
    _, mu2, _ = line.spend()
    assert (mu2 <= headroom).all() and line.sums.count > 4
    assert (mu2 / headroom).max() > 0.2  # the bound is not uselessly loose


def test_ledgers_in_the_earlier_per_key_format_still_replay_and_report(tmp_path):
    """A ledger written before answer blocks (one ``answers`` row per key, one ``spend`` row
    per session and group): its stored answer is replayed and its spend counts."""
    host, ledger = make_host(tmp_path, budget=1e6, sigmas=(1.0,))
    host.open_session("s", "penalty", 100)
    theta, prop = np.array([[0.1, 0.2]]), np.array([[0.105, 0.2]])
    digest = hashlib.sha256(
        LOG_RATIO.encode() + theta[0].astype("<f8").tobytes() + prop[0].astype("<f8").tobytes()
    ).digest()
    owner_id = int(ledger.ids(["o0"])[0])
    session_id = ledger._id("s")
    members = np.array([owner_id], dtype="<i8").tobytes()
    db = ledger._db
    db.execute("INSERT INTO groups(id, members) VALUES (77, ?)", (members,))
    db.execute(
        "INSERT INTO answers VALUES (?, 4, 0, 77, ?, ?)",
        (session_id, digest, np.array([1.25], "<f8").tobytes()),
    )
    db.execute(
        "INSERT INTO spend VALUES (?, 77, ?, ?, ?)",
        (
            session_id,
            np.array([9], "<i8").tobytes(),
            np.array([0.5], "<f8").tobytes(),
            np.array([0.3], "<f8").tobytes(),
        ),
    )
    ledger.close()
    # a reader (owner report) of a file from before the new tables existed
    old = tmp_path / "old.sqlite"
    shutil.copy(tmp_path / "ledger.sqlite", old)
    with closing(sqlite3.connect(old)) as db:
        db.executescript("DROP TABLE answer_blocks; DROP TABLE spend_lines;")
    reader = Ledger(old, read_only=True)
    assert (reader.total("o0").answers, reader.total("o0").mu_squared) == (9, 0.5)
    assert reader.stored(["o0"], "s", 0, 10)[("o0", 0, 4)] == (digest, np.float64(1.25).tobytes())
    reader.close()

    host, ledger = make_host(tmp_path, budget=1e6, sigmas=(1.0,))
    host.open_session("s", "penalty", 100)
    assert (ledger.total("o0").answers, ledger.total("o0").mu_squared) == (9, 0.5)
    assert host.log_ratio("s", 4, np.array([0]), theta, prop)[0, 0] == 1.25
    assert ledger.total("o0").answers == 9  # replayed: nothing charged
    with pytest.raises(ReplayConflict):
        host.log_ratio("s", 4, np.array([0]), theta, prop + 0.001)
    host.log_ratio("s", 5, np.array([0]), theta, prop)
    assert ledger.total("o0").answers == 10
