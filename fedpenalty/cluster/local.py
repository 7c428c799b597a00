"""Owners as local processes: K owners packed into H owner-host processes on loopback gRPC.

``LocalCluster.start`` writes each host's owners (records, policy, noise seed) into a folder
(the records are removed once the hosts have loaded them),
starts ``python -P -m fedpenalty.cluster.local HOST.json`` per host on 127.0.0.1 with a port the
operating system picks (``-P``: the working directory is not put first on ``sys.path``, so a
``fedpenalty`` folder there — another checkout — cannot shadow the installed package; a user's
model module is still found there, by the model registry's fallback), waits until every host
reports SERVING on the standard health check,
and ``stop`` ends them with SIGTERM (SIGKILL after a timeout). The hosts run in their own
session, so a terminal's Ctrl-C reaches the coordinator alone: it stops the run, collects the
owners' reports and then stops the hosts; a host whose launcher is gone stops itself. Owners
are split into contiguous
blocks, so the gRPC oracle's owner order (address order, then each host's order) is the order
given here. The owners of one host share one ledger file: one transaction per request.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ..common import Policy
from ..errors import FedPenaltyError
from ..models import Model, build_model
from ..owner import Ledger, OwnerNode
from ..owner.host import OwnerHost


@dataclass
class LocalCluster:
    """Running host processes and their loopback addresses (in owner order)."""

    processes: list[subprocess.Popen]
    addresses: list[str]

    @classmethod
    def start(
        cls,
        folder: Path,
        model: Model,
        records: Sequence[np.ndarray],
        policies: Sequence[Policy],
        noise_seeds: Sequence[np.random.SeedSequence],
        hosts: int,
        synchronous: str = "NORMAL",
        names: Sequence[str] | None = None,
        timeout: float = 120.0,
    ) -> LocalCluster:
        """Start ``hosts`` processes serving ``len(records)`` owners named ``names`` (default
        ``owner-k``); their files, ledgers and logs go to ``folder``."""
        folder.mkdir(parents=True, exist_ok=True)
        names = list(names or [f"owner-{k}" for k in range(len(records))])
        processes: list[subprocess.Popen] = []
        cluster = cls(processes, [])
        try:
            for h, block in enumerate(
                np.array_split(np.arange(len(records)), min(hosts, len(records)))
            ):
                spec = _write_host(
                    folder,
                    h,
                    model,
                    [names[k] for k in block],
                    [records[k] for k in block],
                    [policies[k] for k in block],
                    [noise_seeds[k] for k in block],
                    synchronous,
                )
                log = (folder / f"host-{h}.log").open("ab")
                processes.append(
                    subprocess.Popen(
                        [sys.executable, "-P", "-m", "fedpenalty.cluster.local", str(spec)],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,  # not stopped by the terminal's Ctrl-C
                    )
                )
                log.close()
            deadline = time.monotonic() + timeout
            cluster.addresses = [
                _wait_ready(folder, h, p, deadline) for h, p in enumerate(processes)
            ]
            for h in range(len(processes)):  # loaded by now: the records need not stay on disk
                (folder / f"host-{h}.npz").unlink()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM every host, wait for clean exits, SIGKILL what remains."""
        for p in self.processes:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + timeout
        for p in self.processes:
            try:
                p.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def default_owner_hosts() -> int:
    """Owner host processes for a local run: one per CPU core, less the coordinator's core
    (on 2 cores, one host: measured faster for cheap answers, see scenarios/throughput.py)."""
    return max(1, (os.cpu_count() or 1) - 1)


def _write_host(
    folder: Path,
    h: int,
    model: Model,
    names: list[str],
    records: list[np.ndarray],
    policies: list[Policy],
    seeds: list[np.random.SeedSequence],
    synchronous: str,
) -> Path:
    data = folder / f"host-{h}.npz"
    np.savez(data, **dict(zip(names, records)))  # type: ignore[arg-type]  # numpy's stub
    spec = {
        "model": {"name": model.name, **model.params()},
        "data": data.name,
        "ledger": f"host-{h}.sqlite",
        "synchronous": synchronous,
        "port_file": f"host-{h}.port",
        "launcher": os.getpid(),
        "owners": [
            {
                "name": n,
                "policy": p.to_dict(),
                "noise_seed": {"entropy": s.entropy, "spawn_key": list(s.spawn_key)},
            }
            for n, p, s in zip(names, policies, seeds)
        ],
    }
    path = folder / f"host-{h}.json"
    path.write_text(json.dumps(spec, indent=1))
    (folder / f"host-{h}.port").unlink(missing_ok=True)
    return path


def _wait_ready(folder: Path, h: int, process: subprocess.Popen, deadline: float) -> str:
    """Wait for host ``h``'s port file, then for SERVING on its health check; its address."""
    port_file = folder / f"host-{h}.port"
    while not port_file.exists():
        if process.poll() is not None:
            log = (folder / f"host-{h}.log").read_text(errors="replace")[-2000:]
            raise FedPenaltyError(
                f"owner host {h} exited with code {process.returncode} before serving:\n{log}"
            )
        if time.monotonic() > deadline:
            raise FedPenaltyError(
                f"owner host {h} did not start in time (see {folder / f'host-{h}.log'})"
            )
        time.sleep(0.02)
    address = f"127.0.0.1:{int(port_file.read_text())}"
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        reply = health.Check(
            health_pb2.HealthCheckRequest(service=""),
            timeout=max(deadline - time.monotonic(), 1.0),
            wait_for_ready=True,
        )
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        raise FedPenaltyError(f"owner host {h} at {address} is not serving")
    return address


def serve_host(spec_path: Path) -> None:
    """Build the owners of one host spec and serve them until SIGTERM/SIGINT, or until the
    launcher process named in the spec is gone."""
    from ..owner.server import serve

    folder = spec_path.parent
    spec = json.loads(spec_path.read_text())
    threading.Thread(target=_stop_without, args=(spec["launcher"],), daemon=True).start()
    model = build_model(spec["model"])
    ledger = Ledger.simulation(folder / spec["ledger"], spec["synchronous"])
    with np.load(folder / spec["data"]) as data:
        nodes = [
            OwnerNode.simulated(
                o["name"],
                model,
                data[o["name"]],
                Policy(**o["policy"]),
                ledger,
                np.random.SeedSequence(
                    o["noise_seed"]["entropy"], spawn_key=tuple(o["noise_seed"]["spawn_key"])
                ),
                simulation=False,
            )
            for o in spec["owners"]
        ]
    try:
        serve(OwnerHost(nodes), "127.0.0.1:0", port_file=folder / spec["port_file"])
    finally:
        ledger.close()


def _stop_without(launcher: int, every: float = 1.0) -> None:
    """SIGTERM this process once ``launcher`` (its parent) has exited: a host in its own
    session would otherwise serve on after a coordinator that was killed."""
    while os.getppid() == launcher:
        time.sleep(every)
    os.kill(os.getpid(), signal.SIGTERM)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    serve_host(Path(sys.argv[1]))
