"""Foulds, Geumlek, Welling & Chaudhuri (2016), Figure 2 and §3, reproduced: how far is one
private posterior sample of a Bernoulli success probability from the truth, against the
number of observations N?

    python scenarios/foulds_beta_bernoulli.py [--quick] [--out DIR] [--seed 0]
                                              [--repeats R] [--no-progress]

N records x ~ Bernoulli(p = 0.1), prior Beta(1, 1), ε = 0.1 (replace-one neighbours). For
each N = 10 … 10⁵ and each repeat (fresh data, 1,000 repeats as in the paper) one sample p̂
is released by each method, and the L1 error |p̂ − p| is averaged over repeats:

* ``non_private``: a draw from the exact posterior Beta(1 + Σx, 1 + N − Σx);
* ``laplace_paper``: the paper's own construction — Laplace(2/ε) on both pseudo-counts
  (n₁, n₀), clamped at 0, so N is private too; Beta(1 + n̂₁, 1 + n̂₀)
  (``coordinator.baselines.laplace_pseudo_counts``, added for this figure);
* ``laplace_project``: the project's ``noisy_stats``: Laplace(1/ε) on Σx alone, N public,
  projected to [0, N];
* ``ops``: one draw of the tempered posterior with p truncated to [a₀, 1 − a₀], a₀ = 0.05
  (Θ = [−logit(0.95), logit(0.95)], Foulds et al.'s Theorem 2: ρ = ε/(2C), C = log((1 − a₀)/a₀));
  the library tempers prior and likelihood together (docs/design.md §2.4);
* ``penalty``: the last state of one penalty chain (the same truncated model, δ = 1e-5 — not
  pure DP), σ with σ² = 4 and the radius at which its 2,000 answers are exactly (ε, δ); it
  starts at a data-independent point and runs through ``fedpenalty simulate`` (fewer repeats).

Then the asymptotic relative efficiencies of §3, measured at the largest N (10⁵) as
ARE = N·E[(p̂ − p)²]/(p(1 − p)) (the MLE's variance is p(1 − p)/N): 2 for posterior sampling
and for Laplace, 1 + T for OPS at temperature T = 1/ρ, i.e. (1 + T)/2 relative to posterior
sampling; OPS is shown at several ε to trace the (1 + T)/2 growth.

Writes ``foulds_beta_bernoulli.json`` and ``foulds_beta_bernoulli.png``. Error bars: ± one
standard error of the mean over repeats (the spread of single errors, their sd, is in the JSON).
"""

from __future__ import annotations

import math
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy import special

from fedpenalty import reporting
from fedpenalty.coordinator import baselines
from fedpenalty.coordinator.algorithms import ALGORITHMS
from fedpenalty.models import build_model
from fedpenalty.privacy import calibrate_sigma

NAME = "foulds_beta_bernoulli"
P_TRUE, EPSILON, A0, NEIGHBOUR = 0.1, 0.1, 0.05, "replace_one"
PENALTY_DELTA, PENALTY_S2, PENALTY_STEPS = 1e-5, 4.0, 2000
WIDE = {"name": "bernoulli", "theta_bound": 12.0}  # p ∈ [6e-6, 1 − 6e-6]: untruncated in effect
TRUNCATED = {"name": "bernoulli", "theta_bound": float(special.logit(1 - A0))}
METHODS = ("non_private", "laplace_paper", "laplace_project", "ops", "penalty")


@dataclass(frozen=True)
class Setup:
    sizes: tuple[int, ...]
    repeats: int
    penalty_repeats: int
    are_epsilons: tuple[float, ...]


FULL = Setup((10, 30, 100, 300, 1_000, 10_000, 100_000), 1000, 10, (0.1, 0.3, 1.0, 3.0))
QUICK = Setup((10, 1_000, 100_000), 120, 2, (0.1, 1.0))

Release = Callable[[np.random.Generator, np.ndarray], float]


