"""Secure aggregation against the number of owners (issue 12, docs/design.md §2.6).

    python scenarios/secure_aggregation.py [--owners 1,10,100,1000] [--ray-from 1000] [--out DIR]
        [--quick]

Penalty MH on one Gaussian mean (d = 1, Θ = [−1, 1]), n = 1,000,000 records split evenly among
K owners, K = 1, 10, 100, 1,000, 4 chains started from draws of the exact posterior, in three
modes at the same per-owner privacy:

* ``none``: every owner adds noise of sd σ and the coordinator sees every answer; the sum it
  uses carries variance K·σ²;
* ``secure t=0``: secure aggregation with s = σ, no colluder assumed; the decoded sum carries
  variance s²;
* ``secure t=K/2``: s = σ, t = ⌊K/2⌋ colluders assumed; variance K·s²/(K − t) ≈ 2s².

Every owner is a simulated lattice owner (seeded exact discrete-Gaussian noise; with secure
aggregation also X25519 session keys and SplitMix64 masks), so every mode is accounted the
same way (Rényi DP) and each answer costs the owner the same μ = (Δ + γ√w)/σ: the per-owner ε
is equal across modes up to the lattice term γ/σ ≈ 2⁻²⁰. Transport: in-process below
``--ray-from`` owners (default 1,000) — one host computes every owner's masked answer, all
K(K − 1)/2 pair masks per key — and the Ray transport from there on: the owners packed into
one actor per CPU (``run.ray_actors = 0``) of a local Ray started once for the whole script,
each actor computing its owners' masked sum (the masks of every pair with an end among its
owners) in parallel, the coordinator adding the actors' sums and decoding. The transport
changes no number but the timings: the owners' seeded noise and keys are the same. ``--quick``
runs in-process only, for K = 1, 10, 100 by default (under a minute). Larger K run fewer
iterations (the table says how many); ESS/s divides the kept draws' bulk ESS by the wall time
of warmup and kept draws; the session's open (X25519 agreement of every pair) is timed apart.

Also measured: the per-request cost of masking for one deployed owner (ChaCha20 noise and
masks, its own ledger file) in a session of K owners: requests of 4 chains, secure against
plain lattice answers, interleaved rounds, the median ratio over rounds (absolute times drift
on a shared machine).

Writes ``secure_aggregation.json`` and ``secure_aggregation.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from fedpenalty.cli import table
from fedpenalty.cluster.ray_hosts import connect_ray
from fedpenalty.common import Policy
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
from fedpenalty.owner.aggregation import PeerKey, SecureOpen, public_bytes, session_private_key
from fedpenalty.owner.noise import NoiseKey

MODEL = build_model({"name": "gaussian_mean", "dim": 1, "theta_bound": 1.0})
N_TOTAL, TRUE_THETA, SIGMA, STEP, CHAINS = 1_000_000, 0.3, 1.0, 0.002, 4
MODES = ("none", "secure t=0", "secure t=K/2")


def colluders(mode: str, owners: int) -> int | None:
    """t of a mode (None: no secure aggregation)."""
    return {"none": None, "secure t=0": 0, "secure t=K/2": owners // 2}[mode]


def iterations_for(owners: int, quick: bool) -> tuple[int, int]:
    """(warmup, kept) per chain: fewer for the largest K, whose iterations cost most."""
    if quick:
        return 100, 300
    return (200, 600) if owners >= 1000 else (500, 2500)


def owner_records(owners: int) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    sizes = np.full(owners, N_TOTAL // owners)
    sizes[: N_TOTAL - sizes.sum()] += 1
    return [MODEL.simulate_records(rng, np.array([TRUE_THETA]), n) for n in sizes]


def run_mode(
    mode: str, records: list[np.ndarray], folder: Path, quick: bool, transport: str
) -> dict[str, Any]:
    """One chain run through ``transport``: acceptance, ESS/s, error vs exact, per-owner ε
    (median over owners)."""
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
        np.random.SeedSequence(11).spawn(owners),
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
        rng = np.random.default_rng(3)
        theta0 = reference.mean + reference.sd * rng.standard_normal((CHAINS, 1))
        algorithm = ALGORITHMS["penalty"].kernel(MODEL, ChainData(oracle=oracle), {"step": STEP})
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
    return {
        "owners": owners,
        "mode": mode,
        "transport": transport,
        "colluders": t,
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
        "open_seconds": opened,
        "epsilon_per_owner": statistics.median(r.session.epsilon for r in reports if r.session),
        "epsilon_own_noise_only": statistics.median(own) if own else None,
        "delta": reports[0].delta,
    }


# --------------------------------------------------------------------------- masking cost


def masking_cost(owners: int, seconds: float, rounds: int, folder: Path) -> dict[str, Any]:
    """Requests/s of one deployed owner's 4-chain log-ratio answers: plain lattice vs secure
    among ``owners`` owners (its K − 1 peers' keys are random), interleaved, median ratio."""
    records = MODEL.simulate_records(np.random.default_rng(0), np.array([TRUE_THETA]), 1000)
    policy = Policy(sigma=SIGMA, max_step=STEP, budget_epsilon=1e9, total_noise_sd=SIGMA)
    ledger = Ledger(folder / f"cost-{owners}.sqlite")
    node = OwnerNode("owner-0", MODEL, records, policy, ledger, noise_key=NoiseKey.from_os())
    host = OwnerHost([node])
    peers = [node.session_key("secure")] + [
        PeerKey(f"peer-{k}", public_bytes(session_private_key(k.to_bytes(32, "little"), "secure")))
        for k in range(1, owners)
    ]
    host.open_session("plain", "penalty", 10**7)
    # as its server passes the request on once it authenticated the peers (PeerAuth.check)
    opening = SecureOpen(tuple(peers), SIGMA, 0, authenticated=True)
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
        "plain_requests_per_second": statistics.median(rates["plain"]),
        "secure_requests_per_second": statistics.median(rates["secure"]),
        "secure_cost_vs_plain": ratio,
    }


