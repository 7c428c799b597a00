"""Secure aggregation (docs/design.md §2.6), tested against the protocol's claims: the masks
cancel exactly, one owner's masked answer is uniform on 2⁶⁴ (a χ² test), colluders and the
coordinator together see exactly the noise the accounting assumes, the owner — not the
coordinator — decides K, s and t, a dropout stops the run and it resumes, each answer is
charged (Δ + γ√w)/s, and the penalty chain stays exact.

Owners here are "deployed-style" (ChaCha20 noise and masks, agreement secret in the ledger)
unless a test says otherwise; their noise keys are derived from fixed tags so runs repeat.
"""

from __future__ import annotations

import json
import re

import dp_accounting
import numpy as np
import pytest
from grpc_processes import run_cli
from owners import kernel
from ray_support import ray_oracle_of
from scipy import stats
from test_samplers import Z, z_scores

from fedpenalty.common import Policy, SecureTerms
from fedpenalty.config import load_scenario, resolve
from fedpenalty.coordinator import checkpoint
from fedpenalty.coordinator.driver import SamplingStopped, sample
from fedpenalty.coordinator.grpc_oracle import GrpcOracle
from fedpenalty.coordinator.inprocess import InProcessOracle
from fedpenalty.coordinator.oracle import Answers, SecureAggregation
from fedpenalty.coordinator.secure_sum import combine, secure_open
from fedpenalty.errors import (
    AggregationFailed,
    BudgetExhausted,
    ConfigError,
    InvalidRequest,
    ReplayConflict,
)
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerHost, OwnerNode
from fedpenalty.owner.aggregation import (
    ChaChaMasks,
    MixMasks,
    PeerKey,
    SecureOpen,
    SecureSession,
    lattice_step,
    pair_secrets,
    public_bytes,
    session_private_key,
    transcript,
)
from fedpenalty.owner.compute.gradient import clipped_gradient_sum
from fedpenalty.owner.noise.lattice import lattice_gradient_multiplier
from fedpenalty.owner.noise.sources import NoiseKey
from fedpenalty.owner.server import ServerThread
from fedpenalty.privacy.subsampled import SubsampledGaussian
from fedpenalty.simulation import run_scenario

MODEL = build_model({"name": "gaussian_mean", "dim": 1, "data_bound": 4.0, "theta_bound": 3.0})
RECORDS = [MODEL.simulate_records(np.random.default_rng(k), np.array([0.4]), 60 + 20 * k)
           for k in range(6)]  # fmt: skip
U64 = np.uint64


def make_nodes(count, s=1.0, t=0, ledger=None, tag="n", **policy) -> list[OwnerNode]:
    """``count`` lattice owners allowing secure sessions at (s, t), on one ledger; their peers
    are this test's own owners (``simulated_peers``: charged at s without peer authentication)."""
    ledger = ledger if ledger is not None else Ledger(":memory:")
    settings = {"budget_epsilon": 1e9, "max_step": 0.2, "max_answers_per_request": 10**6, **policy}
    return [
        OwnerNode(f"o{k}", MODEL, RECORDS[k], Policy(total_noise_sd=s, colluders=t, **settings),
                  ledger, noise_key=NoiseKey.derive(tag.encode(), f"o{k}"), simulated_peers=True)
        for k in range(count)
    ]  # fmt: skip


def open_hosts(hosts: list[OwnerHost], session: str, s: float, t: int, plan=10**6) -> SecureOpen:
    """A coordinator's secure open of ``session`` at every host (each its own process)."""
    keys = [k for h in hosts for k in h.session_keys(session)]
    request = secure_open(keys, SecureAggregation(s, t))
    for h in hosts:
        h.open_session(session, "penalty", plan, secure=request)
    return request


def ask(hosts, session, iteration, chains, step=0.01):
    """Every host's ``Reply`` to one log-ratio request at θ = 0, θ' = step."""
    theta = np.zeros((len(chains), 1))
    return [
        h.reply(session, h.log_ratio(session, iteration, chains, theta, theta + step))
        for h in hosts
    ]


def exact_lattice_sum(nodes, gamma, step=0.01) -> float:
    """Σ_k λ_k rounded to the lattice, as the owners encode them."""
    theta = np.zeros((1, 1))
    values = [MODEL.log_lik_diff(n.records, theta, theta + step).sum() for n in nodes]
    return float(sum(np.rint(np.array(values) / gamma)) * gamma)


def chi_square_uniform(words: np.ndarray, shift: int) -> float:
    """p-value of the χ² test that the 8 bits of ``words`` at ``shift`` are uniform."""
    bins = ((words >> U64(shift)) & U64(255)).astype(np.int64)
    return float(stats.chisquare(np.bincount(bins, minlength=256)).pvalue)


# --------------------------------------------------------------------------- the masks


def keys_of(count: int, session: str = "sess"):
    private = [session_private_key(bytes([k + 1]) * 32, session) for k in range(count)]
    return private, [PeerKey(f"o{k}", public_bytes(key)) for k, key in enumerate(private)]


