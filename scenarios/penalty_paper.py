"""Yıldırım (2016), "On the use of penalty MCMC for differential privacy", reproduced: does the
penalty chain keep mixing as the owners' noise, the data size and the number of owners grow?

    python scenarios/penalty_paper.py [--quick] [--out DIR] [--seed 0] [--repeats R]
                                      [--no-progress]

Model: the mean of Gaussian records (``gaussian_mean``, σ₀ = 1, |x| ≤ 2, Θ = [−1, 1], so
L = 3 nats per unit θ), true θ = 0, replace-one neighbours. Every chain runs through
``fedpenalty simulate``'s own path with in-process owners.

1. **Proposition 1** (acceptance falls monotonically as the noise variance s² grows): one
   owner, n = 10⁴, proposal radius one posterior sd, s² from 0 (exact MH) to 16. Beside the
   measured acceptance, the expected one, E_π[Φ((λ − s²/2)/s) + e^λ Φ((−λ − s²/2)/s)], with
   λ the exact log posterior ratio of stationary pairs (θ ~ π, θ' = θ + u), by Monte Carlo
   (``coordinator.mh.expected_acceptance``). Chains start near the posterior (init_scale
   0.005): the proposition is about the stationary chain.
2. **Theorem 1** (the paper's regime): n = 10³ … 10⁷, one owner, fixed σ = 2, proposal radius
   a = (σ/L)/√n (∝ n^−½; μ = 2La√n/σ = 2 for the T = n answers), δ = n^−1.5. ε for T = n
   answers all at the full radius — by the exact accountant (μ-GDP) and by the paper's own
   bound (classical Gaussian mechanism + advanced composition) — and acceptance, ESS per 1,000
   kept draws and R-hat of 4 chains that start at data-independent points (init_scale 0.1)
   with warmup ⌈2√n⌉ (burn-in grows like √n at a step ∝ n^−½).
3. **Algorithm 2's cost of more owners**: n = 10⁵ records split equally over K = 1 … 64
   owners, each with σ = 0.5 (so each owner's ε does not depend on K), radius one posterior
   sd: the total noise s² = Σσ_k² = K σ² grows with K and acceptance falls as Proposition 1
   predicts. This is the paper's Algorithm 2, without secure aggregation; the same cost with
   and without it (total noise independent of K, docs/design.md §2.6), at one per-owner ε
   and K up to 1,000 with Ray owners, is ``privacy_mixing.py``'s owner-count sweep.

Writes ``penalty_paper.json`` and ``penalty_paper.png`` (three panels, error bars ± one sd
over repeats).
"""

from __future__ import annotations

import math
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from fedpenalty import reporting
from fedpenalty.coordinator.mh import expected_acceptance, propose_in_ball
from fedpenalty.models import build_model
from fedpenalty.privacy import epsilon_for_delta, paper_bound_epsilon

NAME = "penalty_paper"
MODEL = {"name": "gaussian_mean", "data_bound": 2.0, "theta_bound": 1.0}
NEIGHBOUR, DELTA = "replace_one", 1e-5
THEOREM_SIGMA, OWNERS_SIGMA = 2.0, 0.5
EXPECTED_PAIRS = 400_000


@dataclass(frozen=True)
class Setup:
    """The three sweeps and their chain lengths."""

    noise_vars: tuple[float, ...]
    sizes: tuple[int, ...]
    owners: tuple[int, ...]
    chains: int
    warmup: int
    iterations: int
    repeats: int


FULL = Setup(
    (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0),
    (1_000, 10_000, 100_000, 1_000_000, 10_000_000),
    (1, 2, 4, 8, 16, 32, 64),
    4,
    500,
    1000,
    2,
)
QUICK = Setup((0.0, 2.0, 8.0), (1_000, 100_000), (1, 4, 16), 4, 200, 400, 1)


