"""How much privacy does each owner spend for how good a posterior? Every method at a sweep of
per-owner ε targets, equal and unequal owners; and penalty MH at one per-owner ε as the number
of owners grows, with and without secure aggregation.

    python scenarios/privacy_mixing.py [--quick] [--out DIR] [--seed 0] [--repeats R]
                                       [--owners equal,unequal] [--no-progress]
                                       [--sweeps epsilon,owners] [--owner-counts 1,10,100,1000]
                                       [--owner-methods penalty,penalty_expfam]
                                       [--ray-from 100] [--secure-in-process]

**ε sweep** (``--sweeps epsilon``). Data: the mean of Gaussian records (``gaussian_mean``,
σ₀ = 1, records clipped to |x| ≤ 2, Θ = [−1, 1], true θ = 0.2), n records split over K = 4
owners. Two owner configurations:
``equal`` (n/4 records each, equal noise) and ``unequal`` (n_k = 10, 20, 30, 40 % of n; noise
ratios 1 : 1.5 : 2 : 3, so each owner's ε is set by its own σ_k). For each per-owner target
ε at δ = 1e-5 (replace-one neighbours), every private method is calibrated by the project's
accountants so that the owner that spends most spends exactly the target in the worst case:

* ``penalty``: proposal radius a = min(a_priv, 2 posterior sd), with σ_k such that Σσ_k² = 4
  and the least noisy owner's planned answers (all at the full radius) compose to (ε, δ)
  (exact μ-GDP); when the radius is capped, σ_k shrink until they do;
* ``penalty_expfam``: σ_k of the statistic copies calibrated to (ε, δ) for the planned copies;
  the radius puts the largest penalty variance at 4 (capped at 2 posterior sd);
* ``sgld``, ``sghmc`` (Li et al.: tight accounting): noise multiplier by the PLD accountant
  for the planned gradient answers at rate q = 0.02, clip = L (never binds); the step is the
  smaller of what the owners' noise admits and 0.1 (SGLD) or 0.25² (SGHMC, h) × the posterior
  variance σ₀²/n;
* ``sgld_wang``: the same SGLD with Wang et al.'s noise multiplier and admissible step;
* ``sgfs``: DP-SGFS (docs/design.md §2.11) at the same noise multiplier as ``sgld`` (its answers
  are charged alike), F = C·I and the step at which the owners' noise fits the design noise
  4C²/η (capped at an effective Langevin step of 0.1 σ₀²/n);
* ``ops``: 10 draws of the tempered posterior (Foulds et al.'s ρ = ε/(2C) per draw at ε/10),
  trusted curator; ``noisy_stats``: each owner's Σx once with Laplace noise, conjugate draws.
* ``barker`` (docs/design.md §2.12): at q = 1 and τ = 1 (the posterior itself), noise
  multiplier by the PLD accountant, the ratio clip as large as C = 1 allows (it binds at small
  ε: the chain then samples the clipped-likelihood target).

``exact_mh`` (non-private, trusted curator) runs once per owner configuration and repeat: the
floor of every error and the baseline of the speed ratios. Every run goes through ``fedpenalty
simulate``'s own path with in-process owners, so each owner's ε is what its ledger reports
(``privacy.json``); the chains start at data-independent points (cold starts).

**Owner-count sweep** (``--sweeps owners``; docs/design.md §2.6). The same model with true
θ = 0; n = 10⁵ records split equally over K = 1, 10, 100, 1,000 owners (n/K each), every owner
at the same per-owner target ε = 4 (δ = 1e-5) whatever K, in three modes:

* ``none``: each owner adds noise σ and the coordinator sees every answer; the sum it uses
  carries variance Kσ²;
* ``secure t=0``: secure aggregation with total_noise_sd s, no colluder assumed; the decoded
  sum carries variance s²;
* ``secure t=K/2``: s and t = ⌊K/2⌋ colluders assumed; variance K·s²/(K − t) ≈ 2s².

σ and s are set so that each owner's planned answers (every step at the full radius, one
posterior sd) spend exactly the target in the worst case: by exact μ-GDP for the float
answers of ``none``, by Rényi DP for the lattice answers of secure aggregation (§2.5, §2.7),
so s is about 7 % above σ. Chains (4 × (200 + 600) at every K) start within ±0.005 of 0,
±1.6 posterior sd: the sweep measures mixing, not burn-in. Reported per run: acceptance, ESS/s
relative to exact MH in the same run, error against the exact posterior (mean in sd, W1, KS,
sd ratio), R-hat, each owner's ledger ε and, with secure aggregation, what its own noise alone
would give (if every other owner colluded). ``penalty_expfam`` (statistic copies, the same
calibration on the statistic's sensitivity) joins with ``--owner-methods``.

Transport: owners run in process below K = ``--ray-from`` (100) and as Ray actors from there
(``run.transport = 'ray'``, ``run.ray_actors`` = one per CPU; one local Ray for the whole
sweep), in every mode; ``--secure-in-process`` keeps the secure runs in process at every K
(as in the measured figures of scenarios/README.md, taken before secure aggregation ran over
Ray). In process, one host computes every owner's noise and all K(K − 1)/2 pair masks per
iteration, so secure runs at K = 1,000 are slow (about 0.3 s of CPU per iteration of 4
chains, and a minute to agree the pair keys).

Writes ``privacy_mixing.json`` (every run's figures and resolved scenario; the owner-count
sweep under ``results.owner_count``) and ``privacy_mixing.png`` (the ε sweep: error and ESS/s
relative to exact MH against ε, per configuration; the owner-count sweep: acceptance, ESS/s
and error against K, log x).
"""

