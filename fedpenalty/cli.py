"""Command line: ``fedpenalty simulate`` and ``fedpenalty account``."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, Sequence

from . import __version__
from .errors import FedPenaltyError


def _fmt(x: float | None, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return f"{x:.{digits}g}"


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain aligned text table."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.rjust(w) for h, w in zip(headers, widths))
    body = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join([line, "  ".join("-" * w for w in widths), *body])


def privacy_table(privacy: dict[str, Any]) -> str:
    rows = [[o["owner"], str(o["n"]), _fmt(o["sigma"]), str(o["answers"]), _fmt(o["mu"]), _fmt(o["epsilon"]),
             _fmt(o["epsilon_paper_bound"]), _fmt(o["budget_epsilon"])] for o in privacy["owners"]]
    return table(["owner", "n", "sigma", "answers", "mu", f"eps@{privacy['delta']:g}", "eps paper bound",
                  "budget"], rows)


def mixing_table(diag: dict[str, Any]) -> str:
    d = len(diag["posterior_mean"])
    shown = range(min(d, 10))
    rows = []
    for j in shown:
        row = [f"θ[{j}]", _fmt(diag["posterior_mean"][j]), _fmt(diag["posterior_sd"][j]), _fmt(diag["ess_bulk"][j], 3),
               _fmt(diag["rhat"][j]) if diag["rhat"] else "n/a"]
        if "reference" in diag:
            row += [_fmt(diag["reference"]["mean"][j]), _fmt(diag["reference"]["sd"][j]),
                    _fmt(diag["error"]["mean_in_sd"][j], 3)]
        rows.append(row)
    headers = ["param", "mean", "sd", "ess_bulk", "rhat"]
    if "reference" in diag:
        headers += ["ref mean", "ref sd", "|err|/ref sd"]
    return table(headers, rows)


def cmd_simulate(args: argparse.Namespace) -> int:
    from .config import load_scenario
    from .simulation import run_scenario

    scenario = load_scenario(args.scenario, args.set or [])
    if args.no_progress:
        scenario["run"]["progress"] = False
    result = run_scenario(scenario, args.out)
    model, sampler = scenario["model"], scenario["sampler"]
    print(f"fedpenalty simulate: {sampler['algorithm']} on {model['name']} (dim {len(result.diagnostics['posterior_mean'])}), "
          f"{scenario['data']['owners']} owners, {sampler['chains']} chains × {sampler['iterations']} draws "
          f"(+{sampler['warmup']} warmup)")
    if result.privacy["owners"]:
        print(f"\nPer-owner privacy ({result.privacy['neighbour']}, δ = {result.privacy['delta']:g}; "
              "each owner's own ledger):")
        print(privacy_table(result.privacy))
    else:
        print("\nexact_mh is the non-private trusted-curator baseline: no owner privacy.")
    diag = result.diagnostics
    print(f"\nMixing: acceptance {diag['acceptance_rate']:.3f}, mean noise variance s² {diag['mean_noise_variance']:.3g}")
    print(mixing_table(diag))
    print(f"\nrun directory: {result.out}")
    return 0


def cmd_account(args: argparse.Namespace) -> int:
    from .privacy import calibrate_sigma, epsilon_for_delta, paper_bound_epsilon

    if (args.sigma is None) == (args.epsilon is None):
        raise FedPenaltyError("give exactly one of --sigma (to get ε) or --epsilon (to get the calibrated σ)")
    for name in ("sigma", "epsilon", "sensitivity", "delta"):
        value = getattr(args, name)
        if value is not None and (not math.isfinite(value) or value <= 0):
            raise FedPenaltyError(f"--{name} must be a positive finite number, got {value:g}")
    if args.delta >= 1:
        raise FedPenaltyError(f"--delta must be below 1, got {args.delta:g}")
    if args.queries < 1:
        raise FedPenaltyError("--queries must be a positive integer")
    if args.sigma is not None:
        mu_answer = args.sensitivity / args.sigma
        eps = epsilon_for_delta(mu_answer * math.sqrt(args.queries), args.delta)
        paper = paper_bound_epsilon(mu_answer, args.queries, args.delta)
        out = {"sigma": args.sigma, "sensitivity": args.sensitivity, "queries": args.queries, "delta": args.delta,
               "mu": mu_answer * math.sqrt(args.queries), "epsilon": eps,
               "epsilon_paper_bound": paper if math.isfinite(paper) else None}
        text = (f"{args.queries} Gaussian answers, sensitivity {args.sensitivity:g}, σ = {args.sigma:g}: "
                f"μ = {out['mu']:.6g}\n  ε = {eps:.10g} at δ = {args.delta:g} (exact, analytic Gaussian)\n"
                f"  ε = {_fmt(paper, 10)} (paper's bound: classical Gaussian + advanced composition)")
    else:
        sigma = calibrate_sigma(args.epsilon, args.delta, args.queries, args.sensitivity)
        out = {"sigma": sigma, "epsilon": args.epsilon, "sensitivity": args.sensitivity, "queries": args.queries,
               "delta": args.delta}
        text = (f"σ = {sigma:.10g} gives ε = {args.epsilon:g} at δ = {args.delta:g} for {args.queries} answers "
                f"of sensitivity {args.sensitivity:g} (exact)")
    print(json.dumps(out) if args.json else text)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedpenalty", description=__doc__)
    parser.add_argument("--version", action="version", version=f"fedpenalty {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    sim = sub.add_parser("simulate", help="run a local multi-owner simulation (default: the embedded scenario)")
    sim.add_argument("scenario", nargs="?", help="scenario TOML file (default: embedded default scenario)")
    sim.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a scenario key")
    sim.add_argument("--out", help="run directory (default: run.out or runs/<algorithm>-<time>)")
    sim.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    sim.set_defaults(func=cmd_simulate)

    acc = sub.add_parser("account", help="ε of T Gaussian answers, or σ for a target ε")
    acc.add_argument("--sigma", type=float, help="noise sd of each answer")
    acc.add_argument("--epsilon", type=float, help="target ε (prints the calibrated σ instead)")
    acc.add_argument("--sensitivity", type=float, default=1.0, help="L2 sensitivity of each answer (default 1)")
    acc.add_argument("--queries", type=int, default=1, help="number of answers T (default 1)")
    acc.add_argument("--delta", type=float, default=1e-5, help="δ (default 1e-5)")
    acc.add_argument("--json", action="store_true", help="print JSON")
    acc.set_defaults(func=cmd_account)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (FedPenaltyError, ValueError, FileExistsError) as exc:
        print(f"fedpenalty: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedpenalty: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
