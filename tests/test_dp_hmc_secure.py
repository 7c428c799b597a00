"""DP-HMC with secure aggregation (docs/design.md §2.6, §2.9; §4 "Sessions of several kinds").

A secure session of DP-HMC asks two kinds — clipped gradients at sub-steps 1..L and clipped
log ratios at sub-step 0 of every iteration — under one key agreement: each kind masks under a
transcript that binds its name, and each sub-step under a label of its own, so no mask word
ever covers two answers (two answers masked alike would give away their difference). Tested
here: those words never repeat across kinds, sub-steps, iterations and chains and still cancel
across hosts; one owner's masked reply says nothing the coordinator can decode; each owner's ε
is the composition, by hand, of the answers its ledger recorded at μ = (2 + γ√w)/s; the chain
over gRPC and Ray equals the in-process chain draw for draw; a resumed chain equals the
uninterrupted one.

Owners are lattice owners with fixed noise keys and simulated peers (charged at s), as in
tests/test_secure_aggregation.py.
"""

from __future__ import annotations

import dataclasses
import math
import pickle
import re

import dp_accounting
import numpy as np
import pytest
from test_dp_hmc import Crash, CrashingOracle
from test_secure_aggregation import U64, chi_square_uniform, keys_of

from fedpenalty.common import Policy, SecureTerms
from fedpenalty.config import load_scenario, resolve
from fedpenalty.coordinator import checkpoint, dp_hmc
from fedpenalty.coordinator.algorithms import ALGORITHMS
from fedpenalty.coordinator.base import ChainData
from fedpenalty.coordinator.driver import sample
from fedpenalty.coordinator.inprocess import InProcessOracle
from fedpenalty.coordinator.oracle import SecureAggregation
from fedpenalty.coordinator.secure_sum import combine, secure_open
from fedpenalty.errors import AggregationFailed, ConfigError
from fedpenalty.kinds import KindTerms
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerHost, OwnerNode
from fedpenalty.owner.aggregation import SecureSession, lattice_step
from fedpenalty.owner.noise.sources import NoiseKey
from fedpenalty.owner.session_request import SessionRequest
from fedpenalty.refusals import PlanRefused
from fedpenalty.simulation import run_scenario

MODEL = build_model({"name": "gaussian_mean", "dim": 2, "data_bound": 3.0, "theta_bound": 2.0})
RECORDS = [
    MODEL.simulate_records(np.random.default_rng(k), np.array([0.4, -0.3]), 80 + 20 * k)
    for k in range(3)
]
#: s (a noise multiplier for the clipped kinds: the sum's noise sd is s·clip) and t colluders
S, T = 3.0, 1
GRAD_CLIP, RATIO_CLIP, LEAPFROG = 1.0, 0.5, 2
KINDS = ("gradient_clipped", "penalty_clipped")


def secure_nodes(folder, tag: str, groups=((0, 1), (2,))) -> list[OwnerNode]:
    """Three lattice owners allowing secure sessions at (S, T), one ledger file per group."""
    policy = Policy(sigma=1.0, total_noise_sd=S, colluders=T, budget_epsilon=1e9,
                    max_clip=10.0, max_answers_per_request=10**6)  # fmt: skip
    nodes = []
    for g, members in enumerate(groups):
        ledger = Ledger(folder / f"{tag}-{g}.sqlite", synchronous="NORMAL")
        nodes += [OwnerNode(f"o{k}", MODEL, RECORDS[k], policy, ledger,
                            noise_key=NoiseKey.derive(b"hmc", f"o{k}"), simulated_peers=True)
                  for k in members]  # fmt: skip
    return nodes


def settings(warmup: int, iterations: int, per_distance: float = 0.0) -> dict:
    """The ``[sampler]`` settings of the kernel-level runs: every iteration an HMC move (no
    warmup descent), so each asks L gradients and one ratio; ``per_distance`` > 0: the ratio
    clipped at that × ‖θ' − θ‖."""
    return {"warmup": warmup, "iterations": iterations, "leapfrog_steps": LEAPFROG, "step": 0.1,
            "adapt_step": True, "target_accept": 0.65, "grad_clip": GRAD_CLIP,
            "hmc_ratio_clip": RATIO_CLIP, "step_jitter": 1.0, "warmup_descent": 0,
            "hmc_ratio_clip_per_distance": per_distance}  # fmt: skip


def open_hmc(oracle, chains: int, warmup: int, iterations: int, session: str = "hmc") -> str:
    """Open DP-HMC's two kinds, planned for its run, with secure aggregation at (S, T)."""
    plan = dp_hmc.asks(settings(warmup, iterations))
    terms = [KindTerms(kind, chains * n) for kind, n in plan.items()]
    return oracle.open_kinds(terms, session, secure=SecureAggregation(S, T))


