"""Start-up shortcuts for many owners (docs/design.md §4, "Many owners"): what is checked once
per group of alike owners gives exactly what checking each owner alone gives, and a refusal
still names its own owner and records nothing."""

from __future__ import annotations

import numpy as np
import pytest

from fedpenalty.common import LOG_RATIO, Policy
from fedpenalty.config import load_scenario
from fedpenalty.errors import BudgetExhausted
from fedpenalty.models import build_model
from fedpenalty.models.api import project_to_ball
from fedpenalty.owner import Ledger, OwnerNode
from fedpenalty.owner.host import OwnerHost
from fedpenalty.simulation import owner_policies

MODEL = build_model({"name": "gaussian_mean"})
SHARED = Policy(sigma=0.5, max_step=0.1, budget_epsilon=50.0, delta=1e-5)
#: alike owners share SHARED; two others differ in budget and in σ (separate groups)
POLICIES = [SHARED] * 4 + [
    Policy(sigma=0.5, max_step=0.1, budget_epsilon=80.0, delta=1e-5),
    Policy(sigma=0.7, max_step=0.1, budget_epsilon=50.0, delta=1e-5),
]


def _nodes(ledgers: list[Ledger], policies: list[Policy]) -> list[OwnerNode]:
    seeds = np.random.SeedSequence(3).spawn(len(policies))
    return [
        OwnerNode.simulated(
            f"o{k}",
            MODEL,
            MODEL.simulate_records(np.random.default_rng(k), np.array([0.2]), 50 + k),
            p,
            ledgers[k % len(ledgers)],
            s,
        )
        for k, (p, s) in enumerate(zip(policies, seeds))
    ]


def _answer_twice(host: OwnerHost) -> np.ndarray:
    chains, theta = np.arange(2), np.array([[0.0], [0.1]])
    first = host.log_ratio("s", 0, chains, theta, theta + 0.008)
    second = host.log_ratio("s", 1, chains, theta + 0.008, theta - 0.001)
    return np.concatenate([np.asarray(first), np.asarray(second)], axis=1)


def test_a_host_of_alike_owners_admits_what_each_owner_alone_admits(tmp_path):
    """Caps, answers and ε of six owners opened together on one ledger (four sharing one
    policy) equal, to the bit, those of each owner opened alone on a ledger of its own."""
    together = _nodes([Ledger.simulation(tmp_path / "one.sqlite")], POLICIES)
    alone = _nodes([Ledger.simulation(tmp_path / f"{k}.sqlite") for k in range(6)], POLICIES)
    host = OwnerHost(together)
    host.open_session("s", LOG_RATIO, 30, max_step=0.01)
    for node in alone:
        OwnerHost([node]).open_session("s", LOG_RATIO, 30, max_step=0.01)
    caps = [n.max_mu_squared for n in together]
    assert caps == [n.max_mu_squared for n in alone]
    assert caps[4] != caps[0]  # the other budget's group has its own cap
    answers = _answer_twice(host)
    each = np.concatenate([_answer_twice(OwnerHost([n])) for n in alone])
    np.testing.assert_array_equal(answers, each)
    reports = host.privacy_reports("s")
    singles = [OwnerHost([n]).privacy_reports("s")[0] for n in alone]
    assert [r.session.epsilon for r in reports] == [r.session.epsilon for r in singles]
    assert [r.total.epsilon for r in reports] == [r.total.epsilon for r in singles]


def test_a_refusal_in_a_group_names_its_owner_and_records_nothing(tmp_path):
    """An owner of a tight budget among alike owners is refused by name; the ledger they
    share records no session for anyone, and the same owners open a plan that fits."""
    tight = Policy(sigma=0.5, max_step=0.1, budget_epsilon=5.0, delta=1e-5)
    ledger = Ledger.simulation(tmp_path / "one.sqlite")
    nodes = _nodes([ledger], [SHARED, SHARED, tight, SHARED])
    host = OwnerHost(nodes)
    with pytest.raises(BudgetExhausted, match="o2"):
        host.open_session("s", LOG_RATIO, 30, max_step=0.01)
    assert ledger.store.db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 0
    host.open_session("s", LOG_RATIO, 1, max_step=0.001)
    assert ledger.store.db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 4


def test_simulated_owners_share_one_policy_per_sigma():
    """``owner_policies``: one object per distinct σ, equal to the policy each owner had."""
    scenario = load_scenario(None, {"data.owners": 5, "privacy.sigma": [0.1, 0.2, 0.1, 0.1, 0.2]})
    policies = owner_policies(scenario, 5)
    assert [p.sigma for p in policies] == [0.1, 0.2, 0.1, 0.1, 0.2]
    assert policies[0] is policies[2] is policies[3] and policies[1] is policies[4]
    assert policies[0] is not policies[1] and policies[0].noise is not policies[1].noise


def _projected(x: np.ndarray, radius: float) -> np.ndarray:
    """``project_to_ball`` without its shortcut (the full overflow-safe rescaling)."""
    x = np.array(x, dtype=float, copy=True)
    m = np.max(np.abs(x), axis=1)
    safe = np.where(m > 0, m, 1.0)
    norms = m * np.linalg.norm(x / safe[:, None], axis=1)
    over = norms > radius
    x[over] = (x[over] / safe[over, None]) * (radius / (norms[over] / safe[over]))[:, None]
    return x


@pytest.mark.parametrize("d", [1, 2, 5])
def test_project_to_ball_is_the_full_projection_to_the_bit(d):
    """Inside, on and outside the ball, rows at the boundary within rounding: the shortcut for
    rows well inside gives exactly the full projection's bytes."""
    rng = np.random.default_rng(d)
    radius = 3.0
    for scale in (0.1, radius / np.sqrt(d), radius, 10.0):
        x = scale * rng.uniform(-1, 1, (200, d))
        np.testing.assert_array_equal(project_to_ball(x, radius), _projected(x, radius))
    edge = np.full((3, d), radius / np.sqrt(d)) * np.array([[1 - 1e-16], [1.0], [1 + 1e-15]])
    np.testing.assert_array_equal(project_to_ball(edge, radius), _projected(edge, radius))
