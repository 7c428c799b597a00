"""Command line: ``fedpenalty simulate``, ``run``, ``owner serve``/``report``, ``account``,
``init``."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__
from .errors import FedPenaltyError

if TYPE_CHECKING:
    from .models.base import Neighbour
    from .privacy.subsampled import Accountant


def _fmt(x: float | None, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return f"{x:.{digits}g}"


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain aligned text table."""
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    line = "  ".join(h.rjust(w) for h, w in zip(headers, widths))
    body = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join([line, "  ".join("-" * w for w in widths), *body])


#: privacy.json owner keys shown per algorithm family: (key, header) in order.
_PENALTY_COLUMNS = [
    ("owner", "owner"),
    ("n", "n"),
    ("sigma", "sigma"),
    ("answers", "answers"),
    ("mu", "mu"),
    ("epsilon", "eps"),
    ("epsilon_paper_bound", "eps paper bound"),
    ("budget_epsilon", "budget"),
]
_PRIVACY_COLUMNS = {
    "sgmcmc": [
        ("owner", "owner"),
        ("n", "n"),
        ("noise_multiplier", "noise mult."),
        ("sampling_rate", "q"),
        ("clip", "clip"),
        ("answers", "answers"),
        ("epsilon", "eps"),
        ("budget_epsilon", "budget"),
    ],
    "hybrid": [
        ("owner", "owner"),
        ("n", "n"),
        ("noise_multiplier", "noise mult."),
        ("sampling_rate", "q"),
        ("answers", "answers"),
        ("epsilon_ops", "eps OPS"),
        ("epsilon_sgld", "eps SGLD"),
        ("epsilon", "eps"),
        ("budget_epsilon", "budget"),
    ],
    "ops": [("owner", "owner"), ("n", "n"), ("draws", "draws"), ("rho", "rho"), ("epsilon", "eps")],
    "noisy_stats": [
        ("owner", "owner"),
        ("n", "n"),
        ("mechanism", "mechanism"),
        ("scale", "scale"),
        ("sensitivity", "sensitivity"),
        ("epsilon", "eps"),
    ],
}


#: Secure aggregation: the owner's own σ does not protect it, the honest owners' sum does —
#: s (its noise sd), t (colluders assumed), and what each owner added, s/√(K − t); then ε from
#: its own noise alone next to ε (docs/design.md §2.6).
_SECURE_NOISE_COLUMNS = [
    ("total_noise_sd", "s"),
    ("colluders", "t"),
    ("owners_counted", "K"),
    ("owner_noise_sd", "own sd"),
]
_PER_OWNER_NOISE = ("sigma", "noise_multiplier")


def privacy_columns(privacy: dict[str, Any]) -> list[tuple[str, str]]:
    """privacy.json owner keys the console shows for this run, (key, header) in order."""
    from .coordinator.algorithms import ALGORITHMS

    algorithm = ALGORITHMS[privacy["algorithm"]]
    columns = _PRIVACY_COLUMNS.get(algorithm.name) or _PRIVACY_COLUMNS.get(
        algorithm.query or "", _PENALTY_COLUMNS
    )
    if privacy.get("aggregation") != "secure":
        return columns
    at = next(i for i, (key, _) in enumerate(columns) if key in _PER_OWNER_NOISE)
    shown = [c for c in columns if c[0] not in _PER_OWNER_NOISE]
    shown[at:at] = _SECURE_NOISE_COLUMNS
    eps = next(i for i, (key, _) in enumerate(shown) if key == "epsilon")
    shown.insert(eps + 1, ("epsilon_own_noise_only", "eps own noise"))
    return shown


def privacy_table(privacy: dict[str, Any]) -> str:
    """The per-owner rows of a run's privacy.json, with the columns its run has."""
    columns = privacy_columns(privacy)
    eps = "eps@δ" if privacy["delta"] is None else f"eps@{privacy['delta']:g}"

    def cell(value: Any) -> str:
        return (
            value
            if isinstance(value, str)
            else str(value)
            if isinstance(value, int)
            else _fmt(value)
        )

    return table(
        [eps if key == "epsilon" else header for key, header in columns],
        [[cell(o.get(key)) for key, _ in columns] for o in privacy["owners"]],
    )


#: Owners shown one row each in the console; past this, a summary over owners (privacy.json
#: keeps every owner).
MAX_OWNER_ROWS = 20


