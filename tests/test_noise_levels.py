"""Each query kind at its own noise level (issue 22; docs/design.md §4, "Noise levels per
kind"): ``Policy.noise`` names a kind's level, ``sigma`` is every other kind's; a session of
several kinds answers, reports and charges each kind at its own level, and admits their joint
plan with both; OWNER.toml names each level for what it is; a policy of sigma alone draws,
reports and charges exactly as before."""

from __future__ import annotations

import hashlib
import logging
from collections import defaultdict

import numpy as np
import pytest

from fedpenalty.common import Policy
from fedpenalty.coordinator.inprocess import InProcessOracle
from fedpenalty.errors import BudgetExhausted, ConfigError
from fedpenalty.kinds import KINDS, KindTerms
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerNode, wire
from fedpenalty.owner.noise.sources import NoiseKey
from fedpenalty.owner.owner_config import load_owner_config, noise_level
from fedpenalty.privacy import GaussianSpend
from fedpenalty.privacy.owner_epsilon import owner_epsilon
from fedpenalty.privacy.subsampled import SubsampledGaussian

MODEL = build_model({"name": "gaussian_mean", "dim": 2, "data_bound": 3.0, "theta_bound": 2.0})
RECORDS = MODEL.simulate_records(np.random.default_rng(1), np.array([0.3, -0.2]), 300)
THETA = np.array([[0.1, 0.0], [0.0, 0.1]])
CHAINS = np.array([0, 1])
#: log ratios at sd 1 nat, gradients at noise multiplier 2 (every other kind: sigma = 5)
LEVELS = {"penalty": 1.0, "sgmcmc": 2.0}
BOTH = [KindTerms("log_ratio", 40), KindTerms("gradient", 40, 0.2)]


def owners(tmp_path, policy: Policy, name: str = "o", lattice: bool = False) -> InProcessOracle:
    """Two simulated owners of ``policy`` on one ledger (lattice: seeded lattice noise)."""
    ledger = Ledger(tmp_path / f"{name}.sqlite", synchronous="NORMAL")
    nodes = [
        OwnerNode(
            f"{name}{k}",
            MODEL,
            RECORDS,
            policy,
            ledger,
            np.random.default_rng(7 + k),
            noise_key=NoiseKey.derive(b"k", f"{name}{k}") if lattice else None,
            seeded_streams=lattice,
        )
        for k in range(2)
    ]
    return InProcessOracle(nodes)


def policy(budget: float = 5000.0, **levels: float) -> Policy:
    return Policy(sigma=5.0, noise=levels, max_step=0.05, budget_epsilon=budget, delta=1e-5)


# --- Policy ----------------------------------------------------------------------------------
def test_a_policy_names_each_kinds_level_and_sigma_is_every_other_kinds():
    p = policy(**LEVELS)
    assert p.noise_for("penalty") == 1.0 and p.noise_for("sgmcmc") == 2.0
    assert p.noise_for("penalty_expfam") == 5.0
    assert all(Policy(sigma=3.0).noise_for(k.ledger_name) == 3.0 for k in KINDS.values())
    assert hash(p) == hash(policy(sgmcmc=2.0, penalty=1.0)) and p == policy(sgmcmc=2, penalty=1)
    assert Policy(**p.to_dict()) == p and "noise" not in Policy(sigma=3.0).to_dict()
    with pytest.raises(TypeError):
        p.noise["penalty"] = 9.0  # type: ignore[index]
    with pytest.raises(KeyError):
        p.noise_for("log_ratio")  # by ledger name only: no fallback for an unknown kind
    with pytest.raises(ConfigError, match="unknown query kinds"):
        Policy(noise={"gradient": 1.0})
    with pytest.raises(ConfigError, match="positive finite"):
        Policy(noise={"sgmcmc": 0.0})
    with pytest.raises(ConfigError, match=r"gradient_noise_multiplier × privacy\.min_clip"):
        Policy(noise={"sgmcmc": 1e-300}, min_clip=1e-20)


def test_the_levels_travel_in_an_owners_description(tmp_path):
    for p in (policy(**LEVELS), Policy(sigma=3.0)):
        description = owners(tmp_path, p, f"d{len(p.noise)}").describe()[0]
        back = wire.owner_description(wire.owner_info(description))
        assert back.policy == p and back.policy.noise == p.noise