@pytest.mark.parametrize("simulation", [False, True], ids=["chacha20", "splitmix-simulation"])
def test_masks_cancel_exactly_across_hosts_and_batches(simulation):
    """Seven owners in hosts of 3, 1 and 3: the masked words of all of them add up, mod 2⁶⁴,
    to exactly the sum of their lattice values, and every check word to 0; an owner's masked
    answer computed alone equals the one computed with its host's other owners."""
    count, terms = 7, SecureTerms(7, 2, 1.0)
    private, peers = keys_of(count)
    rng = np.random.default_rng(0)
    multiples = rng.integers(-(2**40), 2**40, size=(count, 5, 3))
    chains, iterations = np.arange(5), np.array([3, 3, 4, 9, 2**40])
    total = np.zeros((5, 4), dtype=U64)
    for group in ((0, 1, 2), (3,), (4, 5, 6)):
        hosted = [(f"o{k}", private[k]) for k in group]
        session = SecureSession("sess", "penalty", terms, peers, hosted, simulation)
        masked = session.mask(multiples[list(group)], np.arange(len(group)), chains, iterations)
        assert masked.dtype == U64 and np.all(masked[:, :, :3] != multiples[list(group)].view(U64))
        alone = session.mask(multiples[[group[-1]]], np.array([len(group) - 1]), chains, iterations)
        np.testing.assert_array_equal(alone[0], masked[-1])
        total += masked.sum(axis=0, dtype=U64)
    np.testing.assert_array_equal(total[:, :3].view(np.int64), multiples.sum(axis=0))
    assert np.all(total[:, 3] == 0)


@pytest.mark.parametrize("masks", [ChaChaMasks, MixMasks], ids=["chacha20", "splitmix"])
def test_a_keys_mask_words_do_not_depend_on_the_batch_it_is_asked_in(masks):
    """Words of (pair, chain, iteration) asked in one batch — chains far apart, across the
    2¹⁶-chain nonce boundary, several iterations — equal the words asked one key at a time, and
    no two keys share words."""
    secrets = [bytes([k]) * 32 for k in range(1, 4)]
    source = masks(secrets, "s", "penalty") if masks is ChaChaMasks else masks(secrets)
    chains = np.array([0, 1, 9, 65535, 65536, 70000, 3, 3])
    iterations = np.array([5, 5, 5, 5, 5, 5, 6, 2**40])
    batch = source.words(np.arange(3), chains, iterations, 11)
    for j in range(len(chains)):
        one = source.words(np.arange(3), chains[j : j + 1], iterations[j : j + 1], 11)
        np.testing.assert_array_equal(batch[:, j], one[:, 0])
    assert len(np.unique(batch.reshape(-1))) == batch.size


def test_the_decoded_sum_is_the_sum_of_the_owners_lattice_answers():
    """Three owners in three hosts: the coordinator's decoded sum is Σ_k λ_k (on the lattice)
    plus noise of variance K s²/(K − t) — mean within 5 standard errors over 3,000 keys, sd
    within 6% (relative sd of a sample sd of 3,000: 1.3%)."""
    nodes = make_nodes(3, s=0.8, t=1)
    hosts = [OwnerHost([n]) for n in nodes]
    request = open_hosts(hosts, "s", 0.8, 1)
    answers = combine(ask(hosts, "s", 0, np.arange(3000)))
    sd = 0.8 * np.sqrt(3 / 2)
    assert answers.values.shape == (1, 3000) and answers.noise_sd == pytest.approx([sd])
    terms = SecureTerms(3, 1, 0.8)
    assert len(request.peers) == 3
    exact = exact_lattice_sum(nodes, lattice_step(terms))
    assert abs(answers.values.mean() - exact) < 5 * sd / np.sqrt(3000)
    assert abs(answers.values.std(ddof=1) / sd - 1) < 0.06


def test_a_repeated_key_replays_the_stored_masked_words_and_charges_nothing():
    """The ledger stores each owner's masked words; a retried request gets them back byte for
    byte, nothing is drawn or charged, and another query at that key is refused."""
    nodes = make_nodes(3)
    hosts = [OwnerHost([n]) for n in nodes]
    open_hosts(hosts, "s", 1.0, 0)
    first = ask(hosts, "s", 0, np.arange(4))
    spent = [n.ledger.total(n.name) for n in nodes]
    stored = nodes[0].ledger.stored(["o0"], "s", 0, 0)[("o0", 0, 0)][1]
    assert np.frombuffer(stored, dtype="<u8")[0] == first[0].values[0, 0]
    again = ask(hosts, "s", 0, np.arange(4))
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a.values, b.values)
        np.testing.assert_array_equal(a.check, b.check)
    assert [n.ledger.total(n.name) for n in nodes] == spent
    with pytest.raises(ReplayConflict):
        ask(hosts[:1], "s", 0, np.arange(4), step=0.02)