def privacy_overview(privacy: dict[str, Any]) -> str:
    """The per-owner privacy of a run for the console: the table of ``privacy_table`` for up
    to MAX_OWNER_ROWS owners, else min / median / max ε over the owners and which owners are at
    the max."""
    owners = privacy["owners"]
    if len(owners) <= MAX_OWNER_ROWS:
        return privacy_table(privacy)
    eps = [o["epsilon"] for o in owners]
    top = max(eps)
    at_max = [o["owner"] for o in owners if o["epsilon"] >= top * (1 - 1e-12)]
    named = ", ".join(at_max[:5]) + (f" and {len(at_max) - 5} more" if len(at_max) > 5 else "")
    lines = [
        f"{len(owners)} owners; ε over owners: min {_fmt(min(eps))}, median "
        f"{_fmt(statistics.median(eps))}, max {_fmt(top)} ({named})"
    ]
    paper = [o.get("epsilon_paper_bound") for o in owners]
    if all(p is not None for p in paper):
        lines.append(f"paper's bound over owners: min {_fmt(min(paper))}, max {_fmt(max(paper))}")
    budgets = [o.get("budget_epsilon") for o in owners]
    if all(b is not None for b in budgets):
        left = [o["budget_left"] for o in owners if o.get("budget_left") is not None]
        spare = f", least left {_fmt(min(left))}" if left else ""
        lines.append(f"budgets: min {_fmt(min(budgets))}, max {_fmt(max(budgets))}{spare}")
    return "\n".join([*lines, "(every owner's row is in privacy.json)"])


def unreported_lines(unreported: list[dict[str, Any]]) -> str:
    """The console lines naming the owners that could not report (privacy.json
    ``unreported``): status and the answers this coordinator received from each."""
    lines = [
        f"\nNo privacy report from {len(unreported)} owner{'s' if len(unreported) > 1 else ''} "
        "(privacy.json: unreported; no ε is shown for them: their own ledgers hold their spend, "
        "`fedpenalty owner report OWNER.toml` reads a deployed owner's):"
    ]
    for u in unreported[:MAX_OWNER_ROWS]:
        received = u.get("answers_received")
        answers = "" if received is None else f"; {received} answers received before"
        lines.append(f"  {u['owner']}: {u['status']}{answers}")
    if len(unreported) > MAX_OWNER_ROWS:
        lines.append(f"  and {len(unreported) - MAX_OWNER_ROWS} more (privacy.json)")
    return "\n".join(lines)


def mixing_table(diag: dict[str, Any]) -> str:
    names = diag.get("param_names")
    d = len(diag["posterior_mean"])
    shown = range(min(d, 10))
    rows = []
    for j in shown:
        row = [
            names[j] if names else f"θ[{j}]",
            _fmt(diag["posterior_mean"][j]),
            _fmt(diag["posterior_sd"][j]),
            _fmt(diag["ess_bulk"][j], 3),
            _fmt(diag["rhat"][j]) if diag["rhat"] else "n/a",
        ]
        if "reference" in diag:
            row += [
                _fmt(diag["reference"]["mean"][j]),
                _fmt(diag["reference"]["sd"][j]),
                _fmt(diag["error"]["mean_in_sd"][j], 3),
            ]
        rows.append(row)
    headers = ["param", "mean", "sd", "ess_bulk", "rhat"]
    if "reference" in diag:
        headers += ["ref mean", "ref sd", "|err|/ref sd"]
    return table(headers, rows)


def secure_line(privacy: dict[str, Any]) -> str:
    """The console's line on a secure run: what the owners' ε rests on, from their reports
    (each owner's ``peers`` in privacy.json)."""
    s, t = _fmt(privacy["total_noise_sd"]), privacy["colluders"]
    bases = {o.get("peers", "") for o in privacy.get("owners", [])}
    words = []
    if bases & {"authenticated", "simulated"}:
        which = " and ".join(b for b in ("authenticated", "simulated") if b in bases)
        words.append(
            f"for owners with {which} peers its noise sd s = {s} protects each while at most "
            f"t = {t} owners collude with the coordinator"
        )
    if "own_noise" in bases:
        words.append(
            "owners that could not authenticate their peers are charged at their own noise "
            "alone (eps = eps own noise)"
        )
    return (
        "secure aggregation: the coordinator saw only the owners' masked sum; "
        + "; ".join(words or ["the owners did not say what their eps rests on"])
        + " ('eps own noise': its own noise alone, if all others colluded; privacy.json: "
        "assumption)"
    )