from __future__ import annotations

import contextlib
import functools
import math
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from fedpenalty import reporting
from fedpenalty.cluster.ray_hosts import connect_ray
from fedpenalty.coordinator.algorithms import ALGORITHMS
from fedpenalty.models import build_model
from fedpenalty.privacy import calibrate_sigma
from fedpenalty.privacy.owner_epsilon import max_gdp_mu_squared
from fedpenalty.privacy.subsampled import calibrate_noise_multiplier
from fedpenalty.privacy.wang import wang_noise_multiplier

NAME = "privacy_mixing"
DELTA, NEIGHBOUR = 1e-5, "replace_one"
MODEL = {"name": "gaussian_mean", "data_bound": 2.0, "theta_bound": 1.0}
TRUE_THETA, INIT_SCALE = 0.2, 0.1
#: Owner configurations: shares of n and noise ratios σ_k / σ_min.
OWNERS = {
    "equal": ((0.25, 0.25, 0.25, 0.25), (1.0, 1.0, 1.0, 1.0)),
    "unequal": ((0.1, 0.2, 0.3, 0.4), (1.0, 1.5, 2.0, 3.0)),
}
PENALTY_S2, MAX_RADIUS_SD = 4.0, 2.0
SAMPLING_RATE, SGLD_STEP_VAR, SGHMC_H_SD, SGHMC_FRICTION_SD = 0.02, 0.1, 0.25, 2.0
OPS_CHAINS, OPS_DRAWS = 2, 5
METHODS = (
    "penalty",
    "penalty_expfam",
    "sgld",
    "sghmc",
    "sgld_wang",
    "ops",
    "noisy_stats",
    "sgfs",
    "barker",
)


@dataclass(frozen=True)
class Setup:
    """The sweep: total records, chains × (warmup + kept), targets, repeats, configurations."""

    n: int
    chains: int
    warmup: int
    iterations: int
    epsilons: tuple[float, ...]
    repeats: int
    configs: tuple[str, ...]


FULL = Setup(50_000, 4, 1000, 1000, (0.5, 1.0, 2.0, 4.0, 8.0), 2, ("equal", "unequal"))
QUICK = Setup(10_000, 2, 300, 300, (0.5, 2.0), 1, ("unequal",))


@dataclass(frozen=True)
class Owners:
    """One configuration at one size: records ``n_k`` and noise ratios ``ratios``; ``answers``
    each owner gives per run (all chains); ``sd`` the posterior sd scale σ₀/√n (public)."""

    setup: Setup
    n_k: list[int]
    ratios: np.ndarray
    answers: int
    sd: float

    @classmethod
    def of(cls, setup: Setup, config: str) -> Owners:
        shares, ratios = OWNERS[config]
        n_k = [round(s * setup.n) for s in shares]
        sampler = {"chains": setup.chains, "warmup": setup.warmup, "iterations": setup.iterations}
        answers = ALGORITHMS["penalty"].planned_answers(sampler)
        return cls(setup, n_k, np.array(ratios), answers, 1.0 / math.sqrt(sum(n_k)))


def scenario(owners: Owners, algorithm: str, seed: int) -> dict[str, dict[str, Any]]:
    """The shared scenario (unresolved) before calibration."""
    s = owners.setup
    return {
        "model": dict(MODEL),
        "data": {"owners": len(owners.n_k), "n_per_owner": owners.n_k, "true_theta": TRUE_THETA},
        "privacy": {"delta": DELTA, "neighbour": NEIGHBOUR},
        "sampler": {
            "algorithm": algorithm,
            "chains": s.chains,
            "warmup": s.warmup,
            "iterations": s.iterations,
            "init_scale": INIT_SCALE,
            "adapt_step": False,  # mixing at the step each point sets
        },
        "run": {"transport": "inprocess", "progress": False, "seed": seed},
    }


def private(raw: dict, sigmas: np.ndarray, epsilon: float, **sampler: Any) -> dict:
    """``raw`` with per-owner noise ``sigmas``, a budget just above the target and ``sampler``."""
    raw["privacy"].update(sigma=[float(s) for s in sigmas], budget_epsilon=epsilon * 1.001)
    raw["sampler"].update(sampler)
    return raw


def penalty(owners: Owners, epsilon: float, raw: dict) -> dict:
    """Radius and σ_k so that the least noisy owner's worst case is exactly (ε, δ)."""
    model = build_model(MODEL)
    per_unit = calibrate_sigma(
        epsilon, DELTA, owners.answers, float(model.log_ratio_sensitivity(1.0, NEIGHBOUR))
    )  # σ needed per unit of radius
    sigma_min = math.sqrt(PENALTY_S2 / float(np.sum(owners.ratios**2)))
    radius = min(sigma_min / per_unit, MAX_RADIUS_SD * owners.sd)
    sigmas = owners.ratios * radius * per_unit
    return private(raw, sigmas, epsilon, step=radius)