def test_a_single_masked_answer_is_uniform_and_hides_the_data():
    """One owner's released word (its host serves it alone): the top, middle and low 8 bits of
    4,000 masked answers pass a χ² test of uniformity (p > 1e-4), for its data and for its data
    with one record flipped. Without peers (K = 1, no masks) the same test rejects at once."""
    for records in (RECORDS[0], -RECORDS[0]):
        nodes = make_nodes(3)
        nodes[0] = OwnerNode("o0", MODEL, records, nodes[0].policy, nodes[0].ledger,
                             noise_key=NoiseKey.derive(b"u", "o0"),
                             simulated_peers=True)  # fmt: skip
        hosts = [OwnerHost([n]) for n in nodes]
        open_hosts(hosts, "s", 1.0, 0)
        words = ask(hosts, "s", 0, np.arange(4000))[0].values.ravel()
        for shift in (56, 28, 0):
            assert chi_square_uniform(words, shift) > 1e-4
    alone = OwnerHost(make_nodes(1))
    open_hosts([alone], "s", 1.0, 0)
    words = ask([alone], "s", 0, np.arange(4000))[0].values.ravel()
    assert chi_square_uniform(words, 56) < 1e-30


def test_colluders_and_the_coordinator_see_exactly_the_noise_the_accounting_assumes():
    """K = 5, t = 2. The coordinator with both colluders' keys and noise subtracts what they
    know: the honest owners' sum is left with noise of sd s (what each owner is charged for,
    within 6%), and one honest owner's answer with the colluders' pair masks removed is still
    uniform (χ², p > 1e-4). With t = K − 1 = 4 colluders the last honest owner's own answer is
    laid bare — with noise of sd s, again exactly the assumed protection."""
    for t, chains in ((2, 3000), (4, 3000)):
        s, count = 0.9, 5
        nodes = make_nodes(count, s=s, t=t, tag=f"c{t}")
        hosts = [OwnerHost([n]) for n in nodes]
        request = open_hosts(hosts, "s", s, t)
        replies = ask(hosts, "s", 0, np.arange(chains))
        total = combine(replies).values[0]
        terms = SecureTerms(count, t, s)
        gamma = lattice_step(terms)
        colluders = list(range(t))
        known = _colluder_masks(nodes, colluders, request, terms, np.arange(chains))
        revealed = sum(
            (replies[c].values[0] - known[c]).view(np.int64).astype(float) * gamma
            for c in colluders
        )
        honest = nodes[t:]
        residual = total - revealed - exact_lattice_sum(honest, gamma)
        assert abs(residual.std(ddof=1) / s - 1) < 0.06
        if count - t >= 2:
            first = t  # an honest owner, minus its pair masks with the colluders
            assert chi_square_uniform(replies[first].values[0] - known[first], 56) > 1e-4


def _colluder_masks(nodes, colluders, request, terms, chains) -> dict[int, np.ndarray]:
    """What the colluders know of each owner's masks at iteration 0 (value word): all masks of
    a colluder; an honest owner's masks shared with colluders."""
    ordered = sorted(request.peers, key=lambda p: p.owner)
    position = {p.owner: i for i, p in enumerate(ordered)}
    keys = {position[nodes[c].name]: nodes[c].session_private_key("s") for c in colluders}
    digest = transcript("s", "penalty", terms, request.peers)
    low, high, secrets = pair_secrets(keys, ordered, digest)
    words = ChaChaMasks(secrets, "s", "penalty")
    known = {k: np.zeros(len(chains), dtype=U64) for k in range(len(nodes))}
    for p, (a, b) in enumerate(zip(low.tolist(), high.tolist())):
        mask = words.words(np.array([p]), chains, np.zeros(len(chains), int), 2)[0, :, 0]
        known[int(a)] += mask  # positions are the owners' indices: names o0 < o1 < …
        known[int(b)] -= mask
    return known


# --------------------------------------------------------------------------- the owner decides


def _refusal(nodes: list[OwnerNode], request: SecureOpen) -> str:
    """The refusal of owner o0 (``nodes[0]``) of the secure open ``request``."""
    host = OwnerHost(nodes[:1])
    with pytest.raises(InvalidRequest) as info:
        host.open_session("s", "penalty", 100, secure=request)
    return str(info.value)


def _peers(nodes) -> list[PeerKey]:
    return [n.session_key("s") for n in nodes]


@pytest.mark.parametrize(
    "change, refusal",
    [
        (lambda p: SecureOpen(tuple(p), 2.0, 1), "policy has privacy.total_noise_sd = 1"),
        (lambda p: SecureOpen(tuple(p), 1.0, 0), "privacy.colluders = 1"),
        (lambda p: SecureOpen((*p, PeerKey("o9", p[1].public_key)), 1.0, 1), "one public key"),
        (lambda p: SecureOpen((PeerKey("o0", p[1].public_key), p[2]), 1.0, 1), "own key"),
        (lambda p: SecureOpen((*p, PeerKey("o9", bytes(31))), 1.0, 1), "not 32 bytes"),
        (lambda p: SecureOpen((*p, PeerKey("o9", bytes(32))), 1.0, 1), "unusable"),
        (lambda p: SecureOpen(tuple(p[:1]), 1.0, 1), "needs more than 1 owners"),
    ],
    ids=["s", "t", "repeated-key", "own-key-replaced", "short-key", "low-order-key", "K<=t"],
)
def test_an_owner_refuses_a_lying_coordinator_and_records_nothing(change, refusal):
    nodes = make_nodes(3, s=1.0, t=1)
    assert refusal in _refusal(nodes, change(_peers(nodes)))
    assert nodes[0].ledger.session("o0", "s") is None