def run_chain(
    oracle, chains: int = 3, warmup: int = 5, iterations: int = 15, per_distance=0.0, **kwargs
):
    """DP-HMC through ``oracle`` from fixed starts near the data's mean."""
    sampler = settings(warmup, iterations, per_distance)
    algo = ALGORITHMS["dp_hmc"].kernel(MODEL, ChainData(oracle, n_total=300), sampler)
    rng = np.random.default_rng(5)
    theta0 = np.array([[0.4, -0.3]]) + 0.05 * rng.standard_normal((chains, 2))
    return sample(algo, rng, theta0, iterations=iterations, warmup=warmup, progress=False, **kwargs)


# --------------------------------------------------------------------------- the masks


@pytest.mark.parametrize("simulation", [False, True], ids=["chacha20", "splitmix-simulation"])
def test_mask_words_never_repeat_across_kinds_substeps_iterations_and_chains(simulation):
    """Five owners in hosts of 2 and 3, one key agreement shared by DP-HMC's two kinds: owner
    o0's mask words over 2 kinds × 3 sub-steps × 4 iterations × 4 chains (and its check words)
    are all distinct — a repeat would give away the difference of two answers — and at every
    (kind, sub-step) the masks of all owners still cancel. Sharing the X25519 exchanges between
    the kinds changes no word (a session built alone masks alike)."""
    count, terms = 5, SecureTerms(5, 1, 1.0)
    private, peers = keys_of(count)
    multiples = np.random.default_rng(0).integers(-(2**40), 2**40, size=(count, 16, 2))
    chains, iterations = np.tile(np.arange(4), 4), np.repeat(np.arange(4), 4)
    groups = ((0, 1), (2, 3, 4))
    sessions = {}
    for group in groups:
        hosted = [(f"o{k}", private[k]) for k in group]
        shared: dict = {}
        for kind in KINDS:
            sessions[group, kind] = SecureSession(
                "s", kind, terms, peers, hosted, simulation, shared
            )
    alone = SecureSession("s", KINDS[1], terms, peers, [("o0", private[0]), ("o1", private[1])],
                          simulation)  # fmt: skip
    zeros = np.zeros((1, 16, 2), dtype=np.int64)
    words = []
    for kind in KINDS:
        for substep in range(3):
            total = np.zeros((16, 3), dtype=U64)
            for group in groups:
                masked = sessions[group, kind].mask(
                    multiples[list(group)], np.arange(len(group)), chains, iterations, substep
                )
                total += masked.sum(axis=0, dtype=U64)
            np.testing.assert_array_equal(total[:, :2].view(np.int64), multiples.sum(axis=0))
            assert np.all(total[:, 2] == 0)  # the check words cancel
            own = sessions[groups[0], kind].mask(zeros, np.array([0]), chains, iterations, substep)
            words.append(own.ravel())  # o0's masks alone (its values are 0)
            if kind == KINDS[1]:
                again = alone.mask(zeros, np.array([0]), chains, iterations, substep)
                np.testing.assert_array_equal(again, own)
    every = np.concatenate(words)
    assert every.size == 2 * 3 * 16 * 3 and np.unique(every).size == every.size


def test_one_owners_masked_reply_is_not_its_answer_and_decodes_to_nothing_alone():
    """Each owner served by a host of its own, DP-HMC's kinds opened securely: the coordinator
    sees per host a masked word whose top, middle and low bits are uniform over 1,500 chains
    (χ², p > 1e-4), for the ratio and for the gradient; one host's reply alone does not decode
    (its check words do not cancel); all of them decode to the clipped sums within 5 sd."""
    nodes = secure_nodes_in_memory()
    hosts = [OwnerHost([n]) for n in nodes]
    request = secure_open([k for h in hosts for k in h.session_keys("v")], SecureAggregation(S, T))
    terms = [KindTerms("clipped_gradient", 10**5), KindTerms("clipped_log_ratio", 10**5)]
    for host in hosts:
        host.open(SessionRequest.several("v", terms, secure=request))
    chains = np.arange(1500)
    theta = np.tile([[0.35, -0.25]], (1500, 1))
    asked = {
        "clipped_log_ratio": ({"theta": theta, "theta_prop": theta + 0.05, "clip": RATIO_CLIP}, 0),
        "clipped_gradient": ({"theta": theta, "clip": GRAD_CLIP}, 1),
    }
    for kind, (arrays, substep) in asked.items():
        replies = [
            h.reply("v", h.answer(kind, "v", 3, chains, substep, **arrays), kind=kind)
            for h in hosts
        ]
        for reply in replies:
            for shift in (56, 28, 0):
                assert chi_square_uniform(reply.values.ravel(), shift) > 1e-4
            with pytest.raises(AggregationFailed, match="check words"):
                combine([reply])
        decoded = combine(replies)
        clip = RATIO_CLIP if kind == "clipped_log_ratio" else GRAD_CLIP
        assert decoded.noise_sd == pytest.approx([S * clip * math.sqrt(3 / (3 - T))])
        exact = exact_sum(kind, arrays)
        assert np.all(np.abs(decoded.values[0] - exact) < 5 * decoded.noise_sd[0])