def scenario(
    algorithm: str, n: int, owners: int, seed: int, setup: Setup, **sampler: Any
) -> dict[str, dict[str, Any]]:
    """A scenario (unresolved) of ``n`` records split equally over ``owners``."""
    per = [n // owners + (1 if k < n % owners else 0) for k in range(owners)]
    return {
        "model": dict(MODEL),
        "data": {"owners": owners, "n_per_owner": per, "true_theta": 0.0},
        "privacy": {"delta": DELTA, "neighbour": NEIGHBOUR, "budget_epsilon": 1e6},
        "sampler": {
            "algorithm": algorithm,
            "chains": setup.chains,
            "warmup": setup.warmup,
            "iterations": setup.iterations,
            "init_scale": 0.005,
            "adapt_step": False,  # the question is acceptance at the step set here
            **sampler,
        },
        "run": {"transport": "inprocess", "progress": False, "seed": seed},
    }


def stationary_acceptance(
    sim: reporting.Simulated, radius: float, noise_var: float, seed: int
) -> float:
    """E_π[expected_acceptance(λ, s²)] over stationary pairs: θ from the exact posterior (the
    normal with the reference moments; Θ's truncation is negligible at this n), θ' = θ + u with
    u uniform in the ball; λ the exact log posterior ratio; proposals outside Θ are rejected."""
    ref = sim.result.diagnostics["reference"]
    mean, sd = ref["mean"][0], ref["sd"][0]
    rng = np.random.default_rng(seed)
    theta = rng.normal(mean, sd, size=(EXPECTED_PAIRS, 1))
    prop = propose_in_ball(rng, theta, radius)
    lam = (((theta - mean) ** 2 - (prop - mean) ** 2) / (2 * sd * sd))[:, 0]
    inside = np.abs(prop[:, 0]) <= MODEL["theta_bound"]
    return float(np.mean(np.where(inside, expected_acceptance(lam, noise_var), 0.0)))


def chain_figures(sim: reporting.Simulated) -> dict[str, Any]:
    d = sim.result.diagnostics
    kept = sim.result.theta.shape[0] * sim.result.theta.shape[1]
    owners = sim.result.privacy.get("owners", [])
    return {
        "acceptance": d["acceptance_rate"],
        "ess_bulk": d["ess_bulk"][0],
        "ess_per_1000_draws": 1000.0 * d["ess_bulk"][0] / kept,
        "rhat": d["rhat"][0],
        "mean_error_in_sd": d["error"]["mean_in_sd"][0],
        "sd_ratio": d["error"]["sd_ratio"][0],
        "ledger_epsilon_per_owner": [o["epsilon"] for o in owners],
        "ledger_answers": owners[0]["answers"] if owners else None,
        "stopped_attempts": list(sim.stopped),
    }


def proposition_1(setup: Setup, seed: int, folder: Path, bar) -> list[dict]:
    """Measured and expected acceptance at each noise variance s² (one owner, n = 10⁴)."""
    n = 10_000
    radius = 1.0 / math.sqrt(n)
    rows = []
    for repeat in range(setup.repeats):
        for s2 in setup.noise_vars:
            if s2 == 0.0:
                raw = scenario("exact_mh", n, 1, seed + repeat, setup, step=radius)
            else:
                raw = scenario("penalty", n, 1, seed + repeat, setup, step=radius)
                raw["privacy"]["sigma"] = math.sqrt(s2)
            sim = reporting.simulate(raw, folder / f"prop1-{repeat}-{s2:g}")
            bar.update()
            rows.append(
                {
                    "repeat": repeat,
                    "noise_var": s2,
                    "radius": radius,
                    "expected_acceptance": stationary_acceptance(sim, radius, s2, seed + repeat),
                    **chain_figures(sim),
                    "scenario": sim.scenario.sections,
                }
            )
    return rows


def theorem_1_privacy(n: int) -> dict[str, float]:
    """ε of T = n answers at the full radius a = (σ/L)/√n, δ = n^−1.5, replace-one."""
    model = build_model(MODEL)
    radius = THEOREM_SIGMA / model.lipschitz / math.sqrt(n)
    mu_answer = float(model.log_ratio_sensitivity(radius, NEIGHBOUR)) / THEOREM_SIGMA
    delta = n**-1.5
    exact = epsilon_for_delta(mu_answer * math.sqrt(n), delta)
    paper = paper_bound_epsilon(mu_answer, n, delta)
    return {
        "n": n,
        "answers": n,
        "delta": delta,
        "radius": radius,
        "mu_per_answer": mu_answer,
        "mu_total": mu_answer * math.sqrt(n),
        "epsilon_exact": exact,
        "epsilon_paper_bound": paper,
        "paper_over_exact": paper / exact,
    }


def theorem_1(setup: Setup, seed: int, folder: Path, bar) -> list[dict]:
    """The paper's regime at every n: ε for T = n, and chains with warmup ⌈2√n⌉."""
    rows = []
    for n in setup.sizes:
        privacy = theorem_1_privacy(n)
        for repeat in range(setup.repeats):
            raw = scenario(
                "penalty",
                n,
                1,
                seed + repeat,
                setup,
                step=privacy["radius"],
                warmup=math.ceil(2 * math.sqrt(n)),
                init_scale=0.1,
            )
            raw["privacy"]["sigma"] = THEOREM_SIGMA
            sim = reporting.simulate(raw, folder / f"thm1-{repeat}-{n}")
            bar.update()
            rows.append(
                {
                    "repeat": repeat,
                    **privacy,
                    "warmup": raw["sampler"]["warmup"],
                    **chain_figures(sim),
                    "scenario": sim.scenario.sections,
                }
            )
    return rows


def more_owners(setup: Setup, seed: int, folder: Path, bar) -> list[dict]:
    """K owners at σ = 0.5 each over n = 10⁵ records: s² = Kσ², measured and expected."""
    n = 100_000
    radius = 1.0 / math.sqrt(n)
    rows = []
    for repeat in range(setup.repeats):
        for k in setup.owners:
            raw = scenario("penalty", n, k, seed + repeat, setup, step=radius)
            raw["privacy"]["sigma"] = OWNERS_SIGMA
            sim = reporting.simulate(raw, folder / f"owners-{repeat}-{k}")
            bar.update()
            s2 = k * OWNERS_SIGMA**2
            rows.append(
                {
                    "repeat": repeat,
                    "owners": k,
                    "noise_var": s2,
                    "expected_acceptance": stationary_acceptance(sim, radius, s2, seed + repeat),
                    **chain_figures(sim),
                    "scenario": sim.scenario.sections,
                }
            )
    return rows


def by(rows: list[dict], key: str, values: tuple, field: str) -> list[list[Any]]:
    return [[r[field] for r in rows if r[key] == v] for v in values]


def expected_vs_measured(ax: Any, rows: list[dict], key: str, x: tuple, label: str) -> None:
    """Measured acceptance (± sd over repeats) and the expected one (Proposition 1) against x."""
    reporting.errorbar(ax, x, by(rows, key, x, "acceptance"), label="measured")
    expected = [np.mean(v) for v in by(rows, key, x, "expected_acceptance")]
    ax.plot(x, expected, "k--", label=label)
    ax.set(ylabel="acceptance", ylim=(0, 1))
    ax.legend(fontsize=8)


def plot(prop: list[dict], thm: list[dict], owners: list[dict], setup: Setup) -> Any:
    """Proposition 1; Theorem 1's ε and its chains' mixing; the cost of more owners."""
    fig, axes = reporting.figure(2, 2, width=5.8, height=4.2)
    expected_vs_measured(axes[0, 0], prop, "noise_var", setup.noise_vars, "expected (Prop. 1)")
    axes[0, 0].set(xlabel="noise variance s² (nats²)", title="Proposition 1 (one owner, n = 10⁴)")
    sizes = setup.sizes
    eps = [next(r for r in thm if r["n"] == n) for n in sizes]
    ax = axes[0, 1]
    ax.plot(sizes, [e["epsilon_exact"] for e in eps], "o-", label="exact (μ-GDP)")
    ax.plot(sizes, [e["epsilon_paper_bound"] for e in eps], "s-", label="paper's bound")
    reporting.log_x(ax, sizes)
    ax.set(
        yscale="log",
        xlabel="n (T = n answers, δ = n^−1.5)",
        ylabel="ε per owner",
        title="Theorem 1 regime: ε for T = n",
    )
    ax.legend(fontsize=8)
    ax = axes[1, 0]
    reporting.errorbar(ax, sizes, by(thm, "n", sizes, "acceptance"), label="acceptance")
    ax.set(
        ylim=(0, 1),
        ylabel="acceptance",
        xlabel="n (step ∝ n^−½, warmup ⌈2√n⌉)",
        title="Theorem 1 regime: mixing",
    )
    twin = ax.twinx()
    reporting.errorbar(
        twin,
        sizes,
        by(thm, "n", sizes, "ess_per_1000_draws"),
        color="tab:red",
        label="ESS per 1,000 draws",
    )
    twin.set(ylim=(0, None), ylabel="ESS per 1,000 draws")
    reporting.log_x(ax, sizes)
    ax.legend(loc="lower left", fontsize=8)
    twin.legend(loc="lower right", fontsize=8)
    expected_vs_measured(axes[1, 1], owners, "owners", setup.owners, "expected (s² = Kσ²)")
    reporting.log_x(axes[1, 1], setup.owners)
    axes[1, 1].set(xlabel="owners K (σ = 0.5 each, n = 10⁵)", title="Algorithm 2: more owners")
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = reporting.scenario_parser(
        __doc__ or NAME, "s² ∈ {0, 2, 8}, n ∈ {10³, 10⁵}, K ≤ 16, 400 kept draws, 1 repeat"
    )
    parser.add_argument("--repeats", type=int, help="repeats (seeds seed, seed+1, …)")
    args = parser.parse_args(argv)
    setup = QUICK if args.quick else FULL
    if args.repeats:
        setup = replace(setup, repeats=args.repeats)
    runs = setup.repeats * (len(setup.noise_vars) + len(setup.sizes) + len(setup.owners))
    with (
        tempfile.TemporaryDirectory() as tmp,
        reporting.progress(runs, NAME, not args.no_progress) as bar,
    ):
        folder = Path(tmp)
        prop = proposition_1(setup, args.seed, folder, bar)
        thm = theorem_1(setup, args.seed, folder, bar)
        owners = more_owners(setup, args.seed, folder, bar)
    settings = {
        "setup": setup.__dict__,
        "model": MODEL,
        "neighbour": NEIGHBOUR,
        "delta_proposition_and_owners": DELTA,
        "theorem_sigma": THEOREM_SIGMA,
        "owners_sigma": OWNERS_SIGMA,
        "expected_acceptance_pairs": EXPECTED_PAIRS,
        "seeds": [args.seed + r for r in range(setup.repeats)],
    }
    notes = [
        "Theorem 1: epsilon_exact and epsilon_paper_bound are for T = n answers all at the full "
        "radius (the theorem's count); the chains measure acceptance, ESS and R-hat over warmup "
        "⌈2√n⌉ + a fixed number of kept draws, and their owners' ledgers report what those runs "
        "spent (ledger_epsilon_per_owner, at δ = 1e-5)",
        "more owners: the paper's Algorithm 2 (no secure aggregation); with and without secure "
        "aggregation, K up to 1,000 with Ray owners: privacy_mixing.py's owner-count sweep",
        "error bars: ± one sd over repeats (new data, noise and chains per repeat)",
    ]
    results = {"proposition_1": prop, "theorem_1": thm, "more_owners": owners}
    json_path, png_path = reporting.write_report(
        args.out,
        NAME,
        argv=list(argv if argv is not None else sys.argv[1:]),
        settings=settings,
        results=results,
        notes=notes,
        fig=plot(prop, thm, owners, setup),
    )
    print(headlines(prop, thm, owners))
    print(f"wrote {json_path} and {png_path}")
    return 0


def headlines(prop: list[dict], thm: list[dict], owners: list[dict]) -> str:
    """The three results as tables, each figure the mean (± sd) over repeats."""
    prop, thm, owners = (
        [{**r, "ledger_epsilon_max": max(r["ledger_epsilon_per_owner"], default=None)} for r in rs]
        for rs in (prop, thm, owners)
    )
    mixing = ["acceptance", "ess_per_1000_draws", "rhat"]
    return "\n".join(
        [
            reporting.headline(
                "Proposition 1: acceptance falls in the penalty noise s² (expected: exact formula)",
                reporting.over_repeats(prop, ["noise_var"], ["expected_acceptance", *mixing]),
                [
                    ("noise_var", "s²"),
                    ("expected_acceptance", "expected"),
                    ("acceptance", "acceptance"),
                    ("ess_per_1000_draws", "ESS/1000 draws"),
                    ("rhat", "R-hat"),
                ],
            ),
            reporting.headline(
                "Theorem 1: ε for T = n answers at δ = n^-1.5, exact against the paper's bound",
                reporting.over_repeats(
                    thm,
                    ["n"],
                    [
                        "epsilon_exact",
                        "epsilon_paper_bound",
                        "paper_over_exact",
                        *mixing,
                        "ledger_epsilon_max",
                    ],
                ),
                [
                    ("n", "n"),
                    ("epsilon_exact", "ε exact"),
                    ("epsilon_paper_bound", "paper bound"),
                    ("paper_over_exact", "bound ÷ exact"),
                    ("acceptance", "acceptance"),
                    ("ess_per_1000_draws", "ESS/1000"),
                    ("rhat", "R-hat"),
                    ("ledger_epsilon_max", "ledger ε of the run"),
                ],
            ),
            reporting.headline(
                "Algorithm 2: more owners at a fixed per-owner σ (ledger ε at δ = 1e-5)",
                reporting.over_repeats(
                    owners,
                    ["owners"],
                    ["noise_var", "expected_acceptance", *mixing, "ledger_epsilon_max"],
                ),
                [
                    ("owners", "K"),
                    ("noise_var", "s² = Kσ²"),
                    ("expected_acceptance", "expected"),
                    ("acceptance", "acceptance"),
                    ("ess_per_1000_draws", "ESS/1000"),
                    ("rhat", "R-hat"),
                    ("ledger_epsilon_max", "ledger ε per owner (max)"),
                ],
            ),
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
