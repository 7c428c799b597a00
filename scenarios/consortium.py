"""A consortium's hierarchical regression on real data: penalty MH, DP-HMC and DP-SGLD at equal
per-owner ε, against the non-private posterior of the pooled records.

    python scenarios/consortium.py [--quick] [--out DIR] [--seed 0] [--no-progress]
        [--methods penalty,dp_hmc,sgld] [--epsilons 1,2,4,8] [--adapt-mass [diag|dense]]

Data: statsmodels' copy of the RAND Health Insurance Experiment (``randhie``: 20,190
person-years). Outcome y = log(1 + doctor visits), standardised; seven covariates (income,
family size, physical limitation, chronic disease count, three self-rated health indicators)
standardised and divided by 3 (rows with ‖x‖ > 1 are rescaled onto the unit sphere by the
model). One owner per insurance plan of the experiment (coinsurance rate × individual
deductible): K = 6 owners of 1,074 to 6,822 records, one random intercept per owner.

Model: the user-written ``consortium_model:GroupInterceptsRegression``
(scenarios/consortium_model.py, selected by its module path as any user's model is):
y = μ_k + xᵀβ + e, e ~ N(0, 0.95²) (the residual sd of the pooled least-squares fit with plan
effects), owner effects μ_k ~ N(α, τ²), θ = (α, β, log τ, μ_1..μ_K), d = 15. Owner k's
records touch only β and μ_k, so the posterior is close to diagonal (written with offsets
b_k = μ_k − α, α and each b_k correlate −0.92..−0.98); α and log τ are prior-only coordinates,
where DP-HMC drops the owners' gradient noise and which it redraws from their prior
conditional after every iteration (docs/design.md §2.9). Its reference posterior —
the non-private posterior of the pooled data — is deterministic (Gaussian given τ, log τ on a
grid), so the error is not blurred by a reference chain's Monte Carlo error.

Methods, each calibrated so that every owner's planned answers compose to exactly ε at
δ = 1e-5 (replace-one; the owners' ledgers report the ε each spent):

* ``penalty`` — random-walk penalty MH on the owners' clipped log-likelihood ratios
  (``sampler.ratio_clip``), the radius adapted in warmup;
* ``dp_hmc`` — DP-HMC: L = 3 leapfrog steps on clipped noisy gradient sums (clip 2), penalty
  test on clipped noisy ratios; its first 50 warmup iterations descend, the rest of warmup
  adapts a diagonal mass matrix (``--adapt-mass off|diag|dense`` sets ``sampler.adapt_mass``);

both with secure aggregation (``privacy.aggregation = "secure"``, t = 0): each owner adds
noise of sd s·clip/√K and the decoded sum carries s·clip, with s set for all the run's answers
(one s for both of dp_hmc's kinds), and both clip each record's ratio at 1/s nats, where the
decoded ratio's noise has variance 1 nat²;
* ``sgld`` — DP-SGLD with the accountant's noise multiplier and admissible step (no secure
  aggregation).

Per method and ε: the largest |posterior mean − reference mean| in reference posterior sds
(all 15 coordinates, and α with the 7 β), the smallest bulk ESS per second of run time, the
largest R-hat, the largest ε an owner's ledger reports and how often each clip bound was hit.

Writes ``consortium.json`` and ``consortium.png``.
"""

from __future__ import annotations

import math
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from fedpenalty import reporting
from fedpenalty.coordinator.algorithms import ALGORITHMS
from fedpenalty.errors import FedPenaltyError
from fedpenalty.extras import require
from fedpenalty.owner.noise.lattice import LATTICE_BITS
from fedpenalty.privacy.owner_epsilon import max_gdp_mu_squared
from fedpenalty.privacy.wang import compare_admissible_steps

NAME = "consortium"
#: randhie's covariates besides the plan (coinsurance ``lncoins``, deductible ``idp``), which
#: defines the owners: income, family size, physical limitation, chronic diseases, health
OWNERS, SCALE = 6, 3.0
COVARIATES = ["lpi", "fmde", "physlm", "disea", "hlthg", "hlthf", "hlthp"]
MODEL = {
    "name": "consortium_model:GroupInterceptsRegression",
    "covariates": len(COVARIATES),
    "groups": OWNERS,
    "noise_sd": 0.95,
    "theta_bound": 6.0,
}
DELTA, NEIGHBOUR = 1e-5, "replace_one"
DIM = 2 + len(COVARIATES) + OWNERS  # θ = (α, β, log τ, b_1..b_K)
METHODS = ("penalty", "dp_hmc", "sgld")
SGLD_RATE, SGLD_CLIP, MAX_SGLD_STEP = 0.05, 2.0, 1e-4