# --------------------------------------------------------------------------- output


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (
        ("acceptance", "acceptance rate", False),
        ("ess_per_second", "bulk ESS per second", True),
        ("mean_error_in_sd", "|mean − exact| / exact sd", True),
    )
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, (key, label, log) in zip(axes, panels):
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
    axes[0].legend()
    fig.suptitle("penalty MH, n = 10⁶ records split among K owners, equal per-owner ε")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--owners", help="default 1,10,100,1000 (--quick: 1,10,100)")
    parser.add_argument("--cost-owners", help="default 2,10,100,1000 (--quick: 2,10)")
    parser.add_argument(
        "--ray-from",
        type=int,
        default=1000,
        help="K from which owners run on Ray actors (0: never)",
    )
    parser.add_argument("--out", default="runs/secure_aggregation")
    parser.add_argument("--seconds", type=float, default=6.0, help="masking cost: per method")
    parser.add_argument("--quick", action="store_true", help="short chains (a smoke run)")
    args = parser.parse_args(argv)
    full = {"owners": "1,10,100,1000", "cost_owners": "2,10,100,1000"}
    quick = {"owners": "1,10,100", "cost_owners": "2,10"}
    default = quick if args.quick else full
    owner_counts = [int(k) for k in (args.owners or default["owners"]).split(",")]
    cost_counts = [int(k) for k in (args.cost_owners or default["cost_owners"]).split(",")]
    ray_from = 0 if args.quick else args.ray_from  # --quick: in-process only
    seconds = min(args.seconds, 1.0) if args.quick else args.seconds
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    uses_ray = [0 < ray_from <= k for k in owner_counts]
    runtime = connect_ray("") if any(uses_ray) else None  # one local Ray for every Ray run
    rows, costs = [], []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for owners, ray in zip(owner_counts, uses_ray):
                records = owner_records(owners)
                transport = "ray" if ray else "inprocess"
                for mode in MODES:
                    rows.append(run_mode(mode, records, Path(tmp), args.quick, transport))
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            for owners in cost_counts:
                costs.append(masking_cost(owners, seconds, 5, Path(tmp)))
                print(json.dumps(costs[-1]), file=sys.stderr, flush=True)
    finally:
        if runtime is not None:
            runtime.stop()
    result = {"chains": rows, "masking_cost": costs, "ray_from": ray_from, "goal": goal(rows)}
    (out / "secure_aggregation.json").write_text(json.dumps(result, indent=2))
    plot(rows, out / "secure_aggregation.png")
    print(show(rows, COLUMNS))
    print(show(costs, list(costs[0]) if costs else []))
    print(json.dumps(result["goal"]))
    return 0


COLUMNS = ["owners", "mode", "transport", "sum_noise_sd", "kept", "acceptance", "ess_per_second",
           "rhat", "mean_error_in_sd", "sd_ratio", "epsilon_per_owner", "epsilon_own_noise_only",
           "open_seconds"]  # fmt: skip


def show(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """``rows`` as a text table of ``columns`` (numbers to 4 significant digits)."""

    def cell(value: Any) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    return table(columns, [[cell(r[c]) for c in columns] for r in rows])


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


if __name__ == "__main__":
    sys.exit(main())