#: What the console adds when adaptation stopped at an end of its range (``bound``).
_BOUND_NOTE = {
    "admitted": "; it kept the admitted maximum sampler.step: the acceptance there is above "
    "the target, so a larger sampler.step would move further per iteration (and cost the "
    "owners more per answer)",
    "lower": "; it stopped at its floor {lower:.3g}: the target needs a shorter step than "
    "sampler.step allows adapting to; lower sampler.step",
    None: "",
}


def step_line(adaptation: dict[str, Any]) -> str:
    """The console's line on the MH proposal step: the radius the kept draws used against the
    step the owners admitted, how warmup chose it, and a charge floor it lies below."""
    step, admitted = adaptation["step"], adaptation["admitted_step"]
    if not adaptation["adapted_iterations"]:
        return f"Step: {step:.3g}, fixed (sampler.adapt_step = false, or no warmup)"
    line = (
        f"Step: {step:.3g} after {adaptation['adapted_iterations']} warmup iterations of "
        "adaptation "
        f"(admitted maximum {admitted:.3g}; target acceptance {adaptation['target_accept']:g} × "
        f"noise ceiling {adaptation['noise_ceiling']:.3g})"
        + _BOUND_NOTE[adaptation["bound"]].format(lower=adaptation["lower_step"])
    )
    charged = adaptation["charged_step"]
    if charged is not None and step < charged:
        line += (
            f"; below the owners' charged floor {charged:.3g}, so each answer is charged as at "
            f"that step"
        )
    return line


def print_run(title: str, result) -> None:
    """The tables of a finished or stopped run, then where it is."""
    print(title)
    privacy, diag = result.privacy, result.diagnostics
    if privacy.get("owners"):
        delta = (
            f"δ = {privacy['delta']:g}" if privacy["delta"] is not None else "each owner's own δ"
        )
        neighbour = privacy["neighbour"] or "owners differ"
        print(
            f"\nPer-owner privacy ({neighbour}: {privacy.get('neighbour_meaning', '')}; {delta}; "
            f"{privacy['release']}):"
        )
        if privacy.get("aggregation") == "secure":
            print(secure_line(privacy))
        print(privacy_overview(privacy))
        if privacy.get("trusted_curator"):
            print("trusted curator: this baseline pools every owner's records centrally")
    if privacy.get("unreported"):
        print(unreported_lines(privacy["unreported"]))
    if privacy.get("trusted_curator") and not privacy.get("owners"):
        print(
            f"\n{privacy['algorithm']} is a non-private trusted-curator baseline: no owner privacy."
        )
    if diag["kept_draws"] > 1:
        if diag.get("acceptance_rate") is not None:
            print(
                f"\nMixing: acceptance {diag['acceptance_rate']:.3f}, mean noise variance s² "
                f"{diag['mean_noise_variance']:.3g}"
            )
            if "step_adaptation" in diag:
                print(step_line(diag["step_adaptation"]))
        elif "excess_noise_ratio" in diag:
            print(
                f"\nMixing (SG-MCMC, no accept step): owners' gradient-noise variance s² "
                f"{diag['mean_noise_variance']:.3g} per coordinate, excess noise ratio "
                f"{diag['excess_noise_ratio']:.3g}"
            )
        else:
            print(f"\nIndependent draws ({privacy.get('algorithm', '')}):")
        print(mixing_table(diag))
    print(f"\nrun directory: {result.out}")


def excess_warning(diag: dict[str, Any]) -> str | None:
    """The warning of an SG-MCMC run whose owners' noise exceeded the design noise (else None)."""
    ratio = diag.get("excess_noise_ratio") or 0.0
    if ratio <= 0:
        return None
    return (
        f"warning: the owners' gradient noise exceeded the noise the dynamics needs "
        f"(excess_noise_ratio "
        f"{ratio:.3g}, in {diag['excess_noise_fraction']:.1%} of chain steps): the chain runs "
        f"hotter than the "
        "posterior; lower sampler.step (sghmc, sgnht: or raise sampler.friction), raise "
        "sampler.sampling_rate, "
        "or give the owners less noise (privacy.sigma)"
    )


