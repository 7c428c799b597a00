"""What the command line prints about a run: the per-owner privacy table (or its summary over
many owners), the mixing table, the secure-aggregation and step lines, and the warning and stop
lines (``run_warnings``). Pure formatting over a run's privacy.json and diagnostics.json
dictionaries; ``print_run`` is the one that prints."""

from __future__ import annotations

import math
import statistics
from typing import Any

from .coordinator.cost import cost_line
from .privacy_rows import MAX_JSON_OWNERS, OWNERS_FILE, over_budget


def fmt(x: float | None, digits: int = 4) -> str:
    """``x`` to ``digits`` significant digits; "n/a" for None, NaN and ±inf."""
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
#: Runs of several kinds: each owner's ε composes them all; its levels are under ``noise``.
_KINDS_COLUMNS = [
    ("owner", "owner"),
    ("n", "n"),
    ("answers", "answers"),
    ("mu", "mu"),
    ("epsilon", "eps"),
    ("budget_epsilon", "budget"),
]
_PRIVACY_COLUMNS = {
    "penalty_clipped": [
        ("owner", "owner"),
        ("n", "n"),
        ("noise_multiplier", "noise mult."),
        ("answers", "answers"),
        ("mu", "mu"),
        ("epsilon", "eps"),
        ("budget_epsilon", "budget"),
    ],
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


#: DP-SGFS's answers are Poisson-subsampled like gradient answers: the same columns.
_PRIVACY_COLUMNS["sgfs"] = _PRIVACY_COLUMNS["sgmcmc"]


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
    kind = privacy.get("kind") or algorithm.query or ""
    columns = _PRIVACY_COLUMNS.get(algorithm.name) or _PRIVACY_COLUMNS.get(kind, _PENALTY_COLUMNS)
    if len(privacy.get("kinds", ())) > 1:
        columns = _KINDS_COLUMNS
    if privacy.get("aggregation") != "secure":
        return columns
    at = next((i for i, (key, _) in enumerate(columns) if key in _PER_OWNER_NOISE), 2)
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
            else fmt(value)
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
        f"{len(owners)} owners; ε over owners: min {fmt(min(eps))}, median "
        f"{fmt(statistics.median(eps))}, max {fmt(top)} ({named})"
    ]
    paper = [o.get("epsilon_paper_bound") for o in owners]
    if all(p is not None for p in paper):
        lines.append(f"paper's bound over owners: min {fmt(min(paper))}, max {fmt(max(paper))}")
    budgets = [o.get("budget_epsilon") for o in owners]
    if all(b is not None for b in budgets):
        left = [o["budget_left"] for o in owners if o.get("budget_left") is not None]
        spare = f", least left {fmt(min(left))}" if left else ""
        lines.append(f"budgets: min {fmt(min(budgets))}, max {fmt(max(budgets))}{spare}")
    over = over_budget(owners)
    if over:
        lines.append(f"{len(over)} owners over their budget: {', '.join(over[:5])}")
    where = OWNERS_FILE if len(owners) > MAX_JSON_OWNERS else "privacy.json"
    return "\n".join([*lines, f"(every owner's row is in {where})"])


def kinds_lines(privacy: dict[str, Any], diagnostics: dict[str, Any]) -> list[str]:
    """The kinds a run of several (or clipped) kinds asked, and what it samples when a kind
    clips each record's term (privacy.json ``kinds``, ``target``) with how often simulated
    owners hit the clips (``clip_hits_line``)."""
    lines = []
    kinds = privacy.get("kinds") or {}
    if len(kinds) > 1:
        each = ", ".join(f"{k} ({v['answers_per_chain']} per chain)" for k, v in kinds.items())
        lines.append(f"kinds asked: {each}; each owner's eps composes them all")
    if privacy.get("target"):
        lines.append(
            f"target: the {privacy['target']}, not the posterior of the unclipped likelihood"
        )
        if hits := clip_hits_line(diagnostics):
            lines.append(hits)
    return lines


def clip_hits_line(diagnostics: dict[str, Any]) -> str | None:
    """The console line of simulated owners' clip-bound hits per clipped kind
    (diagnostics.json ``simulation_only.clip_hits``), saying so when no term was clipped: the
    chains then sampled the posterior itself, not a clipped one. None without counts."""
    hits = (diagnostics.get("simulation_only") or {}).get("clip_hits") or {}
    counted = {kind: c for kind, c in hits.items() if c.get("fraction") is not None}
    if not counted:
        return None
    each = ", ".join(f"{kind} {100 * c['fraction']:.3g}%" for kind, c in counted.items())
    line = f"clip bound hit (simulated owners' count, of record evaluations): {each}"
    if all(c["fraction"] == 0 for c in counted.values()):
        line += "; no record's term was clipped, so the chains sampled the posterior itself"
    return line


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
            fmt(diag["posterior_mean"][j]),
            fmt(diag["posterior_sd"][j]),
            fmt(diag["ess_bulk"][j], 3),
            fmt(diag["rhat"][j]) if diag["rhat"] else "n/a",
        ]
        if "reference" in diag:
            row += [
                fmt(diag["reference"]["mean"][j]),
                fmt(diag["reference"]["sd"][j]),
                fmt(diag["error"]["mean_in_sd"][j], 3),
            ]
        rows.append(row)
    headers = ["param", "mean", "sd", "ess_bulk", "rhat"]
    if "reference" in diag:
        headers += ["ref mean", "ref sd", "|err|/ref sd"]
    return table(headers, rows)


def secure_line(privacy: dict[str, Any]) -> str:
    """The console's line on a secure run: what the owners' ε rests on, from their reports
    (each owner's ``peers`` in privacy.json)."""
    s, t = fmt(privacy["total_noise_sd"]), privacy["colluders"]
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
    "the target, so a larger sampler.step would move further per iteration (and, where an "
    "answer's cost grows with the step — the Lipschitz route, not a clipped kind — cost the "
    "owners more per answer)",
    "lower": "; it stopped at its floor {lower:.3g}: the target needs a shorter step than "
    "sampler.step allows adapting to; lower sampler.step",
    None: "",
}


def step_line(adaptation: dict[str, Any]) -> str:
    """The console's line on the MH proposal step: the radius the kept draws used against the
    step the owners admitted, how warmup chose it, and a charge floor it lies below."""
    step, admitted = adaptation["step"], adaptation.get("admitted_step")
    if admitted is None:  # penalty_hier: a radius per sub-step
        radii = ", ".join(f"{k} {v:.3g}" for k, v in adaptation.items())
        return f"Radii the kept draws used: {radii}"
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
        for line in kinds_lines(privacy, diag):
            print(line)
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
        elif diag.get("mean_noise_variance") is not None:
            print(
                f"\nMixing (no accept step): owners' noise variance s² "
                f"{diag['mean_noise_variance']:.3g} (mean over the asked steps, per coordinate "
                "of what they answered)"
            )
        else:
            print(f"\nIndependent draws ({privacy.get('algorithm', '')}):")
        print(mixing_table(diag))
    if getattr(result, "cost", None):
        print(cost_line(result.cost))
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