def secure_nodes_in_memory() -> list[OwnerNode]:
    """``secure_nodes`` on one in-memory ledger (each owner's host shares it)."""
    policy = Policy(sigma=1.0, total_noise_sd=S, colluders=T, budget_epsilon=1e9,
                    max_clip=10.0, max_answers_per_request=10**6)  # fmt: skip
    ledger = Ledger(":memory:")
    return [OwnerNode(f"o{k}", MODEL, r, policy, ledger, noise_key=NoiseKey.derive(b"v", f"o{k}"),
                      simulated_peers=True) for k, r in enumerate(RECORDS)]  # fmt: skip


def exact_sum(kind: str, arrays: dict) -> np.ndarray:
    """The owners' clipped sums without noise, for one chain's θ (every chain asks the same)."""
    theta = arrays["theta"][:1]
    if kind == "clipped_log_ratio":
        diff = np.concatenate([MODEL.log_lik_diff(r, theta, arrays["theta_prop"][:1])[0]
                               for r in RECORDS])  # fmt: skip
        return np.clip(diff, -RATIO_CLIP, RATIO_CLIP).sum()
    grads = np.concatenate([MODEL.grad_log_lik(r, theta)[0] for r in RECORDS])
    norms = np.linalg.norm(grads, axis=-1, keepdims=True)
    return (grads * np.minimum(1.0, GRAD_CLIP / norms)).sum(axis=0)


# --------------------------------------------------------------------------- accounting


@pytest.mark.parametrize("per_distance", [0.0, 2.0], ids=["absolute", "per-distance"])
def test_each_owners_epsilon_is_the_composition_of_the_answers_its_ledger_recorded(
    tmp_path, per_distance
):
    """The kernel's own count of what it asked equals each ledger's answers per kind; each
    answer is charged μ = (2 + γ√w)/s per unit clip (replace_one; γ the session's lattice step,
    w = 2 for gradients, 1 for ratios), the owner's ε is the RDP ε of their composition
    (dp-accounting), its own-noise μ is √(K − t) times larger, and the kernel's penalty used the
    decoded sum's variance (s·c)²·K/(K − t) — per chain (s·c·‖θ' − θ‖)²·K/(K − t) with the
    ratio clipped per unit distance (checked on the accepted moves, whose ‖θ' − θ‖ the draws
    show), at the same μ."""
    nodes = secure_nodes(tmp_path, "eps")
    oracle = InProcessOracle(nodes)
    chains, warmup, iterations = 3, 5, 15
    open_hmc(oracle, chains, warmup, iterations)
    result = run_chain(oracle, chains, warmup, iterations, per_distance)
    kept_grads = int(result.stats["gradient_answers"].sum())
    kept_ratios = int(result.queried.sum())
    assert kept_ratios == chains * iterations and kept_grads == LEAPFROG * kept_ratios
    gradients = chains * (1 + LEAPFROG * warmup) + kept_grads
    ratios = chains * warmup + kept_ratios
    if per_distance:
        moved = result.accepted[:, 1:]
        step = np.linalg.norm(np.diff(result.theta, axis=1), axis=2)[moved]
        variance = (S * per_distance * step) ** 2 * 3 / (3 - T)
        assert moved.sum() >= 10
        noise_variance = result.stats["noise_variance"][:, 1:][moved]
        np.testing.assert_allclose(noise_variance, variance, rtol=1e-9)
    else:
        variance = (S * RATIO_CLIP) ** 2 * 3 / (3 - T)
        assert np.allclose(result.stats["noise_variance"][result.queried], variance, rtol=1e-12)
    gamma = lattice_step(SecureTerms(3, T, S))
    mu = math.sqrt(gradients * ((2 + gamma * math.sqrt(2)) / S) ** 2
                   + ratios * ((2 + gamma) / S) ** 2)  # fmt: skip
    rdp = dp_accounting.rdp.RdpAccountant()
    rdp.compose(dp_accounting.GaussianDpEvent(1 / mu))
    expected = rdp.get_epsilon(1e-5)
    for node, report in zip(nodes, oracle.privacy_reports()):
        per_kind = node.ledger.kind_spend([node.name], "hmc")[0]
        assert per_kind["gradient_clipped"][0].answers == gradients
        assert per_kind["penalty_clipped"][0].answers == ratios
        assert report.session is not None and report.session.answers == gradients + ratios
        assert report.session.mu == pytest.approx(mu, rel=1e-12)
        assert report.session.epsilon == pytest.approx(expected, rel=1e-9)
        own = report.own_noise
        assert own is not None and own.terms == SecureTerms(3, T, S) and own.session is not None
        assert own.session.mu == pytest.approx(mu * math.sqrt(3 - T), rel=1e-12)
    oracle.close()


