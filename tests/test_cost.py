"""Protocol cost (docs/design.md §5, cost.json): bytes computed from the protocol's encoding
agree with what gRPC serialises, the network model's arithmetic, the [network] section's
errors, and the simulated wall clock against gRPC runs with the delays imposed for real."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from fedpenalty.common import Policy
from fedpenalty.config import load_scenario
from fedpenalty.coordinator.cost import MeteredOracle, cost_report, request_bytes
from fedpenalty.coordinator.grpc_oracle import GrpcOracle
from fedpenalty.coordinator.inprocess import InProcessOracle
from fedpenalty.coordinator.network import Network, network_of
from fedpenalty.errors import ConfigError
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerNode, wire
from fedpenalty.owner.host import OwnerHost
from fedpenalty.owner.server import ServerThread
from fedpenalty.proto import owner_pb2 as pb
from fedpenalty.simulation import simulate

MODEL = build_model({"name": "gaussian_mean", "dim": 2, "data_bound": 3.0, "theta_bound": 2.0})


def nodes(tmp_path, tag: str, owners: int = 2) -> list[OwnerNode]:
    """``owners`` owners with seeded noise and a generous budget, on one ledger."""
    ledger = Ledger(tmp_path / f"{tag}.sqlite", synchronous="NORMAL")
    rng = np.random.default_rng(1)
    return [
        OwnerNode(
            f"owner-{k}",
            MODEL,
            MODEL.simulate_records(rng, np.array([0.3, -0.2]), 300 + 50 * k),
            Policy(sigma=1.0, max_step=0.05, budget_epsilon=1e4),
            ledger,
            np.random.default_rng(100 + k),
        )
        for k in range(owners)
    ]


def ask(oracle: MeteredOracle, queries: int, chains: int = 3) -> None:
    """Open a penalty session and ask ``queries`` log-ratio queries of ``chains`` chains."""
    oracle.open_session("penalty", 10_000, session="s", max_step=0.05)
    rng = np.random.default_rng(5)
    ids = np.arange(chains)
    for t in range(queries):
        theta = rng.uniform(-1, 1, size=(chains, 2))
        step = rng.normal(size=(chains, 2))
        step *= 0.04 / np.linalg.norm(step, axis=1, keepdims=True)
        oracle.log_ratio(t, ids, theta, theta + step)


def grpc_oracle(tmp_path, tag: str, owners: int, network: Network | None = None):
    """A metered gRPC oracle over ``owners`` owners, one per server (one owner per host)."""
    servers = [ServerThread(OwnerHost([n])) for n in nodes(tmp_path, tag, owners)]
    inner = GrpcOracle([s.address for s in servers], model=MODEL, deadline=10, retry_seconds=2)
    return MeteredOracle(inner, network), servers


def test_bytes_computed_in_process_equal_what_grpc_serialises(tmp_path):
    """The figures agree across transports: per owner the same requests and bytes in process
    as over gRPC, and gRPC's own serialised bytes (one owner per host) equal them exactly."""
    local = MeteredOracle(InProcessOracle(nodes(tmp_path, "local")))
    remote, servers = grpc_oracle(tmp_path, "remote", 2)
    try:
        for oracle in (local, remote):
            ask(oracle, 150)  # ids past 127 take a two-byte varint
        a, b = local.meter, remote.meter
        assert a.requests == b.requests == 150
        assert a.bytes_received.tolist() == b.bytes_received.tolist()
        assert a.bytes_sent.tolist() == b.bytes_sent.tolist()
        measured = remote.measured_bytes()
        assert measured == list(zip(b.bytes_received.tolist(), b.bytes_sent.tolist()))
        assert local.measured_bytes() is None
    finally:
        remote.close()
        for server in servers:
            server.close()


def test_the_network_model_waits_for_the_slowest_owner():
    """t_k = compute + 2·latency + bytes in/down + bytes out/up + straggling; the query takes
    the largest."""
    net = Network(np.array([0.010, 0.030]), up=1e6, down=2e6, probability=1.0, delay=0.5)
    times = net.owner_seconds(np.array([0.002, 0.001]), 4e6, 1e6, np.random.default_rng(0))
    assert times.tolist() == pytest.approx([0.002 + 0.02 + 2 + 1 + 0.5, 0.001 + 0.06 + 3.5])
    never = Network(np.array([0.010, 0.030]), probability=0.0, delay=0.5)
    assert never.query_seconds(0.0, 0, 0, np.random.default_rng(0)) == pytest.approx(0.06)


def test_a_latency_distribution_has_its_median_and_p95():
    """{median, p95}: a log-normal over owners whose quantiles are the ones asked for."""
    section = load_scenario(None, {"network.latency_ms": {"median": 20.0, "p95": 150.0}})
    net = network_of(section["network"], 20_000, seed=3)
    assert net is not None
    ms = net.latency * 1e3
    assert np.median(ms) == pytest.approx(20.0, rel=0.03)  # sampling error ≈ 1% at 20,000
    assert np.quantile(ms, 0.95) == pytest.approx(150.0, rel=0.05)


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("network.latency_ms", {"median": 20.0}, "network.latency_ms"),
        ("network.latency_ms", {"median": 50.0, "p95": 20.0}, "median ≤ p95"),
        ("network.latency_ms", -1.0, "≥ 0"),
        ("network.straggler_probability", 1.5, "network.straggler_probability"),
        ("network.bandwidth_up_mbps", 0.0, "network.bandwidth_up_mbps"),
    ],
)
def test_bad_network_sections_are_refused_naming_the_key(key, value, says):
    with pytest.raises(ConfigError, match=says):
        load_scenario(None, {key: value})