def releases(epsilon: float) -> dict[str, Release]:
    """One private (or not) sample p̂ from records ``(N, 1)``, per closed-form method."""
    wide, truncated = build_model(WIDE), build_model(TRUNCATED)

    def non_private(rng: np.random.Generator, records: np.ndarray) -> float:
        ones = records.sum()
        return float(baselines.conjugate_draws(rng, wide, len(records), np.array([ones]), 1)[0, 0])

    def laplace_paper(rng: np.random.Generator, records: np.ndarray) -> float:
        r = baselines.laplace_pseudo_counts(
            rng, wide, records, epsilon, neighbour=NEIGHBOUR, draws=1
        )
        return float(r.theta[0, 0])

    def laplace_project(rng: np.random.Generator, records: np.ndarray) -> float:
        r = baselines.noisy_stats(rng, wide, [records], epsilon, neighbour=NEIGHBOUR, draws=1)
        return float(r.theta[0, 0])

    def ops(rng: np.random.Generator, records: np.ndarray) -> float:
        r = baselines.ops(rng, truncated, records, epsilon, form="foulds", neighbour=NEIGHBOUR)
        return float(np.asarray(r.theta).reshape(-1)[0])

    return {
        "non_private": non_private,
        "laplace_paper": laplace_paper,
        "laplace_project": laplace_project,
        "ops": ops,
    }


def data(rng: np.random.Generator, n: int) -> np.ndarray:
    return build_model(WIDE).simulate_records(rng, np.array([special.logit(P_TRUE)]), n)


def errors(
    sizes: tuple[int, ...], repeats: int, seed: int, epsilon: float, bar, only: tuple[str, ...] = ()
) -> dict[str, dict[int, np.ndarray]]:
    """p̂ − p per method (all closed-form ones, or ``only`` these), size and repeat."""
    methods = {m: f for m, f in releases(epsilon).items() if not only or m in only}
    out: dict[str, dict[int, np.ndarray]] = {m: {} for m in methods}
    for n in sizes:
        rng = np.random.default_rng([seed, n])
        draws = {m: np.empty(repeats) for m in methods}
        for r in range(repeats):
            records = data(rng, n)
            for m, release in methods.items():
                draws[m][r] = special.expit(release(rng, records)) - P_TRUE
        for m in methods:
            out[m][n] = draws[m]
        bar.update()
    return out


def penalty_settings() -> dict[str, float]:
    """σ with σ² = 4 and the radius at which PENALTY_STEPS answers are exactly (ε, δ)."""
    model = build_model(TRUNCATED)
    sigma = math.sqrt(PENALTY_S2)
    per_unit = calibrate_sigma(
        EPSILON, PENALTY_DELTA, PENALTY_STEPS, float(model.log_ratio_sensitivity(1.0, NEIGHBOUR))
    )
    radius = sigma / per_unit
    return {"sigma": sigma, "radius": radius, "max_travel": radius * PENALTY_STEPS}


def penalty_errors(
    setup: Setup, seed: int, folder: Path, bar
) -> tuple[dict[int, np.ndarray], dict[str, Any]]:
    """p̂ − p of the last state of one penalty chain per repeat (fresh data per repeat), and
    what the owners' ledgers say: the largest ε any run spent, and any stopped attempts."""
    s = penalty_settings()
    out = {}
    ledger: dict[str, Any] = {"epsilon_max": 0.0, "stopped_attempts": []}
    for n in setup.sizes:
        values = []
        for r in range(setup.penalty_repeats):
            raw = {
                "model": dict(TRUNCATED),
                "data": {"owners": 1, "n_per_owner": n, "true_theta": float(special.logit(P_TRUE))},
                "privacy": {
                    "sigma": s["sigma"],
                    "delta": PENALTY_DELTA,
                    "neighbour": NEIGHBOUR,
                    "budget_epsilon": EPSILON * 1.001,
                },
                "sampler": {
                    "algorithm": "penalty",
                    "chains": 1,
                    "warmup": PENALTY_STEPS - 2,
                    "iterations": 2,
                    "step": s["radius"],
                    "adapt_step": False,  # the radius of the construction, fixed
                },
                "run": {"transport": "inprocess", "progress": False, "seed": seed + 1000 * r + n},
            }
            assert ALGORITHMS["penalty"].planned_answers(raw["sampler"]) == PENALTY_STEPS
            sim = reporting.simulate(raw, folder / f"penalty-{n}-{r}")
            eps = sim.result.privacy["owners"][0]["epsilon"]
            ledger["epsilon_max"] = max(ledger["epsilon_max"], eps)
            ledger["stopped_attempts"] += list(sim.stopped)
            values.append(special.expit(sim.result.theta[0, -1, 0]) - P_TRUE)
            bar.update()
        out[n] = np.array(values)
    return out, ledger


def l1(values: np.ndarray) -> dict[str, Any]:
    a = np.abs(values)
    return {
        "mean": float(a.mean()),
        "se": float(a.std(ddof=1) / math.sqrt(a.size)),
        "sd": float(a.std(ddof=1)),
        "repeats": int(a.size),
    }