def penalty_expfam(owners: Owners, epsilon: float, raw: dict) -> dict:
    """σ_k of the statistic copies at (ε, δ); the radius puts the largest penalty at 4."""
    model = build_model(MODEL)
    sigma_min = calibrate_sigma(epsilon, DELTA, owners.answers, model.stat_sensitivity(NEIGHBOUR))
    sigmas = owners.ratios * sigma_min
    slope = float(
        np.abs(model.natural_param(np.ones((1, 1))) - model.natural_param(np.zeros((1, 1)))).max()
    )
    radius = min(
        math.sqrt(PENALTY_S2 / float(np.sum(sigmas**2))) / slope, MAX_RADIUS_SD * owners.sd
    )
    return private(raw, sigmas, epsilon, step=radius)


def gradient_noise(
    owners: Owners, multiplier: float, raw: dict, epsilon: float
) -> tuple[dict, float]:
    """``raw`` with noise multipliers ratios × ``multiplier`` at rate q and clip C = L (never
    binds), and s² = Σ_k (σ_k C / q)², the owners' variance on each coordinate of the gradient."""
    clip = build_model(MODEL).lipschitz
    sigmas = owners.ratios * multiplier
    s2 = float(np.sum((sigmas * clip / SAMPLING_RATE) ** 2))
    raw["privacy"]["max_step"] = 1.0  # the MH radius limit: not used by gradient answers
    return private(raw, sigmas, epsilon, sampling_rate=SAMPLING_RATE, clip=clip), s2


def sgld_with(noise: Callable[[float, int], float]) -> Callable[[Owners, float, dict], dict]:
    """SGLD at the noise multiplier ``noise(ε, answers)``; η = min(4/s², 0.1 σ₀²/n)."""

    def calibrate(owners: Owners, epsilon: float, raw: dict) -> dict:
        raw, s2 = gradient_noise(owners, noise(epsilon, owners.answers), raw, epsilon)
        raw["sampler"]["step"] = min(4.0 / s2, SGLD_STEP_VAR * owners.sd**2)
        return raw

    return calibrate


@functools.cache
def tight(epsilon: float, answers: int) -> float:
    return calibrate_noise_multiplier(epsilon, DELTA, SAMPLING_RATE, answers, neighbour=NEIGHBOUR)


@functools.cache
def wang(epsilon: float, answers: int) -> float:
    return wang_noise_multiplier(epsilon, DELTA, SAMPLING_RATE, answers)


def sghmc(owners: Owners, epsilon: float, raw: dict) -> dict:
    """SGHMC, tight accounting: friction 2/sd, h = min(2·friction/s², 0.25 sd)."""
    raw, s2 = gradient_noise(owners, tight(epsilon, owners.answers), raw, epsilon)
    friction = SGHMC_FRICTION_SD / owners.sd
    h = min(2.0 * friction / s2, SGHMC_H_SD * owners.sd)
    raw["sampler"].update(step=h * h, friction=friction)
    return raw


def sgfs(owners: Owners, epsilon: float, raw: dict) -> dict:
    """DP-SGFS, tight accounting (its answers are charged as gradient answers at the same
    multiplier): F = C·I; its owners' gradient noise is 2s² (the √2 of its scaled answers), so
    η = min(4C²/(2s²), 0.1 σ₀²C²/n) (the design noise 4C²/η covers it; η/C² is the Langevin
    step)."""
    raw, s2 = gradient_noise(owners, tight(epsilon, owners.answers), raw, epsilon)
    clip = raw["sampler"]["clip"]
    step = min(4.0 * clip**2 / (2.0 * s2), SGLD_STEP_VAR * owners.sd**2 * clip**2)
    raw["sampler"].update(step=step, fisher_bound=clip)
    return raw


def ops(owners: Owners, epsilon: float, raw: dict) -> dict:
    raw["privacy"].update(epsilon=epsilon, ops_form="foulds")
    raw["sampler"].update(chains=OPS_CHAINS, iterations=OPS_DRAWS, warmup=0)
    return raw


def noisy_stats(owners: Owners, epsilon: float, raw: dict) -> dict:
    raw["privacy"].update(epsilon=epsilon, mechanism="laplace")
    return raw


def barker(owners: Owners, epsilon: float, raw: dict) -> dict:
    """Barker at q = 1 and τ = 1, so that it samples the posterior this sweep measures (at the
    sweep's n the subsampling bound leaves no room for q < 1): noise multipliers by the PLD
    accountant for the planned answers; the proposal sd 2 posterior sd; the ratio clip the
    larger that keeps the owners' noise Σ_k(σ_k c)² within 0.9 of C = 1, at most the 20
    posterior sd no ratio of a 3-sd move exceeds (|x − θ| ≤ 3)."""
    multiplier = calibrate_noise_multiplier(
        epsilon, DELTA, 1.0, owners.answers, neighbour=NEIGHBOUR
    )
    sigmas = owners.ratios * multiplier
    clip = min(20.0 * owners.sd, math.sqrt(0.9 / float(np.sum(sigmas**2))))
    raw["privacy"]["max_step"] = 1.0  # the MH radius limit: not used by these answers
    return private(
        raw,
        sigmas,
        epsilon,
        sampling_rate=1.0,
        barker_clip=clip,
        temperature=1.0,
        step=2.0 * owners.sd,
    )


