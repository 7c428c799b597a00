"""Owner invariants (docs/design.md §3): validation, charge-before-answer, budget, replay and
crash safety."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from owners import SoloOwner

from fedpenalty.common import Policy
from fedpenalty.errors import BudgetExhausted, InvalidRequest, ReplayConflict, UnknownSession
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerNode
from fedpenalty.owner.compute.log_ratio import ExpFamShortcut, LogRatioCompute
from fedpenalty.privacy import GaussianSpend

MODEL = build_model({"name": "gaussian_mean", "dim": 2, "data_bound": 3.0, "theta_bound": 2.0})
RECORDS = MODEL.simulate_records(np.random.default_rng(1), np.array([0.3, -0.2]), 500)


def make_node(tmp_path, name="alice", **policy) -> SoloOwner:
    defaults = dict(sigma=1.0, max_step=0.05, budget_epsilon=50.0, delta=1e-5)
    ledger = Ledger(tmp_path / "ledger.sqlite", synchronous="NORMAL")
    return SoloOwner(
        OwnerNode(
            name, MODEL, RECORDS, Policy(**{**defaults, **policy}), ledger, np.random.default_rng(7)
        )
    )


def query(rng, chains=3, step=0.05):
    theta = rng.uniform(-1, 1, size=(chains, 2))
    u = rng.normal(size=(chains, 2))
    u *= step / np.linalg.norm(u, axis=1, keepdims=True)
    return np.arange(chains), theta, theta + u


def spent(node: SoloOwner) -> GaussianSpend:
    return node.ledger.total(node.name)


def test_answer_is_charged_with_owner_computed_sensitivity(tmp_path):
    node = make_node(tmp_path, sigma=2.0)
    node.open_session("s", "penalty", 100)
    chains, theta, prop = query(np.random.default_rng(0))
    node.log_ratio("s", 0, chains, theta, prop)
    step = np.linalg.norm(prop - theta, axis=1)
    expected = GaussianSpend().add(2 * MODEL.lipschitz * step / 2.0)  # replace-one: Δ = 2 L ‖u‖
    total = spent(node)
    assert total.answers == 3
    assert total.mu_squared == pytest.approx(expected.mu_squared, rel=1e-12)
    report = node.privacy_report("s")
    assert report.session.answers == 3 and report.total.mu == pytest.approx(expected.mu)


def test_add_remove_halves_the_sensitivity(tmp_path):
    node = make_node(tmp_path, neighbour="add_remove")
    node.open_session("s", "penalty", 10)
    chains, theta, prop = query(np.random.default_rng(0))
    node.log_ratio("s", 0, chains, theta, prop)
    step = np.linalg.norm(prop - theta, axis=1)
    assert spent(node).mu_squared == pytest.approx(np.sum((MODEL.lipschitz * step) ** 2), rel=1e-12)


def test_answer_is_clipped_log_ratio_plus_noise_of_declared_sd(tmp_path):
    """Many distinct queries at the same (θ, θ'): mean = exact ratio, sd = σ (chi-square bounds)."""
    sigma = 0.7
    node = make_node(tmp_path, sigma=sigma, budget_epsilon=1e6)
    node.open_session("s", "penalty", 10**6)
    theta, prop = np.array([[0.2, 0.1]]), np.array([[0.24, 0.08]])
    exact = MODEL.log_lik_diff(node.records, theta, prop).sum()
    values = np.array([node.log_ratio("s", t, np.array([0]), theta, prop)[0] for t in range(2000)])
    # sd of the mean is σ/√2000 ≈ 0.016; 5 of those is a 1-in-10⁶ false alarm.
    assert abs(values.mean() - exact) < 5 * sigma / np.sqrt(2000)
    # sample variance × (n−1)/σ² ~ χ²(1999): its 1e-6 quantiles are about ±0.15 relative.
    assert 0.85 < values.var(ddof=1) / sigma**2 < 1.15  # σ/2 or 2σ noise fails by a factor 4


@pytest.mark.parametrize("name", ["gaussian_mean", "bernoulli", "poisson"])
def test_sufficient_statistic_path_equals_per_record_clipped_sum(name):
    model = build_model({"name": name})
    rng = np.random.default_rng(5)
    records = model.simulate_records(rng, np.full(model.dim, 0.3), 2000)
    fast = OwnerNode("f", model, records, Policy(), Ledger(":memory:"))
    slow = OwnerNode(
        "s", model, records, Policy(), Ledger(":memory:"), simulation=True, per_record=True
    )
    theta = rng.uniform(-1, 1, (6, model.dim))
    prop = theta + rng.uniform(-0.03, 0.03, (6, model.dim))
    step = np.linalg.norm(prop - theta, axis=1)
    assert LogRatioCompute([fast]).shortcut is not None
    assert LogRatioCompute([slow]).shortcut is None
    np.testing.assert_allclose(
        LogRatioCompute([fast]).sums(theta, prop, step)[0],
        LogRatioCompute([slow]).sums(theta, prop, step)[0],
        rtol=1e-9,
        atol=1e-8,
    )
    assert slow.simulation_diagnostics().clip_binds == 0


@pytest.mark.parametrize("name", ["gaussian_mean", "bernoulli", "poisson"])
def test_a_binding_clip_vetoes_the_sufficient_statistic_shortcut(name):
    """The shortcut Δηᵀ Σ S(x) − n ΔA equals the per-record clipped sum only while no per-record
    clip binds. A clip below L (here L/20, which binds on these records) must not reach it: the
    host's log-ratio compute then answers record by record, and its sums are the per-record
    clipped sums — which differ from what the shortcut gives, so this test fails if a binding
    clip reaches the shortcut."""
    model = build_model({"name": name})
    rng = np.random.default_rng(11)
    records = model.simulate_records(rng, np.full(model.dim, 0.3), 500)
    node = OwnerNode("f", model, records, Policy(), Ledger(":memory:"), simulation=True)
    theta = rng.uniform(-1, 1, (6, model.dim))
    prop = theta + rng.uniform(-0.05, 0.05, (6, model.dim))
    step = np.linalg.norm(prop - theta, axis=1)
    diffs = model.log_lik_diff(node.records, theta, prop)
    clip = 0.5 * float(np.median(np.abs(diffs) / step[:, None]))
    assert clip < model.lipschitz
    compute = LogRatioCompute([node], clip=clip)
    assert compute.shortcut is None and compute.per_record
    bound = (clip * step)[:, None]
    per_record = np.clip(diffs, -bound, bound).sum(axis=1)
    np.testing.assert_allclose(compute.sums(theta, prop, step)[0], per_record, rtol=1e-12)
    assert node.simulation_diagnostics().clip_binds > 0  # the clip did bind
    # what the shortcut would have answered at this clip: a different (under-clipped) sum
    stats = np.stack([node.stat_sum])
    shortcut = ExpFamShortcut(model, stats, np.array([float(len(node.records))]), clip)
    assert not np.allclose(shortcut.sums(theta, prop, step)[0], per_record, rtol=1e-6)
    # the veto is the clip's: at L (the default) the same owner is offered the shortcut
    assert LogRatioCompute([node]).shortcut is not None


def test_clip_binds_when_lipschitz_bound_is_wrong(tmp_path):
    class WrongL(type(MODEL)):
        @property
        def lipschitz(self) -> float:
            return 0.01

    model = WrongL(**MODEL.params())
    node = SoloOwner(
        OwnerNode(
            "a",
            model,
            RECORDS,
            Policy(sigma=1e-6, max_step=0.1, budget_epsilon=1e7),
            Ledger(":memory:"),
            np.random.default_rng(0),
            simulation=True,
            per_record=True,
        )
    )
    node.open_session("s", "penalty", 1)
    theta, prop = np.array([[0.0, 0.0]]), np.array([[0.05, 0.0]])
    value = node.log_ratio("s", 0, np.array([0]), theta, prop)[0]
    diffs = model.log_lik_diff(node.records, theta, prop)[0]
    bound = 0.01 * 0.05
    assert value == pytest.approx(np.clip(diffs, -bound, bound).sum(), abs=1e-4)
    assert node.simulation_diagnostics().clip_binds > 0
    deployed = OwnerNode("b", model, RECORDS, Policy(), Ledger(":memory:"))
    with pytest.raises(InvalidRequest, match="simulation diagnostics are off"):
        deployed.simulation_diagnostics()


BAD_REQUESTS = {
    "nan theta": lambda c, t, p: (
        c,
        np.where(np.arange(t.size).reshape(t.shape) == 0, np.nan, t),
        p,
    ),
    "inf proposal": lambda c, t, p: (c, t, np.full_like(p, np.inf)),
    "wrong dimension": lambda c, t, p: (c, t[:, :1], p[:, :1]),
    "wrong chain count": lambda c, t, p: (c[:2], t, p),
    "theta outside box": lambda c, t, p: (c, t + 5.0, p + 5.0),
    "step too large": lambda c, t, p: (c, t, t + 0.5),
    "duplicate chains": lambda c, t, p: (np.array([0, 0, 1]), t, p),
    "negative chain": lambda c, t, p: (np.array([-1, 0, 1]), t, p),
    "float chains": lambda c, t, p: (c.astype(float), t, p),
    "string theta": lambda c, t, p: (c, "zero", p),
}


@pytest.mark.parametrize("bad", sorted(BAD_REQUESTS))
def test_bad_requests_are_refused_and_charge_nothing(tmp_path, bad):
    node = make_node(tmp_path)
    node.open_session("s", "penalty", 100)
    chains, theta, prop = BAD_REQUESTS[bad](*query(np.random.default_rng(0)))
    with pytest.raises(InvalidRequest):
        node.log_ratio("s", 0, chains, theta, prop)
    assert spent(node).answers == 0
    # the iteration was not consumed: a valid request at the same key is answered
    node.log_ratio("s", 0, *query(np.random.default_rng(0)))
    assert spent(node).answers == 3


def test_bad_iteration_and_oversized_requests(tmp_path):
    node = make_node(tmp_path, max_answers_per_request=2)
    node.open_session("s", "penalty", 100)
    for iteration in (-1, 1.5, "3", True):
        with pytest.raises(InvalidRequest, match="iteration"):
            node.log_ratio("s", iteration, *query(np.random.default_rng(0), chains=2))
    with pytest.raises(InvalidRequest, match="at most 2"):
        node.log_ratio("s", 0, *query(np.random.default_rng(0), chains=3))
    assert spent(node).answers == 0


def test_unknown_closed_and_mismatched_sessions(tmp_path):
    node = make_node(tmp_path)
    with pytest.raises(UnknownSession):
        node.log_ratio("nope", 0, *query(np.random.default_rng(0)))
    node.open_session("s", "penalty", 10)
    with pytest.raises(InvalidRequest, match="not 'penalty_expfam'"):
        node.suff_stats("s", np.array([0]), 0, 1)
    with pytest.raises(InvalidRequest, match="unknown algorithm"):
        node.open_session("t", "magic", 10)
    node.close_session("s")
    with pytest.raises(UnknownSession):
        node.log_ratio("s", 0, *query(np.random.default_rng(0)))
    assert spent(node).answers == 0


def test_a_session_closed_at_the_node_is_closed_for_its_hosts(tmp_path):
    from fedpenalty.owner.host import OwnerHost

    node = make_node(tmp_path)
    host = OwnerHost([node])
    host.open_session("s", "penalty", 100)
    host.log_ratio("s", 0, *query(np.random.default_rng(0)))  # the host now knows "s" is open
    node.close_session("s")
    with pytest.raises(UnknownSession):
        host.log_ratio("s", 1, *query(np.random.default_rng(1)))


def test_replay_returns_stored_answer_without_charge(tmp_path):
    node = make_node(tmp_path)
    node.open_session("s", "penalty", 100)
    req = query(np.random.default_rng(0))
    first = node.log_ratio("s", 4, *req)
    before = spent(node)
    again = node.log_ratio("s", 4, *req)
    np.testing.assert_array_equal(first, again)
    assert spent(node) == before
    # partial replay: chains 0..2 stored, chain 3 new → only chain 3 is charged
    c, t, p = query(np.random.default_rng(0), chains=4)
    t[:3], p[:3] = req[1], req[2]
    mixed = node.log_ratio("s", 4, c, t, p)
    np.testing.assert_array_equal(mixed[:3], first)
    assert spent(node).answers == before.answers + 1


def test_different_query_at_answered_iteration_is_refused(tmp_path):
    node = make_node(tmp_path)
    node.open_session("s", "penalty", 100)
    chains, theta, prop = query(np.random.default_rng(0))
    node.log_ratio("s", 0, chains, theta, prop)
    before = spent(node)
    with pytest.raises(ReplayConflict, match="different query"):
        node.log_ratio("s", 0, chains, theta, theta + 0.9 * (prop - theta))
    assert spent(node) == before


def test_budget_refusal_charges_nothing(tmp_path):
    node = make_node(tmp_path, budget_epsilon=1.0, sigma=5.0)
    node.open_session("s", "penalty", 5)  # the worst case of 5 answers fits
    rng = np.random.default_rng(0)
    answered = 0
    with pytest.raises(BudgetExhausted, match="budget") as info:
        for t in range(10_000):
            node.log_ratio("s", t, *query(rng))
            answered += 3
    total = spent(node)
    assert total.answers == answered > 0
    assert total.epsilon(1e-5) <= 1.0
    assert 0 <= info.value.epsilon_left < 1.0
    assert info.value.grpc_code == "RESOURCE_EXHAUSTED"


def test_plan_beyond_budget_is_refused_up_front(tmp_path):
    node = make_node(tmp_path, budget_epsilon=1.0)
    with pytest.raises(BudgetExhausted, match="refusing a plan"):
        node.open_session("s", "penalty", 10**6)
    with pytest.raises(
        BudgetExhausted, match="refusing a plan"
    ):  # a hostile plan: no huge allocation
        node.open_session("s", "penalty", 10**15)
    with pytest.raises(UnknownSession):
        node.log_ratio("s", 0, *query(np.random.default_rng(0)))


def test_ledger_survives_restart_and_replays(tmp_path):
    node = make_node(tmp_path)
    node.open_session("s", "penalty", 100)
    req = query(np.random.default_rng(0))
    first = node.log_ratio("s", 0, *req)
    before = spent(node)
    node.ledger.close()
    restarted = make_node(tmp_path)  # new process state, same ledger file, fresh noise source
    assert spent(restarted) == before
    restarted.open_session("s", "penalty", 100)  # the coordinator resumes the session
    np.testing.assert_array_equal(restarted.log_ratio("s", 0, *req), first)
    assert spent(restarted) == before


def test_ledger_survives_kill_9(tmp_path):
    """A process charges, then dies by SIGKILL: the charge and the stored answers are there."""
    script = textwrap.dedent(f"""
        import os, signal, numpy as np
        from fedpenalty.models import build_model
        from fedpenalty.common import Policy
        from fedpenalty.owner import Ledger, OwnerHost, OwnerNode
        model = build_model({MODEL.params() | {"name": "gaussian_mean"}!r})
        recs = model.simulate_records(np.random.default_rng(1), np.array([0.3, -0.2]), 500)
        node = OwnerNode("alice", model, recs, Policy(max_step=0.05, budget_epsilon=50.0),
                         Ledger({str(tmp_path / "ledger.sqlite")!r}, synchronous="FULL"))
        host = OwnerHost([node])
        host.open_session("s", "penalty", 100)
        v = host.log_ratio("s", 0, np.array([0]), np.array([[0.0, 0.0]]), np.array([[0.05, 0.0]]))
        print(repr(float(v[0, 0])), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    released = float(proc.stdout.strip())
    node = make_node(tmp_path)
    assert spent(node).answers == 1
    node.open_session("s", "penalty", 100)
    again = node.log_ratio("s", 0, np.array([0]), np.array([[0.0, 0.0]]), np.array([[0.05, 0.0]]))
    assert again[0] == released


def test_suff_stats_blocks(tmp_path):
    model = build_model({"name": "bernoulli", "theta_bound": 4.0})
    records = model.simulate_records(np.random.default_rng(0), np.array([0.4]), 1000)
    node = SoloOwner(
        OwnerNode(
            "b",
            model,
            records,
            Policy(sigma=2.0, budget_epsilon=1000.0, max_answers_per_request=10**6),
            Ledger(":memory:"),
            np.random.default_rng(3),
        )
    )
    node.open_session("s", "penalty_expfam", 3 * 400)
    out = node.suff_stats("s", np.array([0, 1, 2]), 0, 400)
    assert out.shape == (3, 400, 1)
    assert spent(node).answers == 1200
    assert spent(node).mu_squared == pytest.approx(1200 * (1.0 / 2.0) ** 2)  # Δ_S = 1, σ = 2
    # mean and sd of 1200 copies: exact Σx and σ (bounds as in the log-ratio test)
    assert abs(out.mean() - records.sum()) < 5 * 2.0 / np.sqrt(1200)
    assert 0.8 < out.std(ddof=1) / 2.0 < 1.2
    np.testing.assert_array_equal(node.suff_stats("s", np.array([1]), 0, 400), out[1:2])
    assert spent(node).answers == 1200
    with pytest.raises(InvalidRequest, match="block"):
        node.suff_stats("s", np.array([0]), 400, 0)


def test_suff_stats_need_an_exponential_family(tmp_path):
    model = build_model({"name": "logistic", "dim": 2})
    records = model.simulate_records(np.random.default_rng(0), np.zeros(2), 50)
    node = SoloOwner(OwnerNode("l", model, records, Policy(), Ledger(":memory:")))
    with pytest.raises(InvalidRequest, match="no sufficient statistics"):
        node.open_session("s", "penalty_expfam", 1)
