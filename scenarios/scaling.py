"""How the penalty sampler scales with the number of owners K, by transport.

    python scenarios/scaling.py [--owners 10,100,1000,10000] [--transports inprocess,grpc,ray]
        [--models gaussian_mean,bernoulli] [--json FILE] [--plot FILE.png]
        [--n-per-owner 1000] [--sigma 0.02] [--iterations 1000] [--warmup 200] [--seed 0]

Each (model, K, transport) runs in a fresh Python process, so that its peak memory is its own:
K synthetic owners of ``--n-per-owner`` records each (made inside the owners' hosts from
per-owner seed streams), every owner with the same noise sd ``--sigma`` (fixed per owner, so the
penalty's total noise variance Σσ_k² = Kσ² grows with K), 4 chains of ``penalty`` MH.

Rows (JSON list of objects) have exactly the keys ``model``, ``owners``, ``transport``,
``iterations_per_second`` (warmup + kept iterations over the time sampling took),
``startup_seconds`` (starting the owners — for ``ray`` with an empty ``run.ray_address``,
starting Ray itself too — and opening the session), ``open_seconds`` (opening the session
alone: every owner's session check, plan check and ledger rows), ``peak_rss_bytes`` (the
coordinator's peak resident memory plus the peaks of the owners' processes: gRPC host processes
or Ray actors; Ray's own processes — raylet, GCS, agents — are printed separately on stderr,
not counted),
``acceptance_rate``, ``epsilon_min``/``epsilon_median``/``epsilon_max`` (each owner's ε at
δ = 1e-5 for this run, from its own ledger) and ``error_in_sd`` (|posterior mean − exact| /
exact sd, the largest over dimensions). With ``--footprint`` rows add ``run_directory_mb``
(the owners' files the run left: their ledgers, in MB of 10⁶ bytes) and
``ratio_to_numpy_floor`` (iterations/s over ``throughput.py``'s numpy floor for K owners,
measured in the same process after the run).

Every row opens the session ``scaling``: the simulated owners' noise is addressed by session,
so the rows of one model and K are the same chain on every transport (same acceptance, ε and
error). Simulation choices, made from the known posterior so that the rows measure mixing
rather than burn-in: the proposal radius (and the owners' ``max_step``) is 1.5 exact posterior
sds, so without owner noise acceptance would stay level as K grows; chains start at draws from
N(exact mean, exact sd²). The owners' budget is 10⁶ so that no owner refuses.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from fedpenalty.cli import table
from fedpenalty.common import LOG_RATIO, Policy
from fedpenalty.config import resolve
from fedpenalty.coordinator.algorithms import ALGORITHMS
from fedpenalty.coordinator.base import ChainData
from fedpenalty.coordinator.driver import sample
from fedpenalty.coordinator.transport_base import OwnerSetup
from fedpenalty.coordinator.transports import TRANSPORTS
from fedpenalty.data import ChildSeeds, OwnerRecords, synthetic_sources
from fedpenalty.models import Model, build_model
from fedpenalty.simulation import pooled_reference

MODELS = {
    "gaussian_mean": ({"name": "gaussian_mean", "dim": 1}, 0.5),
    "bernoulli": ({"name": "bernoulli"}, -0.85),  # p = 0.3
}
KEYS = (
    "model",
    "owners",
    "transport",
    "iterations_per_second",
    "startup_seconds",
    "open_seconds",
    "peak_rss_bytes",
    "acceptance_rate",
    "epsilon_min",
    "epsilon_median",
    "epsilon_max",
    "error_in_sd",
)
CHAINS, STEP_IN_SD, DELTA = 4, 1.5, 1e-5


def _status_kb(pid: int, field: str) -> int:
    """A ``/proc/<pid>/status`` memory field in kB (0 when the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (children, their children, …), from ``/proc``."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [root]
    while frontier:
        children = [p for p, pp in parent.items() if pp in frontier]
        found += children
        frontier = children
    return found


def peak_memory(transport: str, oracle: Any) -> tuple[int, int, int]:
    """Peak resident bytes of (this coordinator, the owners' processes, Ray's own processes)."""
    driver = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    below = {pid: _status_kb(pid, "VmHWM") * 1024 for pid in descendants(os.getpid())}
    if transport == "ray":
        actors = {pid: peak for _, pid, peak in oracle.hosts.processes()}
        system = sum(peak for pid, peak in below.items() if pid not in actors)
        return driver, sum(actors.values()), system
    return driver, sum(below.values()), 0


def measure(model_name: str, owners: int, transport: str, args: argparse.Namespace) -> dict:
    """One row, measured in this process."""
    params, true_theta = MODELS[model_name]
    model = build_model(params)
    seeds = np.random.SeedSequence(args.seed).spawn(3)
    sources = synthetic_sources(
        seeds[0], np.full(model.dim, true_theta), [args.n_per_owner] * owners
    )
    records = OwnerRecords(model, sources)
    reference, n_total = pooled_reference(model, records)
    step = STEP_IN_SD * float(reference.sd.min())
    policy = Policy(sigma=args.sigma, max_step=step, budget_epsilon=1e6, delta=DELTA)
    run = resolve({"run": {"transport": transport}})["run"]
    sampler = {
        "step": step,
        "adapt_step": False,  # a fixed step in posterior sds: acceptance then shows K's effect
        "target_accept": 0.5,
        "chains": CHAINS,
        "warmup": args.warmup,
        "iterations": args.iterations,
    }
    algorithm = ALGORITHMS["penalty"]
    with tempfile.TemporaryDirectory() as folder:
        names = [f"owner-{k}" for k in range(owners)]
        setup = OwnerSetup(
            Path(folder),
            model,
            names,
            records,
            [policy] * owners,
            ChildSeeds.of(seeds[1], owners),
            run,
        )
        started = time.perf_counter()
        launched = TRANSPORTS[transport].launch(setup)
        try:
            oracle = launched.oracle
            built = time.perf_counter()
            oracle.open_session(LOG_RATIO, algorithm.planned_answers(sampler), session="scaling")
            startup, opening = time.perf_counter() - started, time.perf_counter() - built
            row = _sample(model, oracle, reference, n_total, sampler, seeds[2])
            epsilons = [r.session.epsilon for r in oracle.privacy_reports()]
            driver, hosts, system = peak_memory(transport, oracle)
            oracle.close()
        finally:
            launched.stop()
        files = sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file())
    print(
        f"{model_name:>13} K={owners:<6} {transport:<9} peak RSS: coordinator "
        f"{driver / 2**20:.0f} MiB + owner processes {hosts / 2**20:.0f} MiB"
        + (f" (Ray's own processes {system / 2**20:.0f} MiB, not counted)" if system else ""),
        file=sys.stderr,
        flush=True,
    )
    extra = footprint(model, owners, args.n_per_owner, row["rate"], files) if args.footprint else {}
    return {
        "model": model_name,
        "owners": owners,
        "transport": transport,
        "iterations_per_second": row["rate"],
        "startup_seconds": startup,
        "open_seconds": opening,
        "peak_rss_bytes": driver + hosts,
        "acceptance_rate": row["acceptance"],
        "epsilon_min": float(np.min(epsilons)),
        "epsilon_median": float(np.median(epsilons)),
        "epsilon_max": float(np.max(epsilons)),
        "error_in_sd": row["error"],
        **extra,
    }