CALIBRATE: dict[str, tuple[str, Callable[[Owners, float, dict], dict]]] = {
    "penalty": ("penalty", penalty),
    "penalty_expfam": ("penalty_expfam", penalty_expfam),
    "sgld": ("sgld", sgld_with(tight)),
    "sghmc": ("sghmc", sghmc),
    "sgld_wang": ("sgld", sgld_with(wang)),
    "ops": ("ops", ops),
    "noisy_stats": ("noisy_stats", noisy_stats),
    "sgfs": ("sgfs", sgfs),
    "barker": ("barker", barker),
}


def measure(sim: reporting.Simulated) -> dict[str, Any]:
    """One run's figures: ε per owner (ledger), mixing and error against the exact posterior
    (W1 and KS against the normal with the reference moments: the truncation to Θ is
    negligible here, its mass is reported)."""
    d, p = sim.result.diagnostics, sim.result.privacy
    ref_mean, ref_sd = d["reference"]["mean"][0], d["reference"]["sd"][0]
    exact = stats.norm(ref_mean, ref_sd)
    distance = reporting.quantile_distance(sim.result.theta[..., 0], exact)
    eps = [o["epsilon"] for o in p.get("owners", [])]
    ess = d["ess_bulk"][0]
    bound = MODEL["theta_bound"]
    return {
        "epsilon_per_owner": eps,
        "epsilon_max": max(eps) if eps else None,
        "acceptance": d["acceptance_rate"],
        "ess_bulk": ess,
        "rhat": d["rhat"][0] if d["rhat"] else None,
        "mean_error_in_sd": d["error"]["mean_in_sd"][0],
        "sd_ratio": d["error"]["sd_ratio"][0],
        "w1_in_sd": distance["w1"] / ref_sd,
        "ks": distance["ks"],
        "excess_noise_ratio": d.get("excess_noise_ratio"),
        "seconds": sim.seconds,
        "ess_per_second": ess / sim.seconds,
        "ess_per_epsilon": ess / max(eps) if eps else None,
        "reference_mass_outside_theta": float(exact.cdf(-bound) + exact.sf(bound)),
        "stopped_attempts": list(sim.stopped),
    }


def run_config(setup: Setup, config: str, repeat: int, seed: int, folder: Path, bar) -> list[dict]:
    """Every method at every target for one configuration and repeat, and exact MH once."""
    owners = Owners.of(setup, config)
    rows = []
    exact_raw = scenario(owners, "exact_mh", seed)
    exact_raw["sampler"]["step"] = 1.5 * owners.sd
    exact = reporting.simulate(exact_raw, folder / f"{config}-{repeat}-exact")
    bar.update()
    base = measure(exact)
    rows.append(
        {
            "method": "exact_mh",
            "config": config,
            "repeat": repeat,
            "target_epsilon": None,
            **base,
            "scenario": exact.scenario.sections,
        }
    )
    for method in METHODS:
        algorithm, calibrate = CALIBRATE[method]
        for eps in setup.epsilons:
            raw = calibrate(owners, eps, scenario(owners, algorithm, seed))
            sim = reporting.simulate(raw, folder / f"{config}-{repeat}-{method}-{eps:g}")
            bar.update()
            row = measure(sim)
            row["ess_per_second_vs_exact"] = row["ess_per_second"] / base["ess_per_second"]
            rows.append(
                {
                    "method": method,
                    "config": config,
                    "repeat": repeat,
                    "target_epsilon": eps,
                    **row,
                    "scenario": sim.scenario.sections,
                }
            )
    return rows


def plot(rows: list[dict], setup: Setup, axes: Any) -> None:
    """Error (W1 in posterior sd) and ESS/s relative to exact MH against ε, per configuration,
    on ``axes`` (2 × configurations)."""
    for j, config in enumerate(setup.configs):
        mine = [r for r in rows if r["config"] == config]
        exact = [r["w1_in_sd"] for r in mine if r["method"] == "exact_mh"]
        for i, key in enumerate(("w1_in_sd", "ess_per_second_vs_exact")):
            ax = axes[i, j]
            for method in METHODS:
                per_eps = [
                    [r[key] for r in mine if r["method"] == method and r["target_epsilon"] == e]
                    for e in setup.epsilons
                ]
                reporting.errorbar(ax, setup.epsilons, per_eps, label=method)
            if key == "w1_in_sd":
                ax.axhline(np.mean(exact), color="k", ls="--", lw=1, label="exact_mh (non-private)")
            else:
                ax.axhline(1.0, color="k", ls="--", lw=1, label="exact_mh")
            reporting.log_x(ax, setup.epsilons)
            ax.set_yscale("log")
            ax.set_xlabel("target ε per owner (δ = 1e-5)")
            ax.set_ylabel(
                "W1 to exact posterior / posterior sd" if i == 0 else "ESS/s ÷ exact MH's ESS/s"
            )
            ax.set_title(f"{config} owners")
    axes[0, 0].legend(fontsize=7)


