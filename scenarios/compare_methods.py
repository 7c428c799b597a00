"""Per-owner ε and posterior error of penalty MH, DP-SGLD, OPS and noisy statistics on one
logistic scenario, at one δ and one target ε.

    python scenarios/compare_methods.py [--epsilon 2] [--delta 1e-5] [--json FILE] [--no-progress]

Data: logistic regression (d = 2), 4 owners × 5,000 records, true θ = (1, −0.5); every method
starts its chains at the same data-independent points and runs through ``fedpenalty
simulate``'s own path (in-process owners), so ε comes from ``privacy.json`` — the owners'
ledgers for ``penalty`` and ``sgld``, the tested baseline formulas for ``ops`` and
``noisy_stats`` — and the error is against the exact-MH reference posterior of the pooled
records. Each private method is calibrated to the target ε per owner at δ:

* ``penalty``: σ per owner with K σ² = 1 (acceptance penalty e^{−1/2}) and the proposal radius
  at which the planned answers are exactly (ε, δ)-DP (μ-GDP, analytic Gaussian);
* ``sgld``: the noise multiplier calibrated by the PLD accountant for the planned gradient
  answers, at the largest step where the owners' noise fits under the Langevin noise;
* ``ops``: 10 released draws (2 chains × 5), each (ε/10, 0)-DP (Wang et al.'s ρ = ε/(4B));
  a trusted curator pools the records;
* ``noisy_stats``: logistic regression has no sufficient statistics, so it cannot run here.
  It is shown on the nearest sensible model, a Bernoulli mean with the same owners and record
  counts (labelled), against that model's closed-form posterior.

``exact_mh`` (non-private, trusted curator) is shown for scale.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

from fedpenalty import reporting
from fedpenalty.cli import table
from fedpenalty.config import resolve
from fedpenalty.coordinator.algorithms import ALGORITHMS
from fedpenalty.models import build_model
from fedpenalty.privacy import mu_for_epsilon
from fedpenalty.privacy.subsampled import calibrate_noise_multiplier
from fedpenalty.simulation import run_scenario

OWNERS, N_PER_OWNER, CHAINS, ITERATIONS, WARMUP = 4, 5000, 2, 1500, 1000
LOGISTIC = {"name": "logistic", "dim": 2}
SAMPLING_RATE, CLIP, PENALTY_S2 = 0.02, 1.0, 1.0


NOTES = """notes: penalty is calibrated for its worst case (every proposal at the full radius);
each owner charges an answer by the step actually proposed, so its ledger reports less. Its
random walk pays privacy for every step, so at a fixed ε it can travel only so far from its
data-independent starts; sgld's drift follows the gradient. ops releases 10 draws of a tempered
posterior; noisy_stats runs on a Bernoulli model (labelled), since logistic regression has no
sufficient statistics."""


def base(
    args: argparse.Namespace,
    algorithm: str,
    model: dict[str, Any] = LOGISTIC,
    true_theta: Any = (1.0, -0.5),
) -> dict[str, dict[str, Any]]:
    """The shared scenario (unresolved) for ``algorithm``."""
    return {
        "model": dict(model),
        "data": {"owners": OWNERS, "n_per_owner": N_PER_OWNER, "true_theta": list(true_theta)},
        "privacy": {
            "delta": args.delta,
            "epsilon": args.epsilon,
            "budget_epsilon": args.epsilon * 1.01,
            "neighbour": "replace_one",
        },
        "sampler": {
            "algorithm": algorithm,
            "chains": CHAINS,
            "iterations": ITERATIONS,
            "warmup": WARMUP,
            "init_scale": 0.1,
        },
        "run": {"transport": "inprocess", "progress": not args.no_progress, "seed": args.seed},
    }


def scenarios(args: argparse.Namespace) -> list[tuple[str, dict]]:
    """(label, scenario) of every method, each calibrated to the target (ε, δ)."""
    answers = ALGORITHMS["penalty"].planned_answers(
        {"chains": CHAINS, "iterations": ITERATIONS, "warmup": WARMUP}
    )
    model = build_model(LOGISTIC)
    penalty = base(args, "penalty")
    sigma = math.sqrt(PENALTY_S2 / OWNERS)
    # T answers of sensitivity 2·L·step at noise σ compose to μ = 2 L step √T / σ = μ(ε, δ)
    step = (
        mu_for_epsilon(args.epsilon, args.delta)
        * sigma
        / (2 * model.lipschitz * math.sqrt(answers))
    )
    penalty["privacy"]["sigma"] = sigma
    penalty["sampler"]["step"] = step

    sgld = base(args, "sgld")
    noise = calibrate_noise_multiplier(
        args.epsilon, args.delta, SAMPLING_RATE, answers, neighbour="replace_one"
    )
    sgld["privacy"]["sigma"] = noise
    sgld["sampler"].update(
        sampling_rate=SAMPLING_RATE,
        clip=CLIP,
        step=4 * SAMPLING_RATE**2 / (OWNERS * (noise * CLIP) ** 2),
    )

    ops = base(args, "ops")
    ops["sampler"].update(iterations=5, warmup=0)

    noisy = base(args, "noisy_stats", {"name": "bernoulli"}, [0.5])
    noisy["privacy"]["mechanism"] = "laplace"

    exact = base(args, "exact_mh")
    exact["sampler"]["step"] = 0.02
    return [
        ("exact_mh (non-private)", exact),
        ("penalty", penalty),
        ("sgld", sgld),
        ("ops", ops),
        ("noisy_stats [bernoulli, not logistic]", noisy),
    ]


def row(label: str, scenario: dict, result) -> dict[str, Any]:
    """One table row from a finished run."""
    privacy, diag = result.privacy, result.diagnostics
    owners = privacy.get("owners", [])
    return {
        "method": label,
        "model": scenario["model"]["name"],
        "epsilon_per_owner": max((o["epsilon"] for o in owners), default=None),
        "delta": privacy.get("delta"),
        "neighbour": privacy.get("neighbour"),
        "trusted_curator": privacy.get("trusted_curator"),
        "draws": diag["kept_draws"] * scenario["sampler"]["chains"],
        "ess_bulk": min(diag["ess_bulk"]),
        "rhat": max(diag["rhat"]) if diag["rhat"] else None,
        "error_mean_in_sd": max(diag["error"]["mean_in_sd"]),
        "sd_ratio": max(diag["error"]["sd_ratio"]),
        "settings": {
            "step": scenario["sampler"].get("step"),
            "sigma": scenario["privacy"].get("sigma"),
            "sampling_rate": scenario["sampler"].get("sampling_rate"),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epsilon", type=float, default=2.0, help="target ε per owner (default 2)")
    parser.add_argument(
        "--delta", type=float, default=1e-5, help="δ for every method (default 1e-5)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the rows as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    rows = []
    methods = scenarios(args)
    with (
        tempfile.TemporaryDirectory() as tmp,
        reporting.progress(len(methods), "compare_methods", not args.no_progress) as bar,
    ):
        for label, raw in methods:
            bar.set_postfix_str(label)
            scenario = resolve(raw)
            rows.append(
                row(label, raw, run_scenario(scenario, Path(tmp) / raw["sampler"]["algorithm"]))
            )
            bar.update()
    print(
        f"logistic d=2, {OWNERS} owners × {N_PER_OWNER} records; target ε = {args.epsilon:g} per "
        f"owner, "
        f"δ = {args.delta:g} (δ = 0 for ops and Laplace noisy_stats), replace_one neighbours\n"
    )

    def fmt(x: Any, spec: str) -> str:
        return "n/a" if x is None else format(x, spec)

    print(
        table(
            [
                "method",
                "ε/owner",
                "δ",
                "trusted curator",
                "draws",
                "min ESS",
                "max R-hat",
                "max |err|/ref sd",
                "max sd ratio",
            ],
            [
                [
                    r["method"],
                    fmt(r["epsilon_per_owner"], ".4g"),
                    fmt(r["delta"], "g"),
                    "yes" if r["trusted_curator"] else "no",
                    str(r["draws"]),
                    fmt(r["ess_bulk"], ".0f"),
                    fmt(r["rhat"], ".3f"),
                    fmt(r["error_mean_in_sd"], ".3g"),
                    fmt(r["sd_ratio"], ".3g"),
                ]
                for r in rows
            ],
        )
    )
    print(
        "\nsettings: "
        + "; ".join(
            f"{r['method'].split()[0]}: "
            + ", ".join(f"{k} {v:.4g}" for k, v in r["settings"].items() if v is not None)
            for r in rows
            if any(r["settings"].values())
        )
    )
    print(NOTES)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