def stop_message(result, resumable: bool, command: str = "run") -> str:
    """One message saying why a run stopped early, what it kept and how to continue
    (``fedpenalty COMMAND --resume``, when ``resumable``)."""
    from .errors import BudgetExhausted, InvalidRequest
    from .refusals import policy_refusal

    cause = result.stopped
    kept = f"kept {result.diagnostics['kept_draws']} draws per chain in {result.out}"
    then = (
        f"; `fedpenalty {command} --resume {result.out}` continues from its checkpoint"
        if resumable
        else ""
    )
    if isinstance(cause, InvalidRequest):
        return f"stopped: {policy_refusal(cause)}; {kept}"
    if isinstance(cause, BudgetExhausted):
        return (
            f"stopped: owner {cause.owner!r} refused to answer: its privacy budget is exhausted "
            f"({cause.epsilon_left:.4g} ε left); {kept}{then} once the owner can answer again"
        )
    return f"stopped: {cause}; {kept}{then}"


def cmd_simulate(args: argparse.Namespace) -> int:
    from .config import load_scenario
    from .coordinator.algorithms import ALGORITHMS
    from .coordinator.base import ReleaseAlgorithm
    from .simulation import resume_simulation, simulate

    if args.resume:
        if args.scenario or args.set or args.out:
            raise FedPenaltyError(
                "--resume continues a simulation as it was configured: give no scenario, --set "
                "or --out"
            )
        result = resume_simulation(args.resume, False if args.no_progress else None)
    else:
        progress = False if args.no_progress else None
        result = simulate(args.scenario, args.set or [], args.out, progress)
    scenario = load_scenario(result.out / "config.toml")
    model, sampler = scenario["model"], scenario["sampler"]
    algorithm = ALGORITHMS[sampler["algorithm"]]
    transport = "" if algorithm.query is None else f", {scenario['run']['transport']} transport"
    warmup = "" if isinstance(algorithm, ReleaseAlgorithm) else f" (+{sampler['warmup']} warmup)"
    print_run(
        f"fedpenalty simulate: {sampler['algorithm']} on {model['name']} (dim "
        f"{model.get('dim', 1)}), "
        f"{scenario['data']['owners']} owners{transport}, {sampler['chains']} chains × "
        f"{sampler['iterations']} "
        f"draws{warmup}",
        result,
    )
    return _exit_status(result, resumable=algorithm.query is not None, command="simulate")


#: Mixing warnings printed one per line; the rest are counted (diagnostics.json has them all).
MAX_WARNING_LINES = 5


def run_warnings(result, resumable: bool, command: str = "run") -> list[str]:
    """The lines that warn about a run: unmixed chains, excess noise and, last, the one-line
    reason when it stopped early (``stop_message``)."""
    warnings = result.diagnostics.get("warnings", [])
    lines = [f"warning: {line}" for line in warnings[:MAX_WARNING_LINES]]
    if len(warnings) > MAX_WARNING_LINES:
        lines.append(
            f"warning: {len(warnings) - MAX_WARNING_LINES} more parameters have not mixed "
            "(diagnostics.json: warnings)"
        )
    if warning := excess_warning(result.diagnostics):
        lines.append(warning)
    if result.stopped is not None:
        lines.append(stop_message(result, resumable, command))
    return lines


def _exit_status(result, resumable: bool, command: str = "run") -> int:
    """Print ``run_warnings`` to stderr; 3 when the run stopped early, else 0."""
    for line in run_warnings(result, resumable, command):
        print(line, file=sys.stderr)
    return 3 if result.stopped is not None else 0


def _tls(args: argparse.Namespace):
    from .owner.owner_config import TlsFiles

    given = [args.tls_cert, args.tls_key, args.tls_ca]
    if not any(given):
        return None
    if not all(given):
        raise FedPenaltyError("mutual TLS needs all of --tls-cert, --tls-key and --tls-ca")
    for flag, file in zip(("--tls-cert", "--tls-key", "--tls-ca"), given):
        if not Path(file).is_file():
            raise FedPenaltyError(f"{flag} {file}: no such file")
    return TlsFiles(Path(args.tls_cert), Path(args.tls_key), Path(args.tls_ca))