def summary(rows: list[dict], setup: Setup) -> list[dict]:
    """Per configuration, method and target: mean and sd over repeats of the headline figures."""
    out = []
    keys = (
        "w1_in_sd",
        "ks",
        "mean_error_in_sd",
        "sd_ratio",
        "rhat",
        "acceptance",
        "ess_bulk",
        "ess_per_second_vs_exact",
        "ess_per_epsilon",
        "epsilon_max",
    )
    for config in setup.configs:
        for method in ("exact_mh", *METHODS):
            targets = [None] if method == "exact_mh" else list(setup.epsilons)
            for eps in targets:
                mine = [
                    r
                    for r in rows
                    if r["config"] == config
                    and r["method"] == method
                    and r["target_epsilon"] == eps
                ]
                out.append(
                    {
                        "config": config,
                        "method": method,
                        "target_epsilon": eps,
                        **{k: reporting.spread(r.get(k) for r in mine) for k in keys},
                    }
                )
    return out


# --------------------------------------------------------------------------- owner-count sweep

#: Aggregation modes of the owner-count sweep: t(K), the colluders assumed (None: no secure
#: aggregation, each owner's answer seen by the coordinator).
MODES: dict[str, Callable[[int], int | None]] = {
    "none": lambda k: None,
    "secure t=0": lambda k: 0,
    "secure t=K/2": lambda k: k // 2,
}
OWNER_METHODS = ("penalty", "penalty_expfam")


@dataclass(frozen=True)
class OwnerSweep:
    """The owner-count sweep: ``n`` records split equally over K owners for each K in
    ``owners``, every owner at the per-owner target ``epsilon`` (δ = 1e-5) in every mode, chains
    × (warmup + kept) at every K; ``ray_from``: the smallest K whose owners run as Ray actors
    (0: never)."""

    n: int
    owners: tuple[int, ...]
    epsilon: float
    chains: int
    warmup: int
    iterations: int
    repeats: int
    methods: tuple[str, ...]
    ray_from: int


FULL_OWNERS = OwnerSweep(100_000, (1, 10, 100, 1000), 4.0, 4, 200, 600, 1, ("penalty",), 100)
QUICK_OWNERS = OwnerSweep(10_000, (1, 16), 8.0, 4, 100, 300, 1, ("penalty",), 0)


def transport(owners: int, secure: bool, sweep: OwnerSweep, secure_in_process: bool) -> str:
    """``run.transport`` of one run: ``ray`` from K = ``ray_from`` on (secure aggregation too,
    unless ``secure_in_process``), else ``inprocess``."""
    large = sweep.ray_from > 0 and owners >= sweep.ray_from
    return "ray" if large and not (secure and secure_in_process) else "inprocess"


def owner_noise(sweep: OwnerSweep, method: str, secure: bool) -> tuple[float, float]:
    """(radius a, noise sd) of every owner at the target ε for the planned answers, whatever
    K: σ (``none``) or s (secure) = Δ·√T/μ with μ the largest total that (ε, δ) admits —
    exact μ-GDP for float answers, Rényi DP for the lattice answers of secure aggregation
    (docs/design.md §2.5, §2.7), so both modes spend the same worst-case ε. The radius is one
    posterior sd σ₀/√n; Δ is the log-ratio sensitivity at a (penalty) or the sufficient
    statistic's (penalty_expfam)."""
    model = build_model(MODEL)
    sampler = {"chains": sweep.chains, "warmup": sweep.warmup, "iterations": sweep.iterations}
    answers = ALGORITHMS[method].planned_answers({**sampler, "block": 1})
    mu2 = max_gdp_mu_squared(sweep.epsilon, DELTA, NEIGHBOUR, (), lattice=secure)
    radius = 1.0 / math.sqrt(sweep.n)
    if method == "penalty":
        sensitivity = float(model.log_ratio_sensitivity(radius, NEIGHBOUR))
    else:
        sensitivity = float(model.stat_sensitivity(NEIGHBOUR))
    return radius, sensitivity * math.sqrt(answers / mu2)