def are(values: np.ndarray, n: int) -> dict[str, float]:
    """ARE against the MLE, N·E[(p̂ − p)²]/(p(1 − p)), with its standard error."""
    scaled = n * values**2 / (P_TRUE * (1 - P_TRUE))
    return {"are": float(scaled.mean()), "se": float(scaled.std(ddof=1) / math.sqrt(scaled.size))}


def efficiencies(
    setup: Setup, main: dict[str, dict[int, np.ndarray]], seed: int, bar
) -> list[dict]:
    """Measured ARE at the largest N: every closed-form method at ε (from the main sweep), and
    OPS alone at every other ε of the sweep (fresh repeats)."""
    n = setup.sizes[-1]
    truncated = build_model(TRUNCATED)
    rows = []
    for eps in setup.are_epsilons:
        err = main if eps == EPSILON else errors((n,), setup.repeats, seed + 7, eps, bar, ("ops",))
        t = 1.0 / baselines.ops_temperature(truncated, eps, form="foulds", neighbour=NEIGHBOUR)
        theory = {"non_private": 2.0, "laplace_paper": 2.0, "laplace_project": 2.0, "ops": 1.0 + t}
        for m in releases(eps):
            if m not in err:
                continue
            measured = are(err[m][n], n)
            rows.append(
                {
                    "method": m,
                    "epsilon": eps,
                    "n": n,
                    "ops_temperature_T": t,
                    **measured,
                    "theory_vs_mle": theory[m],
                    "relative_to_posterior_sampling": measured["are"] / 2.0,
                    "theory_relative_to_posterior_sampling": theory[m] / 2.0,
                }
            )
    return rows


def conclusions(
    table: dict[str, dict[int, dict]], sizes: tuple[int, ...], eff: list[dict]
) -> dict[str, Any]:
    """The paper's three claims, as measured: where OPS beats the Laplace mechanism (by more
    than 2 SE), how close Laplace gets to non-private sampling, and OPS's effective N."""

    def z(a: dict, b: dict) -> float:
        return (a["mean"] - b["mean"]) / math.hypot(a["se"], b["se"])

    ops_better = {
        name: [n for n in sizes if z(table[name][n], table["ops"][n]) > 2.0]
        for name in ("laplace_paper", "laplace_project")
    }
    largest = sizes[-1]
    ratio = {
        name: table[name][largest]["mean"] / table["non_private"][largest]["mean"]
        for name in ("laplace_paper", "laplace_project")
    }
    n_eff = {n: n * (table["non_private"][n]["mean"] / table["ops"][n]["mean"]) ** 2 for n in sizes}
    ops_eff = [r for r in eff if r["method"] == "ops" and r["epsilon"] == EPSILON]
    return {
        "ops_better_than_laplace_at_n": ops_better,
        "laplace_over_non_private_l1_at_largest_n": ratio,
        "ops_effective_n_over_n": {n: v / n for n, v in n_eff.items()},
        "ops_expected_effective_n_over_n": 2.0 / (1.0 + ops_eff[0]["ops_temperature_T"])
        if ops_eff
        else None,
    }


