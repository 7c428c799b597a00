"""Secure aggregation against the number of owners (issues 12 and 26, docs/design.md §2.6).

    python scenarios/secure_aggregation.py [--owners 1,10,100,1000,10000] [--ray-from 1000]
        [--out DIR] [--quick] [--seed 0] [--no-progress]

Penalty MH on one Gaussian mean (d = 1, Θ = [−1, 1]), n = 1,000,000 records split evenly among
K owners, K = 1, 10, 100, 1,000, 10,000, 4 chains started from draws of the exact posterior, in
three modes at the same per-owner privacy:

* ``none``: every owner adds noise of sd σ and the coordinator sees every answer; the sum it
  uses carries variance K·σ²;
* ``secure t=0``: secure aggregation with s = σ, no colluder assumed; the decoded sum carries
  variance s²;
* ``secure t=K/2``: s = σ, t = ⌊K/2⌋ colluders assumed; variance K·s²/(K − t) ≈ 2s².

Every owner is a simulated lattice owner (seeded exact discrete-Gaussian noise; with secure
aggregation also X25519 session keys and SplitMix64 masks), so every mode is accounted the
same way (Rényi DP) and each answer costs the owner the same μ = (Δ + γ√w)/σ: the per-owner ε
is equal across modes up to the lattice term γ/σ ≈ 2⁻²⁰. Owners mask along the session's masking
graph (``graph_degree`` k: the complete graph, k = K − 1, up to 64 owners; above, the SecAgg+
Harary graph whose degree keeps the honest owners connected but for 2⁻⁴⁰). Transport:
in-process below ``--ray-from`` owners (default 1,000) — one host computes every owner's masked
answer, Kk/2 pair masks per key — and the Ray transport from there on: the owners packed into
one actor per CPU (``run.ray_actors = 0``) of a local Ray started once for the whole script,
each actor computing its owners' masked sum (the masks of every pair with an end among its
owners) in parallel, the coordinator adding the actors' sums and decoding. The transport
changes no number but the timings: the owners' seeded noise and keys are the same. ``--quick``
runs in-process only, for K = 1, 10, 100 by default (under a minute). Larger K run fewer
iterations (the table says how many); ESS/s divides the kept draws' bulk ESS by the wall time
of warmup and kept draws, ``iterations_per_second`` the iterations per chain; the session's open
(X25519 agreement of every pair of neighbours) is timed apart (``open_seconds``).

Also measured: the per-request cost of masking for one deployed owner (ChaCha20 noise and
masks, its own ledger file) in a session of K owners at t = 0 and t = ⌊K/2⌋: requests of 4
chains, secure against plain lattice answers, interleaved rounds, the median ratio over rounds
(absolute times drift on a shared machine), and ``mask_seconds_per_answer``, the median seconds
its masking alone (ChaCha20 words of every neighbour, summed in) takes per 4-chain answer.

The goals (issue 26), each a ratio within this run: the masking seconds per answer at the
largest K within 2× of K = 100's; secure iterations/s at least 0.3× the same K's without
aggregation; secure acceptance at the largest K within 10% of K = 1's; the session's open at
the largest K (seconds).

Prints the tables (chains per K and mode, masking cost, the goal) and writes
``secure_aggregation.json`` and ``secure_aggregation.png`` into ``--out`` (default
runs/scenarios, as every scenario).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from fedpenalty import reporting
from fedpenalty.cluster.ray_hosts import connect_ray
from fedpenalty.common import Policy, SecureTerms
from fedpenalty.config import resolve
from fedpenalty.coordinator.algorithms import ALGORITHMS
from fedpenalty.coordinator.base import ChainData
from fedpenalty.coordinator.driver import sample
from fedpenalty.coordinator.oracle import SecureAggregation
from fedpenalty.coordinator.transport_base import OwnerSetup
from fedpenalty.coordinator.transports import TRANSPORTS
from fedpenalty.diagnostics import summarize
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerHost, OwnerNode
from fedpenalty.owner.aggregation import (
    SecureOpen,
    SecureSession,
    revealed_key,
    session_private_key,
)
from fedpenalty.owner.mask_graph import graph_degree
from fedpenalty.owner.noise.sources import NoiseKey

MODEL = build_model({"name": "gaussian_mean", "dim": 1, "theta_bound": 1.0})
N_TOTAL, TRUE_THETA, SIGMA, STEP, CHAINS = 1_000_000, 0.3, 1.0, 0.002, 4
MODES = ("none", "secure t=0", "secure t=K/2")

NAME = "secure_aggregation"
FULL = {"owners": "1,10,100,1000,10000", "cost_owners": "2,10,100,1000,10000"}
QUICK = {"owners": "1,10,100", "cost_owners": "2,10"}
NOTES = [
    "every owner is a simulated lattice owner: each mode is accounted by Rényi DP at the same "
    "per-owner μ, so epsilon_per_owner is equal across modes up to the lattice term",
    "secure aggregation: epsilon_per_owner holds if at most t owners collude with the "
    "coordinator; epsilon_own_noise_only if all do",
    "ess_per_second and the masking cost are timings of this machine: compare them within "
    "one run only",
]


def colluders(mode: str, owners: int) -> int | None:
    """t of a mode (None: no secure aggregation)."""
    return {"none": None, "secure t=0": 0, "secure t=K/2": owners // 2}[mode]


def iterations_for(owners: int, quick: bool) -> tuple[int, int]:
    """(warmup, kept) per chain: fewer for the largest K, whose iterations cost most."""
    if quick:
        return 100, 300
    if owners >= 10000:
        return 100, 400
    return (200, 600) if owners >= 1000 else (500, 2500)


def owner_records(owners: int, seed: int) -> list[np.ndarray]:
    """n records split evenly among ``owners``, drawn from seed 7 + ``seed``."""
    rng = np.random.default_rng(7 + seed)
    sizes = np.full(owners, N_TOTAL // owners)
    sizes[: N_TOTAL - sizes.sum()] += 1
    return [MODEL.simulate_records(rng, np.array([TRUE_THETA]), n) for n in sizes]


def run_mode(
    mode: str, records: list[np.ndarray], folder: Path, quick: bool, transport: str, seed: int
) -> dict[str, Any]:
    """One chain run through ``transport``: acceptance, ESS/s, error vs exact, per-owner ε
    (median over owners). The owners' noise derives from seed 11 + ``seed``, the chains' from
    3 + ``seed``."""
    owners = len(records)
    t = colluders(mode, owners)
    policy = Policy(sigma=SIGMA, max_step=STEP, budget_epsilon=1e6, total_noise_sd=SIGMA,
                    colluders=t or 0)  # fmt: skip
    setup = OwnerSetup(
        folder / f"{owners}-{mode.replace(' ', '_').replace('/', '')}",
        MODEL,
        [f"owner-{k}" for k in range(owners)],
        records,
        [policy] * owners,
        np.random.SeedSequence(11 + seed).spawn(owners),
        resolve({"run": {"transport": transport}})["run"],
    )
    setup.folder.mkdir(parents=True)
    launched = TRANSPORTS[transport].launch(setup)
    try:
        oracle = launched.oracle
        warmup, kept = iterations_for(owners, quick)
        secure = None if t is None else SecureAggregation(SIGMA, t)
        start = time.perf_counter()
        oracle.open_session("penalty", CHAINS * (warmup + kept), max_step=STEP, secure=secure)
        opened = time.perf_counter() - start
        reference = MODEL.reference_posterior(np.concatenate(records))
        rng = np.random.default_rng(3 + seed)
        theta0 = reference.mean + reference.sd * rng.standard_normal((CHAINS, 1))
        fixed = {"step": STEP, "adapt_step": False, "target_accept": 0.5}  # compared across K
        algorithm = ALGORITHMS["penalty"].kernel(MODEL, ChainData(oracle=oracle), fixed)
        start = time.perf_counter()
        result = sample(algorithm, rng, theta0, iterations=kept, warmup=warmup, progress=False)
        seconds = time.perf_counter() - start
        diagnostics = summarize(result.theta, result.accepted, reference)
        reports = oracle.privacy_reports()
        oracle.close()
    finally:
        launched.stop()
    own = [r.own_noise.session.epsilon for r in reports if r.own_noise and r.own_noise.session]
    sum_sd = SIGMA * (np.sqrt(owners) if t is None else np.sqrt(owners / (owners - t)))
    degree, failure = (None, None) if t is None else graph_degree(owners, t)
    return {
        "owners": owners,
        "mode": mode,
        "transport": transport,
        "colluders": t,
        "graph_degree": degree,
        "graph_failure": failure,
        "sum_noise_sd": float(sum_sd),
        "warmup": warmup,
        "kept": kept,
        "acceptance": diagnostics["acceptance_rate"],
        "ess_bulk": diagnostics["ess_bulk"][0],
        "ess_per_second": diagnostics["ess_bulk"][0] / seconds,
        "rhat": diagnostics["rhat"][0],
        "mean_error_in_sd": diagnostics["error"]["mean_in_sd"][0],
        "sd_ratio": diagnostics["error"]["sd_ratio"][0],
        "sampling_seconds": seconds,
        "iterations_per_second": (warmup + kept) / seconds,
        "open_seconds": opened,
        "epsilon_per_owner": statistics.median(r.session.epsilon for r in reports if r.session),
        "epsilon_own_noise_only": statistics.median(own) if own else None,
        "delta": reports[0].delta,
    }


# --------------------------------------------------------------------------- masking cost


def masking_cost(
    owners: int, colluders: int, seconds: float, rounds: int, folder: Path
) -> dict[str, Any]:
    """Requests/s of one deployed owner's 4-chain log-ratio answers: plain lattice vs secure
    among ``owners`` owners with ``colluders`` t (its K − 1 peers' keys are random; it masks
    with its neighbours in the session's graph), interleaved, median ratio; and the seconds its
    masking alone takes per answer (``mask_seconds``)."""
    records = MODEL.simulate_records(np.random.default_rng(0), np.array([TRUE_THETA]), 1000)
    policy = Policy(sigma=SIGMA, max_step=STEP, budget_epsilon=1e9, total_noise_sd=SIGMA,
                    colluders=colluders, min_peers=0)  # fmt: skip
    ledger = Ledger(folder / f"cost-{owners}-{colluders}.sqlite")
    node = OwnerNode("owner-0", MODEL, records, policy, ledger, noise_key=NoiseKey.from_os())
    host = OwnerHost([node])
    peers = [
        revealed_key(f"peer-{k}", session_private_key(k.to_bytes(32, "little"), "secure"), "secure")
        for k in range(1, owners)
    ]
    # the reveal round (a sparse graph's seed): the owner binds every commitment, then reveals
    listed = [*host.session_keys("secure"), *(replace(p, share=b"") for p in peers)]
    own = host.reveal_shares("secure", listed)
    host.open_session("plain", "penalty", 10**7)
    # as its server passes the request on once it authenticated the peers (PeerAuth.check)
    opening = SecureOpen((*own, *peers), SIGMA, colluders, authenticated=True)
    host.open_session("secure", "penalty", 10**7, secure=opening)
    theta = np.zeros((CHAINS, 1))
    counters = {"plain": 0, "secure": 0}

    def request(session: str) -> None:
        counters[session] += 1
        host.log_ratio(session, counters[session], np.arange(CHAINS), theta, theta + STEP)

    rates: dict[str, list[float]] = {"plain": [], "secure": []}
    for _ in range(rounds):
        for session in rates:
            done, start = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - start) < seconds / rounds or done < 3:
                request(session)
                done += 1
            rates[session].append(done / elapsed)
    ledger.close()
    ratio = statistics.median(p / s for p, s in zip(rates["plain"], rates["secure"], strict=True))
    return {
        "owners": owners,
        "colluders": colluders,
        "graph_degree": graph_degree(owners, colluders)[0],
        "mask_seconds_per_answer": mask_seconds(node, opening, seconds, rounds),
        "plain_requests_per_second": statistics.median(rates["plain"]),
        "secure_requests_per_second": statistics.median(rates["secure"]),
        "secure_cost_vs_plain": ratio,
    }


def mask_seconds(node: OwnerNode, opening: SecureOpen, seconds: float, rounds: int) -> float:
    """Median over ``rounds`` of the seconds ``node``'s ChaCha20 masks of one 4-chain answer
    take (``SecureSession.mask``: every neighbour's words, summed in), each round ~``seconds /
    rounds / 2`` of answers at fresh iterations."""
    terms = SecureTerms(len(opening.peers), opening.colluders, opening.total_noise_sd)
    hosted = [(node.name, node.session_private_key("secure"))]
    session = SecureSession("secure", "log_ratio", terms, opening.peers, hosted)
    multiples, chains = np.zeros((1, CHAINS, 1), dtype=np.int64), np.arange(CHAINS)
    iteration, times = 0, []
    for _ in range(rounds):
        done, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds / rounds / 2 or done < 3:
            iteration += 1
            session.mask(multiples, np.zeros(1, dtype=np.int64), chains, np.full(CHAINS, iteration))
            done += 1
        times.append(elapsed / done)
    return statistics.median(times)


# --------------------------------------------------------------------------- output


def figure(rows: list[dict[str, Any]]) -> Any:
    """Acceptance, ESS/s and error against K (log x), one line per mode."""
    panels = (
        ("acceptance", "acceptance rate", False),
        ("ess_per_second", "bulk ESS per second", True),
        ("mean_error_in_sd", "|mean − exact| / exact sd", True),
    )
    fig, axes = reporting.figure(1, 3, width=4.4, height=3.8)
    for ax, (key, label, log) in zip(axes[0], panels):
        for mode in MODES:
            mine = [r for r in rows if r["mode"] == mode]
            ks = [r["owners"] for r in mine]
            values = [max(r[key], 1e-4) if log else r[key] for r in mine]
            ax.plot(ks, values, marker="o", label=mode)
        ax.set_xscale("log")
        if log:
            ax.set_yscale("log")
        ax.set_xlabel("owners K")
        ax.set_title(label)
    axes[0, 0].legend()
    fig.suptitle("penalty MH, n = 10⁶ records split among K owners, equal per-owner ε")
    return fig


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = reporting.scenario_parser(
        __doc__ or NAME,
        "K = 1, 10, 100 in process, 100 + 300 iterations, masking cost at K = 2, 10",
    )
    parser.add_argument("--owners", help="default 1,10,100,1000 (--quick: 1,10,100)")
    parser.add_argument("--cost-owners", help="default 2,10,100,1000 (--quick: 2,10)")
    parser.add_argument(
        "--ray-from",
        type=int,
        default=1000,
        help="K from which owners run on Ray actors (0: never)",
    )
    parser.add_argument("--seconds", type=float, default=6.0, help="masking cost: per method")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    default = QUICK if args.quick else FULL
    owner_counts = [int(k) for k in (args.owners or default["owners"]).split(",")]
    cost_counts = [int(k) for k in (args.cost_owners or default["cost_owners"]).split(",")]
    ray_from = 0 if args.quick else args.ray_from  # --quick: in-process only
    seconds = min(args.seconds, 1.0) if args.quick else args.seconds
    uses_ray = [0 < ray_from <= k for k in owner_counts]
    runtime = connect_ray("") if any(uses_ray) else None  # one local Ray for every Ray run
    rows, costs = [], []
    runs = len(owner_counts) * len(MODES) + len(cost_counts)
    try:
        with (
            tempfile.TemporaryDirectory() as tmp,
            reporting.progress(runs, NAME, not args.no_progress) as bar,
        ):
            for owners, ray in zip(owner_counts, uses_ray):
                records = owner_records(owners, args.seed)
                transport = "ray" if ray else "inprocess"
                for mode in MODES:
                    rows.append(
                        run_mode(mode, records, Path(tmp), args.quick, transport, args.seed)
                    )
                    bar.update()
            for owners in cost_counts:
                for t in sorted({0, owners // 2}):
                    costs.append(masking_cost(owners, t, seconds, 5, Path(tmp)))
                bar.update()
    finally:
        if runtime is not None:
            runtime.stop()
    results = {"chains": rows, "masking_cost": costs, "goal": goal(rows),
               "scaling": scaling(rows, costs)}  # fmt: skip
    settings = {"owners": owner_counts, "cost_owners": cost_counts, "ray_from": ray_from,
                "seconds": seconds, "n": N_TOTAL, "true_theta": TRUE_THETA, "sigma": SIGMA,
                "step": STEP, "chains": CHAINS, "seed": args.seed}  # fmt: skip
    json_path, png_path = reporting.write_report(
        args.out,
        NAME,
        argv=list(argv if argv is not None else sys.argv[1:]),
        settings=settings,
        results=results,
        notes=NOTES,
        fig=figure(rows),
    )
    print(headlines(results))
    print(f"wrote {json_path} and {png_path}")
    return 0


def headlines(results: dict[str, Any]) -> str:
    """The tables a reader wants: the chains per K and mode, the masking cost per K, and
    the goal (secure acceptance at the largest K against K = 1's)."""
    goal_rows = [{"mode": mode, **g} for mode, g in results["goal"].items()]
    for g in goal_rows:
        g["from_to"] = f"K = {g['owners'][0]} → {g['owners'][1]}"
        g["acceptance_from_to"] = " → ".join(f"{a:.3f}" for a in g["acceptance"])
    return "\n".join(
        [
            reporting.headline(
                "Penalty MH at equal per-owner ε (ε at δ = 1e-5, median over owners):",
                results["chains"],
                [(c, c.replace("_", " ")) for c in COLUMNS],
            ),
            reporting.headline(
                "Cost of masking for one deployed owner (4-chain requests; ratio of medians):",
                results["masking_cost"],
                [
                    ("owners", "K"),
                    ("colluders", "t"),
                    ("graph_degree", "degree"),
                    ("mask_seconds_per_answer", "mask s/answer"),
                    ("plain_requests_per_second", "plain req/s"),
                    ("secure_requests_per_second", "secure req/s"),
                    ("secure_cost_vs_plain", "secure cost ÷ plain"),
                ],
            ),
            reporting.headline(
                "Scaling (goals: mask s/answer within 2× of K = 100's, secure it/s ≥ 0.3× none):",
                results["scaling"],
                [(c, c.replace("_", " ")) for c in SCALING],
            ),
            reporting.headline(
                "Acceptance as owners join (goal: secure within 10% of K = 1):",
                goal_rows,
                [
                    ("mode", "mode"),
                    ("from_to", "owners"),
                    ("acceptance_from_to", "acceptance"),
                    ("relative_change", "relative change"),
                ],
            ),
        ]
    )


COLUMNS = ["owners", "mode", "transport", "graph_degree", "sum_noise_sd", "kept", "acceptance",
           "ess_per_second", "iterations_per_second", "rhat", "mean_error_in_sd", "sd_ratio",
           "epsilon_per_owner", "epsilon_own_noise_only", "open_seconds"]  # fmt: skip


def goal(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's goal: secure acceptance at the largest K within 10% of K = 1's."""
    out: dict[str, Any] = {}
    for mode in MODES:
        mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["owners"])
        if len(mine) > 1:
            first, last = mine[0], mine[-1]
            out[mode] = {
                "owners": [first["owners"], last["owners"]],
                "acceptance": [first["acceptance"], last["acceptance"]],
                "relative_change": last["acceptance"] / first["acceptance"] - 1,
            }
    return out


SCALING = ["mode", "owners", "graph_degree", "open_seconds", "mask_cost_vs_k100",
           "iterations_per_second_vs_none"]  # fmt: skip


def scaling(rows: list[dict[str, Any]], costs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 26's ratios per secure mode at the largest K: the session's open (s), one owner's
    masking seconds per answer against K = 100's (None without K = 100 in both), and the
    chains' iterations/s against the same K without aggregation."""
    out = []
    for mode in MODES[1:]:
        mine = [r for r in rows if r["mode"] == mode]
        if not mine:
            continue
        last = max(mine, key=lambda r: r["owners"])
        plain = [r for r in rows if r["mode"] == "none" and r["owners"] == last["owners"]]
        half = mode.endswith("K/2")
        cost = {c["owners"]: c["mask_seconds_per_answer"] for c in costs
                if (c["colluders"] > 0) == half}  # fmt: skip
        top = max(cost, default=None)
        out.append({
            "mode": mode,
            "owners": last["owners"],
            "graph_degree": last["graph_degree"],
            "open_seconds": last["open_seconds"],
            "mask_cost_vs_k100": cost[top] / cost[100] if 100 in cost and top else None,
            "mask_cost_owners": [100, top],
            "iterations_per_second_vs_none": (
                last["iterations_per_second"] / plain[0]["iterations_per_second"] if plain else None
            ),
        })  # fmt: skip
    return out


if __name__ == "__main__":
    sys.exit(main())
