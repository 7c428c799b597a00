"""The random_intercept hierarchical model (docs/design.md §6, "Hierarchical models (design)"):
its prior, box and local model, and its deterministic reference posterior."""

from __future__ import annotations

import math

import numpy as np
import pytest
from ray_support import ray_oracle_of
from scipy import stats

from fedpenalty.common import Policy
from fedpenalty.coordinator import penalty_hier
from fedpenalty.coordinator.grpc_oracle import GrpcOracle
from fedpenalty.coordinator.inprocess import InProcessOracle
from fedpenalty.coordinator.mh import expected_acceptance
from fedpenalty.coordinator.oracle import Answers, SecureAggregation
from fedpenalty.errors import ConfigError, InvalidRequest
from fedpenalty.kinds import KindTerms
from fedpenalty.models.random_intercept import RandomIntercept
from fedpenalty.owner import Ledger, OwnerNode
from fedpenalty.owner.host import OwnerHost
from fedpenalty.owner.noise.sources import NoiseKey
from fedpenalty.owner.server import ServerThread

COUNTS = (30, 60, 120, 240)


def _owners(model: RandomIntercept, seed: int = 0, counts=COUNTS):
    """z_true (μ = 0.5, τ = 0.7) and each owner's records."""
    rng = np.random.default_rng(seed)
    z = model.simulate_blocks(rng, np.array([0.5, math.log(0.7)]), len(counts))
    return z, [model.simulate_owner_records(rng, z, k, n) for k, n in enumerate(counts)]


def test_prior_gradient_and_box():
    model, k = RandomIntercept(), 3
    rng = np.random.default_rng(1)
    z = np.column_stack(
        [rng.uniform(-2, 2, 5), rng.uniform(-2, 0.5, 5), rng.uniform(-1, 1, (5, k))]
    )
    h = 1e-6
    for j in range(z.shape[1]):
        e = np.zeros_like(z)
        e[:, j] = h
        num = (model.log_prior(z + e, k) - model.log_prior(z - e, k)) / (2 * h)
        np.testing.assert_allclose(model.grad_log_prior(z, k)[:, j], num, rtol=1e-6, atol=1e-6)
    # the prior of log τ is the half-normal density of τ times its Jacobian τ
    t = z[:, 1]
    expected = (
        stats.halfnorm.logpdf(np.exp(t)) + t - k * t - 0.5 * (z[:, 2:] ** 2).sum(1) / np.exp(2 * t)
    )
    mu = -0.5 * (z[:, 0] / 10.0) ** 2
    diff = model.log_prior(z, k) - (expected + mu)
    np.testing.assert_allclose(diff, diff[0])  # equal up to a constant
    assert model.in_theta_space(z, k).all()
    outside = z.copy()
    outside[0, 1] = math.log(2.5)  # τ above tau_max
    outside[1, 2] = 12.5  # a block beyond b_bound
    outside[2, 0] = np.nan
    assert model.in_theta_space(outside, k).tolist() == [False, False, False, True, True]


def test_local_model_is_what_each_owner_reads():
    model = RandomIntercept()
    z, records = _owners(model)
    phi = model.local_params(z[None, :], len(COUNTS))
    assert phi.shape == (len(COUNTS), 1, 1)
    np.testing.assert_allclose(phi[:, 0, 0], z[0] + z[2:])
    local = model.local_model()
    assert local.name == "gaussian_mean" and local.dim == 1
    assert local.theta_bound == model.mu_bound + model.b_bound
    corner = np.array([[model.mu_bound, model.log_tau_box[1], *[model.b_bound] * 4]])
    assert local.in_theta_space(model.local_params(corner, 4)[:, 0]).all()
    # owner k's log-likelihood at φ_k is the model's: Σ_i log N(y_ki; μ + b_k, σ²)
    for k, rec in enumerate(records):
        direct = stats.norm.logpdf(rec[:, 0], z[0] + z[2 + k], 1.0).sum()
        assert local.log_lik(rec, phi[k]).sum() == pytest.approx(direct, rel=1e-12)