# --------------------------------------------------------------------------- resume


def test_a_resumed_secure_dp_hmc_chain_equals_the_uninterrupted_one(tmp_path):
    """A coordinator crash between checkpoints; the owners are restarted on their ledgers (the
    same agreement secrets, so the same session keys and masks), the session re-opened with the
    same peers and kinds, the re-asked keys replayed: the same draws and answers charged."""

    def opened(tag):
        oracle = InProcessOracle(secure_nodes(tmp_path, tag))
        open_hmc(oracle, 3, 20, 30, session="run")
        return oracle

    reference_oracle = opened("reference")
    reference = run_chain(reference_oracle, warmup=20, iterations=30)
    answers = [r.session.answers for r in reference_oracle.privacy_reports()]
    crashed = opened("crashed")
    path = tmp_path / "checkpoint.npz"
    with pytest.raises(Crash):  # checkpoints every 10 iterations, crash between two of them
        run_chain(CrashingOracle(crashed, calls=100), warmup=20, iterations=30,
                  checkpoint=lambda p: checkpoint.save(path, p), checkpoint_every=10)  # fmt: skip
    saved = checkpoint.load(path)
    assert 0 < saved.done < 50
    for node in crashed.host.nodes[::2]:  # the two ledger files
        node.ledger.close()
    oracle = opened("crashed")
    resumed = run_chain(oracle, warmup=20, iterations=30, resume=saved)
    np.testing.assert_array_equal(resumed.theta, reference.theta)
    np.testing.assert_array_equal(resumed.accepted, reference.accepted)
    assert [r.session.answers for r in oracle.privacy_reports()] == answers


# --------------------------------------------------------------------------- transports

#: the embedded default's dp_hmc, shortened, with secure aggregation at s = 20: 2 chains × 25
#: iterations × (3 gradients + 1 ratio) + the starts, μ = 2/20 each, fit the budget ε = 10
SMALL = [
    "sampler.algorithm='dp_hmc'",
    "data.owners=3",
    "data.n_per_owner=2000",
    "sampler.chains=2",
    "sampler.warmup=10",
    "sampler.iterations=15",
    "sampler.leapfrog_steps=3",
    "sampler.grad_clip=2.0",
    "sampler.hmc_ratio_clip=0.006",
    "privacy.aggregation='secure'",
    "privacy.total_noise_sd=20.0",
    f"privacy.colluders={T}",
    "run.progress=false",
]


def test_a_secure_plan_past_the_budget_is_explained_at_s(tmp_path):
    """At s = 3 the same plan (about 200 answers per owner at μ = 2/3, lattice answers
    accounted by RDP) passes ε = 10: the refusal states the ε of the plan at s — not at the
    owners' plain levels, which would fit — and names privacy.total_noise_sd as the level to
    raise."""
    scenario = load_scenario(None, [*SMALL, f"privacy.total_noise_sd={S}"])
    sampler = scenario["sampler"]
    plan = {kind: sampler["chains"] * n for kind, n in ALGORITHMS["dp_hmc"].asks(sampler).items()}
    gradients, ratios = plan["clipped_gradient"], plan["clipped_log_ratio"]
    assert gradients == 2 * (3 * 25 + 1) and 0 < ratios <= 2 * 25
    with pytest.raises(PlanRefused) as refused:
        run_scenario(scenario, tmp_path / "refused")
    message = str(refused.value)
    assert f"({gradients} gradient_clipped, {ratios} penalty_clipped)" in message
    epsilon = float(re.search(r"needs ε = ([0-9.]+)", message).group(1))
    mu = 2 * math.sqrt(gradients + ratios) / S
    rdp = dp_accounting.rdp.RdpAccountant()
    rdp.compose(dp_accounting.GaussianDpEvent(1 / mu))
    assert epsilon == pytest.approx(rdp.get_epsilon(1e-5), rel=1e-2)
    assert "every kind's noise level × " in message and "(privacy.total_noise_sd in" in message