def test_an_owner_refuses_too_few_peers_and_secure_sessions_its_policy_does_not_allow():
    nodes = make_nodes(3, s=1.0, t=1, min_peers=3)
    message = _refusal(nodes, SecureOpen(tuple(_peers(nodes)), 1.0, 1))
    assert "2 other owners; this owner's privacy.min_peers is 3" in message
    plain = OwnerNode("o0", MODEL, RECORDS[0], Policy(), Ledger(":memory:"),
                      noise_key=NoiseKey.derive(b"n", "o0"))  # fmt: skip
    with pytest.raises(InvalidRequest, match=r"sets no privacy\.total_noise_sd"):
        OwnerHost([plain]).open_session("s", "penalty", 10, secure=SecureOpen((), 1.0, 1))


def test_owners_count_K_themselves_and_a_split_view_decodes_nothing():
    """A coordinator that shows owner o2 an invented fourth peer: o2 counts K = 4 and adds
    noise s²/(4 − t), the others K = 3 — and since their transcripts differ, their masks do not
    cancel: the sum is refused (AggregationFailed), never decoded."""
    nodes = make_nodes(3, s=1.0, t=1)
    hosts = [OwnerHost([n]) for n in nodes]
    peers = [k for h in hosts for k in h.session_keys("s")]
    invented = PeerKey("o9", public_bytes(session_private_key(bytes(range(32)), "s")))
    for h in hosts[:2]:
        h.open_session("s", "penalty", 100, secure=SecureOpen(tuple(peers), 1.0, 1))
    hosts[2].open_session("s", "penalty", 100, secure=SecureOpen((*peers, invented), 1.0, 1))
    replies = ask(hosts, "s", 0, np.arange(4))
    assert replies[0].noise_sd == pytest.approx([1 / np.sqrt(2)])
    assert replies[2].noise_sd == pytest.approx([1 / np.sqrt(3)])
    with pytest.raises(AggregationFailed, match="nothing was decoded"):
        combine(replies)


def test_a_dropout_stops_with_a_clear_error_and_the_session_resumes(tmp_path):
    """Host B fails at iteration 1 after host A answered: the partial sum is refused. B
    restarts (new process: new noise key, its agreement secret from its ledger), the coordinator
    re-opens with the same keys, A replays its stored masked answer and the sum decodes. A
    coordinator that re-opens with other keys is refused (the masks would not cancel)."""
    ledgers = [Ledger(tmp_path / f"{h}.sqlite") for h in "ab"]
    nodes = make_nodes(3, ledger=ledgers[0])[:2] + make_nodes(3, ledger=ledgers[1])[2:]
    hosts = [OwnerHost(nodes[:2]), OwnerHost(nodes[2:])]
    request = open_hosts(hosts, "s", 1.0, 0)
    combine(ask(hosts, "s", 0, np.arange(4)))
    first = ask(hosts[:1], "s", 1, np.arange(4))
    with pytest.raises(AggregationFailed, match="an owner did not answer"):
        combine(first)
    restarted = OwnerNode("o2", MODEL, RECORDS[2], nodes[2].policy, ledgers[1],
                          noise_key=NoiseKey.from_os(), simulated_peers=True)  # fmt: skip
    assert restarted.session_key("s") == nodes[2].session_key("s")
    hosts = [OwnerHost(nodes[:2]), OwnerHost([restarted])]
    assert open_hosts(hosts, "s", 1.0, 0) == request
    replies = ask(hosts, "s", 1, np.arange(4))
    np.testing.assert_array_equal(replies[0].values, first[0].values)
    answers = combine(replies)
    gamma = hosts[0]._noise.secure["s"].gamma
    assert np.all(np.abs(answers.values - exact_lattice_sum(nodes, gamma))
                  < 8 * answers.noise_sd)  # fmt: skip
    other = [*request.peers[:2], PeerKey("o2", public_bytes(session_private_key(bytes(32), "s")))]
    with pytest.raises(InvalidRequest, match="keeps its peers and terms"):
        hosts[0].open_session("s", "penalty", 10**6, secure=SecureOpen(tuple(other), 1.0, 0))


# --------------------------------------------------------------------------- every transport


def by_ledger(nodes: list[OwnerNode]) -> list[list[OwnerNode]]:
    """Contiguous owners sharing a ledger: one owner host each."""
    groups: list[list[OwnerNode]] = []
    for node in nodes:
        if groups and groups[-1][0].ledger is node.ledger:
            groups[-1].append(node)
        else:
            groups.append([node])
    return groups