#: ``--adapt-mass``'s values and the ``sampler.adapt_mass`` each sets (diag: true, as before).
MASS_FLAG: dict[str, bool | str] = {"off": False, "diag": True, "dense": "dense"}


@dataclass(frozen=True)
class Tuning:
    """The penalty methods' settings besides the noise: dp_hmc's per-record gradient clip
    (nats per unit of θ), leapfrog steps L, descent iterations, largest leapfrog step (units
    of θ), ``sampler.adapt_mass`` and target acceptance; penalty's largest step (both steps
    adapted down in warmup); both: the decoded ratio's noise sd (nats) that sets the ratio
    clip c = ratio_noise / s."""

    grad_clip: float = 2.0
    leapfrog: int = 3
    descent: int = 50
    hmc_step: float = 0.005
    adapt_mass: bool | str = True
    target_accept: float = 0.5
    penalty_step: float = 0.01
    ratio_noise: float = 1.0


TUNING = Tuning()


@dataclass(frozen=True)
class Setup:
    epsilons: tuple[float, ...]
    chains: int
    warmup: int
    iterations: int
    methods: tuple[str, ...] = METHODS
    tuning: Tuning = TUNING


FULL = Setup((1.0, 2.0, 4.0, 8.0), 4, 200, 200)
QUICK = Setup((4.0,), 4, 100, 100)


def owners_data(folder: Path) -> list[str]:
    """The owners' NPZ files (columns x0..x6, group, y): randhie's records, one owner per
    insurance plan (coinsurance rate × individual deductible), largest first."""
    import statsmodels.api as sm  # the [scenarios] extra (checked in main)

    data = sm.datasets.randhie.load_pandas().data
    plans = data.groupby(["lncoins", "idp"]).ngroup().to_numpy()
    y = np.log1p(data["mdvis"].to_numpy(dtype=float))
    x = data[COVARIATES].to_numpy(dtype=float)
    x = (x - x.mean(axis=0)) / x.std(axis=0) / SCALE
    y = (y - y.mean()) / y.std()
    order = np.argsort(-np.bincount(plans), kind="stable")
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, plan in enumerate(order):
        rows = plans == plan
        path = folder / f"owner-{k}.npz"
        columns = {f"x{j}": x[rows, j] for j in range(x.shape[1])}
        np.savez(path, **columns, group=np.full(rows.sum(), float(k)), y=y[rows])
        paths.append(str(path))
    return paths


def scenario(paths: list[str], setup: Setup, algorithm: str, seed: int) -> dict[str, Any]:
    return {
        "model": dict(MODEL),
        "data": {"paths": paths},
        "privacy": {"delta": DELTA, "neighbour": NEIGHBOUR},
        "sampler": {
            "algorithm": algorithm,
            "chains": setup.chains,
            "warmup": setup.warmup,
            "iterations": setup.iterations,
            "init_scale": 0.01,
        },
        "run": {"transport": "inprocess", "progress": False, "seed": seed},
    }


def secure_multiplier(mu_squared: float, answers: int) -> float:
    """The noise multiplier s of secure aggregation (t = 0: the decoded sum's noise sd is
    s·clip) at which ``answers`` lattice answers per owner, each charged μ = (2 + γ√d)/s per
    unit clip (replace-one; docs/design.md §4, "The noise level of a clipped kind"), compose
    to μ² = ``mu_squared``: γ ≤ 2⁻²⁰ of an owner's sd s/√K, so s = (2 + γ√d)·√(answers/μ²)
    with γ at that bound."""
    s0 = 2.0 * math.sqrt(answers / mu_squared)
    gamma = s0 / math.sqrt(OWNERS) * 2.0**-LATTICE_BITS
    return (2.0 + gamma * math.sqrt(DIM)) * math.sqrt(answers / mu_squared)