def cmd_run(args: argparse.Namespace) -> int:
    from .config import load_scenario
    from .simulation import resume_run, run_deployed

    owners = [a.strip() for a in args.owners.split(",") if a.strip()] if args.owners else None
    for address in owners or []:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise FedPenaltyError(
                f"--owners: {address!r} is not HOST:PORT (the address and port an owner's "
                "server.listen serves on, e.g. a.example.org:50051)"
            )
    if args.resume:
        if args.scenario or args.set or args.out:
            raise FedPenaltyError(
                "--resume continues a run as it was configured: give no scenario, --set or --out"
            )
        result = resume_run(args.resume, owners, _tls(args), False if args.no_progress else None)
    else:
        if not args.scenario or not owners:
            raise FedPenaltyError(
                "give a scenario and --owners HOST:PORT[,HOST:PORT...] (or --resume DIR)"
            )
        scenario = load_scenario(args.scenario, args.set or [])
        if args.no_progress:
            scenario["run"]["progress"] = False
        result = run_deployed(scenario, owners, _tls(args), args.out)
    owners_n = (
        len(result.privacy.get("owners", [])) + len(result.privacy.get("unreported", [])) or "the"
    )
    algorithm = load_scenario(result.out / "config.toml")["sampler"]["algorithm"]
    print_run(f"fedpenalty run: {algorithm} with {owners_n} deployed owners", result)
    return _exit_status(result, resumable=True)


def cmd_owner_serve(args: argparse.Namespace) -> int:
    import logging

    from .owner import Ledger
    from .owner.host import OwnerHost
    from .owner.owner_config import build_node, load_owner_config
    from .owner.server import check_exposure, serve

    configs = [load_owner_config(path, args.listen, args.ledger) for path in args.owner_files]
    for config in configs:
        config.check_servable()
    first = configs[0]
    for c in configs[1:]:
        shared = (
            "listen",
            "tls",
            "allowed_clients",
            "max_message_bytes",
            "peer_ca",
            "allowed_peers",
        )
        for key in shared:
            if getattr(c, key) != getattr(first, key):
                raise FedPenaltyError(
                    f"owners served by one process must share server.{key}: "
                    f"{c.name!r} differs from {first.name!r}"
                )
    check_exposure(first.listen, first.tls, first.allowed_clients, args.insecure)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s fedpenalty.owner %(message)s")
    ledgers: dict[Path, Ledger] = {}
    try:
        nodes = []
        for c in configs:
            if c.ledger.resolve() not in ledgers:
                ledgers[c.ledger.resolve()] = Ledger(c.ledger, synchronous=c.synchronous)
            nodes.append(build_node(c, ledgers[c.ledger.resolve()]))
        serve(
            OwnerHost(nodes),
            first.listen,
            first.tls,
            first.max_message_bytes,
            allowed_clients=first.allowed_clients,
            insecure=args.insecure,
            peers=first.peer_auth(),
        )
    finally:
        for ledger in ledgers.values():
            ledger.close()
    return 0


def cmd_owner_report(args: argparse.Namespace) -> int:
    from .owner.owner_config import load_owner_config
    from .owner.report import owner_report, report_text

    config = load_owner_config(args.owner_file, ledger=args.ledger)
    if not config.ledger.is_file():
        raise FedPenaltyError(
            f"no ledger at {config.ledger}: owner {config.name!r} has never served from it"
        )
    report = owner_report(config)
    print(json.dumps(report) if args.json else report_text(report, config))
    return 0


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
        f"  ε = {_fmt(paper, 10)} (paper's bound: classical Gaussian + advanced composition)"
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


def cmd_init(args: argparse.Namespace) -> int:
    from .deployment import DEFAULT_PORT, OWNERS, RECORDS, SCENARIO, write_deployment

    port = DEFAULT_PORT if args.port is None else args.port
    done = write_deployment(Path(args.folder), port, args.force)
    sampler = SCENARIO["sampler"]
    kept = "".join(
        f"kept {ledger}: its spend still counts against its owner's budget (delete it to start "
        "afresh)\n"
        for ledger in done.kept_ledgers
    )
    servers = "".join(f"  fedpenalty owner serve {n}.toml > {n}.log 2>&1 &\n" for n in OWNERS)
    files = {
        "ca.crt, ca.key": "the study's CA",
        f"{OWNERS[0]}.toml, …": f"{len(OWNERS)} owners on {', '.join(done.addresses)}, each "
        f"with its certificate (localhost, 127.0.0.1) and {RECORDS:,} records (.csv)",
        "coordinator.crt, .key": "the coordinator's client certificate",
        "scenario.toml": f"the coordinator's scenario: {sampler['algorithm']}, "
        f"{sampler['chains']} chains × {sampler['iterations']:,} draws",
    }
    print(
        f"fedpenalty init: a deployment on this machine, under mutual TLS, in {done.folder}/\n"
        + "".join(f"  {name:<22} {what}\n" for name, what in files.items())
        + f"Private keys (*.key) are readable by you only.\n{kept}"
        f"Next, in {done.folder}/: start the owners, run the coordinator, stop the owners:\n"
        f"{servers}  {done.run_command()} --out runs/first\n"
        "  kill %1 %2 %3"
    )
    return 0


