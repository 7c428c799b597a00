"""Start-up shortcuts for many owners (docs/design.md §4, "Many owners"): what is checked once
per group of alike owners gives exactly what checking each owner alone gives, and a refusal
still names its own owner and records nothing."""

from __future__ import annotations

import gc
import pickle

import numpy as np
import pytest

from fedpenalty.cluster.ray_hosts import HostSpec, OwnerBlock
from fedpenalty.common import LOG_RATIO, Policy
from fedpenalty.config import load_scenario
from fedpenalty.data import ChildSeeds, SyntheticRecords, synthetic_sources
from fedpenalty.errors import BudgetExhausted
from fedpenalty.kinds import KINDS
from fedpenalty.models import build_model
from fedpenalty.models.api import project_to_ball
from fedpenalty.owner import Ledger, OwnerNode
from fedpenalty.owner.host import OwnerHost, gc_paused
from fedpenalty.owner.ledger_records import Opening, PlanView, SessionPart
from fedpenalty.owner.mechanism import HostNoise
from fedpenalty.owner.noise.seeded import seed_materials
from fedpenalty.owner.noise.sources import NoiseKey
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


def _views(ledger: Ledger, names: list[str], part: SessionPart) -> list[PlanView]:
    """The plan views admission reads when ``names`` open ``part`` together."""
    book, openings = ledger.sessions_book, [Opening(n) for n in names]
    with ledger.store.writing():
        return book._plan_views(openings, [ledger.store.id(n) for n in names], part, [part])


def test_plan_views_shared_by_alike_owners_are_each_owners_own(tmp_path):
    """The views six owners read opening together equal, field by field, those each reads
    opening alone: o2 holds an open session (read alone), o3 spent in a closed one (its
    spend line is its own), the four others spent nothing and share one view; for a new
    session and for resuming o2's."""
    ledger = Ledger.simulation(tmp_path / "one.sqlite")
    nodes = _nodes([ledger], POLICIES)
    spent = OwnerHost(nodes[2:4])
    spent.open_session("s", LOG_RATIO, 30, max_step=0.01)
    _answer_twice(spent)
    ledger.close_sessions(["o3"], "s")
    names = [n.name for n in nodes]
    for part in (SessionPart("t", "penalty", 10), SessionPart("s", "penalty", 30)):
        together = _views(ledger, names, part)
        alone = [_views(ledger, [n], part)[0] for n in names]
        assert together == alone
        assert together[0] is together[1] is together[4] is together[5]
        assert together[3].total != together[0].total and together[3].total.answers > 0
    assert together[2].existing is not None and together[2].existing.spend.answers > 0


def test_host_noise_levels_are_each_owners_noise_for(tmp_path):
    """``HostNoise.levels``, read once per distinct policy, is each owner's
    ``Policy.noise_for`` of each kind, in owner order."""
    noisy = Policy(sigma=0.3, max_step=0.1, noise={"sgmcmc": 0.9})
    policies = [SHARED, noisy, *POLICIES[4:], noisy, SHARED]
    nodes = _nodes([Ledger.simulation(tmp_path / "one.sqlite")], policies)
    levels = HostNoise(nodes, "h").levels
    assert levels.keys() == {k.ledger_name for k in KINDS.values()}
    for name, sigma in levels.items():
        assert sigma.tolist() == [p.noise_for(name) for p in policies]
    assert levels["sgmcmc"][1] == 0.9 and levels["penalty"][1] == 0.3


def test_host_noise_multipliers_are_each_owners_own(tmp_path):
    """The gradient multipliers, asked once per alike owners, are each owner's
    ``gradient_noise_multiplier`` in owner order (policies differing in σ and in the gradient
    kind's own level)."""
    noisy = Policy(sigma=0.3, max_step=0.1, noise={"sgmcmc": 0.9})
    policies = [SHARED, noisy, *POLICIES[4:], noisy, SHARED]
    nodes = _nodes([Ledger.simulation(tmp_path / "one.sqlite")], policies)
    multipliers = HostNoise(nodes, "h").plain["sgmcmc"].gradient_multiplier
    assert multipliers.tolist() == [n.gradient_noise_multiplier for n in nodes]
    assert multipliers.tolist() == [0.5, 0.9, 0.5, 0.7, 0.9, 0.5]


def test_seed_materials_at_once_are_each_owners_seed_material():
    """The seed material of many seeded owners, hashed as arrays, is byte for byte what each
    ``SeedSequence.generate_state(4, uint64)`` gives (what ``seed_material`` took before)."""
    seeds = [
        *ChildSeeds.of(np.random.SeedSequence(5), 40),
        np.random.SeedSequence(2**130 + 1),
        np.random.SeedSequence(7, spawn_key=(3, 1)),
        np.random.SeedSequence(),
    ]
    rngs = [np.random.default_rng(s) for s in seeds]
    expected = [s.generate_state(4, np.uint64).astype("<u8").tobytes() for s in seeds]
    assert seed_materials(rngs) == expected
    assert len(set(expected)) == len(seeds)
    assert seed_materials([]) == []