# --- answers and charges of a session of two kinds --------------------------------------------
@pytest.mark.parametrize("lattice", [False, True])
def test_each_kind_of_a_session_is_answered_reported_and_charged_at_its_own_level(
    tmp_path, lattice
):
    both = owners(tmp_path, policy(**LEVELS), "both", lattice)
    session = both.open_kinds(BOTH)
    ratio = both.query("log_ratio", 0, CHAINS, theta=THETA, theta_prop=THETA + 0.01)
    grad = both.query("gradient", 0, CHAINS, theta=THETA, clip=1.5)
    np.testing.assert_array_equal(ratio.noise_sd, [1.0, 1.0])
    np.testing.assert_array_equal(grad.noise_sd, [3.0, 3.0])  # σ·clip = 2 × 1.5
    # each kind charged exactly what an owner of that one level charges for the same keys
    alone = {
        "log_ratio": owners(tmp_path, Policy(sigma=1.0, max_step=0.05, budget_epsilon=5000.0),
                            "r", lattice),
        "gradient": owners(tmp_path, Policy(sigma=2.0, max_step=0.05, budget_epsilon=5000.0),
                           "g", lattice),
    }  # fmt: skip
    alone["log_ratio"].open_session("log_ratio", 40, session="a")
    alone["gradient"].open_session("gradient", 40, session="a", sampling_rate=0.2)
    single_ratio = alone["log_ratio"].query(
        "log_ratio", 0, CHAINS, theta=THETA, theta_prop=THETA + 0.01
    )
    alone["gradient"].query("gradient", 0, CHAINS, theta=THETA, clip=1.5)
    np.testing.assert_array_equal(single_ratio.noise_sd, ratio.noise_sd)
    spend = both.host.nodes[0].ledger.kind_spend(["both0"], session)[0]
    ratio_alone = alone["log_ratio"].host.nodes[0].ledger.kind_spend(["r0"], "a")[0]
    grad_alone = alone["gradient"].host.nodes[0].ledger.kind_spend(["g0"], "a")[0]
    assert spend["penalty"][0] == ratio_alone["penalty"][0]
    assert spend["penalty"][0].answers == 2 and spend["penalty"][0].mu > 0
    assert spend["sgmcmc"][1] == grad_alone["sgmcmc"][1]
    multiplier = both.host.nodes[0].gradient_noise_multiplier
    assert [(e.noise_multiplier, e.count) for e in spend["sgmcmc"][1]] == [(multiplier, 2)]
    assert multiplier == pytest.approx(2.0, rel=1e-5) and multiplier <= 2.0  # lattice: lowered


def test_a_float_owners_answers_have_each_kinds_stated_sd(tmp_path):
    """400 chains × 2 owners: the sample sd of each kind's noise within 10% of its level σ
    (σ·clip for gradients; sampling rate 1, so the gradient sums are exact): 10% is four
    standard errors of a sample sd of 800 (1600 for the two coordinates) normals."""
    p = Policy(sigma=5.0, noise=LEVELS, max_step=0.05, budget_epsilon=1e6, delta=1e-5)
    o = owners(tmp_path, p)
    o.open_kinds([KindTerms("log_ratio", 400), KindTerms("gradient", 400, 1.0)])
    chains = np.arange(400)
    theta = np.tile([0.1, 0.0], (400, 1))
    ratio = o.query("log_ratio", 0, chains, theta=theta, theta_prop=theta + 0.01).values
    grad = o.query("gradient", 0, chains, theta=theta, clip=1.5).values
    # every chain asks the same question: the spread across chains is the noise alone
    assert np.std(ratio - ratio.mean(axis=1, keepdims=True)) == pytest.approx(1.0, rel=0.1)
    assert np.std(grad - grad.mean(axis=1, keepdims=True)) == pytest.approx(3.0, rel=0.1)


# --- admission ---------------------------------------------------------------------------------
def _joint_epsilon(levels: dict[str, float], answers: int = 40, rate: float = 0.2) -> float:
    """ε at δ of the joint worst case of ``BOTH`` at ``levels``, composed by hand."""
    p = policy(**levels)
    mu = KINDS["log_ratio"].worst_sensitivity(MODEL, p, None) / p.noise_for("penalty")
    gauss = GaussianSpend(answers, answers * mu * mu, mu)
    sampled = [SubsampledGaussian(rate, p.noise_for("sgmcmc"), answers)]
    return owner_epsilon(gauss, sampled, p.delta, p.neighbour, False)[0]


