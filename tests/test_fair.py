"""The owner server's fair worker (docs/design.md §3, invariant 14): the order in which waiting
host calls are served, and that calls run one at a time on one thread."""

from __future__ import annotations

import asyncio
import threading

import pytest

from fedpenalty.owner.fair import FairWorker, _Flows


def served(flows: _Flows, count: int) -> list[str]:
    return [flows.pop()[0][0] for _ in range(count)]


def job(name: str):
    return (name, None, ())


def test_an_idle_client_waits_only_for_the_call_in_service():
    """Two flooders keep large calls queued; an honest client's small call, arriving later, is
    served next, not after their queues."""
    flows = _Flows(depth=2)
    for i in range(3):
        for who in ("flood-a", "flood-b"):
            flows.push((who, "s"), job(f"{who}{i}"), 4096)
    assert served(flows, 1) == ["flood-a0"]  # in service
    flows.push(("honest", "h"), job("honest"), 1)
    assert served(flows, 2) == ["honest", "flood-b0"]


def test_large_and_small_calls_share_the_work_not_the_turns():
    """Clients get equal work (answers), so one asking 4 answers per call gets 4 calls per call
    of one asking 16; no client is starved."""
    flows = _Flows(depth=2)
    for i in range(8):
        flows.push(("small", "s"), job(f"small{i}"), 4)
    for i in range(2):
        flows.push(("large", "s"), job(f"large{i}"), 16)
    order = served(flows, 10)
    assert order.index("large0") <= 4 and order.index("large1") <= 9
    assert [o for o in order if o.startswith("small")] == [f"small{i}" for i in range(8)]


def test_sessions_share_their_clients_turns():
    """A client with many sessions gets no more than a client with one; within the client its
    sessions take turns."""
    flows = _Flows(depth=2)
    for i in range(4):
        flows.push(("many", f"s{i}"), job(f"many-s{i}"), 1)
        flows.push(("one", "s"), job(f"one{i}"), 1)
    order = served(flows, 8)
    assert [o.startswith("one") for o in order] == [False, True] * 4
    assert [o for o in order if o.startswith("many")] == [f"many-s{i}" for i in range(4)]


def test_idle_flows_are_forgotten_once_the_clock_passes_them_or_nothing_waits():
    flows = _Flows(depth=2)
    flows.push(("a", "s"), job("a"), 1)
    for _ in range(3):
        flows.push(("b", "s"), job("b"), 1)
    assert served(flows, 3) == ["a", "b", "b"] and set(flows.flows) == {"b"}
    served(flows, 1)
    assert flows.flows == {}


def test_the_worker_runs_calls_one_at_a_time_and_returns_their_results_and_errors():
    worker = FairWorker(name="test-fair")
    running, most, threads = [0], [0], set()
    lock = threading.Lock()

    def call(value):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        threads.add(threading.get_ident())
        with lock:
            running[0] -= 1
        if value < 0:
            raise ValueError("negative")
        return value * 2

    async def main():
        results = await asyncio.gather(
            *(worker.submit(f"c{i % 3}", "s", 1 + i, call, i) for i in range(30))
        )
        with pytest.raises(ValueError, match="negative"):
            await worker.submit("c0", "s", 1, call, -1)
        return results

    try:
        assert asyncio.run(main()) == [2 * i for i in range(30)]
    finally:
        worker.close()
    assert most[0] == 1 and len(threads) == 1
    with pytest.raises(RuntimeError, match="stopped"):
        worker.submit("c0", "s", 1, call, 1)
