"""``fedpenalty account``: ε of Gaussian answers (exact and the penalty paper's bound) or of
Poisson-subsampled Gaussian answers (dp-accounting), or the calibration of σ, of the noise
multiplier or of the number of answers; and its argument parser."""

from __future__ import annotations

import argparse
import json
import math
from typing import TYPE_CHECKING, Any

from .cli_print import fmt
from .errors import FedPenaltyError

if TYPE_CHECKING:
    from .models.base import Neighbour
    from .privacy.subsampled import Accountant


def _positive_args(args: argparse.Namespace, *names: str) -> None:
    for name in names:
        value = getattr(args, name)
        if value is not None and (not math.isfinite(value) or value <= 0):
            raise FedPenaltyError(
                f"--{name.replace('_', '-')} must be a positive finite number, got {value:g}"
            )
    if args.delta >= 1:
        raise FedPenaltyError(f"--delta must be below 1, got {args.delta:g}")


def cmd_account(args: argparse.Namespace) -> int:
    """ε of Gaussian answers (``--sigma``) or of Poisson-subsampled Gaussian answers
    (``--sampling-rate``), or the calibration of σ, of the noise multiplier or of the steps."""
    out, text = _account_subsampled(args) if args.sampling_rate is not None else _account(args)
    print(json.dumps(out) if args.json else text)
    return 0