def owners_scenario(
    sweep: OwnerSweep, method: str, owners: int, mode: str, seed: int, where: str
) -> dict:
    """One run of the sweep (unresolved): n records over ``owners``, true θ = 0, chains
    started within ±0.005 (±1.6 posterior sd at n = 10⁵) so that they measure mixing near
    the posterior, not burn-in."""
    t = MODES[mode](owners)
    radius, noise = owner_noise(sweep, method, t is not None)
    privacy: dict[str, Any] = {"delta": DELTA, "neighbour": NEIGHBOUR, "sigma": noise}
    privacy["budget_epsilon"] = sweep.epsilon * 1.001
    if t is not None:
        privacy.update(aggregation="secure", total_noise_sd=noise, colluders=t)
    per = [sweep.n // owners + (1 if k < sweep.n % owners else 0) for k in range(owners)]
    return {
        "model": dict(MODEL),
        "data": {"owners": owners, "n_per_owner": per, "true_theta": 0.0},
        "privacy": privacy,
        "sampler": {
            "algorithm": method,
            "chains": sweep.chains,
            "warmup": sweep.warmup,
            "iterations": sweep.iterations,
            "init_scale": 0.005,
            "step": radius,
            "adapt_step": False,  # mixing at the radius each point sets
        },
        "run": {"transport": where, "progress": False, "seed": seed},
    }


def sum_noise_var(raw: dict) -> float:
    """Variance of the noise in the sum the coordinator uses: Σσ_k² (``none``) or K·s²/(K − t),
    in the units of the answers (nats² for penalty, statistic² for penalty_expfam)."""
    p, owners = raw["privacy"], raw["data"]["owners"]
    if p.get("aggregation") != "secure":
        return owners * p["sigma"] ** 2
    return owners * p["total_noise_sd"] ** 2 / (owners - p["colluders"])


def owner_count_run(
    sweep: OwnerSweep,
    method: str,
    owners: int,
    mode: str,
    seed: int,
    folder: Path,
    secure_in_process: bool,
) -> dict:
    """One run of the sweep and its figures (``secure_in_process``: never on Ray when secure)."""
    t = MODES[mode](owners)
    where = transport(owners, t is not None, sweep, secure_in_process)
    raw = owners_scenario(sweep, method, owners, mode, seed, where)
    tag = f"{method}-{owners}-{mode}".replace(" ", "_").replace("/", "")
    sim = reporting.simulate(raw, folder / tag)
    own = [o.get("epsilon_own_noise_only") for o in sim.result.privacy["owners"]]
    p = raw["privacy"]
    return {
        "method": method,
        "mode": mode,
        "owners": owners,
        "colluders": t,
        "transport": where,
        "owner_noise_sd": p["sigma"] if t is None else p["sigma"] / math.sqrt(owners - t),
        "sum_noise_var": sum_noise_var(raw),
        "target_epsilon": sweep.epsilon,
        **measure(sim),
        "epsilon_own_noise_only_median": None if t is None else statistics.median(own),
        "scenario": sim.scenario.sections,
    }


def owner_count_runs(
    sweep: OwnerSweep, seed: int, folder: Path, bar, secure_in_process: bool
) -> list[dict]:
    """Every method and mode at every K (K = 1's ``secure t=K/2`` is its ``secure t=0`` run:
    t = 0 there), and exact MH once per repeat: the error floor and the speed baseline."""
    rows = []
    for repeat in range(sweep.repeats):
        at = folder / f"owners-{repeat}"
        exact_raw = owners_scenario(sweep, "penalty", 1, "none", seed + repeat, "inprocess")
        exact_raw["sampler"]["algorithm"] = "exact_mh"
        base = measure(reporting.simulate(exact_raw, at / "exact"))
        bar.update()
        rows.append({"method": "exact_mh", "mode": None, "owners": None, "repeat": repeat, **base})
        for method in sweep.methods:
            for owners in sweep.owners:
                done: dict[int | None, dict] = {}
                for mode, colluders in MODES.items():
                    t = colluders(owners)
                    if t in done:
                        rows.append({**done[t], "mode": mode, "same_run_as": done[t]["mode"]})
                        continue
                    row = owner_count_run(
                        sweep, method, owners, mode, seed + repeat, at, secure_in_process
                    )
                    bar.update()
                    speed = row["ess_per_second"] / base["ess_per_second"]
                    done[t] = {**row, "repeat": repeat, "ess_per_second_vs_exact": speed}
                    rows.append(done[t])
    return rows


def owner_count_runs_total(sweep: OwnerSweep) -> int:
    """Runs of the sweep (the progress bar's length): exact MH, then every distinct (K, t)."""
    distinct = sum(len({t(k) for t in MODES.values()}) for k in sweep.owners)
    return sweep.repeats * (1 + len(sweep.methods) * distinct)


def owner_count_summary(rows: list[dict], sweep: OwnerSweep) -> list[dict]:
    """Per method, mode and K: mean and sd over repeats of the headline figures."""
    keys = ("acceptance", "ess_per_second_vs_exact", "mean_error_in_sd", "w1_in_sd", "rhat",
            "sd_ratio", "epsilon_max", "epsilon_own_noise_only_median",
            "sum_noise_var")  # fmt: skip
    out = []
    for method in sweep.methods:
        for mode in MODES:
            for owners in sweep.owners:
                mine = [
                    r
                    for r in rows
                    if r["method"] == method and r["mode"] == mode and r["owners"] == owners
                ]
                out.append(
                    {
                        "method": method,
                        "mode": mode,
                        "owners": owners,
                        "transport": mine[0]["transport"] if mine else None,
                        **{k: reporting.spread(r.get(k) for r in mine) for k in keys},
                    }
                )
    return out


def plot_owner_count(rows: list[dict], sweep: OwnerSweep, axes: Any) -> None:
    """Acceptance, ESS/s relative to exact MH and error against K (log x), one row of
    ``axes`` (methods × 3) per method."""
    panels = (
        ("acceptance", "acceptance", False),
        ("ess_per_second_vs_exact", "ESS/s ÷ exact MH's ESS/s", True),
        ("w1_in_sd", "W1 to exact posterior / posterior sd", True),
    )
    exact = [r for r in rows if r["method"] == "exact_mh"]
    for i, method in enumerate(sweep.methods):
        for j, (key, label, log) in enumerate(panels):
            ax = axes[i, j]
            for mode in MODES:
                per_k = [
                    [
                        max(r[key], 1e-4) if log and r[key] is not None else r[key]
                        for r in rows
                        if r["method"] == method and r["mode"] == mode and r["owners"] == k
                    ]
                    for k in sweep.owners
                ]
                reporting.errorbar(ax, sweep.owners, per_k, label=mode)
            if key == "w1_in_sd":
                ax.axhline(np.mean([r[key] for r in exact]), color="k", ls="--", lw=1,
                           label="exact_mh (non-private)")  # fmt: skip
            elif key == "ess_per_second_vs_exact":
                ax.axhline(1.0, color="k", ls="--", lw=1, label="exact_mh")
            reporting.log_x(ax, sweep.owners)
            if log:
                ax.set_yscale("log")
            else:
                ax.set_ylim(0, 1)
            ax.set_xlabel(f"owners K (n = {sweep.n:,} split equally)")
            ax.set_ylabel(label)
            ax.set_title(f"{method}, ε = {sweep.epsilon:g} per owner")
        axes[i, 0].legend(fontsize=7)


SWEEPS = ("epsilon", "owners")


def main(argv: list[str] | None = None) -> int:
    parser = reporting.scenario_parser(
        __doc__ or NAME,
        "ε sweep: n = 10,000, 2 chains × 600 steps, ε ∈ {0.5, 2}, unequal owners, 1 repeat; "
        "owner-count sweep: n = 10,000, K ∈ {1, 16} in process, penalty only, ε = 8, "
        "4 chains × 400 steps",
    )
    parser.add_argument("--repeats", type=int, help="repeats (seeds seed, seed+1, …)")
    parser.add_argument("--owners", help="owner configurations, comma-separated (equal,unequal)")
    parser.add_argument(
        "--sweeps", default=",".join(SWEEPS), help="which sweeps, comma-separated (epsilon,owners)"
    )
    parser.add_argument(
        "--owner-counts", help="owner-count sweep: K values, comma-separated (1,10,100,1000)"
    )
    parser.add_argument(
        "--owner-methods",
        help=f"owner-count sweep: methods, comma-separated ({','.join(OWNER_METHODS)}; "
        "default penalty)",
    )
    parser.add_argument(
        "--ray-from",
        type=int,
        help="owner-count sweep: smallest K run on Ray actors (0: none; default 100, quick 0)",
    )
    parser.add_argument(
        "--secure-in-process",
        action="store_true",
        help="owner-count sweep: run secure aggregation in process at every K (default: on Ray "
        "from --ray-from on, like the runs without it)",
    )
    args = parser.parse_args(argv)
    setup = QUICK if args.quick else FULL
    sweep = QUICK_OWNERS if args.quick else FULL_OWNERS
    if args.repeats:
        setup = replace(setup, repeats=args.repeats)
        sweep = replace(sweep, repeats=args.repeats)
    if args.ray_from is not None:
        if args.ray_from < 0:
            parser.error("--ray-from must be 0 (never) or a number of owners")
        sweep = replace(sweep, ray_from=args.ray_from)
    if args.owner_counts:
        try:
            counts = tuple(int(k) for k in args.owner_counts.split(","))
        except ValueError:
            counts = ()
        if not counts or min(counts) < 1:
            parser.error("--owner-counts: positive whole numbers, comma-separated (1,10,100)")
        sweep = replace(sweep, owners=counts)
    if args.owner_methods:
        methods = tuple(m.strip() for m in args.owner_methods.split(","))
        if not methods or any(m not in OWNER_METHODS for m in methods):
            parser.error(f"--owner-methods: use one or both of {', '.join(OWNER_METHODS)}")
        sweep = replace(sweep, methods=methods)
    if args.owners:
        configs = tuple(c.strip() for c in args.owners.split(","))
        unknown = [c for c in configs if c not in OWNERS]
        if unknown:
            parser.error(
                f"--owners: unknown configuration {', '.join(unknown)}; use equal, unequal"
            )
        setup = replace(setup, configs=configs)
    sweeps = tuple(w.strip() for w in args.sweeps.split(","))
    if not sweeps or any(w not in SWEEPS for w in sweeps):
        parser.error(f"--sweeps: use one or both of {', '.join(SWEEPS)}")
    runs = 0
    if "epsilon" in sweeps:
        runs += len(setup.configs) * setup.repeats * (1 + len(METHODS) * len(setup.epsilons))
    if "owners" in sweeps:
        runs += owner_count_runs_total(sweep)
    rows: list[dict] = []
    owner_rows: list[dict] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        reporting.progress(runs, NAME, not args.no_progress) as bar,
        ray_session(sweep, "owners" in sweeps),
    ):
        if "epsilon" in sweeps:
            for config in setup.configs:
                for repeat in range(setup.repeats):
                    rows += run_config(setup, config, repeat, args.seed + repeat, Path(tmp), bar)
        if "owners" in sweeps:
            owner_rows = owner_count_runs(sweep, args.seed, Path(tmp), bar, args.secure_in_process)
    settings = {
        "sweeps": sweeps,
        "setup": setup.__dict__,
        "delta": DELTA,
        "neighbour": NEIGHBOUR,
        "model": MODEL,
        "owners": {
            c: {"shares": OWNERS[c][0], "noise_ratios": OWNERS[c][1]} for c in setup.configs
        },
        "penalty_total_noise_variance": PENALTY_S2,
        "max_radius_in_sd": MAX_RADIUS_SD,
        "sampling_rate": SAMPLING_RATE,
        "sgld_step_in_posterior_variance": SGLD_STEP_VAR,
        "sghmc_h_in_sd": SGHMC_H_SD,
        "sghmc_friction_times_sd": SGHMC_FRICTION_SD,
        "ops_draws": OPS_CHAINS * OPS_DRAWS,
        "owner_count": {**sweep.__dict__, "secure_in_process": args.secure_in_process},
        "seeds": [args.seed + r for r in range(max(setup.repeats, sweep.repeats))],
    }
    notes = [
        "x axis: the per-owner target; each run's ledger ε per owner is in epsilon_per_owner "
        "(penalty spends less than the target: it is calibrated for every step at the full radius)",
        "error bars: ± one sd over repeats (new data, noise and chains per repeat)",
        "owner-count sweep: every owner's noise is calibrated to the same worst-case ε for the "
        "planned answers whatever K (exact μ-GDP for the float answers of 'none', Rényi DP for "
        "the lattice answers of secure aggregation); with secure aggregation 'epsilon' holds "
        "if at most t owners collude with the coordinator, 'epsilon_own_noise_only' if all do",
        "owner-count sweep: "
        + (f"Ray owners from K = {sweep.ray_from} on" if sweep.ray_from else "no Ray owners")
        + (
            "; secure aggregation in process at every K (--secure-in-process)"
            if args.secure_in_process
            else ", secure aggregation included"
        )
        + "; ESS/s of a Ray run includes starting its actors",
    ]
    results: dict[str, Any] = {}
    if "epsilon" in sweeps:
        results.update(summary=summary(rows, setup), runs=rows)
    if "owners" in sweeps:
        results["owner_count"] = {
            "summary": owner_count_summary(owner_rows, sweep),
            "runs": owner_rows,
        }
    json_path, png_path = reporting.write_report(
        args.out,
        NAME,
        argv=list(argv if argv is not None else sys.argv[1:]),
        settings=settings,
        results=results,
        notes=notes,
        fig=figure(rows, setup, owner_rows, sweep, sweeps),
    )
    print(headlines(results))
    print(f"wrote {json_path} and {png_path}")
    return 0


