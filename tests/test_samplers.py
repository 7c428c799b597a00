"""Exactness of the samplers against closed-form posteriors (docs/design.md §3, invariant 5).

The check: for every dimension, the posterior mean and sd of the draws must lie within
Z = 4.5 Monte Carlo standard errors (arviz-stats MCSE of the mean and of the sd, which account
for autocorrelation) of the exact values. Two statistics × a few dimensions per test at
4.5 MCSE give a false-alarm rate per test below ~1e-4 under a correct sampler; the seeds are
fixed, so each test is deterministic.

Each sampler test also runs the *same* check on sabotaged runs — the coordinator ignoring the
noise variance (the missing penalty term), or owners declaring σ while adding σ/2 noise — and
requires the check to fail, so the tests are shown to catch the bugs they exist for.
"""

from __future__ import annotations

import numpy as np
from arviz_stats.base import array_stats
from owners import kernel

from fedpenalty.common import Policy
from fedpenalty.coordinator.driver import sample
from fedpenalty.coordinator.inprocess import InProcessOracle
from fedpenalty.coordinator.oracle import Answers
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerNode

Z = 4.5


def z_scores(draws: np.ndarray, ref) -> np.ndarray:
    """|mean − ref| and |sd − ref sd| in MCSE units, per dimension: ``(2, d)``."""
    mean = draws.mean(axis=(0, 1))
    sd = draws.std(axis=(0, 1), ddof=1)
    mcse_mean = np.atleast_1d(array_stats.mcse(draws, chain_axis=0, draw_axis=1, method="mean"))
    mcse_sd = np.atleast_1d(array_stats.mcse(draws, chain_axis=0, draw_axis=1, method="sd"))
    return np.vstack([np.abs(mean - ref.mean) / mcse_mean, np.abs(sd - ref.sd) / mcse_sd])


class MisdeclaredNoise:
    """An oracle whose owners declare ``factor`` × the noise sd they actually add."""

    def __init__(self, oracle: InProcessOracle, factor: float):
        self.oracle, self.factor = oracle, factor

    def __getattr__(self, name):
        return getattr(self.oracle, name)

    def log_ratio(self, *args) -> Answers:
        a = self.oracle.log_ratio(*args)
        return Answers(a.values, a.noise_sd * self.factor)

    def suff_stats(self, *args) -> Answers:
        a = self.oracle.suff_stats(*args)
        return Answers(a.values, a.noise_sd * self.factor)


def make_oracle(model, records, sigmas, max_step, seed, **node_options) -> InProcessOracle:
    ledger = Ledger(":memory:")
    rngs = np.random.default_rng(seed).spawn(len(records))
    nodes = [
        OwnerNode(
            f"o{k}",
            model,
            r,
            Policy(sigma=s, max_step=max_step, budget_epsilon=1e9),
            ledger,
            rng,
            **node_options,
        )
        for k, (r, s, rng) in enumerate(zip(records, sigmas, rngs))
    ]
    return InProcessOracle(nodes)


def run(
    model,
    records,
    algorithm,
    sigmas,
    step,
    *,
    iterations,
    chains=8,
    seed=0,
    block=1,
    sabotage=None,
    **node_options,
):
    ref = model.reference_posterior(np.concatenate(records))
    oracle = make_oracle(model, records, sigmas, step, seed + 1, **node_options)
    rng = np.random.default_rng(seed)
    theta0 = ref.mean + 0.5 * ref.sd * rng.standard_normal((chains, model.dim))
    oracle.open_session(algorithm, chains * (iterations + 600), session="samplers")
    used = oracle if sabotage is None else MisdeclaredNoise(oracle, sabotage)
    algo = kernel(
        algorithm, model, oracle=used, n_total=sum(map(len, records)), step=step, block=block
    )
    result = sample(algo, rng, theta0, iterations=iterations, warmup=500, progress=False)
    return result, z_scores(result.theta, ref)


def owners_data(model, theta, sizes, seed):
    rng = np.random.default_rng(seed)
    return [model.simulate_records(rng, np.asarray(theta, dtype=float), n) for n in sizes]


GAUSS1 = build_model(
    {"name": "gaussian_mean", "dim": 1, "data_bound": 4.0, "theta_bound": 3.0, "prior_sd": 2.0}
)