def two_hosts(folder, count: int, tag: str = "n", **kwargs) -> list[OwnerNode]:
    """``make_nodes`` on two ledger files — the first ⌈count/2⌉ owners, then the rest — so
    that every transport serves them as two hosts and sums masked answers across them."""
    ledgers = [Ledger(folder / f"{tag}-{h}.sqlite") for h in range(2)]
    half = (count + 1) // 2
    first = make_nodes(count, ledger=ledgers[0], tag=tag, **kwargs)[:half]
    return first + make_nodes(count, ledger=ledgers[1], tag=tag, **kwargs)[half:]


@pytest.fixture(params=["inprocess", "grpc", pytest.param("ray", marks=pytest.mark.slow)])
def connect(request):
    """connect(nodes) → an oracle over those owners through the transport under test: one
    in-process host; one gRPC owner server per ledger; one Ray actor per ledger (on the
    session's local Ray; the nodes then read their ledger files through read-only views; a
    new Ray oracle closes the previous one, whose actors it takes over)."""
    opened = []

    def make(nodes: list[OwnerNode]):
        if request.param == "inprocess":
            oracle = InProcessOracle(nodes)
        elif request.param == "ray":
            while opened:  # the session's two actors serve one oracle at a time
                opened.pop().close()
            oracle, actors = ray_oracle_of(request.getfixturevalue("ray_actors"), nodes)
            opened.append(actors)
        else:
            servers = [ServerThread(OwnerHost(group)) for group in by_ledger(nodes)]
            opened.extend(servers)
            addresses = [x.address for x in servers]
            oracle = GrpcOracle(addresses, model=nodes[0].model, deadline=10, retry_seconds=2)
        opened.append(oracle)
        return oracle

    yield make
    for thing in reversed(opened):
        thing.close()


# --------------------------------------------------------------------------- accounting


def test_each_answer_is_charged_delta_plus_gamma_over_s_and_the_report_shows_own_noise(
    tmp_path, connect
):
    """μ = (2 L step + γ)/s per answer, ε the RDP ε of the total μ (dp-accounting); the report
    adds what the owner's own noise s/√(K − t) alone would give: μ·√(K − t)."""
    nodes = two_hosts(tmp_path, 4, s=1.5, t=1)
    oracle = connect(nodes)
    oracle.open_session("penalty", 100, secure=SecureAggregation(1.5, 1))
    theta = np.zeros((10, 1))
    oracle.log_ratio(0, np.arange(10), theta, theta + 0.02)
    report = oracle.privacy_reports()[0]
    gamma = lattice_step(SecureTerms(4, 1, 1.5))
    mu = np.sqrt(10) * (2 * MODEL.lipschitz * 0.02 + gamma) / 1.5
    assert report.session is not None and report.session.mu == pytest.approx(mu, rel=1e-12)
    rdp = dp_accounting.rdp.RdpAccountant()
    rdp.compose(dp_accounting.GaussianDpEvent(1 / mu))
    assert report.session.epsilon == pytest.approx(rdp.get_epsilon(1e-5), rel=1e-9)
    own = report.own_noise
    assert own is not None and own.terms == SecureTerms(4, 1, 1.5) and own.session is not None
    assert own.session.mu == pytest.approx(mu * np.sqrt(3), rel=1e-12)
    assert own.session.epsilon > 1.5 * report.session.epsilon


def test_the_plan_is_checked_at_s_and_gradient_answers_are_accounted_at_s(tmp_path, connect):
    """A budget that fits 20 log-ratio answers at s (μ = 0.14 each) but not at σ = s/10: the
    secure plan opens, the plain one is refused; gradient answers are charged at multiplier s
    (less what lattice rounding can add)."""
    policy = {"sigma": 0.1, "budget_epsilon": 3.0, "max_step": 0.01}
    host = OwnerHost(make_nodes(2, s=1.0, t=0, **policy))
    open_hosts([host], "secure", 1.0, 0, plan=20)
    with pytest.raises(BudgetExhausted, match="refusing a plan of 20"):
        host.open_session("plain", "penalty", 20)
    nodes = two_hosts(tmp_path, 2, s=2.0, t=1, max_sampling_rate=0.5, max_clip=1.0)
    oracle = connect(nodes)
    oracle.open_session("sgmcmc", 10, sampling_rate=0.5, secure=SecureAggregation(2.0, 1))
    oracle.gradient(0, np.arange(2), np.zeros((2, 1)), 1.0)
    events = nodes[0].ledger.sampled("o0")
    assert events == [SubsampledGaussian(0.5, lattice_gradient_multiplier(2.0, 1), 2)]


# --------------------------------------------------------------------------- every query kind


