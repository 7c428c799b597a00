"""Nearly free floods (docs/design.md §3, invariant 14) against a real ``owner serve`` process:
two clients that send the largest requests the owner admits at the smallest step it admits,
continuously, must neither starve an honest client nor fill the owner's disk for free."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
from grpc_processes import free_port, write_owner
from owners import save_csv

from fedpenalty.models import build_model
from fedpenalty.proto import owner_pb2 as pb
from fedpenalty.proto import owner_pb2_grpc as pb_grpc

MODEL_TABLE = {"name": "gaussian_mean", "dim": 1, "data_bound": 4.0, "theta_bound": 4.0}
MODEL = build_model(MODEL_TABLE)
#: a budget no honest request here reaches, so that the honest client is always answered; the
#: other limits are the owner's defaults
POLICY = {"sigma": 1.0, "max_step": 0.05, "budget_epsilon": 1e9}
FLOOD_SECONDS = 10.0
FLOODERS = 2
IDLE_REQUESTS = 100
FLOOD_CLIENT = Path(__file__).with_name("flood_client.py")


def honest_latencies(stub, session: str, first: int, *, count: int = 0, seconds: float = 0.0):
    """Seconds per 1-chain log-ratio request, sent one after another: ``count`` of them, or as
    many as fit in ``seconds``."""
    latencies: list[float] = []
    deadline = time.monotonic() + seconds
    while len(latencies) < count or time.monotonic() < deadline:
        request = pb.LogRatioRequest(
            session=session,
            iteration=first + len(latencies),
            chains=[0],
            theta=[0.0],
            theta_prop=[0.01],
        )
        start = time.perf_counter()
        stub.LogRatio(request, timeout=60)
        latencies.append(time.perf_counter() - start)
    return latencies


def ledger_bytes(ledger: Path) -> int:
    return sum(p.stat().st_size for p in (ledger, ledger.with_name(ledger.name + "-wal")))


def test_an_honest_client_is_served_and_the_disk_bounded_under_two_flooding_clients(
    tmp_path, procs
):
    data = tmp_path / "alice.csv"
    save_csv(data, MODEL.simulate_records(np.random.default_rng(0), np.array([0.2]), 500), MODEL)
    port = free_port()
    toml = write_owner(tmp_path, "alice", data, port, POLICY, MODEL_TABLE)
    procs.owner(toml, port)
    address, ledger = f"127.0.0.1:{port}", tmp_path / "alice.sqlite"
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.OwnerStub(channel)
        policy = stub.Describe(pb.DescribeRequest(), timeout=10).owners[0].policy
        stub.OpenSession(
            pb.OpenSessionRequest(session="honest", algorithm="penalty", planned_answers=1),
            timeout=10,
        )
        honest_latencies(stub, "honest", 0, count=20)  # warm up
        idle = statistics.median(honest_latencies(stub, "honest", 20, count=IDLE_REQUESTS))

        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        flooders = [
            subprocess.Popen(
                [sys.executable, str(FLOOD_CLIENT), address, f"flood-{i}", str(FLOOD_SECONDS)],
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for i in range(FLOODERS)
        ]
        try:
            time.sleep(1.5)  # the flooders start, open their sessions and fill the queue
            before, start = ledger_bytes(ledger), time.monotonic()
            flooded = honest_latencies(stub, "honest", 10_000, seconds=FLOOD_SECONDS - 3.0)
            after, seconds = ledger_bytes(ledger), time.monotonic() - start
            outs = [json.loads(f.communicate(timeout=120)[0]) for f in flooders]
        finally:
            for f in flooders:
                if f.poll() is None:
                    f.kill()
                    f.wait(timeout=30)
        floods = [
            stub.PrivacyReport(pb.PrivacyReportRequest(session=f"flood-{i}"), timeout=10)
            .owners[0]
            .session
            for i in range(FLOODERS)
        ]

    median = statistics.median(flooded)
    growth = (after - before) / seconds
    answers = sum(f.answers for f in floods)
    mu_squared = sum(f.mu**2 for f in floods)
    # what the cheapest stored answer costs the owner's budget: μ of a step max_step/10
    least = MODEL.log_ratio_sensitivity(policy.max_step / 10, "replace_one") / POLICY["sigma"]
    print(
        f"\nidle median {idle * 1e3:.2f} ms; flooded median {median * 1e3:.2f} ms, mean "
        f"{statistics.fmean(flooded) * 1e3:.2f} ms, 90th percentile "
        f"{np.percentile(flooded, 90) * 1e3:.2f} ms ({len(flooded)} requests); ratio "
        f"{median / idle:.1f}; ledger growth "
        f"{growth / 1e6:.2f} MB/s; flood {answers} stored answers charged μ² = {mu_squared:.3g} "
        f"(≥ {least**2:.3g} each: {mu_squared >= answers * least**2 * (1 - 1e-9)}); {outs}"
    )
    assert all(o["answered"] > 0 for o in outs), outs  # the flood was admitted: a real flood
    assert median <= 10 * idle
    # the disk: slow growth, or every stored flood answer charged at least `least`, so the
    # budget bounds how many the owner ever stores
    assert growth < 1e6 or mu_squared >= answers * least**2 * (1 - 1e-9)
