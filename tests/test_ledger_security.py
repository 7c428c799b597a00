"""One ledger, one writer (docs/design.md §3, invariant 8) and clear storage failures
(invariant 3): regression tests for an outside attack on ``fedpenalty owner serve``.

* Two servers on one ledger file each admitted a gradient plan worth most of the budget: the
  second ``Ledger`` on a file is now refused, and plans and the Gaussian cap are checked against
  the reservations recorded in the ledger, in the transaction that records the plan.
* A full or read-only ledger surfaced as gRPC UNKNOWN ("cannot rollback") while health said
  SERVING: it is now ``StorageUnavailable`` (UNAVAILABLE), charges nothing, and health says
  NOT_SERVING until a later write succeeds.
"""

from __future__ import annotations

import resource
import signal
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_processes import FEDPENALTY, TIMEOUT, free_port, run_cli, wait_for, write_owner
from owners import SoloOwner, save_csv

from fedpenalty.common import Policy
from fedpenalty.errors import BudgetExhausted, LedgerInUse, StorageUnavailable
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerHost, OwnerNode
from fedpenalty.owner.server import ServerThread
from fedpenalty.privacy import GaussianSpend
from fedpenalty.privacy.owner_epsilon import owner_epsilon
from fedpenalty.privacy.subsampled import SubsampledGaussian
from fedpenalty.proto import owner_pb2 as pb
from fedpenalty.proto import owner_pb2_grpc as pb_grpc

MODEL_TABLE = {"name": "gaussian_mean", "dim": 1, "data_bound": 4.0, "theta_bound": 4.0}
MODEL = build_model(MODEL_TABLE)
RECORDS = MODEL.simulate_records(np.random.default_rng(0), np.array([0.2]), 400)
# A gradient plan of 200 answers at q = 0.05, σ = 2 costs ε ≈ 2.95 at δ = 1e-5: one fits a budget
# of 3, two (ε ≈ 4.38) do not.
POLICY = dict(sigma=2.0, max_step=0.05, budget_epsilon=3.0, delta=1e-5, max_sampling_rate=0.05)
PLAN, RATE = 200, 0.05
SERVING, NOT_SERVING = (
    health_pb2.HealthCheckResponse.SERVING,
    health_pb2.HealthCheckResponse.NOT_SERVING,
)


def alice(ledger: Ledger, seed: int = 0) -> OwnerNode:
    """Owner "alice" on ``ledger`` (several of them stand for servers sharing its file)."""
    return OwnerNode("alice", MODEL, RECORDS, Policy(**POLICY), ledger, np.random.default_rng(seed))


def ask(host: OwnerHost, iteration: int, chains: int = 10, step: float = 0.01) -> np.ndarray:
    """Log-ratio answers at ``chains`` chains, each with a step of ``step``."""
    theta = np.zeros((chains, 1))
    return host.log_ratio("s", iteration, np.arange(chains), theta, theta + step)


# --- one writer ------------------------------------------------------------------------------
def test_a_second_ledger_on_the_same_file_is_refused_until_the_first_closes(tmp_path):
    first = Ledger(tmp_path / "ledger.sqlite")
    with pytest.raises(LedgerInUse, match=r"ledger .*ledger\.sqlite is in use: another process"):
        Ledger(tmp_path / "sub" / ".." / "ledger.sqlite")  # another spelling of the same file
    reader = Ledger(tmp_path / "ledger.sqlite", read_only=True)  # reports need no lock
    assert reader.total("alice") == GaussianSpend()
    with pytest.raises(StorageUnavailable, match="cannot be written"):
        alice(reader).open_session("s", "penalty", 1)
    reader.close()
    first.close()
    Ledger(tmp_path / "ledger.sqlite").close()  # the lock went with the first ledger


def test_two_owners_of_one_ledger_never_both_fit_a_plan_only_one_fits(tmp_path):
    """Before: each node held its reservations in memory, so both plans were admitted."""
    ledger = Ledger(tmp_path / "ledger.sqlite", synchronous="NORMAL")
    first, second = alice(ledger, 1), alice(ledger, 2)
    first.open_session("g1", "sgmcmc", PLAN, RATE)
    with pytest.raises(BudgetExhausted, match="refusing a plan of 200 sgmcmc answers"):
        second.open_session("g2", "sgmcmc", PLAN, RATE)
    first.close_session("g1")  # a closed session holds nothing
    second.open_session("g2", "sgmcmc", PLAN, RATE)