def test_secure_gradients_and_statistics_decode_with_the_sum_variance(tmp_path, connect):
    """Gradient sums (q = 1: the whole data, no subsampling noise) and statistic copies come
    back as one decoded row with noise sd s·scale·√(K/(K − t)); over 3,000 chains the sd is
    within 6% of it and the mean within 5 standard errors of the exact sum."""
    bern = build_model({"name": "bernoulli", "theta_bound": 3.0})
    records = [bern.simulate_records(np.random.default_rng(k), np.array([0.2]), 50)
               for k in range(4)]  # fmt: skip
    policy = Policy(sigma=1.0, total_noise_sd=2.0, colluders=1, budget_epsilon=1e9,
                    max_sampling_rate=1.0, max_clip=1.0, max_answers_per_request=10**6)  # fmt: skip

    def owners(tag: str) -> list[OwnerNode]:
        ledgers = [Ledger(tmp_path / f"{tag}-{h}.sqlite") for h in range(2)]
        return [OwnerNode(f"o{k}", bern, r, policy, ledgers[k // 2],
                          noise_key=NoiseKey.derive(b"g", f"o{k}"), simulated_peers=True)
                for k, r in enumerate(records)]  # fmt: skip

    nodes = owners("gradient")
    oracle = connect(nodes)
    sd = 2.0 * np.sqrt(4 / 3)
    oracle.open_session("sgmcmc", 3000, sampling_rate=1.0, secure=SecureAggregation(2.0, 1))
    grads = oracle.gradient(0, np.arange(3000), np.full((3000, 1), 0.3), 0.5)
    assert grads.values.shape == (1, 3000, 1) and grads.noise_sd == pytest.approx([0.5 * sd])
    theta = np.array([[0.3]])
    exact = sum(
        clipped_gradient_sum(bern, n.records, theta, np.ones((1, len(n.records)), bool), 0.5)[0, 0]
        for n in nodes
    )
    assert abs(grads.values.mean() - exact) < 5 * 0.5 * sd / np.sqrt(3000)
    assert abs(grads.values.std(ddof=1) / (0.5 * sd) - 1) < 0.06
    stats_oracle = connect(owners("stats"))
    stats_oracle.open_session("penalty_expfam", 3000, secure=SecureAggregation(2.0, 1))
    copies = stats_oracle.suff_stats(np.arange(1000), 0, 3)
    assert copies.values.shape == (1, 1000, 3, 1)
    total = sum(float(n.stat_sum[0]) for n in nodes)
    assert abs(copies.values.mean() - total) < 5 * sd / np.sqrt(3000)
    assert abs(copies.values.std(ddof=1) / sd - 1) < 0.06


def test_every_transport_decodes_what_the_in_process_one_does(tmp_path, connect):
    """Hosts of 2 + 1 owners (gRPC: two owner servers; Ray: two actors) against one in-process
    host: the same owners give the same decoded sums (their noise keys are the same; their
    agreement secrets and so the masks differ, but cancel) with the same noise sd and own-noise
    reports, for log-likelihood ratios, statistic copies and gradient sums."""
    s, t = 1.2, 1
    policy = {"max_sampling_rate": 1.0, "max_clip": 1.0, "max_answers_per_request": 10**6}

    def owners(tag):
        nodes = make_nodes(3, s=s, t=t, tag="same", **policy)
        ledgers = [Ledger(tmp_path / f"{tag}{h}.sqlite") for h in range(2)]
        for n, ledger in zip(nodes, (ledgers[0], ledgers[0], ledgers[1])):
            n.ledger = ledger
        return nodes

    secure = SecureAggregation(s, t)
    chains, theta = np.arange(5), np.zeros((5, 1))
    oracles = [InProcessOracle(owners("local")), connect(owners("other"))]
    answers: list[list[Answers]] = []
    for oracle in oracles:
        opened = [oracle.open_session("penalty", 100, session="p", secure=secure)]
        mine = [oracle.log_ratio(3, chains, theta, theta + 0.01)]
        opened.append(oracle.open_session("penalty_expfam", 100, session="e", secure=secure))
        mine.append(oracle.suff_stats(chains, 0, 2))
        # an sgmcmc session at q = 1: no subsampling draws
        opened.append(oracle.open_session("sgmcmc", 100, session="g", sampling_rate=1.0,
                                          secure=secure))  # fmt: skip
        mine.append(oracle.gradient(2, chains, theta + 0.1, 0.5))
        assert opened == ["p", "e", "g"]
        answers.append(mine)
    for a, b in zip(*answers):
        assert a.values.shape[0] == 1
        np.testing.assert_array_equal(a.values, b.values)
        np.testing.assert_array_equal(a.noise_sd, b.noise_sd)
    assert oracles[1].privacy_reports() == oracles[0].privacy_reports()
    assert oracles[1].privacy_reports()[2].own_noise is not None
    oracles[0].close()


# --------------------------------------------------------------------------- exactness


class SumNoiseAsS:
    """A coordinator that takes the sum's noise variance for s² instead of K s²/(K − t)."""

    def __init__(self, oracle, factor: float):
        self.oracle, self.factor = oracle, factor

    def __getattr__(self, name):
        return getattr(self.oracle, name)

    def log_ratio(self, *args) -> Answers:
        a = self.oracle.log_ratio(*args)
        return Answers(a.values, a.noise_sd * self.factor)


def _secure_chain(sabotage: float | None = None, iterations: int = 4000):
    gauss = build_model({"name": "gaussian_mean", "dim": 1, "data_bound": 4.0,
                         "theta_bound": 3.0, "prior_sd": 2.0})  # fmt: skip
    records = [gauss.simulate_records(np.random.default_rng(k), np.array([0.4]), n)
               for k, n in enumerate((60, 100, 140, 80))]  # fmt: skip
    policy = Policy(max_step=0.12, budget_epsilon=1e9, total_noise_sd=1.3, colluders=2)
    ledger = Ledger(":memory:")
    seeds = np.random.SeedSequence(9).spawn(len(records))
    nodes = [OwnerNode.simulated(f"o{k}", gauss, r, policy, ledger, seed)
             for k, (r, seed) in enumerate(zip(records, seeds))]  # fmt: skip
    oracle = InProcessOracle(nodes)
    ref = gauss.reference_posterior(np.concatenate(records))
    rng = np.random.default_rng(5)
    theta0 = ref.mean + 0.5 * ref.sd * rng.standard_normal((8, 1))
    oracle.open_session("penalty", 8 * (iterations + 500), secure=SecureAggregation(1.3, 2))
    used = oracle if sabotage is None else SumNoiseAsS(oracle, sabotage)
    algo = kernel("penalty", gauss, oracle=used, step=0.12)
    result = sample(algo, rng, theta0, iterations=iterations, warmup=500, progress=False)
    return result, z_scores(result.theta, ref)


@pytest.mark.slow
def test_penalty_chain_with_secure_aggregation_is_exact_and_fails_when_sabotaged():
    """K = 4 simulated owners (seeded lattice noise, SplitMix masks), t = 2, s = 1.3: the sum's
    noise variance is 2s² = 3.4, a strong penalty. The closed-form posterior within Z = 4.5
    MCSE; a coordinator that takes the variance for s² (t ignored) fails the same check (its sd
    came out 12 MCSE off at 6,000 iterations in development)."""
    result, z = _secure_chain()
    assert z.max() < Z, z
    assert 0.05 < result.acceptance_rate < 0.6
    _, z_wrong = _secure_chain(sabotage=np.sqrt(2 / 4))
    assert z_wrong.max() > Z, z_wrong


# --------------------------------------------------------------------------- scenarios


@pytest.mark.parametrize(
    "privacy, sampler, message",
    [
        ({"aggregation": "secure"}, {}, "needs privacy.total_noise_sd"),
        ({"aggregation": "secure", "total_noise_sd": 1.0, "colluders": 4}, {},
         "privacy.colluders = 4 must be below the number of owners (4)"),
        ({"aggregation": "secure", "total_noise_sd": 1.0}, {"algorithm": "ops"},
         "not 'ops'"),
        ({"aggregation": "secure", "total_noise_sd": 1.0}, {"algorithm": "hybrid"},
         "not 'hybrid'"),
        ({"total_noise_sd": 1.0}, {}, "apply with privacy.aggregation = 'secure' only"),
        ({"aggregation": "sum"}, {}, "privacy.aggregation must be one of 'none', 'secure'"),
    ],
)  # fmt: skip
def test_scenario_checks_secure_aggregation_keys(privacy, sampler, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        resolve({"data": {"owners": 4}, "privacy": privacy, "sampler": sampler})


@pytest.mark.parametrize("transport", ["inprocess", pytest.param("ray", marks=pytest.mark.slow)])
def test_a_simulated_secure_run_writes_what_it_assumed(tmp_path, request, transport):
    """``simulate`` with secure aggregation (in process; Ray: owners in two actors):
    privacy.json states the aggregation, s, t, the assumption, the simulated noise and masks,
    and per owner the K it counted and ε from its own noise alone (larger than under the
    assumption)."""
    if transport == "ray":
        request.getfixturevalue("ray_session")  # the session's local Ray, started once
    scenario = load_scenario(None, [
        "privacy.aggregation='secure'", "privacy.total_noise_sd=1.0", "privacy.colluders=1",
        f"run.transport='{transport}'", "run.progress=false", "data.owners=3",
        "data.n_per_owner=2000", "sampler.iterations=150", "sampler.warmup=50",
        "sampler.chains=2", "sampler.step=0.02", "privacy.budget_epsilon=100.0",
    ])  # fmt: skip
    result = run_scenario(scenario, tmp_path / "run")
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert (privacy["aggregation"], privacy["total_noise_sd"], privacy["colluders"]) == (
        "secure",
        1.0,
        1,
    )
    assert "at most t = 1" in privacy["assumption"] and "SplitMix64" in privacy["noise"]
    for owner in privacy["owners"]:
        assert owner["owners_counted"] == 3 and "sigma" not in owner
        assert owner["owner_noise_sd"] == pytest.approx(1 / np.sqrt(2))
        assert owner["epsilon_own_noise_only"] > owner["epsilon"] > 0
        assert owner["accountant"] == "rdp"
    assert result.diagnostics["kept_draws"] == 150
    assert result.diagnostics["mean_noise_variance"] == pytest.approx(3 / 2)


def test_the_offline_owner_report_shows_the_own_noise_epsilon(tmp_path):
    """``fedpenalty owner report`` reads a ledger with secure sessions and prints ε under the
    assumption and from the owner's own noise alone, as the owner's live report does."""
    ledger = Ledger(tmp_path / "alice.sqlite")
    nodes = make_nodes(3, s=1.0, t=1, ledger=ledger)
    oracle = InProcessOracle(nodes)
    oracle.open_session("penalty", 100, secure=SecureAggregation(1.0, 1))
    theta = np.zeros((5, 1))
    oracle.log_ratio(0, np.arange(5), theta, theta + 0.02)
    live = oracle.privacy_reports()[0]
    ledger.close()
    np.savetxt(tmp_path / "x.csv", RECORDS[0], header="x", comments="")
    (tmp_path / "o0.toml").write_text(
        '[model]\nname = "gaussian_mean"\ndim = 1\ndata_bound = 4.0\ntheta_bound = 3.0\n'
        '[data]\npath = "x.csv"\n[privacy]\nbudget_epsilon = 1e9\ntotal_noise_sd = 1.0\n'
        'colluders = 1\n[server]\nledger = "alice.sqlite"\n'
    )
    done = run_cli("owner", "report", str(tmp_path / "o0.toml"), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert live.own_noise is not None
    assert report["epsilon"] == pytest.approx(live.total.epsilon, rel=1e-9)
    assert report["epsilon_own_noise_only"] == pytest.approx(live.own_noise.total.epsilon, rel=1e-9)


class TwoHosts:
    """A coordinator over two owner hosts (owners o0, o1 | o2) with secure aggregation; host B
    does not answer the query of iteration ``drop_at`` (a dropout), once."""

    def __init__(self, folder, tag: str, drop_at: int = -1):
        model = build_model({"name": "bernoulli", "theta_bound": 3.0})
        records = [model.simulate_records(np.random.default_rng(k), np.array([0.5]), 300)
                   for k in range(3)]  # fmt: skip
        policy = Policy(max_step=0.3, budget_epsilon=1e9, total_noise_sd=1.5, colluders=1)
        seeds = np.random.SeedSequence(4).spawn(3)
        ledgers = [Ledger(folder / f"{tag}-{h}.sqlite") for h in "ab"]
        nodes = [OwnerNode.simulated(f"o{k}", model, r, policy, ledgers[k // 2], seeds[k])
                 for k, r in enumerate(records)]  # fmt: skip
        self.model, self.ledgers, self.drop_at = model, ledgers, drop_at
        self.hosts = [OwnerHost(nodes[:2]), OwnerHost(nodes[2:])]
        open_hosts(self.hosts, "run", 1.5, 1)

    def describe(self):
        return [d for h in self.hosts for d in h.describe()]

    def log_ratio(self, iteration, chains, theta, theta_prop) -> Answers:
        hosts = self.hosts[:1] if iteration == self.drop_at else self.hosts
        if iteration == self.drop_at:
            self.drop_at = -1
        asked = [h.log_ratio("run", iteration, chains, theta, theta_prop) for h in hosts]
        return combine([h.reply("run", a) for h, a in zip(hosts, asked)])

    def run(self, **kwargs):
        algo = kernel("penalty", self.model, oracle=self, step=0.3)
        theta0 = np.random.default_rng(3).uniform(-0.5, 0.5, (3, 1))
        rng = np.random.default_rng(5)
        return sample(algo, rng, theta0, iterations=60, warmup=20, progress=False, **kwargs)

    def close(self):
        for ledger in self.ledgers:
            ledger.close()


def test_a_dropout_stops_the_run_resumably_and_the_resumed_chain_is_the_uninterrupted_one(
    tmp_path,
):
    """Host B drops out at iteration 47: the sum is refused (AggregationFailed), the driver
    stops with a checkpoint; restarted owners (same seeds, same ledgers) and a re-opened
    session continue to exactly the chain of a run without the dropout."""
    reference = TwoHosts(tmp_path, "reference").run()
    stopped = TwoHosts(tmp_path, "stopped", drop_at=47)
    path = tmp_path / "checkpoint.npz"
    with pytest.raises(SamplingStopped) as info:
        stopped.run(checkpoint=lambda p: checkpoint.save(path, p), checkpoint_every=10)
    assert isinstance(info.value.cause, AggregationFailed)
    checkpoint.save(path, info.value.progress)
    stopped.close()
    resumed = TwoHosts(tmp_path, "stopped").run(resume=checkpoint.load(path))
    np.testing.assert_array_equal(resumed.theta, reference.theta)
    np.testing.assert_array_equal(resumed.accepted, reference.accepted)