def test_the_joint_plan_is_admitted_at_both_levels(tmp_path):
    need = _joint_epsilon(LEVELS)
    assert need < _joint_epsilon({"penalty": 1.0, "sgmcmc": 1.0})  # the gradient level counts
    assert need < _joint_epsilon({"penalty": 0.5, "sgmcmc": 2.0})  # so does the log-ratio one
    owners(tmp_path, policy(budget=need * 1.001, **LEVELS), "fits").open_kinds(BOTH)
    with pytest.raises(BudgetExhausted):
        owners(tmp_path, policy(budget=need * 0.999, **LEVELS), "over").open_kinds(BOTH)


# --- OWNER.toml --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("given", "sigma", "noise", "named"),
    [
        ({"sigma": 2.0}, 2.0, {}, None),
        ({"log_ratio_sd": 2.0}, 2.0, {}, "log_ratio_sd"),
        ({"stat_sd": 2.0, "gradient_noise_multiplier": 2.0}, 2.0, {}, "stat_sd"),
        ({"gradient_noise_multiplier": 2.0, "sigma": 2.0}, 2.0, {}, "gradient_noise_multiplier"),
        # the kinds not named: Policy's default sigma (1.0)
        ({"log_ratio_sd": 1.0, "gradient_noise_multiplier": 2.0}, 1.0, LEVELS, None),
        (
            {"log_ratio_sd": 1.0, "gradient_noise_multiplier": 2.0, "sigma": 7.0},
            7.0,
            LEVELS,
            None,
        ),
        ({"stat_sd": 3.0, "sigma": 7.0}, 7.0, {"penalty_expfam": 3.0}, None),
        (
            {"log_ratio_sd": 1.0, "stat_sd": 3.0, "gradient_noise_multiplier": 2.0},
            1.0,
            {**LEVELS, "penalty_expfam": 3.0},
            None,
        ),
    ],
)
def test_owner_toml_reads_each_combination_of_noise_names(
    tmp_path, caplog, given, sigma, noise, named
):
    raw = {"privacy": dict(given)}
    with caplog.at_level(logging.INFO, logger="fedpenalty.owner"):
        assert noise_level(raw) == named
    if noise:
        assert "its own noise level" in caplog.text
    lines = "\n".join(f"{k} = {v!r}" for k, v in given.items())
    (tmp_path / "data.csv").write_text("x0,x1\n" + "\n".join("0.1,0.2" for _ in range(5)))
    (tmp_path / "OWNER.toml").write_text(
        '[model]\nname = "gaussian_mean"\ndim = 2\ndata_bound = 3.0\ntheta_bound = 2.0\n'
        f'[data]\npath = "data.csv"\n[privacy]\n{lines}\n'
    )
    read = load_owner_config(tmp_path / "OWNER.toml").policy
    assert read == Policy(sigma=sigma, noise=noise)
    for kind in KINDS.values():  # each kind named is answered at the level it is named with
        assert read.noise_for(kind.ledger_name) == given.get(kind.noise_key, read.sigma)


def test_owner_toml_refuses_a_bad_kind_level_naming_its_key(tmp_path):
    with pytest.raises(ConfigError, match=r"privacy\.gradient_noise_multiplier must be"):
        noise_level({"privacy": {"log_ratio_sd": 1.0, "gradient_noise_multiplier": "two"}})
    with pytest.raises(ConfigError, match=r"unknown key privacy\.noise; name each kind's"):
        noise_level({"privacy": {"noise": {"penalty": 1.0}}})


# --- sigma alone: as before ------------------------------------------------------------------
#: sha256 of every answer, reported noise sd and privacy report of ``_sigma_only_draws`` as the
#: code before per-kind levels gave them (main at 8af89dc), float and lattice owners
SIGMA_ONLY_DRAWS = "7dd99efe3627a9d90468ab3f8d43815103262c02c4deb028df083468be6c3294"