def headlines(results: dict[str, Any]) -> str:
    """Each sweep's summary as a table (mean ± sd over repeats)."""
    tables = []
    if "summary" in results:
        tables.append(
            reporting.headline(
                "ε sweep: error and mixing per method and per-owner target ε (δ = 1e-5; ledger "
                "ε of the owner that spent most)",
                results["summary"],
                [
                    ("config", "owners"),
                    ("method", "method"),
                    ("target_epsilon", "target ε"),
                    ("w1_in_sd", "W1 / sd"),
                    ("rhat", "R-hat"),
                    ("acceptance", "acceptance"),
                    ("ess_per_second_vs_exact", "ESS/s ÷ exact"),
                    ("epsilon_max", "ledger ε"),
                ],
            )
        )
    if "owner_count" in results:
        tables.append(
            reporting.headline(
                "Owner-count sweep: penalty MH at one per-owner ε, with and without secure "
                "aggregation",
                results["owner_count"]["summary"],
                [
                    ("method", "method"),
                    ("mode", "mode"),
                    ("owners", "K"),
                    ("transport", "transport"),
                    ("acceptance", "acceptance"),
                    ("rhat", "R-hat"),
                    ("w1_in_sd", "W1 / sd"),
                    ("epsilon_max", "ledger ε"),
                    ("epsilon_own_noise_only_median", "ε own noise only"),
                ],
            )
        )
    return "\n".join(tables)


