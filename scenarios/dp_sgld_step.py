"""Wang et al.'s admissible DP-SGLD step against the one the exact (PLD) accountant admits.

    python scenarios/dp_sgld_step.py [--epsilon 1] [--delta 1e-5] [--sampling-rate 0.02]
                                     [--iterations 1500] [--warmup 1000] [--json FILE]
                                     [--no-progress]

Setting: logistic regression (d = 2), 4 owners × 2,500 records, 4 chains, each owner answering
one gradient per chain per iteration (Poisson sampling at q, clip 1, so the clip never binds:
‖x‖ ≤ 1). For a target (ε, δ) per owner, replace-one neighbours, both calibrations choose a
noise multiplier σ for all the answers of the run and the largest SGLD step at which the
owners' noise fits under the Langevin noise, (η/2)² s² ≤ η with s² = K (σ·clip/q)²:

* Wang et al. (Algorithm 2 / Theorem 4, advanced composition): σ_W, η_W;
* the exact accountant (dp-accounting PLD, ``subsampled.calibrate_noise_multiplier``): σ_A, η_A.

Both are then run on in-process owners (``fedpenalty simulate``'s own path: the owners' ledgers
charge every answer and report ε), starting from the same data-independent points, and the
table shows each owner's ε as its ledger reports it, the bulk ESS and the error of the
posterior mean against the exact-MH reference. Wang et al.'s noise fits under a step ~600×
smaller, so in the same number of iterations that chain barely leaves its starting points.

Progress bars on stderr (``--no-progress`` hides them): the script's three phases (the two
calibrations, then each run), and inside each run the logistic reference posterior (a long
exact-MH run, the first time only: then cached) and the DP-SGLD chains.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from fedpenalty import reporting
from fedpenalty.cli import table
from fedpenalty.config import resolve
from fedpenalty.privacy.wang import compare_admissible_steps
from fedpenalty.simulation import run_scenario

NAME = "dp_sgld_step"
OWNERS, N_PER_OWNER, CHAINS, CLIP = 4, 5000, 2, 1.0


def scenario(args: argparse.Namespace, sigma: float, step: float) -> dict:
    """The DP-SGLD scenario with noise multiplier ``sigma`` and step ``step`` (unresolved)."""
    return {
        "model": {"name": "logistic", "dim": 2},
        "data": {"owners": OWNERS, "n_per_owner": N_PER_OWNER, "true_theta": [1.0, -0.5]},
        "privacy": {
            "delta": args.delta,
            "sigma": sigma,
            "budget_epsilon": args.epsilon * 1.01,
            "neighbour": "replace_one",
        },
        "sampler": {
            "algorithm": "sgld",
            "chains": CHAINS,
            "iterations": args.iterations,
            "warmup": args.warmup,
            "step": step,
            "sampling_rate": args.sampling_rate,
            "clip": CLIP,
            "init_scale": 0.1,
        },
        "run": {"transport": "inprocess", "progress": not args.no_progress, "seed": args.seed},
    }


def intro(args: argparse.Namespace, c: Any, answers: int) -> str:
    """The setting and both calibrations, in words."""
    return (
        f"logistic d=2, {OWNERS} owners × {N_PER_OWNER} records, {CHAINS} chains × "
        f"({args.warmup} + {args.iterations}) iterations = {answers} gradient answers per owner, "
        f"q = {args.sampling_rate:g}, clip {CLIP:g}, target ε = {args.epsilon:g} at δ = "
        f"{args.delta:g} per owner ({c.neighbour}: one record replaced; sensitivity 2·clip)\n\n"
        f"Wang et al. (Thm 4): noise multiplier {c.wang_noise_multiplier:.4g}, admissible step "
        f"{c.wang_step:.4g}; the exact accountant says that noise spends only ε = "
        f"{c.wang_exact_epsilon:.4g}\n"
        f"PLD accountant:      noise multiplier {c.accountant_noise_multiplier:.4g}, admissible "
        f"step {c.accountant_step:.4g}  (gain {c.gain:.1f}×)\n"
    )


def runs(args: argparse.Namespace, c: Any, bar: Any) -> list[dict[str, Any]]:
    """DP-SGLD at each calibration's noise and step (in-process owners): one row each."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, sigma, step in (
            ("Wang et al.", c.wang_noise_multiplier, c.wang_step),
            ("PLD", c.accountant_noise_multiplier, c.accountant_step),
        ):
            bar.set_postfix_str(f"DP-SGLD at the {name} step")
            result = run_scenario(resolve(scenario(args, sigma, step)), Path(tmp) / name.split()[0])
            diag, owners = result.diagnostics, result.privacy["owners"]
            rows.append(
                {
                    "calibration": name,
                    "noise_multiplier": sigma,
                    "step": step,
                    "epsilon_per_owner": max(o["epsilon"] for o in owners),
                    "accountant": owners[0]["accountant"],
                    "excess_noise_ratio": diag["excess_noise_ratio"],
                    "ess_bulk": min(diag["ess_bulk"]),
                    "rhat": max(diag["rhat"]),
                    "error_mean_in_sd": max(diag["error"]["mean_in_sd"]),
                    "sd_ratio": diag["error"]["sd_ratio"],
                }
            )
            bar.update()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epsilon", type=float, default=2.0, help="target ε per owner (default 2)")
    parser.add_argument("--delta", type=float, default=1e-5, help="δ (default 1e-5)")
    parser.add_argument(
        "--sampling-rate", type=float, default=0.02, help="Poisson sampling rate q (default 0.02)"
    )
    parser.add_argument(
        "--iterations", type=int, default=1500, help="kept iterations per chain (default 1500)"
    )
    parser.add_argument(
        "--warmup", type=int, default=1000, help="warmup iterations per chain (default 1000)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the rows as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)

    answers = CHAINS * (args.iterations + args.warmup)
    with reporting.progress(3, NAME, not args.no_progress) as bar:
        bar.set_postfix_str("calibrating the noise (Wang et al.; PLD)")
        c = compare_admissible_steps(
            args.epsilon, args.delta, args.sampling_rate, answers, CLIP, owners=OWNERS
        )
        bar.update()
        print(intro(args, c, answers), flush=True)
        rows = runs(args, c, bar)
    print(
        table(
            [
                "calibration",
                "noise mult.",
                "step η",
                "ε/owner (ledger)",
                "excess",
                "min ESS",
                "max R-hat",
                "max |err|/ref sd",
            ],
            [
                [
                    r["calibration"],
                    f"{r['noise_multiplier']:.4g}",
                    f"{r['step']:.3g}",
                    f"{r['epsilon_per_owner']:.4g} ({r['accountant']})",
                    f"{r['excess_noise_ratio']:.2g}",
                    f"{r['ess_bulk']:.0f}",
                    f"{r['rhat']:.3f}",
                    f"{r['error_mean_in_sd']:.3g}",
                ]
                for r in rows
            ],
        )
    )
    if args.json:
        args.json.write_text(json.dumps({"comparison": c.__dict__, "runs": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