def _sigma_only_draws(tmp_path) -> str:
    h = hashlib.sha256()
    for lattice in (False, True):
        for sigma in (1.5, 4.0):
            p = Policy(sigma=sigma, max_step=0.05, budget_epsilon=5000.0, delta=1e-5)
            for kind, rate in (("log_ratio", None), ("suff_stats", None), ("gradient", 0.2)):
                (tmp_path / f"{lattice}-{sigma}-{kind}").mkdir()
                o = owners(tmp_path / f"{lattice}-{sigma}-{kind}", p, "o", lattice)
                o.open_session(kind, 30, session="s", sampling_rate=rate)
                for it in range(3):
                    if kind == "log_ratio":
                        a = o.query(kind, it, CHAINS, theta=THETA, theta_prop=THETA + 0.01)
                    elif kind == "suff_stats":
                        a = o.suff_stats(CHAINS, it * 2, 2)
                    else:
                        a = o.query(kind, it, CHAINS, theta=THETA, clip=1.5)
                    h.update(np.ascontiguousarray(a.values).tobytes())
                    h.update(np.ascontiguousarray(a.noise_sd).tobytes())
                for r in o.privacy_reports():
                    h.update(repr((r.total, r.session)).encode())
    return h.hexdigest()


def test_a_policy_of_sigma_alone_draws_reports_and_charges_as_before(tmp_path):
    assert _sigma_only_draws(tmp_path) == SIGMA_ONLY_DRAWS


# --- over gRPC ---------------------------------------------------------------------------------
def test_over_grpc_each_kind_is_answered_and_checked_at_its_own_level(tmp_path):
    """The coordinator reads each owner's levels from its description and checks every
    answer's sd against the asked kind's; the answers equal the in-process oracle's."""
    from fedpenalty.coordinator.grpc_oracle import GrpcOracle
    from fedpenalty.owner.host import OwnerHost
    from fedpenalty.owner.server import ServerThread

    local = owners(tmp_path, policy(**LEVELS), "o")
    (tmp_path / "remote").mkdir()
    server = ServerThread(OwnerHost(owners(tmp_path / "remote", policy(**LEVELS), "o").host.nodes))
    remote = GrpcOracle([server.address], model=MODEL, deadline=10, retry_seconds=2)
    try:
        assert [d.policy for d in remote.describe()] == [policy(**LEVELS)] * 2
        for oracle in (local, remote):
            oracle.open_kinds(BOTH, session="s")
        for kind, arrays, sd in (
            ("log_ratio", {"theta": THETA, "theta_prop": THETA + 0.01}, 1.0),
            ("gradient", {"theta": THETA, "clip": 1.5}, 3.0),
        ):
            there = remote.query(kind, 0, CHAINS, **arrays)
            here = local.query(kind, 0, CHAINS, **arrays)
            np.testing.assert_array_equal(there.values, here.values)
            np.testing.assert_array_equal(there.noise_sd, [sd, sd])
    finally:
        remote.close()
        server.close()


# --- refusal advice ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("query", "session"),
    [("penalty", {"max_step": 0.05}), ("penalty_expfam", {}), ("sgmcmc", {"sampling_rate": 0.2})],
)
def test_refusal_advice_is_figured_at_the_asked_kinds_level(query, session):
    """What a refused plan needs is what it needs of an owner whose every level is the asked
    kind's; a deployed refusal names the kind's key and level."""
    from fedpenalty.refusals import plan_causes, plan_needs

    levels = {"penalty": 0.7, "penalty_expfam": 3.0, "sgmcmc": 1.3}
    mixed = Policy(sigma=9.0, noise=levels, budget_epsilon=2.0, delta=1e-5)
    alone = Policy(sigma=levels[query], budget_epsilon=2.0, delta=1e-5)
    for lattice in (False, True):
        assert plan_needs(query, MODEL, mixed, 10**4, session, lattice) == plan_needs(
            query, MODEL, alone, 10**4, session, lattice
        )
    kind = next(k for k in KINDS.values() if k.ledger_name == query)
    words = plan_causes(_Scenario(), query, mixed, deployed=True)  # type: ignore[arg-type]
    assert words.endswith(f", the owner's {kind.noise_key} = {levels[query]:g} (its OWNER.toml)")


class _Scenario(dict):
    """Just what ``plan_causes`` reads of a scenario: every key is 4, set by a test."""

    def __getitem__(self, section):
        return defaultdict(lambda: 4)

    def origin(self, key):
        return "this test"