@contextlib.contextmanager
def ray_session(sweep: OwnerSweep, wanted: bool) -> Iterator[None]:
    """One local Ray for every Ray run of the sweep (each run then keeps this connection
    instead of starting and stopping its own Ray); nothing when no run uses Ray."""
    if not wanted or sweep.ray_from <= 0 or max(sweep.owners) < sweep.ray_from:
        yield
        return
    runtime = connect_ray("")
    try:
        yield
    finally:
        runtime.stop()


def figure(
    rows: list[dict], setup: Setup, owner_rows: list[dict], sweep: OwnerSweep, sweeps: tuple
) -> Any:
    """One figure, every panel drawn: the ε sweep's panels (error and ESS/s, per configuration:
    2 × C, or one row of two for one configuration), then the owner-count sweep's row of three
    per method, each block as wide as the figure."""
    blocks = []
    if "epsilon" in sweeps:
        configs = len(setup.configs)
        blocks.append(("epsilon", (1, 2) if configs == 1 else (2, configs)))
    if "owners" in sweeps:
        blocks.append(("owners", (len(sweep.methods), 3)))
    cols = max(c for _, (_, c) in blocks)
    heights = [r for _, (r, _) in blocks]
    fig = reporting.plt.figure(figsize=(5.5 * cols, 4.2 * sum(heights)), layout="constrained")
    subfigures = fig.subfigures(len(blocks), 1, height_ratios=heights, squeeze=False)[:, 0]
    for sub, (name, shape) in zip(subfigures, blocks):
        axes = sub.subplots(*shape, squeeze=False)
        if name == "epsilon":
            plot(rows, setup, axes.T if shape[0] == 1 else axes)  # plot wants (2, configs)
        else:
            plot_owner_count(owner_rows, sweep, axes)
    return fig


if __name__ == "__main__":
    sys.exit(main())