def test_bad_boxes_are_refused_naming_the_key():
    with pytest.raises(ConfigError, match="b_bound"):
        RandomIntercept(b_bound=5.0)  # < 6·tau_max = 12
    with pytest.raises(ConfigError, match="tau_min"):
        RandomIntercept(tau_min=3.0)
    with pytest.raises(ConfigError, match="unknown key 'dim'"):
        RandomIntercept(dim=2)
    _, records = _owners(RandomIntercept())
    with pytest.raises(ValueError, match=r"model\.mu_bound"):
        RandomIntercept(mu_bound=0.6).reference_posterior(records)


def _gibbs(model: RandomIntercept, records, chains: int, iters: int, seed: int) -> np.ndarray:
    """Exact Metropolis-within-Gibbs on z given the records (no privacy, no owners): μ and each
    b_k from their Gaussian conditionals, log τ by random-walk MH on its box. ``(chains, iters,
    2 + K)`` after a burn-in of iters/5."""
    rng = np.random.default_rng(seed)
    n = np.array([len(r) for r in records], dtype=float)
    ysum = np.array([r.sum() for r in records])
    k = len(records)
    lo, hi = model.log_tau_box
    mu, lt, b = np.zeros(chains), np.full(chains, -0.5), np.zeros((chains, k))

    def log_target_tau(t):
        tau2 = np.exp(2 * t)
        return -0.5 * tau2 + t - k * t - 0.5 * (b * b).sum(1) / tau2

    out = np.empty((chains, iters, 2 + k))
    for i in range(iters + iters // 5):
        prec = 1 / 100.0 + n.sum()
        mean = (ysum - n * b).sum(1) / prec
        mu = mean + rng.standard_normal(chains) / math.sqrt(prec)
        tau2 = np.exp(2 * lt)[:, None]
        bprec = n + 1 / tau2
        b = (ysum - n * mu[:, None]) / bprec + rng.standard_normal((chains, k)) / np.sqrt(bprec)
        prop = lt + 0.5 * rng.standard_normal(chains)
        inside = (prop >= lo) & (prop <= hi)
        acc = inside & (np.log(rng.random(chains)) < log_target_tau(prop) - log_target_tau(lt))
        lt = np.where(acc, prop, lt)
        if i >= iters // 5:
            out[:, i - iters // 5] = np.column_stack([mu, lt, b])
    return out


def test_reference_matches_an_exact_gibbs_sampler():
    """The quadrature reference against an independent exact sampler (conditionals, not the
    marginal of τ): 400 chains × 1500 draws; each coordinate's |z| = |mean − ref| / MCSE < 4.5
    (MCSE from the spread of the 400 chain means, which are independent), and the sd within
    3% (its MCSE is ~1% with ≥ 10,000 effective draws). A wrong conditional variance or a
    missing Jacobian moves log τ's mean by several tenths."""
    model = RandomIntercept()
    _, records = _owners(model)
    ref = model.reference_posterior(records)
    assert ref.source == "closed_form" and ref.mean.shape == (6,)
    draws = _gibbs(model, records, chains=400, iters=1500, seed=3)
    chain_means = draws.mean(axis=1)
    mcse = chain_means.std(axis=0, ddof=1) / math.sqrt(len(chain_means))
    z = (chain_means.mean(axis=0) - ref.mean) / mcse
    assert np.all(np.abs(z) < 4.5), (z, ref.mean)
    sd = draws.reshape(-1, 6).std(axis=0)
    np.testing.assert_allclose(sd, ref.sd, rtol=0.03)


def test_reference_is_deterministic_and_pools_as_the_records_say():
    model = RandomIntercept()
    _, records = _owners(model)
    a, b = model.reference_posterior(records), model.reference_posterior(records)
    np.testing.assert_array_equal(a.mean, b.mean)
    # many records per owner: b_k's posterior concentrates on ȳ_k − μ
    _, big = _owners(model, seed=2, counts=(20000, 20000, 20000))
    ref = model.reference_posterior(big)
    ybar = np.array([r.mean() for r in big])
    np.testing.assert_allclose(ref.mean[0] + ref.mean[2:], ybar, atol=1e-3)


# --- the per-owner θ axis and the penalty_hier kernel ------------------------------------------

LOCAL = RandomIntercept().local_model()


def _oracle(tmp_path, records, sigma: float = 0.5, max_step: float = 0.5, name: str = "o"):
    """In-process owners serving the local model, one per records array, noise sd ``sigma``
    (nats) and a budget no test reaches."""
    ledger = Ledger(tmp_path / f"{name}.sqlite", synchronous="NORMAL")
    policy = Policy(sigma=sigma, max_step=max_step, budget_epsilon=1e9, delta=1e-5)
    nodes = [
        OwnerNode(f"{name}{k}", LOCAL, LOCAL.prepare_records(r), policy, ledger, rng)
        for k, (r, rng) in enumerate(zip(records, np.random.default_rng(5).spawn(len(records))))
    ]
    return InProcessOracle(nodes, LOCAL)


def _session_epsilon(oracle: InProcessOracle) -> list[float]:
    return [r.session.epsilon for r in oracle.privacy_reports()]


def test_per_owner_epsilon_is_the_same_with_2_and_8_owners(tmp_path):
    """Owner 0 answers the same local moves φ_0 → φ_0' whether 1 or 7 other owners answer
    beside it (their blocks move far more): its ε is the same, and equals the ε of the same
    moves asked of it alone (an independent composition of its own answers)."""
    rng = np.random.default_rng(0)
    theta = rng.uniform(-1, 1, (4, 1))
    step0 = np.array([[0.1], [-0.2], [0.05], [0.3]])
    eps = {}
    for owners in (2, 8):
        o = _oracle(tmp_path, [np.zeros((50, 1))] * owners, name=f"k{owners}_")
        o.open_kinds([KindTerms("log_ratio", 40, max_step=0.5)])
        big = rng.uniform(-0.45, 0.45, (owners, 4, 1))
        big[0] = step0  # owner 0's local steps are the same in both runs
        phi = np.broadcast_to(theta, (owners, 4, 1))
        for it in range(5):
            o.query("log_ratio", it, np.arange(4), substep=1, theta=phi, theta_prop=phi + big)
        eps[owners] = _session_epsilon(o)
    alone = _oracle(tmp_path, [np.zeros((50, 1))], name="alone")
    alone.open_kinds([KindTerms("log_ratio", 40, max_step=0.5)])
    for it in range(5):
        alone.query("log_ratio", it, np.arange(4), theta=theta, theta_prop=theta + step0)
    assert eps[2][0] == pytest.approx(eps[8][0], rel=1e-12)
    assert eps[2][0] == pytest.approx(_session_epsilon(alone)[0], rel=1e-12)
    assert max(eps[8][1:]) > 1.5 * eps[8][0]  # the others' larger moves cost only them


def test_each_owner_answers_at_its_own_rows(tmp_path):
    """A per-owner request gives owner k the answer to its row alone: the same value as a flat
    request of that row to a host of owner k only, whatever the other rows are."""
    _, records = _owners(RandomIntercept())
    phi = np.array([[[0.2]], [[0.4]], [[-0.3]], [[1.0]]])
    prop = phi + np.array([[[0.1]], [[-0.2]], [[0.05]], [[0.3]]])
    o = _oracle(tmp_path, records, sigma=0.01)  # noise sd far below the values compared
    o.open_kinds([KindTerms("log_ratio", 10, max_step=0.5)], session="s")
    values = o.query("log_ratio", 0, np.arange(1), substep=2, theta=phi, theta_prop=prop).values
    for k, rec in enumerate(records):
        at = [
            LOCAL.log_lik_diff(LOCAL.prepare_records(rec), phi[j], prop[j]).sum() for j in range(4)
        ]
        assert values[k, 0] == pytest.approx(at[k], abs=0.05)
        assert min(abs(values[k, 0] - a) for j, a in enumerate(at) if j != k) > 0.2


def test_an_owner_refuses_rows_outside_its_box_or_above_its_step(tmp_path):
    """Owner 1's row outside its local box, or its local step above max_step, is refused naming
    owner 1, and no owner — owner 0 neither — is charged (every row is checked first)."""
    o = _oracle(tmp_path, [np.zeros((10, 1))] * 3, max_step=0.3)
    o.open_kinds([KindTerms("log_ratio", 10, max_step=0.3)])
    phi = np.zeros((3, 2, 1))
    outside = phi.copy()
    outside[1, 0, 0] = LOCAL.theta_bound + 0.5
    with pytest.raises(InvalidRequest, match=r"o1.*outside Θ|outside Θ.*o1"):
        o.query("log_ratio", 0, np.arange(2), theta=outside, theta_prop=outside + 0.1)
    long = phi + 0.1
    long[1, 1, 0] = 0.45
    with pytest.raises(InvalidRequest, match=r"exceeds") as err:
        o.query("log_ratio", 0, np.arange(2), theta=phi, theta_prop=long)
    assert "o1" in str(err.value)
    assert all(r.session.answers == 0 for r in o.privacy_reports())
    with pytest.raises(InvalidRequest, match="owner rows"):
        o.query("log_ratio", 0, np.arange(2), theta=phi[:2], theta_prop=phi[:2] + 0.1)


class CountingOracle:
    """An oracle that records the sub-step of every query it passes on."""

    def __init__(self, inner):
        self.inner, self.substeps = inner, []

    def query(self, kind, iteration, chains, substep=0, **arrays):
        self.substeps.append(substep)
        return self.inner.query(kind, iteration, chains, substep=substep, **arrays)


def test_the_hyper_sub_step_asks_no_owner(tmp_path):
    """Sub-step 1 (log τ) never reaches an owner: an iteration asks at sub-steps 1 (μ) and 2
    (blocks) only, and each owner is charged exactly 2 answers per chain per iteration."""
    model = RandomIntercept()
    _, records = _owners(model)
    o = _oracle(tmp_path, records)
    o.open_kinds([KindTerms("log_ratio", 1000, max_step=0.5)], session="s")
    counting = CountingOracle(o)
    state = penalty_hier.init(np.tile([0.5, -0.5, 0, 0, 0, 0], (3, 1)), model, 4)
    radii = penalty_hier.Radii(hyper=0.5, shared=0.2, block=0.3)
    rng = np.random.default_rng(1)
    hyper_moves = 0
    for _ in range(20):
        state, info = penalty_hier.step(rng, state, model, counting, radii)
        hyper_moves += int(info.hyper_accepted.sum())
        assert info.queried.all()  # μ' stays inside |μ| ≤ 3 from 0.5 with radius 0.2
    assert counting.substeps == [1, 2] * 20
    assert [r.session.answers for r in o.privacy_reports()] == [2 * 3 * 20] * 4
    assert hyper_moves > 0  # log τ did move, at no owner's cost


def test_the_shift_keeps_every_owners_local_parameter_and_asks_no_owner():
    """Along random_intercept's invariant direction every φ_k = μ + b_k is unchanged (so the
    likelihood ratio is exactly 1), and the shift move asks no one (no oracle is given) yet
    moves μ; with radius 0 it makes no move and draws nothing from the rng."""
    model = RandomIntercept()
    rng = np.random.default_rng(5)
    z = np.tile([0.1, -0.5, 0.01, -0.02, 0.0, 0.03], (16, 1))
    moved = z + rng.uniform(-0.05, 0.05, (16, 1)) * model.invariant_directions(4)
    np.testing.assert_allclose(model.local_params(moved, 4), model.local_params(z, 4), atol=1e-15)
    out, acc = penalty_hier.shift_step(rng, z, model, 4, radius=0.02)
    assert acc.any() and not np.allclose(out[acc, 0], z[acc, 0])
    np.testing.assert_allclose(model.local_params(out, 4), model.local_params(z, 4), atol=1e-15)
    before = rng.bit_generator.state
    same, none = penalty_hier.shift_step(rng, z, model, 4, radius=0.0)
    assert np.array_equal(same, z) and not none.any() and rng.bit_generator.state == before


@pytest.mark.parametrize("shift", [0.0, 0.3])
def test_penalty_hier_matches_the_closed_form_reference(tmp_path, shift):
    """The kernel on in-process owners (σ = 0.5 nats each) against the quadrature reference:
    48 chains started near the reference mean, 150 iterations dropped, 600 kept. Chains are
    independent, so the MCSE of the mean and of the second moment about the reference mean is
    the spread of the 48 chain-wise estimates /√48; every |z| < 4.5 for both. μ and the b_k
    are strongly correlated and mix slowly, so a fixed sd tolerance would be loose or flaky;
    an owner answering at another owner's row or a wrong prior term moves them by many MCSE.
    At σ = 0.5 a dropped −σ²/2 biases less than the MCSE: the acceptance tests below check
    the penalty itself. The session id is fixed: the simulated owners' noise is keyed by it.
    With ``shift`` > 0 the likelihood-invariant move (μ + c, b_k − c) runs too: a wrong sign
    on one b_k, or a prior term left out of its ratio, moves the b_k by many MCSE."""
    model = RandomIntercept()
    _, records = _owners(model)
    ref = model.reference_posterior(records)
    o = _oracle(tmp_path, records)
    chains, warm, kept = 48, 150, 600
    o.open_kinds([KindTerms("log_ratio", 2 * (warm + kept), max_step=0.5)], session="s")
    rng = np.random.default_rng(11)
    start = ref.mean + 0.1 * ref.sd * rng.standard_normal((chains, 6))
    state = penalty_hier.init(start, model, 4)
    radii = penalty_hier.Radii(hyper=0.8, shared=0.35, block=0.45, shift=shift)
    draws = np.empty((chains, kept, 6))
    for i in range(warm + kept):
        state, _ = penalty_hier.step(rng, state, model, o, radii)
        if i >= warm:
            draws[:, i - warm] = state.z
    chain_means = draws.mean(axis=1)
    mcse = chain_means.std(axis=0, ddof=1) / math.sqrt(chains)
    z = (chain_means.mean(axis=0) - ref.mean) / mcse
    assert np.all(np.abs(z) < 4.5), (z, chain_means.mean(axis=0), ref.mean)
    second = ((draws - ref.mean) ** 2).mean(axis=1)  # (chains, 6), about the reference mean
    mcse2 = second.std(axis=0, ddof=1) / math.sqrt(chains)
    z2 = (second.mean(axis=0) - ref.sd**2) / mcse2
    assert np.all(np.abs(z2) < 4.5), (z2, np.sqrt(second.mean(axis=0)), ref.sd)


# --- the per-owner axis over the transports -----------------------------------------------------

GROUPS = ((0, 1), (2, 3))  # owners per gRPC host / Ray actor (each group shares a ledger)


def _nodes(tmp_path, tag: str, records) -> list[OwnerNode]:
    """Four owners of the local model with seeded noise, two per ledger file."""
    policy = Policy(sigma=0.5, max_step=0.5, budget_epsilon=1e9, delta=1e-5)
    ledgers = [Ledger(tmp_path / f"{tag}-{g}.sqlite", synchronous="NORMAL") for g in range(2)]
    return [
        OwnerNode(f"owner-{k}", LOCAL, LOCAL.prepare_records(r), policy, ledgers[k // 2], rng)
        for k, (r, rng) in enumerate(zip(records, np.random.default_rng(9).spawn(4)))
    ]


def _chain(oracle, iterations: int = 6) -> np.ndarray:
    """``iterations`` penalty_hier steps of 3 chains on ``oracle``: the states ``(it, 3, 6)``."""
    model = RandomIntercept()
    oracle.open_kinds([KindTerms("log_ratio", 2 * iterations, max_step=0.5)], session="s")
    state = penalty_hier.init(np.tile([0.4, -0.5, 0.1, -0.1, 0.2, 0.0], (3, 1)), model, 4)
    radii = penalty_hier.Radii(hyper=0.8, shared=0.35, block=0.45)
    rng, out = np.random.default_rng(4), []
    for _ in range(iterations):
        state, _ = penalty_hier.step(rng, state, model, oracle, radii)
        out.append(state.z)
    return np.array(out)


@pytest.mark.parametrize("transport", ["grpc", pytest.param("ray", marks=pytest.mark.slow)])
def test_the_per_owner_axis_over_a_transport_equals_in_process_draw_for_draw(
    tmp_path, request, transport
):
    """penalty_hier over two owner hosts (gRPC servers or Ray actors, 2 + 2 owners: each host
    receives its own owners' rows only) gives the in-process chain draw for draw, and each
    owner is charged the same."""
    _, records = _owners(RandomIntercept())
    local = InProcessOracle(_nodes(tmp_path, "a", records), LOCAL)
    expected = _chain(local)
    nodes = _nodes(tmp_path, "b", records)
    opened: list = []
    if transport == "grpc":
        servers = [ServerThread(OwnerHost([nodes[k] for k in g])) for g in GROUPS]
        opened.extend(servers)
        oracle = GrpcOracle([s.address for s in servers], model=LOCAL, deadline=10)
    else:
        oracle, actors = ray_oracle_of(request.getfixturevalue("ray_actors"), nodes)
        opened.append(actors)
    try:
        np.testing.assert_allclose(_chain(oracle), expected, rtol=1e-12, atol=1e-12)
        spent = [r.session.epsilon for r in oracle.privacy_reports()]
        assert spent == pytest.approx([r.session.epsilon for r in local.privacy_reports()])
    finally:
        oracle.close()
        for thing in reversed(opened):
            thing.close()


def test_a_block_radius_beyond_the_block_box_is_refused(tmp_path):
    model = RandomIntercept()
    state = penalty_hier.init(np.zeros((1, 6)), model, 4)
    radii = penalty_hier.Radii(hyper=0.5, shared=0.2, block=model.block_bound)
    with pytest.raises(ValueError, match="block_bound"):
        penalty_hier.step(np.random.default_rng(0), state, model, None, radii)  # type: ignore[arg-type]


def test_warmup_adapts_each_radius_to_its_own_acceptance_within_the_owners_step(tmp_path):
    """From radii 50× too small (and a block radius at the cap), 300 warmup iterations bring
    each sub-step's acceptance over the next 100 frozen iterations into [0.15, 0.55] around the
    target 0.3, with the owner-facing radii ≤ max_step = 0.5 (whose refusal would fail the run)."""
    model = RandomIntercept()
    _, records = _owners(model)
    ref = model.reference_posterior(records)
    o = _oracle(tmp_path, records)
    o.open_kinds([KindTerms("log_ratio", 2 * 400, max_step=0.5)], session="s")
    rng = np.random.default_rng(2)
    state = penalty_hier.init(np.tile(ref.mean, (8, 1)), model, 4)
    radii = penalty_hier.Radii(hyper=0.02, shared=0.007, block=0.5)
    for i in range(300):
        state, info = penalty_hier.step(rng, state, model, o, radii)
        radii = penalty_hier.adapted(radii, info, i, cap=0.5)
    assert radii.shared <= 0.5 and radii.block <= 0.5 and radii.shared > 0.05
    rates = np.zeros(3)
    for _ in range(100):
        state, info = penalty_hier.step(rng, state, model, o, radii)
        moved = (info.hyper_accepted, info.accepted, info.block_acceptance)
        rates += [x.mean() / 100 for x in moved]
    assert np.all((rates > 0.15) & (rates < 0.55)), (rates, radii)


class ZeroRatioOwners:
    """Four fake owners whose answers make every exact log ratio, prior included, zero: each
    answers −(the prior ratio of the move)/K (μ moves) or −(its block's prior ratio) (block
    moves), plus N(0, σ²) noise. The penalty test then accepts with probability
    E[min{1, exp(sξ − s²/2)}] (``mh.expected_acceptance(0, s²)``)."""

    def __init__(self, model: RandomIntercept, z: np.ndarray, sigma: float):
        self.model, self.z, self.sigma = model, z, sigma
        self.rng = np.random.default_rng(8)

    def query(self, kind, iteration, chains, substep=0, theta=None, theta_prop=None):
        z, k = self.z[chains], 4
        step = theta_prop - theta  # (K, C, 1): Δμ for every owner, or each owner's Δb_k
        if substep == penalty_hier.THETA_SUBSTEP:
            prop = z.copy()
            prop[:, 0] += step[0, :, 0]
            ratio = self.model.log_prior(prop, k) - self.model.log_prior(z, k)
            exact = np.broadcast_to(-ratio / k, (k, len(chains)))
        else:
            b, tau2 = z[:, 2:].T, np.exp(2 * z[:, 1])
            exact = ((b + step[:, :, 0]) ** 2 - b**2) / (2 * tau2)
        values = exact + self.sigma * self.rng.standard_normal(exact.shape)
        return Answers(values, np.full(k, self.sigma))


@pytest.mark.parametrize("sub_step", ["shared", "block"])
def test_the_penalty_accepts_at_the_rate_the_noise_variance_says(sub_step):
    """With exact log ratios of zero, 20,000 chains accept at 2Φ(−s/2) (s² = Kσ² for μ, σ² for
    a block, σ = 1): within 4 binomial sd (~0.013). Without −s²/2 the rate would be ≥ 0.5,
    and with every owner's σ² charged to each block the block rate would be 0.32."""
    model, chains, sigma = RandomIntercept(), 20_000, 1.0
    rng = np.random.default_rng(3)
    z = np.column_stack(
        [rng.uniform(-1, 1, chains), np.full(chains, -0.5), rng.normal(0, 0.5, (chains, 4))]
    )
    owners = ZeroRatioOwners(model, z, sigma)
    state = penalty_hier.init(z, model, 4)
    if sub_step == "shared":
        _, accepted, _, s2 = penalty_hier.shared_step(rng, state, z, model, owners, 0.3)
        noise_var = 4 * sigma**2
        assert np.allclose(s2, noise_var)
    else:
        _, accepted = penalty_hier.block_step(rng, state, z, model, owners, 0.3)
        noise_var = sigma**2
    expected = float(expected_acceptance(0.0, noise_var))
    sd = math.sqrt(expected * (1 - expected) / accepted.size)
    assert abs(accepted.mean() - expected) < 4 * sd, (accepted.mean(), expected)


def test_a_secure_session_refuses_per_owner_rows(tmp_path):
    """Secure aggregation releases one masked sum over owners: per-owner rows are refused with
    the key to change, and nobody is charged."""
    policy = Policy(total_noise_sd=1.5, colluders=1, budget_epsilon=1e9, max_step=0.5)
    ledger = Ledger(tmp_path / "l.sqlite", synchronous="NORMAL")
    nodes = [
        OwnerNode(f"o{k}", LOCAL, np.zeros((20, 1)), policy, ledger,
                  noise_key=NoiseKey.derive(b"t", f"o{k}"), simulated_peers=True)
        for k in range(3)
    ]  # fmt: skip
    o = InProcessOracle(nodes, LOCAL)
    o.open_session("penalty", 10, session="s", secure=SecureAggregation(1.5, 1))
    phi = np.zeros((3, 2, 1))
    with pytest.raises(InvalidRequest, match=r"privacy\.aggregation = 'none'"):
        o.query("log_ratio", 0, np.arange(2), theta=phi, theta_prop=phi + 0.1)
    assert all(r.session.answers == 0 for r in o.privacy_reports())