def test_answered_on_lattice_asked_once_is_each_owners_answer(tmp_path):
    """``Ledger.answered_on_lattice_of`` (the builder's one question) equals asking owner by
    owner, on a writer and on a reader, and a node given it accounts as one that asked."""
    path = tmp_path / "l.sqlite"
    ledger = Ledger(path)
    records = MODEL.simulate_records(np.random.default_rng(1), np.array([0.2]), 40)
    policy = Policy(sigma=0.8, budget_epsilon=1e9)
    lattice = [
        OwnerNode(name, MODEL, records, policy, ledger, noise_key=NoiseKey.derive(b"k", name))
        for name in ("o1", "o3")
    ]
    OwnerHost(lattice).open_session("s", "penalty", 10)
    ledger.close()
    names = ["o0", "o1", "o2", "o3", "never"]
    for read_only in (False, True):
        batch = Ledger(path, read_only=read_only)
        assert batch.answered_on_lattice_of(names) == [False, True, False, True, False]
        batch.close()
        alone = Ledger(path, read_only=read_only)
        assert [alone.answered_on_lattice(n) for n in names] == [False, True, False, True, False]
        alone.close()
    ledger = Ledger.simulation(path)
    answered = ledger.answered_on_lattice_of(names)
    given = _nodes_answered(ledger, names, answered)
    asked = _nodes_answered(ledger, names, [None] * len(names))
    assert [n.renyi_accounting for n in given] == [n.renyi_accounting for n in asked] == answered
    assert [n.max_mu_squared for n in given] == [n.max_mu_squared for n in asked]
    ledger.close()


def _nodes_answered(ledger: Ledger, names: list[str], answered: list) -> list[OwnerNode]:
    seeds = np.random.SeedSequence(3).spawn(len(names))
    records = MODEL.simulate_records(np.random.default_rng(0), np.array([0.2]), 30)
    return [
        OwnerNode.simulated(name, MODEL, records, SHARED, ledger, seed, True, lattice)
        for name, seed, lattice in zip(names, seeds, answered)
    ]


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


def test_child_seeds_are_the_spawned_children():
    """``ChildSeeds.of(seed, K)`` gives the streams ``seed.spawn(K)`` gives (after earlier
    spawns too), by index, slice and pickling, and leaves ``seed`` unspawned."""
    seed = np.random.SeedSequence(11)
    seed.spawn(2)
    lazy = ChildSeeds.of(seed, 6)
    assert seed.n_children_spawned == 2
    spawned = seed.spawn(6)
    states = [s.generate_state(4).tolist() for s in spawned]
    assert [s.generate_state(4).tolist() for s in lazy] == states
    assert [s.generate_state(4).tolist() for s in pickle.loads(pickle.dumps(lazy[1:5:2]))] == [
        states[1],
        states[3],
    ]
    assert lazy[-1].spawn_key == spawned[-1].spawn_key and len(lazy[2:]) == 4
    with pytest.raises(IndexError):
        lazy[6]


def test_synthetic_sources_make_each_owners_records_as_before():
    """Owner k's records come from child k of the data seed, as one ``SyntheticRecords`` per
    owner made them; a slice of the sources (an actor's block) makes the same owners'."""
    seed = np.random.SeedSequence(4)
    sources = synthetic_sources(seed, np.array([0.3]), [5, 7, 9, 11])
    for k, n in enumerate([5, 7, 9, 11]):
        alone = SyntheticRecords(np.random.SeedSequence(4, spawn_key=(k,)), n, (0.3,))
        np.testing.assert_array_equal(sources[k].make(MODEL), alone.make(MODEL))
    block = pickle.loads(pickle.dumps(sources[1:3]))
    np.testing.assert_array_equal(block[1].make(MODEL), sources[2].make(MODEL))
    assert len(pickle.dumps(synthetic_sources(seed, np.array([0.3]), [100] * 100_000))) < 10**6


def test_an_owner_block_is_the_per_owner_specs():
    """An actor's ``OwnerBlock`` gives each owner the spec a list of ``OwnerSpec`` gave, and
    ``HostSpec.names`` its names without making them."""
    seeds = np.random.SeedSequence(2)
    sources = synthetic_sources(seeds, np.array([0.1]), [4] * 5)
    children = ChildSeeds.of(np.random.SeedSequence(3), 5)
    names = [f"owner-{k}" for k in range(5)]
    block = OwnerBlock(names, [SHARED] * 5, sources, children)[1:4]
    spec = HostSpec({"name": "gaussian_mean"}, "ledger.sqlite", block)
    assert spec.names == names[1:4]
    for j, owner in enumerate(block):
        k = j + 1
        assert owner.name == names[k] and owner.policy is SHARED and owner.rng is None
        made = sources[k]
        assert isinstance(owner.records, SyntheticRecords)
        assert (owner.records.n, owner.records.true_theta) == (made.n, made.true_theta)
        assert owner.records.seed.spawn_key == made.seed.spawn_key
        assert owner.seed is not None and owner.seed.spawn_key == children[k].spawn_key


@pytest.mark.parametrize("enabled", [True, False])
def test_gc_paused_restores_the_collector_as_it_was(enabled):
    """Off inside, as it was after — also when the block raises."""
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        with gc_paused():
            assert not gc.isenabled()
        assert gc.isenabled() == enabled
        with pytest.raises(RuntimeError), gc_paused():
            raise RuntimeError("a failed start-up")
        assert gc.isenabled() == enabled
    finally:
        (gc.enable if was else gc.disable)()