def calibrate(method: str, raw: dict, epsilon: float, tuning: Tuning = TUNING) -> dict:
    """``raw`` calibrated for ``method`` at the per-owner target ``epsilon``. penalty and
    dp_hmc: secure aggregation (t = 0), s for all their planned answers (one s for both of
    dp_hmc's kinds, so the kinds share μ² in proportion to their answers), the ratio clip
    where the decoded ratio's noise has sd ``tuning.ratio_noise`` nats; SGLD: no secure
    aggregation, the accountant's multiplier and admissible step."""
    sampler, privacy = raw["sampler"], raw["privacy"]
    privacy["budget_epsilon"] = epsilon * 1.001
    chains = sampler["chains"]
    if method == "sgld":
        planned = ALGORITHMS["sgld"].planned_answers(sampler)
        c = compare_admissible_steps(
            epsilon, DELTA, SGLD_RATE, planned, SGLD_CLIP, owners=OWNERS, neighbour=NEIGHBOUR
        )
        privacy.update(sigma=c.accountant_noise_multiplier, max_step=1.0)
        sampler.update(
            step=min(c.accountant_step, MAX_SGLD_STEP), sampling_rate=SGLD_RATE, clip=SGLD_CLIP
        )
        return raw
    if method == "penalty":
        sampler.update(ratio_clip=1.0, step=tuning.penalty_step, adapt_step=True)
    else:
        sampler.update(
            hmc_ratio_clip=1.0,
            grad_clip=tuning.grad_clip,
            leapfrog_steps=tuning.leapfrog,
            step=tuning.hmc_step,
            warmup_descent=tuning.descent,
            adapt_mass=tuning.adapt_mass,
            target_accept=tuning.target_accept,
        )
    answers = chains * sum(ALGORITHMS[method].asks(sampler).values())
    mu2 = max_gdp_mu_squared(epsilon, DELTA, NEIGHBOUR, (), lattice=True)
    s = secure_multiplier(mu2, answers)
    sampler["ratio_clip" if method == "penalty" else "hmc_ratio_clip"] = tuning.ratio_noise / s
    privacy.update(sigma=1.0, aggregation="secure", total_noise_sd=s, colluders=0)
    return raw


def measure(sim: reporting.Simulated) -> dict[str, Any]:
    d, p = sim.result.diagnostics, sim.result.privacy
    eps = [o["epsilon"] for o in p.get("owners", [])]
    err = np.asarray(d["error"]["mean_in_sd"], dtype=float)
    ess = min(d["ess_bulk"])
    return {
        "epsilon_max": max(eps) if eps else None,
        "error_max_sd": float(err.max()),
        "error_coefficients_max_sd": float(err[: 1 + MODEL["covariates"]].max()),
        "error_sd": dict(zip(d["param_names"], err.round(3).tolist(), strict=True)),
        "ess_bulk_min": ess,
        "ess_per_second": ess / sim.seconds,
        "rhat_max": max(d["rhat"]) if d.get("rhat") else None,
        "acceptance": d.get("acceptance_rate"),
        "clip_fraction": {
            kind: hits["fraction"]
            for kind, hits in d.get("simulation_only", {}).get("clip_hits", {}).items()
        },
        "seconds": sim.seconds,
    }


def informative_answers(mu_squared: float, records: int) -> float:
    """About how many answers per owner (all chains, all kinds) a penalty test stays
    informative for (scenarios/README.md, consortium): its clip must cover a record's log
    ratio of a move of one posterior sd in all d coordinates, ≈ √(d/N) nats, while the decoded
    sum's noise (sc)² stays ≲ 1 with s = 2√(answers/μ²): answers ≲ μ²N/(4d)."""
    return mu_squared * records / (4 * DIM)