def plot(table: dict[str, dict[int, dict]], sizes: tuple[int, ...], eff: list[dict]) -> Any:
    fig, axes = reporting.figure(1, 2, width=6.0, height=4.5)
    ax = axes[0, 0]
    for m in METHODS:
        ax.errorbar(
            sizes,
            [table[m][n]["mean"] for n in sizes],
            yerr=[table[m][n]["se"] for n in sizes],
            marker="o",
            ms=4,
            capsize=3,
            label=m,
        )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="observations N",
        ylabel="mean L1 error |p̂ − p|",
        title=f"Beta–Bernoulli, p = {P_TRUE}, ε = {EPSILON}",
    )
    ax.legend(fontsize=8)
    ax = axes[0, 1]
    ops = [r for r in eff if r["method"] == "ops"]
    t = np.array([r["ops_temperature_T"] for r in ops])
    ax.errorbar(
        t,
        [r["relative_to_posterior_sampling"] for r in ops],
        yerr=[r["se"] / 2 for r in ops],
        fmt="o",
        capsize=3,
        label="OPS measured",
    )
    grid = np.geomspace(min(t.min(), 1.0), t.max() * 1.2, 50)
    ax.plot(grid, (1 + grid) / 2, "k--", label="(1 + T)/2")
    for m, marker in (("non_private", "s"), ("laplace_paper", "^"), ("laplace_project", "v")):
        rows = [r for r in eff if r["method"] == m and r["epsilon"] == EPSILON]
        ax.errorbar(
            [1.0],
            [rows[0]["relative_to_posterior_sampling"]],
            yerr=[rows[0]["se"] / 2],
            fmt=marker,
            capsize=3,
            label=f"{m} (ε = {EPSILON})",
        )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="OPS temperature T = 1/ρ",
        ylabel="ARE relative to posterior sampling",
        title=f"§3 efficiencies at N = {ops[0]['n']:,}",
    )
    ax.legend(fontsize=8)
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = reporting.scenario_parser(
        __doc__ or NAME, "N ∈ {10, 10³, 10⁵}, 120 repeats (2 penalty chains), ARE at ε ∈ {0.1, 1}"
    )
    parser.add_argument("--repeats", type=int, help="repeats of the closed-form methods")
    args = parser.parse_args(argv)
    setup = QUICK if args.quick else FULL
    if args.repeats:
        setup = replace(setup, repeats=args.repeats)
    runs = len(setup.sizes) * (1 + setup.penalty_repeats) + len(setup.are_epsilons) - 1
    with (
        tempfile.TemporaryDirectory() as tmp,
        reporting.progress(runs, NAME, not args.no_progress) as bar,
    ):
        err = errors(setup.sizes, setup.repeats, args.seed, EPSILON, bar)
        err["penalty"], penalty_ledger = penalty_errors(setup, args.seed, Path(tmp), bar)
        eff = efficiencies(setup, err, args.seed, bar)
    table = {m: {n: l1(err[m][n]) for n in setup.sizes} for m in METHODS}
    settings = {
        "setup": setup.__dict__,
        "p": P_TRUE,
        "epsilon": EPSILON,
        "a0": A0,
        "neighbour": NEIGHBOUR,
        "prior": "Beta(1, 1)",
        "models": {"wide": WIDE, "truncated": TRUNCATED},
        "penalty": {"delta": PENALTY_DELTA, "answers": PENALTY_STEPS, **penalty_settings()},
        "ops_rho": baselines.ops_temperature(
            build_model(TRUNCATED), EPSILON, form="foulds", neighbour=NEIGHBOUR
        ),
        "seed": args.seed,
    }
    results = {
        "l1_error": {m: {str(n): v for n, v in table[m].items()} for m in METHODS},
        "efficiency": eff,
        "conclusions": conclusions(table, setup.sizes, eff),
        "penalty_ledger": penalty_ledger,
    }
    notes = [
        "penalty: (ε, δ = 1e-5)-DP by its owner's ledger, not pure ε-DP like the others; its chain "
        "can move at most max_travel (logit units) from its data-independent start in 2,000 steps",
        "ops: the library tempers prior and likelihood together, [p(θ) Π p(x|θ)]^ρ on the logit "
        "scale",
        "error bars: ± one standard error of the mean over repeats",
    ]
    json_path, png_path = reporting.write_report(
        args.out,
        NAME,
        argv=list(argv if argv is not None else sys.argv[1:]),
        settings=settings,
        results=results,
        notes=notes,
        fig=plot(table, setup.sizes, eff),
    )
    print(headlines(table, setup.sizes, eff))
    print(f"wrote {json_path} and {png_path}")
    return 0


def headlines(table: dict[str, dict[int, dict]], sizes: tuple[int, ...], eff: list[dict]) -> str:
    """Figure 2 (mean L1 error ± one SE per method and N) and §3's efficiencies as tables."""
    errors = [
        {
            "n": f"{n:,}",
            **{m: f"{table[m][n]['mean']:.4g} ± {table[m][n]['se']:.2g}" for m in METHODS},
        }
        for n in sizes
    ]
    efficiency = [
        {**e, "measured": f"{e['relative_to_posterior_sampling']:.3g} ± "
         f"{e['se'] * e['relative_to_posterior_sampling'] / e['are']:.2g}"}
        for e in eff
    ]  # fmt: skip
    return "\n".join(
        [
            reporting.headline(
                f"Figure 2: mean L1 error |p̂ − p| ± one SE (p = {P_TRUE}, ε = {EPSILON})",
                errors,
                [("n", "N"), *((m, m.replace("_", " ")) for m in METHODS)],
            ),
            reporting.headline(
                "§3: asymptotic relative efficiency, relative to posterior sampling "
                "(theory: 1 for Laplace, (1 + T)/2 for OPS)",
                efficiency,
                [
                    ("method", "method"),
                    ("epsilon", "ε"),
                    ("ops_temperature_T", "OPS T"),
                    ("measured", "measured ± SE"),
                    ("theory_relative_to_posterior_sampling", "theory"),
                ],
            ),
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
