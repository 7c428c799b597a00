"""How much privacy does each owner spend for how good a posterior? Every method at a sweep of
per-owner ε targets, equal and unequal owners.

    python scenarios/privacy_mixing.py [--quick] [--out DIR] [--seed 0] [--repeats R]
                                       [--owners equal,unequal] [--no-progress]

Data: the mean of Gaussian records (``gaussian_mean``, σ₀ = 1, records clipped to |x| ≤ 3,
Θ = [−2, 2], true θ = 0.2), n records split over K = 4 owners. Two owner configurations:
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
* ``ops``: 10 draws of the tempered posterior (Foulds et al.'s ρ = ε/(2C) per draw at ε/10),
  trusted curator; ``noisy_stats``: each owner's Σx once with Laplace noise, conjugate draws.

``exact_mh`` (non-private, trusted curator) runs once per owner configuration and repeat: the
floor of every error and the baseline of the speed ratios. Every run goes through ``fedpenalty
simulate``'s own path with in-process owners, so each owner's ε is what its ledger reports
(``privacy.json``); the chains start at data-independent points (cold starts). Large K with
Ray owners and secure aggregation is not yet measured here: it needs the Ray transport /
secure aggregation, which the library does not have yet.

Writes ``privacy_mixing.json`` (every run's figures and resolved scenario) and
``privacy_mixing.png`` (error and ESS/s relative to exact MH against ε, per configuration).
"""

from __future__ import annotations

import functools
import math
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from fedpenalty import reporting
from fedpenalty.coordinator.algorithms import ALGORITHMS
from fedpenalty.models import build_model
from fedpenalty.privacy import calibrate_sigma
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
METHODS = ("penalty", "penalty_expfam", "sgld", "sghmc", "sgld_wang", "ops", "noisy_stats")


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


def ops(owners: Owners, epsilon: float, raw: dict) -> dict:
    raw["privacy"].update(epsilon=epsilon, ops_form="foulds")
    raw["sampler"].update(chains=OPS_CHAINS, iterations=OPS_DRAWS, warmup=0)
    return raw


def noisy_stats(owners: Owners, epsilon: float, raw: dict) -> dict:
    raw["privacy"].update(epsilon=epsilon, mechanism="laplace")
    return raw


CALIBRATE: dict[str, tuple[str, Callable[[Owners, float, dict], dict]]] = {
    "penalty": ("penalty", penalty),
    "penalty_expfam": ("penalty_expfam", penalty_expfam),
    "sgld": ("sgld", sgld_with(tight)),
    "sghmc": ("sghmc", sghmc),
    "sgld_wang": ("sgld", sgld_with(wang)),
    "ops": ("ops", ops),
    "noisy_stats": ("noisy_stats", noisy_stats),
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


def plot(rows: list[dict], setup: Setup) -> Any:
    """Error (W1 in posterior sd) and ESS/s relative to exact MH against ε, per configuration."""
    fig, axes = reporting.figure(2, len(setup.configs), width=6.5, height=4.5)
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
    return fig


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


def main(argv: list[str] | None = None) -> int:
    parser = reporting.scenario_parser(
        __doc__ or NAME, "n = 10,000, 2 chains × 600 steps, ε ∈ {0.5, 2}, unequal owners, 1 repeat"
    )
    parser.add_argument("--repeats", type=int, help="repeats (seeds seed, seed+1, …)")
    parser.add_argument("--owners", help="owner configurations, comma-separated (equal,unequal)")
    args = parser.parse_args(argv)
    setup = QUICK if args.quick else FULL
    if args.repeats:
        setup = replace(setup, repeats=args.repeats)
    if args.owners:
        configs = tuple(c.strip() for c in args.owners.split(","))
        unknown = [c for c in configs if c not in OWNERS]
        if unknown:
            parser.error(
                f"--owners: unknown configuration {', '.join(unknown)}; use equal, unequal"
            )
        setup = replace(setup, configs=configs)
    runs = len(setup.configs) * setup.repeats * (1 + len(METHODS) * len(setup.epsilons))
    rows: list[dict] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        reporting.progress(runs, NAME, not args.no_progress) as bar,
    ):
        for config in setup.configs:
            for repeat in range(setup.repeats):
                rows += run_config(setup, config, repeat, args.seed + repeat, Path(tmp), bar)
    settings = {
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
        "seeds": [args.seed + r for r in range(setup.repeats)],
    }
    notes = [
        "x axis: the per-owner target; each run's ledger ε per owner is in epsilon_per_owner "
        "(penalty spends less than the target: it is calibrated for every step at the full radius)",
        "error bars: ± one sd over repeats (new data, noise and chains per repeat)",
        "large K with Ray owners and secure aggregation: not yet: needs the Ray transport / "
        "secure aggregation",
    ]
    json_path, png_path = reporting.write_report(
        args.out,
        NAME,
        argv=list(argv if argv is not None else sys.argv[1:]),
        settings=settings,
        results={"summary": summary(rows, setup), "runs": rows},
        notes=notes,
        fig=plot(rows, setup),
    )
    print(f"wrote {json_path} and {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