def _add_init(sub: argparse._SubParsersAction) -> None:
    init = sub.add_parser(
        "init",
        help="write a deployment on this machine: CA, certificates, three owners, a scenario",
    )
    init.add_argument("folder", metavar="DIR", help="a new or empty folder")
    init.add_argument(
        "--port",
        type=int,
        help="the first owner's port; the others serve on the next ones (default 50051)",
    )
    init.add_argument(
        "--force",
        action="store_true",
        help="write into a non-empty DIR, replacing the files init writes (ledgers are kept)",
    )
    init.set_defaults(func=cmd_init)


def _add_simulate(sub: argparse._SubParsersAction) -> None:
    sim = sub.add_parser(
        "simulate", help="run a local multi-owner simulation (default: the embedded scenario)"
    )
    sim.add_argument(
        "scenario", nargs="?", help="scenario TOML file (default: embedded default scenario)"
    )
    sim.add_argument(
        "--set", action="append", metavar="SECTION.KEY=VALUE", help="override a scenario key"
    )
    sim.add_argument("--out", help="run directory (default: run.out or runs/<algorithm>-<time>)")
    sim.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    sim.add_argument(
        "--resume",
        metavar="DIR",
        help="continue the stopped or interrupted simulation in DIR from its checkpoint",
    )
    sim.set_defaults(func=cmd_simulate)


def _add_run(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser(
        "run", help="run the coordinator against deployed owners (or --resume a stopped run)"
    )
    run.add_argument(
        "scenario",
        nargs="?",
        help="scenario TOML ([model] and [sampler]; owners' policies govern privacy)",
    )
    run.add_argument(
        "--owners", help="owner hosts HOST:PORT[,HOST:PORT...] (with --resume: where they are now)"
    )
    run.add_argument(
        "--tls-cert", help="this coordinator's client certificate (PEM) for mutual TLS"
    )
    run.add_argument("--tls-key", help="its private key (PEM)")
    run.add_argument(
        "--tls-ca", help="CA certificate (PEM) that signed the owners' server certificates"
    )
    run.add_argument(
        "--set", action="append", metavar="SECTION.KEY=VALUE", help="override a scenario key"
    )
    run.add_argument("--out", help="run directory (default: run.out or runs/<algorithm>-<time>)")
    run.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its checkpoint")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    run.set_defaults(func=cmd_run)


def _add_owner(sub: argparse._SubParsersAction) -> None:
    owner = sub.add_parser("owner", help="serve an owner, or read its ledger").add_subparsers(
        dest="owner_command", required=True
    )
    serve = owner.add_parser(
        "serve", help="serve OWNER.toml (several files: one process hosts them all)"
    )
    serve.add_argument("owner_files", nargs="+", metavar="OWNER.toml")
    serve.add_argument("--listen", help="HOST:PORT (overrides server.listen)")
    serve.add_argument("--ledger", help="ledger file (overrides server.ledger)")
    serve.add_argument(
        "--insecure",
        action="store_true",
        help="serve without mutual TLS on a non-loopback address: anyone who reaches it can "
        "query the owners and spend their budgets",
    )
    serve.set_defaults(func=cmd_owner_serve)
    report = owner.add_parser(
        "report", help="an owner's privacy spend, read offline from its ledger"
    )
    report.add_argument("owner_file", metavar="OWNER.toml")
    report.add_argument("--ledger", help="ledger file (overrides server.ledger)")
    report.add_argument("--json", action="store_true", help="print JSON")
    report.set_defaults(func=cmd_owner_report)


def _add_account(sub: argparse._SubParsersAction) -> None:
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedpenalty", description=__doc__)
    parser.add_argument("--version", action="version", version=f"fedpenalty {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_simulate, _add_run, _add_owner, _add_account, _add_init):
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (FedPenaltyError, ValueError, FileExistsError, FloatingPointError) as exc:
        print(f"fedpenalty: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedpenalty: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