def test_a_latency_list_must_name_every_owner(tmp_path):
    """One latency per owner: another length is refused before any owner is started."""
    with pytest.raises(ConfigError, match=r"network\.latency_ms lists 2 latencies for 4 owners"):
        simulate(
            None,
            {"network.latency_ms": [1.0, 2.0], "run.transport": "inprocess"},
            out=tmp_path / "run",
            progress=False,
        )
    assert not (tmp_path / "run").exists()


def test_simulated_wall_clock_adds_two_latencies_per_query(tmp_path):
    """On a uniform latency L (no bandwidth limit or stragglers) the simulated clock is,
    exactly, the coordinator's own time plus per query 2L and one owner's compute: the host
    in this process answered both owners in turn, and deployed owners compute in parallel,
    each its share (half)."""
    oracle = MeteredOracle(InProcessOracle(nodes(tmp_path, "a")), Network.uniform(20.0, 2))
    ask(oracle, 30)
    oracle.privacy_reports()
    report = cost_report(oracle, ["owner-0", "owner-1"], 10.0, seed=0, transport="inprocess")
    expected = report["wall_seconds"] - report["query_seconds"] / 2 + 30 * 0.040
    assert report["simulated_wall_seconds"] == pytest.approx(expected, rel=1e-9)
    assert [r["round_trips"] for r in report["owners"]] == [32, 32]  # open + 30 + report
    assert report["per_1000_ess"]["round_trips_per_owner"] == pytest.approx(3200.0)


def test_every_owner_run_writes_cost_json(tmp_path):
    """simulate writes cost.json: per-owner rows whose requests are the iterations asked."""
    result = simulate(
        None,
        {"run.transport": "inprocess", "sampler.iterations": 40, "sampler.warmup": 10},
        out=tmp_path / "run",
        progress=False,
    )
    cost = json.loads((tmp_path / "run" / "cost.json").read_text())
    assert cost == json.loads(json.dumps(result.cost))
    assert [r["requests"] for r in cost["owners"]] == [50] * 4  # one query per iteration
    assert all(r["bytes_received"] > 0 and r["bytes_sent"] > 0 for r in cost["owners"])
    assert cost["simulated_wall_seconds"] is None and cost["network"] is None


def test_the_simulated_clock_predicts_grpc_runs_with_the_delays_imposed(tmp_path):
    """The model's prediction from gRPC runs without delays (their measured host times, then
    2L per query added by ``Network``) against gRPC runs with latency L imposed for real on
    each host's stream: within 20% at 5, 20 and 50 ms. Each side is the fastest of several
    runs (as ``timeit`` takes the minimum): load from other processes on this shared machine
    only ever adds time, to one run or another (a sleep that wakes while the process waits
    for a core wakes late), and the fastest run is the one it disturbed least; short runs
    (small latencies) are the most exposed and the cheapest, so they are repeated most.
    Bugs move every run alike: latency priced once per query instead of twice, or imposed
    owner after owner, gives ratios near 0.5 at 50 ms."""
    queries = 20

    def wall(tag: str, network: Network | None) -> MeteredOracle:
        oracle, servers = grpc_oracle(tmp_path, tag, 2, network)
        try:
            ask(oracle, queries)
        finally:
            oracle.close()
            for server in servers:
                server.close()
        return oracle

    ratios = {}
    for ms, repeats in ((5.0, 7), (20.0, 5), (50.0, 3)):
        network = Network.uniform(ms, 2)
        bases, reals = [], []
        for repeat in range(repeats):
            bases.append(wall(f"base-{ms:g}-{repeat}", None))
            reals.append(wall(f"at-{ms:g}-{repeat}", network))
        assert all(r.imposed and r.meter.imposed_seconds >= queries * 2 * ms / 1e3 for r in reals)
        predicted = min(b.meter.simulated_wall(network, seed=0) for b in bases)
        ratios[ms] = predicted / min(r.meter.wall_seconds for r in reals)
    print("predicted / measured wall clock by latency (ms):", ratios)
    # At 5 ms the queries' own handoffs (coordinator, two server threads, back) are a third of
    # each query, and on a machine whose load is several times its cores each handoff after
    # an idle sleep waits for a core: measured 0.72–0.90 at a load of 9–10 on two cores
    # (0.99 idle), so 5 ms is held to 20% only where the machine is not oversubscribed.
    loaded = os.getloadavg()[0] > 2.5 * (os.cpu_count() or 1)
    checked = {ms: r for ms, r in ratios.items() if not (loaded and ms == 5.0)}
    assert all(0.8 <= r <= 1.2 for r in checked.values()), ratios


@pytest.mark.parametrize("seed", range(6))
def test_request_sizes_follow_the_protobuf_encoding(seed):
    """``request_bytes`` sizes the message without building it: equal to ``ByteSize`` of the
    message ``wire.kind_query`` builds, for float and integer arrays, scalars, large and
    negative integers, sub-steps and ids of several varint lengths."""
    rng = np.random.default_rng(seed)
    chains = rng.integers(0, 10 ** rng.integers(1, 6), size=rng.integers(1, 40))
    arrays = {
        "theta": rng.normal(size=(len(chains), int(rng.integers(1, 6)))),
        "clip": float(rng.uniform(0.1, 5)),
        "block": int(rng.integers(-300, 300)),
        "index": rng.integers(-(2**62), 2**62, size=int(rng.integers(0, 5))),
    }
    iteration, substep, request_id = (int(10 ** rng.uniform(0, 7)) for _ in range(3))
    for args in ((iteration, substep), (0, 0)):
        message = wire.kind_query("log_ratio", "session-x", args[0], chains, arrays, args[1])
        expected = pb.QueryRequest(id=request_id, kind_query=message).ByteSize()
        size = request_bytes("log_ratio", "session-x", args[0], chains, arrays, args[1], request_id)
        assert size == expected