def test_racing_plans_on_one_ledger_admit_exactly_one(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite", synchronous="NORMAL")
    nodes = [alice(ledger, k) for k in range(4)]
    barrier = threading.Barrier(len(nodes))
    outcome: dict[int, str] = {}

    def open_plan(k: int) -> None:
        barrier.wait(timeout=30)
        try:
            nodes[k].open_session(f"g{k}", "sgmcmc", PLAN, RATE)
            outcome[k] = "admitted"
        except BudgetExhausted:
            outcome[k] = "refused"

    threads = [threading.Thread(target=open_plan, args=(k,)) for k in range(len(nodes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(outcome.values()) == ["admitted", "refused", "refused", "refused"]


def test_gaussian_answers_respect_a_plan_admitted_through_another_node(tmp_path):
    """Before: the Gaussian cap lived in the node that admitted the gradient plan, so another
    node of the same owner answered up to the whole budget on top of that plan."""
    ledger = Ledger(tmp_path / "ledger.sqlite", synchronous="NORMAL")
    gaussian, gradient = SoloOwner(alice(ledger, 1)), alice(ledger, 2)
    gaussian.open_session("s", "penalty", 0)
    gradient.open_session("g", "sgmcmc", PLAN, RATE)
    refused = False
    for t in range(5000):  # each request: 10 answers of μ = 2·L·0.01/σ
        try:
            ask(gaussian.host, t)
        except BudgetExhausted:
            refused = True
            break
    assert refused
    worst, _ = owner_epsilon(
        ledger.total("alice"), [SubsampledGaussian(RATE, 2.0, PLAN)], 1e-5, "replace_one"
    )
    assert 0 < worst <= POLICY["budget_epsilon"]


# --- storage failures ------------------------------------------------------------------------
def _fail(ledger: Ledger, how: str) -> None:
    """Make ``ledger`` unwritable: "full" (no page may be added) or "read-only"."""
    if how == "full":
        pages = ledger._db.execute("PRAGMA page_count").fetchone()[0]
        ledger._db.execute(f"PRAGMA max_page_count={pages}")
    else:
        ledger._db.execute("PRAGMA query_only=ON")


def _repair(ledger: Ledger, how: str) -> None:
    if how == "full":
        ledger._db.execute("PRAGMA max_page_count=1073741823")
    else:
        ledger._db.execute("PRAGMA query_only=OFF")


@pytest.mark.parametrize(
    ("how", "sqlite_says"),
    [("full", "database or disk is full"), ("read-only", "attempt to write a readonly database")],
)
def test_an_unwritable_ledger_answers_nothing_charges_nothing_and_flips_health(
    tmp_path, how, sqlite_says
):
    ledger = Ledger(tmp_path / "ledger.sqlite", synchronous="NORMAL")
    host = OwnerHost([alice(ledger)])
    host.open_session("s", "penalty", 0)
    with ServerThread(host) as server, grpc.insecure_channel(server.address) as channel:
        stub, health = pb_grpc.OwnerStub(channel), health_pb2_grpc.HealthStub(channel)
        ask(host, 0)
        before = ledger.total("alice")
        _fail(ledger, how)
        refused = 0
        for t in range(1, 200):  # until the file is full (read-only: at once)
            try:
                ask(host, t)
            except StorageUnavailable as exc:
                message, refused = str(exc), t
                break
            before = ledger.total("alice")
        assert refused and sqlite_says in message
        assert "cannot be written" in message and "nothing was answered or charged" in message
        assert ledger.total("alice") == before and not ledger.stored(
            ["alice"], "s", refused, refused
        )
        request = pb.LogRatioRequest(  # the refused request again, over gRPC
            session="s",
            iteration=refused,
            chains=list(range(10)),
            theta=[0.0] * 10,
            theta_prop=[0.01] * 10,
        )
        with pytest.raises(grpc.RpcError) as status:
            stub.LogRatio(request, timeout=10)
        assert status.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "nothing was answered or charged" in status.value.details()
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == NOT_SERVING
        assert ledger.total("alice") == before
        _repair(ledger, how)
        # no request needed: the server probes the ledger while not serving (every 2 s)
        deadline = time.monotonic() + 15
        while health.Check(health_pb2.HealthCheckRequest(), timeout=10).status != SERVING:
            assert time.monotonic() < deadline, "health did not recover after the repair"
            time.sleep(0.2)
        stub.LogRatio(request, timeout=10)
        assert ledger.total("alice").answers == before.answers + 10
    ledger.close()


# --- real processes --------------------------------------------------------------------------
def owner_toml(tmp_path, name: str, port: int, ledger: str = "alice.sqlite") -> Path:
    """OWNER.toml of ``name`` on 127.0.0.1:``port`` with a generous budget."""
    data = tmp_path / f"{name}.csv"
    save_csv(data, RECORDS, MODEL)
    privacy = {**POLICY, "budget_epsilon": 1000.0}
    return write_owner(tmp_path, name, data, port, privacy, MODEL_TABLE, ledger=ledger)


def health_status(port: int) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status


def test_a_second_server_on_a_served_ledger_fails_at_start_with_one_line(tmp_path, procs):
    """Before: the second server started and answered from the same budget."""
    first_port = free_port()
    first = owner_toml(tmp_path, "alice", first_port)
    procs.owner(first, first_port)
    second_port = free_port()
    second = owner_toml(tmp_path, "alice-again", second_port)  # same ledger file
    proc = procs.start([*FEDPENALTY, "owner", "serve", str(second)], "second.log")

    wait_for(lambda: proc.poll() is not None or _serving(second_port), "the second server")
    log = (tmp_path / "second.log").read_text()
    assert proc.poll() not in (None, 0), log
    lines = log.strip().splitlines()
    assert "Traceback" not in log and len(lines) == 1, log
    assert f"ledger {tmp_path / 'alice.sqlite'} is in use: another process serves it" in lines[0]
    done = run_cli("owner", "report", str(first), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr  # reports read while the server runs


def test_one_process_serving_two_owners_on_one_ledger_still_starts(tmp_path, procs):
    port = free_port()
    a = owner_toml(tmp_path, "a", port, ledger="shared.sqlite")
    b = owner_toml(tmp_path, "b", port, ledger="shared.sqlite")
    proc = procs.start([*FEDPENALTY, "owner", "serve", str(a), str(b)], "both.log")
    wait_for(lambda: proc.poll() is not None or _serving(port), "the shared-ledger server")
    assert proc.poll() is None, (tmp_path / "both.log").read_text()


def _serving(port: int) -> bool:
    try:
        return health_status(port) == SERVING
    except grpc.RpcError:
        return False


def test_a_served_ledger_past_its_file_size_limit_is_unavailable_then_recovers(tmp_path, procs):
    """A real ``owner serve`` whose ledger stops growing (RLIMIT_FSIZE, set from outside):
    UNAVAILABLE with the clear message, nothing charged, NOT_SERVING; SERVING again once the
    limit is lifted and a write succeeds."""
    port = free_port()
    toml = owner_toml(tmp_path, "alice", port)
    proc = procs.owner(toml, port)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.OwnerStub(channel)
        stub.OpenSession(
            pb.OpenSessionRequest(session="s", algorithm="penalty", planned_answers=0), timeout=10
        )

        def request(t: int) -> pb.LogRatioRequest:
            return pb.LogRatioRequest(
                session="s",
                iteration=t,
                chains=list(range(50)),
                theta=[0.0] * 50,
                theta_prop=[0.01] * 50,
            )

        stub.LogRatio(request(0), timeout=10)
        wal = tmp_path / "alice.sqlite-wal"
        limit = max(wal.stat().st_size, (tmp_path / "alice.log").stat().st_size) + 4096
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
        failed = None
        for t in range(1, 400):  # each request appends to the WAL until it hits the limit
            try:
                stub.LogRatio(request(t), timeout=10)
            except grpc.RpcError as exc:
                failed = (t, exc)
                break
        assert failed is not None
        t, exc = failed
        assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc.details()
        assert "cannot be written" in exc.details() and "nothing was answered" in exc.details()
        assert health_status(port) == NOT_SERVING
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
        stub.LogRatio(request(t), timeout=10)
        assert health_status(port) == SERVING
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=TIMEOUT)
    done = run_cli("owner", "report", str(toml), "--json", cwd=tmp_path)
    assert '"answers": ' + str(50 * (t + 1)) in done.stdout, done.stdout + done.stderr