def _samples(out) -> dict[str, np.ndarray]:
    with np.load(out / "samples.npz") as data:
        return {k: data[k] for k in data.files}


@pytest.mark.parametrize(
    ("transport", "clip"),
    [
        ("grpc", "sampler.hmc_ratio_clip=0.006"),
        ("grpc", "sampler.hmc_ratio_clip_per_distance=3.0"),
        pytest.param("ray", "sampler.hmc_ratio_clip=0.006", marks=pytest.mark.slow),
    ],
    ids=["grpc", "grpc-per-distance", "ray"],
)
def test_a_secure_dp_hmc_run_equals_the_in_process_run_draw_for_draw(
    tmp_path, request, transport, clip
):
    """``simulate`` of the embedded default with dp_hmc and secure aggregation over gRPC (owner
    host processes) and Ray (two actors) against in process: the same draws, the same owners'
    privacy figures and diagnostics (Ray: its simulation-only clip counters too), and
    privacy.json's secure fields, its assumption saying that s multiplies each kind's clip;
    over gRPC also with the ratio clipped per unit distance."""
    if transport == "ray":
        request.getfixturevalue("ray_session")
    local = run_scenario(load_scenario(None, [*SMALL, clip, "run.transport='inprocess'"]),
                         tmp_path / "local")  # fmt: skip
    other = run_scenario(load_scenario(None, [*SMALL, clip, f"run.transport='{transport}'"]),
                         tmp_path / transport)  # fmt: skip
    assert local.stopped is None and other.stopped is None
    for key, value in _samples(local.out).items():
        np.testing.assert_array_equal(_samples(other.out)[key], value)
    assert other.privacy["owners"] == local.privacy["owners"]
    if transport == "grpc":  # owner host processes keep no simulation-only counters
        assert "simulation_only" not in other.diagnostics
        other.diagnostics["simulation_only"] = local.diagnostics["simulation_only"]
    assert other.diagnostics == local.diagnostics
    assert other.privacy["aggregation"] == "secure"
    for owner in other.privacy["owners"]:
        assert owner["owners_counted"] == 3 and owner["colluders"] == T
        assert owner["epsilon_own_noise_only"] > owner["epsilon"]
    assert set(other.privacy["kinds"]) == set(KINDS)
    assert {k["noise_key"] for k in other.privacy["kinds"].values()} == {"total_noise_sd"}
    assumption = other.privacy["assumption"]
    assert "(clipped_gradient at clip " in assumption and "s is a noise multiplier" in assumption


def test_a_policy_with_levels_per_kind_survives_pickling():
    """A Ray actor receives its owners' policies pickled; dp_hmc's defaults set levels per kind
    (``[privacy.noise]``), which unpickled one by one would hit their immutability."""
    policy = Policy(sigma=1.0, noise={"gradient_clipped": 95.0, "penalty_clipped": 90.0})
    copy = pickle.loads(pickle.dumps(policy))
    assert copy == policy and hash(copy) == hash(policy)
    assert copy.noise_for("penalty_clipped") == 90.0
    with pytest.raises(TypeError, match="immutable"):
        copy.noise["penalty_clipped"] = 1.0


def test_secure_aggregation_refuses_a_kernel_mixing_clipped_and_unclipped_kinds(monkeypatch):
    """One s cannot be both a clip multiplier and a noise sd in nats: a (hypothetical) kernel
    asking clipped gradients and Lipschitz log ratios is refused naming the keys; dp_hmc's two
    clipped kinds are not."""
    mixed = dataclasses.replace(
        ALGORITHMS["dp_hmc"], name="mixed", kinds=lambda s: {"clipped_gradient": 3, "log_ratio": 1}
    )
    monkeypatch.setitem(ALGORITHMS, "mixed", mixed)
    secure = {"aggregation": "secure", "total_noise_sd": 50.0}
    with pytest.raises(ConfigError, match=r"privacy\.total_noise_sd is one noise level") as refused:
        resolve({"data": {"owners": 4}, "privacy": secure, "sampler": {"algorithm": "mixed"}})
    assert "clipped_gradient" in str(refused.value) and "privacy.aggregation = 'none'" in str(
        refused.value
    )
    resolve({"data": {"owners": 4}, "privacy": secure, "sampler": {"algorithm": "dp_hmc"}})