def footprint(model: Model, owners: int, n: int, rate: float, files: int) -> dict[str, float]:
    """The ``--footprint`` columns: the run's ``files`` (bytes) in MB and ``rate`` over the
    numpy floor of ``throughput.py`` for ``owners`` owners of ``n`` records (3 timed seconds)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # throughput.py
    from throughput import floor_rate

    width = model.suff_stat(model.prepare_records(model.simulate_records(
        np.random.default_rng(0), np.zeros(model.dim), 2))).shape[1]  # fmt: skip
    floor = floor_rate(model, np.zeros((owners, width)), np.full(owners, float(n)), 3.0)
    return {"run_directory_mb": files / 1e6, "ratio_to_numpy_floor": rate / floor}


def _sample(model: Model, oracle, reference, n_total: int, sampler: dict, seed) -> dict:
    """Penalty chains from N(exact mean, exact sd²): iterations/s, acceptance, error in sd."""
    rng = np.random.default_rng(seed)
    bound = model.theta_bound
    theta0 = reference.mean + reference.sd * rng.standard_normal((CHAINS, model.dim))
    kernel = ALGORITHMS["penalty"].kernel(model, ChainData(oracle=oracle, n_total=n_total), sampler)
    started = time.perf_counter()
    result = sample(
        kernel,
        rng,
        np.clip(theta0, -bound, bound),
        iterations=sampler["iterations"],
        warmup=sampler["warmup"],
        progress=False,
    )
    elapsed = time.perf_counter() - started
    error = np.abs(result.theta.mean(axis=(0, 1)) - reference.mean) / reference.sd
    return {
        "rate": (sampler["warmup"] + sampler["iterations"]) / elapsed,
        "acceptance": result.acceptance_rate,
        "error": float(error.max()),
    }


def plot(rows: list[dict], path: Path) -> None:
    """Write ``figure(rows)`` to ``path``."""
    import matplotlib.pyplot as plt

    fig = figure(rows)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def figure(rows: list[dict]) -> Any:
    """Iterations/s and acceptance against K (log x), one line per model and transport; one
    legend for both panels, below them, so that it covers no data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (speed, accept) = plt.subplots(1, 2, figsize=(11, 4))
    for model in sorted({r["model"] for r in rows}):
        for transport in sorted({r["transport"] for r in rows}):
            line = sorted(
                (r for r in rows if r["model"] == model and r["transport"] == transport),
                key=lambda r: r["owners"],
            )
            if line:
                k = [r["owners"] for r in line]
                label = f"{model}, {transport}"
                speed.plot(k, [r["iterations_per_second"] for r in line], "o-", label=label)
                accept.plot(k, [r["acceptance_rate"] for r in line], "o-", label=label)
    speed.set(xscale="log", yscale="log", xlabel="owners K", ylabel="iterations / s")
    accept.set(xscale="log", xlabel="owners K", ylabel="acceptance rate", ylim=(0, None))
    speed.set_title("penalty MH, 4 chains")
    accept.set_title("acceptance at fixed per-owner σ")
    handles, labels = accept.get_legend_handles_labels()
    columns = min(len(labels), 3) or 1
    fig.legend(handles, labels, loc="lower center", ncols=columns, fontsize=8, frameon=False)
    legend_rows = -(-len(labels) // columns)
    fig.tight_layout(rect=(0, (0.15 + 0.2 * legend_rows) / fig.get_figheight(), 1, 1))
    return fig


def _child(row: tuple[str, int, str], args: argparse.Namespace) -> dict:
    """Measure one row in a fresh process (its own peak memory)."""
    flags = [
        f"--n-per-owner={args.n_per_owner}",
        f"--sigma={args.sigma}",
        f"--iterations={args.iterations}",
        f"--warmup={args.warmup}",
        f"--seed={args.seed}",
        *(["--footprint"] if args.footprint else []),
    ]
    done = subprocess.run(
        [sys.executable, __file__, "--row", ",".join(map(str, row)), *flags],
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"scaling: the row {row} failed (exit {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


def rows_table(rows: list[dict]) -> str:
    """The rows as the printed table (with the ``--footprint`` columns when the rows have
    them)."""
    extra = bool(rows) and "run_directory_mb" in rows[0]
    headers = ["model", "K", "transport", "it/s", "start s", "open s", "peak RSS MiB", "accept"]
    headers += ["ε median", "err/sd", *(["run dir MB", "× numpy floor"] if extra else [])]
    return table(
        headers,
        [
            [
                r["model"],
                str(r["owners"]),
                r["transport"],
                f"{r['iterations_per_second']:.1f}",
                f"{r['startup_seconds']:.1f}",
                f"{r['open_seconds']:.1f}",
                f"{r['peak_rss_bytes'] / 2**20:.0f}",
                f"{r['acceptance_rate']:.3f}",
                f"{r['epsilon_median']:.3g}",
                f"{r['error_in_sd']:.2f}",
                *(_footprint_cells(r) if extra else []),
            ]
            for r in rows
        ],
    )


def _footprint_cells(row: dict) -> list[str]:
    return [f"{row['run_directory_mb']:.1f}", f"{row['ratio_to_numpy_floor']:.3f}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--owners", default="10,100,1000,10000", help="comma-separated K")
    parser.add_argument("--transports", default="inprocess,grpc,ray")
    parser.add_argument("--models", default="gaussian_mean,bernoulli")
    parser.add_argument("--n-per-owner", type=int, default=1000, help="records per owner")
    parser.add_argument("--sigma", type=float, default=0.02, help="every owner's noise sd (nats)")
    parser.add_argument("--iterations", type=int, default=1000, help="kept iterations per chain")
    parser.add_argument("--warmup", type=int, default=200, help="warmup iterations per chain")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the rows as JSON")
    parser.add_argument("--plot", type=Path, help="write iterations/s and acceptance vs K")
    parser.add_argument(
        "--footprint",
        action="store_true",
        help="add run_directory_mb and ratio_to_numpy_floor to each row",
    )
    parser.add_argument("--row", help=argparse.SUPPRESS)  # MODEL,K,TRANSPORT: one row, here
    args = parser.parse_args(argv)
    if args.row:
        model, owners, transport = args.row.split(",")
        print(json.dumps(measure(model, int(owners), transport, args)))
        return 0
    unknown = set(args.transports.split(",")) - set(TRANSPORTS)
    unknown |= set(args.models.split(",")) - set(MODELS)
    if unknown:
        parser.error(f"unknown model or transport: {', '.join(sorted(unknown))}")
    rows = [
        _child((model, int(k), transport), args)
        for model in args.models.split(",")
        for k in args.owners.split(",")
        for transport in args.transports.split(",")
    ]
    print(rows_table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
