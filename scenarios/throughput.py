"""Iterations per second of the penalty sampler by transport and number of owners.

    python scenarios/throughput.py [--owners 1,4,16,64,256,1024] [--json FILE] [--seconds 3]
        [--clock wall|cpu] [--repeat 1]

Rows: ``numpy-floor`` — the compute floor, one iteration of K owners' noisy clipped
log-likelihood ratios from sufficient statistics for 4 chains in pure numpy (proposal, ratios,
clip, noise, sum; no validation, ledger or transport; exponential-family models only) — and
the transports, each with its ratio to the floor measured in the same run.
Transports: ``inprocess`` (one OwnerHost in this process), ``grpc-one-per-host`` (one owner
host process per owner, only up to ``--max-processes`` owners), ``grpc-packed`` (owners
packed into ``--packed-hosts`` host processes; default one per CPU core but the
coordinator's). Models: ``gaussian_mean`` (d = 1; O(1) answers from sufficient statistics)
and ``logistic`` (d = 10; O(n) per answer, only up to ``--max-logistic-owners`` owners), n =
10,000 records per owner, 4 chains. Every iteration is a real ``penalty`` MH step:
validated, noised, charged answers from every owner (ledgers with synchronous=NORMAL, as in
local simulation). Start-up is not timed; it grows with the number of host processes (each
imports numpy and gRPC: seconds per host on a loaded 2-core machine), so each host is given
``--startup-seconds`` to start. A measurement that fails is reported in one line and left out,
and the others are still printed and written.

``--clock cpu`` times by this process's CPU time instead of the wall clock (for ``numpy-floor``
and ``inprocess``, which run in this process only): on a machine shared with other work the
wall-clock ratio to the floor swings with the load, the CPU-time one much less. ``--repeat N``
measures every row N times, interleaved, and prints each row's median and range.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fedpenalty.cli import table
from fedpenalty.cluster.local import LocalCluster, default_owner_hosts
from fedpenalty.common import Policy
from fedpenalty.coordinator import mh
from fedpenalty.coordinator.grpc_oracle import GrpcOracle
from fedpenalty.coordinator.inprocess import InProcessOracle
from fedpenalty.errors import FedPenaltyError
from fedpenalty.models import ExpFamModel, build_model
from fedpenalty.owner import Ledger, OwnerNode

MODELS = {
    "gaussian_mean": {"name": "gaussian_mean", "dim": 1},
    "logistic": {"name": "logistic", "dim": 10},
}
N_PER_OWNER, CHAINS, STEP = 10_000, 4, 0.001


#: how a measurement is timed (``--clock``): seconds of the wall clock or of this process's CPU
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCKS["wall"]


def measure(oracle, model, seconds: float) -> float:
    """Iterations/s of penalty MH steps for ``seconds`` of ``clock`` (after 20 untimed
    steps)."""
    rng = np.random.default_rng(0)
    oracle.open_session("penalty", 10**6)
    state = mh.init(np.zeros((CHAINS, model.dim)), model)
    ratio = mh.oracle_ratio(oracle)
    for _ in range(20):
        state, _ = mh.step(rng, state, model, STEP, ratio)
    done, start = 0, clock()
    while (elapsed := clock() - start) < seconds:
        state, _ = mh.step(rng, state, model, STEP, ratio)
        done += 1
    return done / elapsed


def numpy_floor(model, records: list[np.ndarray], seconds: float) -> float:
    """Iterations/s of the numpy compute floor (module docstring) for ``records`` of K owners."""
    if not isinstance(model, ExpFamModel):
        raise FedPenaltyError(
            f"the numpy floor needs an exponential-family model, not {model.name}"
        )
    stat = np.stack([model.suff_stat(model.prepare_records(r)).sum(axis=0) for r in records])
    n = np.array([len(r) for r in records], dtype=float)
    return floor_rate(model, stat, n, seconds)


def floor_rate(model: ExpFamModel, stat: np.ndarray, n: np.ndarray, seconds: float) -> float:
    """Iterations/s of the numpy floor for K owners' summed statistics ``stat`` ``(K, s)`` and
    record counts ``n`` ``(K,)`` (its cost depends on K and the shapes, not on the values)."""
    sigma = np.ones(len(n))
    rng = np.random.default_rng(0)
    theta = np.zeros((CHAINS, model.dim))

    def iteration() -> np.ndarray:
        prop = mh.propose_in_ball(rng, theta, STEP)
        d_eta = model.natural_param(prop) - model.natural_param(theta)
        d_a = model.log_partition(prop) - model.log_partition(theta)
        exact = stat @ d_eta.T - n[:, None] * d_a[None, :]
        bound = n[:, None] * (model.lipschitz * np.linalg.norm(prop - theta, axis=1))[None, :]
        noisy = np.clip(exact, -bound, bound) + sigma[:, None] * rng.standard_normal(exact.shape)
        return noisy.sum(axis=0)

    for _ in range(20):
        iteration()
    done, start = 0, clock()
    while (elapsed := clock() - start) < seconds:
        iteration()
        done += 1
    return done / elapsed


def run(
    transport: str,
    model_name: str,
    owners: int,
    seconds: float,
    folder: Path,
    packed_hosts: int,
    startup_per_host: float,
) -> float:
    model = build_model(MODELS[model_name])
    rng = np.random.default_rng(1)
    records = [
        model.simulate_records(rng, np.full(model.dim, 0.1), N_PER_OWNER) for _ in range(owners)
    ]
    policies = [Policy(sigma=1.0, max_step=STEP, budget_epsilon=1e12)] * owners
    seeds = np.random.SeedSequence(2).spawn(owners)
    if transport == "numpy-floor":
        return numpy_floor(model, records, seconds)
    if transport == "inprocess":
        ledger = Ledger.simulation(folder / "ledger.sqlite", batched=True)
        oracle = InProcessOracle(
            [
                OwnerNode(f"owner-{k}", model, r, p, ledger, np.random.default_rng(s))
                for k, (r, p, s) in enumerate(zip(records, policies, seeds))
            ]
        )
        try:
            return measure(oracle, model, seconds)
        finally:
            oracle.close()
            ledger.close()
    hosts = owners if transport == "grpc-one-per-host" else min(owners, packed_hosts)
    timeout = startup_per_host * hosts
    with LocalCluster.start(
        folder, model, records, policies, seeds, hosts=hosts, timeout=timeout
    ) as cluster:
        del records
        oracle = GrpcOracle(cluster.addresses, model)
        try:
            return measure(oracle, model, seconds)
        finally:
            oracle.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--owners", default="1,4,16,64,256,1024", help="comma-separated owner counts"
    )
    parser.add_argument(
        "--models",
        default="gaussian_mean,logistic",
        help="comma-separated: gaussian_mean, logistic",
    )
    parser.add_argument(
        "--transports", default="numpy-floor,inprocess,grpc-one-per-host,grpc-packed"
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per measurement")
    parser.add_argument(
        "--max-processes", type=int, default=64, help="largest K run with one process per owner"
    )
    parser.add_argument(
        "--max-logistic-owners", type=int, default=64, help="largest K run with the logistic model"
    )
    parser.add_argument(
        "--packed-hosts",
        type=int,
        default=default_owner_hosts(),
        help="host processes for grpc-packed (default: one per core but the coordinator's)",
    )
    parser.add_argument(
        "--startup-seconds",
        type=float,
        default=20.0,
        help="start-up time allowed per owner host process (default 20 s)",
    )
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="how to time")
    parser.add_argument("--repeat", type=int, default=1, help="measurements of every row")
    parser.add_argument("--json", type=Path, help="write the rows as JSON")
    args = parser.parse_args(argv)
    if not args.startup_seconds > 0:
        parser.error("--startup-seconds must be positive")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    global clock
    clock = CLOCKS[args.clock]
    rows = []
    for model_name in args.models.split(","):
        for owners, repeat in [
            (int(k), r) for k in args.owners.split(",") for r in range(args.repeat)
        ]:
            for transport in args.transports.split(","):
                if transport == "grpc-one-per-host" and owners > args.max_processes:
                    continue
                if model_name == "logistic" and owners > args.max_logistic_owners:
                    continue
                label = f"{model_name} K={owners} {transport}"
                with tempfile.TemporaryDirectory() as tmp:
                    try:
                        rate = run(
                            transport,
                            model_name,
                            owners,
                            args.seconds,
                            Path(tmp),
                            args.packed_hosts,
                            args.startup_seconds,
                        )
                    except FedPenaltyError as exc:
                        print(f"throughput: {label}: left out: {_one_line(exc)}", file=sys.stderr)
                        continue
                floor = next(
                    (
                        r["iterations_per_second"]
                        for r in rows
                        if (r["model"], r["owners"], r["transport"], r["repeat"])
                        == (model_name, owners, "numpy-floor", repeat)
                    ),
                    None,
                )
                rows.append(
                    {
                        "transport": transport,
                        "owners": owners,
                        "model": model_name,
                        "iterations_per_second": rate,
                        "ratio_to_numpy_floor": None if floor is None else rate / floor,
                        "clock": args.clock,
                        "repeat": repeat,
                    }
                )
                print(
                    f"{model_name:>13} K={owners:<5} {transport:<18} {rate:10.1f} it/s",
                    file=sys.stderr,
                    flush=True,
                )
    print(
        table(
            ["model", "owners", "transport", "it/s", "× numpy floor"],
            [
                [
                    r["model"],
                    str(r["owners"]),
                    r["transport"],
                    f"{r['iterations_per_second']:.1f}",
                    "" if r["ratio_to_numpy_floor"] is None else f"{r['ratio_to_numpy_floor']:.3f}",
                ]
                for r in rows
            ],
        )
    )
    if args.repeat > 1:
        print(spread_table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


def spread_table(rows: list[dict]) -> str:
    """Per (model, owners, transport): the median it/s and ratio to the floor over the
    repeated measurements, and the ratio's range."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["owners"], r["transport"]), []).append(r)
    lines = []
    for (model, owners, transport), group in groups.items():
        ratios = [r["ratio_to_numpy_floor"] for r in group if r["ratio_to_numpy_floor"] is not None]
        rate = float(np.median([r["iterations_per_second"] for r in group]))
        spread = f"{min(ratios):.3f}–{max(ratios):.3f}" if ratios else ""
        median = f"{float(np.median(ratios)):.3f}" if ratios else ""
        lines.append(
            [model, str(owners), transport, str(len(group)), f"{rate:.1f}", median, spread]
        )
    headers = ["model", "owners", "transport", "runs", "median it/s", "median × floor", "range"]
    return table(headers, lines)


def _one_line(exc: Exception) -> str:
    """The error's first line (a host's log tail follows it in the message), without the path
    of a log in the temporary folder, which is gone by the time it is read."""
    text = str(exc).strip().splitlines()
    first = re.sub(r"\s*\(see [^)]*\)", "", text[0]) if text else type(exc).__name__
    return f"{first} (more time per host: --startup-seconds)" if "in time" in first else first


if __name__ == "__main__":
    sys.exit(main())