def _account(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """``account --sigma`` (ε, exact and the paper's bound) or ``--epsilon`` (calibrated σ)."""
    from .privacy import calibrate_sigma, epsilon_for_delta, paper_bound_epsilon

    given = [
        f"--{n.replace('_', '-')}"
        for n in ("noise_multiplier", "steps", "accountant", "neighbour")
        if getattr(args, n) is not None
    ]
    if given:
        raise FedPenaltyError(
            f"{', '.join(given)}: for subsampled gradient answers only; give --sampling-rate too"
        )
    if (args.sigma is None) == (args.epsilon is None):
        raise FedPenaltyError(
            "give exactly one of --sigma (to get ε) or --epsilon (to get the calibrated σ)"
        )
    sensitivity = 1.0 if args.sensitivity is None else args.sensitivity
    queries = 1 if args.queries is None else args.queries
    _positive_args(args, "sigma", "epsilon", "sensitivity", "delta")
    if queries < 1:
        raise FedPenaltyError("--queries must be a positive integer")
    base = {"sensitivity": sensitivity, "queries": queries, "delta": args.delta}
    if args.sigma is None:
        sigma = calibrate_sigma(args.epsilon, args.delta, queries, sensitivity)
        text = (
            f"σ = {sigma:.10g} gives ε = {args.epsilon:g} at δ = {args.delta:g} for {queries} "
            f"answers of sensitivity {sensitivity:g} (exact)"
        )
        return {"sigma": sigma, "epsilon": args.epsilon, **base}, text
    mu_answer = sensitivity / args.sigma
    mu = mu_answer * math.sqrt(queries)
    eps = epsilon_for_delta(mu, args.delta)
    paper = paper_bound_epsilon(mu_answer, queries, args.delta)
    paper_or_none = paper if math.isfinite(paper) else None
    out = {
        "sigma": args.sigma,
        **base,
        "mu": mu,
        "epsilon": eps,
        "epsilon_paper_bound": paper_or_none,
    }
    text = (
        f"{queries} Gaussian answers, sensitivity {sensitivity:g}, σ = {args.sigma:g}: "
        f"μ = {mu:.6g}\n  ε = {eps:.10g} at δ = {args.delta:g} (exact, analytic Gaussian)\n"
        f"  ε = {fmt(paper, 10)} (paper's bound: classical Gaussian + advanced composition)"
    )
    return out, text


#: How each neighbour relation is accounted for subsampled-Gaussian answers (privacy.subsampled).
_SUBSAMPLED_NEIGHBOUR = {
    "add_remove": "add_remove: one record added or removed (sensitivity clip)",
    "replace_one": "replace_one: one record replaced (sensitivity 2·clip)",
}


def _account_subsampled(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """``account --sampling-rate``: ε of T answers, or the calibrated noise multiplier
    (``--epsilon``), or the largest T (``--epsilon`` and ``--noise-multiplier``)."""
    gaussian_only = [
        f"--{n}" for n in ("sigma", "sensitivity", "queries") if getattr(args, n) is not None
    ]
    if gaussian_only:
        raise FedPenaltyError(
            f"{', '.join(gaussian_only)}: for Gaussian answers only; with --sampling-rate give "
            "two of --noise-multiplier, --steps and --epsilon"
        )
    _positive_args(args, "sampling_rate", "noise_multiplier", "epsilon", "delta")
    if args.sampling_rate > 1:
        raise FedPenaltyError(f"--sampling-rate must be in (0, 1], got {args.sampling_rate:g}")
    if args.steps is not None and args.steps < 1:
        raise FedPenaltyError("--steps must be a positive integer")
    given = [args.noise_multiplier, args.steps, args.epsilon]
    if all(v is not None for v in given):
        raise FedPenaltyError("give at most two of --epsilon, --noise-multiplier and --steps")
    if sum(v is not None for v in given) < 2:
        raise FedPenaltyError(
            "with --sampling-rate give --noise-multiplier and --steps (ε), --epsilon and --steps "
            "(noise multiplier), or --epsilon and --noise-multiplier (steps)"
        )
    accountant: Accountant = args.accountant or "pld"
    neighbour: Neighbour = args.neighbour or "replace_one"
    how = (
        f"{accountant.upper()} accountant (dp-accounting), Poisson sampling, "
        f"neighbour {_SUBSAMPLED_NEIGHBOUR[neighbour]}"
    )
    if accountant == "rdp" and neighbour == "replace_one":
        how += "; RDP accounts it as add_remove at noise multiplier σ/2 (conservative)"
    out, text = _subsampled_figure(args, neighbour, accountant)
    return out, f"{text}\n  {how}"


def _subsampled_figure(
    args: argparse.Namespace, neighbour: Neighbour, accountant: Accountant
) -> tuple[dict[str, Any], str]:
    """The one of (noise multiplier, steps, ε) that ``args`` leaves out, from the other two."""
    from .privacy import subsampled

    q, delta, sigma, steps, eps = (
        args.sampling_rate,
        args.delta,
        args.noise_multiplier,
        args.steps,
        args.epsilon,
    )
    options: dict[str, Any] = {"neighbour": neighbour, "accountant": accountant}
    out: dict[str, Any] = {"sampling_rate": q, "delta": delta, **options}
    if eps is None:
        event = subsampled.SubsampledGaussian(q, sigma, steps)
        eps = subsampled.epsilon(event, delta, **options)
        text = (
            f"{steps} answers at sampling rate {q:g}, noise multiplier {sigma:g} (noise sd "
            f"σ·clip):\n  ε = {eps:.10g} at δ = {delta:g}"
        )
    elif sigma is None:
        sigma = subsampled.calibrate_noise_multiplier(eps, delta, q, steps, **options)
        text = (
            f"noise multiplier σ = {sigma:.10g} (noise sd σ·clip) gives ε = {eps:g} at "
            f"δ = {delta:g} for {steps} answers at sampling rate {q:g}"
        )
    else:
        steps = subsampled.max_steps(sigma, q, eps, delta, **options)
        text = (
            f"at most {steps} answers at sampling rate {q:g}, noise multiplier {sigma:g} stay "
            f"within ε = {eps:g} at δ = {delta:g}"
        )
    out.update(noise_multiplier=sigma, steps=steps, epsilon=eps)
    return out, text


def add_account(sub: argparse._SubParsersAction) -> None:
    acc = sub.add_parser(
        "account",
        help="ε of T Gaussian or subsampled-Gaussian answers, or a calibration",
        description="Gaussian answers: --sigma (or --epsilon) with --sensitivity, --queries. "
        "Poisson-subsampled Gaussian answers (SG-MCMC gradients): --sampling-rate with "
        "two of --noise-multiplier, --steps, --epsilon; the third is computed.",
    )
    acc.add_argument("--sigma", type=float, help="Gaussian: noise sd of each answer")
    acc.add_argument(
        "--epsilon",
        type=float,
        help="target ε (prints the calibrated σ, noise multiplier or steps)",
    )
    acc.add_argument(
        "--sensitivity", type=float, help="Gaussian: L2 sensitivity of each answer (default 1)"
    )
    acc.add_argument("--queries", type=int, help="Gaussian: number of answers T (default 1)")
    acc.add_argument(
        "--sampling-rate", type=float, help="subsampled: Poisson sampling rate q in (0, 1]"
    )
    acc.add_argument("--noise-multiplier", type=float, help="subsampled: noise sd / clip")
    acc.add_argument("--steps", type=int, help="subsampled: number of answers T")
    acc.add_argument(
        "--accountant", choices=("pld", "rdp"), help="subsampled: pld (default) or rdp"
    )
    acc.add_argument(
        "--neighbour",
        choices=("replace_one", "add_remove"),
        help="subsampled: neighbour relation (default replace_one, sensitivity 2·clip)",
    )
    acc.add_argument("--delta", type=float, default=1e-5, help="δ (default 1e-5)")
    acc.add_argument("--json", action="store_true", help="print JSON")
    acc.set_defaults(func=cmd_account)
