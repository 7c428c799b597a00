"""Helpers for tests that run real owner and coordinator processes on 127.0.0.1.

Every process a test starts is registered with a ``Processes`` object whose ``stop_all`` (a
fixture finalizer) terminates it; every wait is bounded in time.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import tomli_w
from grpc_health.v1 import health_pb2, health_pb2_grpc

FEDPENALTY = [sys.executable, "-m", "fedpenalty.cli"]
TIMEOUT = 120  # seconds any one process or wait may take


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_owner(
    folder: Path, name: str, data: Path, port: int, privacy: dict, model: dict, **server
) -> Path:
    """An OWNER.toml for ``name`` serving ``data`` on 127.0.0.1:``port``."""
    path = folder / f"{name}.toml"
    path.write_text(
        tomli_w.dumps(
            {
                "model": model,
                "data": {"path": str(data)},
                "privacy": privacy,
                "server": {
                    "name": name,
                    "listen": f"127.0.0.1:{port}",
                    "ledger": f"{name}.sqlite",
                    "synchronous": "NORMAL",
                    **server,
                },
            }
        )
    )
    return path


class Processes:
    """Processes started by one test; ``stop_all`` ends them."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.running: list[subprocess.Popen] = []

    def start(self, args: list[str], log: str) -> subprocess.Popen:
        with (self.folder / log).open("ab") as f:
            proc = subprocess.Popen(
                args, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        self.running.append(proc)
        return proc

    def owner(
        self, toml: Path, port: int, credentials: grpc.ChannelCredentials | None = None
    ) -> subprocess.Popen:
        """``fedpenalty owner serve TOML``, waited for until it reports SERVING."""
        proc = self.start([*FEDPENALTY, "owner", "serve", str(toml)], f"{toml.stem}.log")
        wait_serving(f"127.0.0.1:{port}", proc, credentials, self.folder / f"{toml.stem}.log")
        return proc

    def stop_all(self) -> None:
        for proc in self.running:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.running:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)


def wait_serving(
    address: str, proc: subprocess.Popen, credentials: grpc.ChannelCredentials | None, log: Path
) -> None:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"owner exited with {proc.returncode}:\n{log.read_text()}")
        channel = (
            grpc.secure_channel(address, credentials)
            if credentials
            else grpc.insecure_channel(address)
        )
        with channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=1
                )
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
        time.sleep(0.1)
    raise TimeoutError(f"owner at {address} did not start within {TIMEOUT} s:\n{log.read_text()}")


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run ``fedpenalty ARGS`` to completion (bounded)."""
    return subprocess.run(
        [*FEDPENALTY, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def wait_for(predicate, what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.02)