def test_penalty_is_exact_with_unequal_owner_noise_and_fails_when_sabotaged():
    records = owners_data(GAUSS1, [0.4], [60, 100, 140], seed=1)
    sigmas = [0.5, 1.0, 1.5]  # s² = 3.5: a strong penalty, so a missing one is visible
    kwargs = dict(iterations=6000, step=0.12)
    result, z = run(GAUSS1, records, "penalty", sigmas, **kwargs)
    assert z.max() < Z, z
    assert 0.05 < result.acceptance_rate < 0.6
    _, z_missing = run(GAUSS1, records, "penalty", sigmas, sabotage=0.0, **kwargs)  # no −s²/2 term
    assert z_missing.max() > 2 * Z, z_missing
    half = [s / 2 for s in sigmas]  # owners add σ/2 noise but declare σ
    _, z_half = run(GAUSS1, records, "penalty", half, sabotage=2.0, **kwargs)
    assert z_half.max() > 2 * Z, z_half


def test_penalty_per_record_path_is_exact_in_two_dimensions():
    model = build_model({"name": "gaussian_mean", "dim": 2, "data_bound": 4.0, "theta_bound": 3.0})
    records = owners_data(model, [0.3, -0.5], [150, 250], seed=2)
    _, z = run(model, records, "penalty", [0.8, 1.2], step=0.12, iterations=6000, per_record=True)
    assert z.max() < Z, z


def test_penalty_is_exact_for_poisson():
    model = build_model({"name": "poisson", "count_bound": 30, "theta_bound": 4.0})
    records = owners_data(model, [1.0], [80, 120], seed=3)
    _, z = run(model, records, "penalty", [0.7, 1.3], step=0.06, iterations=6000)
    assert z.max() < Z, z


def test_penalty_expfam_is_exact_with_blocks_and_fails_when_sabotaged():
    model = build_model({"name": "bernoulli", "theta_bound": 5.0, "prior_a": 2.0, "prior_b": 3.0})
    records = owners_data(model, [0.5], [100, 150, 200, 250], seed=4)
    sigmas = [1.0, 2.0, 3.0, 4.0]  # per-component noise of Σ S(x); v = 30 ‖Δη‖²
    kwargs = dict(step=0.25, iterations=6000, block=10)
    _, z = run(model, records, "penalty_expfam", sigmas, **kwargs)
    assert z.max() < Z, z
    _, z_missing = run(model, records, "penalty_expfam", sigmas, sabotage=0.0, **kwargs)
    assert z_missing.max() > 2 * Z, z_missing


def test_penalty_expfam_single_copies_for_gaussian_mean():
    records = owners_data(GAUSS1, [-0.7], [200, 300], seed=5)
    _, z = run(GAUSS1, records, "penalty_expfam", [3.0, 5.0], step=0.1, iterations=6000, block=1)
    assert z.max() < Z, z


def test_exact_mh_is_exact():
    records = owners_data(GAUSS1, [0.4], [300], seed=6)
    pooled = records[0]
    ref = GAUSS1.reference_posterior(pooled)
    rng = np.random.default_rng(7)
    result = sample(
        kernel("exact_mh", GAUSS1, records=pooled, step=0.15),
        rng,
        ref.mean + 0.1 * rng.standard_normal((8, 1)),
        iterations=5000,
        warmup=500,
        progress=False,
    )
    assert z_scores(result.theta, ref).max() < Z


def test_acceptance_falls_as_noise_grows():
    """Proposition 1 of the penalty paper: expected acceptance decreases in s²."""
    records = owners_data(GAUSS1, [0.4], [400], seed=8)
    rates = []
    for sigma in (0.25, 0.5, 1.0, 2.0, 3.0):
        result, _ = run(GAUSS1, records, "penalty", [sigma], step=0.08, iterations=3000, seed=9)
        rates.append(result.acceptance_rate)
    assert all(a > b for a, b in zip(rates, rates[1:])), rates
    assert rates[0] > 3 * rates[-1], rates


def test_out_of_box_proposals_ask_nobody():
    """A chain pinned at the edge of Θ: proposals outside are rejected without any answer."""
    records = owners_data(GAUSS1, [2.9], [50], seed=10)
    oracle = make_oracle(GAUSS1, records, [1.0], 0.5, seed=11)
    oracle.open_session("penalty", 10_000, session="samplers")
    rng = np.random.default_rng(12)
    result = sample(
        kernel("penalty", GAUSS1, oracle=oracle, step=0.5),
        rng,
        np.full((4, 1), 2.95),
        iterations=500,
        warmup=0,
        progress=False,
    )
    answers = oracle.privacy_reports()[0].session.answers
    assert answers == int(result.queried.sum()) < result.queried.size
    assert not np.any(result.accepted & ~result.queried)
    assert np.all(np.abs(result.theta) <= 3.0)