def run(setup: Setup, seed: int, folder: Path, bar) -> list[dict]:
    paths = owners_data(folder / "data")
    records = 0
    for path in paths:
        with np.load(path) as owner:
            records += len(owner["y"])
    rows = []
    for method in setup.methods:
        for eps in setup.epsilons:
            raw = calibrate(method, scenario(paths, setup, method, seed), eps, setup.tuning)
            sim = reporting.simulate(raw, folder / f"{method}-{eps:g}")
            bar.update()
            row = {"method": method, "target_epsilon": eps, **measure(sim)}
            if method != "sgld":
                asks = ALGORITHMS[method].asks(sim.scenario["sampler"])
                mu2 = max_gdp_mu_squared(eps, DELTA, NEIGHBOUR, (), lattice=True)
                row["answers"] = setup.chains * sum(asks.values())
                row["informative_answers"] = informative_answers(mu2, records)
                row["total_noise_sd"] = raw["privacy"]["total_noise_sd"]
            rows.append({**row, "scenario": sim.scenario.sections})
    return rows


def plot(rows: list[dict], setup: Setup) -> Any:
    fig, axes = reporting.figure(1, 3, width=5.0, height=4.0)
    panels = (
        ("error_max_sd", "max |mean − reference| (posterior sd)", "log"),
        ("ess_per_second", "min bulk ESS per second", "log"),
        ("rhat_max", "max R-hat", "linear"),
    )
    for ax, (key, label, scale) in zip(axes[0], panels):
        for m in setup.methods:
            mine = [r for r in rows if r["method"] == m]
            ax.plot([r["target_epsilon"] for r in mine], [r[key] for r in mine], "o-", label=m)
        reporting.log_x(ax, setup.epsilons)
        ax.set(xlabel="ε per owner (δ = 1e-5)", ylabel=label, yscale=scale)
    axes[0, 0].axhline(0.5, color="k", ls="--", lw=1)
    axes[0, 0].legend(fontsize=8)
    axes[0, 0].set_title(f"RAND HIE, {OWNERS} owners (plans), d = 15")
    return fig


def headlines(rows: list[dict]) -> str:
    keys = ("method", "target_epsilon", "epsilon_max", "error_max_sd", "ess_per_second")
    lines = [" ".join(f"{k:>16}" for k in keys)]
    for r in rows:
        lines.append(" ".join(f"{reporting.cell(r[k]):>16}" for k in keys))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = reporting.scenario_parser(__doc__ or NAME, "ε = 4 only, 100 + 100 iterations")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset")
    parser.add_argument("--epsilons", default="", help="comma-separated ε (default: the mode's)")
    parser.add_argument(
        "--adapt-mass",
        nargs="?",
        const="diag",
        default=None,
        choices=tuple(MASS_FLAG),
        help="dp_hmc: sampler.adapt_mass (bare: diag)",
    )
    args = parser.parse_args(argv)
    methods = tuple(args.methods.split(","))
    if not methods or not set(methods) <= set(METHODS):
        parser.error(f"--methods takes a comma-separated subset of {', '.join(METHODS)}")
    try:
        require("statsmodels", f"scenarios/{NAME}.py (statsmodels' RAND HIE records)")
    except FedPenaltyError as exc:
        print(exc, file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # consortium_model
    base = QUICK if args.quick else FULL
    tuning = base.tuning
    if args.adapt_mass is not None:
        tuning = replace(tuning, adapt_mass=MASS_FLAG[args.adapt_mass])
    setup = replace(base, methods=methods, tuning=tuning)
    if args.epsilons:
        setup = replace(setup, epsilons=tuple(float(e) for e in args.epsilons.split(",")))
    total = len(setup.methods) * len(setup.epsilons)
    with (
        tempfile.TemporaryDirectory() as tmp,
        reporting.progress(total, NAME, not args.no_progress) as bar,
    ):
        rows = run(setup, args.seed, Path(tmp), bar)
    notes = [
        "reference: the non-private posterior of the pooled records (closed form given τ, "
        "log τ integrated on a grid), not a Monte Carlo estimate",
        "penalty and dp_hmc clip each record's log ratio (and dp_hmc its gradient): their "
        "target is the clipped-likelihood posterior; clip_fraction says how often the clip bound "
        "was hit",
        "informative_answers ≈ μ²N/(4d): the answers per owner (all kinds) a penalty test "
        "stays informative for with secure aggregation; answers is what the run asked",
    ]
    reporting.write_report(
        args.out,
        NAME,
        argv=list(argv if argv is not None else sys.argv[1:]),
        settings=asdict(setup),
        results=rows,
        notes=notes,
        fig=plot(rows, setup),
    )
    print(headlines(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
