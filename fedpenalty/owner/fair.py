"""The owner server's one worker thread, shared fairly between clients and their sessions.

Every host call of a server (validation, accounting, answers, charges, ledger probes) runs on
one thread, so the host is never re-entered (docs/design.md §3, invariant 9). The calls that
wait for it are not served first come, first served — a client that keeps many large requests
queued would make everyone else wait behind all of them — but by self-clocked fair queueing
(Golestani 1994), on two levels: among clients (``who``: the client's certificate name, or its
connection when clients have no identity), then among each client's sessions. Each waiting call
costs what it asks for (``cost``: its answers, chains × block; 1 for other calls); a client's
calls are tagged with the work it has been given, never below the virtual time of the call in
service, and the call with the smallest finish tag (start tag + cost) runs next. So a client
that was idle gets the next turn for a small request: it waits for the call in service, and for
other clients' calls only as far as it has used more than its share. One call is never
interrupted; ``max_answers_per_request`` and ``max_record_evaluations`` bound how long it runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import threading
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

_Job = tuple[concurrent.futures.Future, Callable[..., Any], tuple]


@dataclass
class _Flow:
    """One client's (or session's) waiting calls and the virtual work it has been given."""

    tag: int
    order: int
    calls: deque[tuple[_Job, int]] | _Flows
    waiting: int = 0


@dataclass
class _Flows:
    """Self-clocked fair queueing among flows keyed by ``keys[0]``; each flow is a FIFO of
    calls (``depth`` 1) or the same queueing among its own flows keyed by ``keys[1:]``."""

    depth: int
    clock: int = 0  # start tag of the call last taken: the virtual time
    flows: dict[Hashable, _Flow] = field(default_factory=dict)
    _arrivals: itertools.count = field(default_factory=itertools.count)

    def push(self, keys: tuple[Hashable, ...], job: _Job, cost: int) -> None:
        flow = self.flows.get(keys[0])
        if flow is None:
            calls: deque | _Flows = deque() if self.depth == 1 else _Flows(self.depth - 1)
            flow = self.flows[keys[0]] = _Flow(self.clock, 0, calls)
        if not flow.waiting:  # idle until now: no credit for the time it did not ask
            flow.tag, flow.order = max(flow.tag, self.clock), next(self._arrivals)
        if isinstance(flow.calls, deque):
            flow.calls.append((job, cost))
        else:
            flow.calls.push(keys[1:], job, cost)
        flow.waiting += 1

    def head_cost(self) -> int:
        """The cost of the call ``pop`` would take."""
        return _head_cost(self._next())

    def _next(self) -> _Flow:
        return min(
            (f for f in self.flows.values() if f.waiting),
            key=lambda f: (f.tag + _head_cost(f), f.order),
        )

    def pop(self) -> tuple[_Job, int]:
        """The next call and its cost (some flow must be waiting)."""
        flow = self._next()
        if isinstance(flow.calls, deque):
            job, cost = flow.calls.popleft()
        else:
            job, cost = flow.calls.pop()
        flow.waiting -= 1
        self.clock = flow.tag
        flow.tag += cost
        # forget idle flows that have had no more than their share (they would restart at the
        # clock), and every flow once none waits (idle, the owner owes nobody a turn)
        if not any(f.waiting for f in self.flows.values()):
            self.clock = max(f.tag for f in self.flows.values())
            self.flows.clear()
        for key in [k for k, f in self.flows.items() if not f.waiting and f.tag <= self.clock]:
            del self.flows[key]
        return job, cost


def _head_cost(flow: _Flow) -> int:
    return flow.calls[0][1] if isinstance(flow.calls, deque) else flow.calls.head_cost()


class FairWorker:
    """One worker thread running submitted calls in fair order (see the module docstring)."""

    def __init__(self, name: str = "owner-host"):
        self._ready = threading.Condition()
        self._queue = _Flows(depth=2)
        self._waiting = 0
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(
        self, who: Hashable, session: Hashable, cost: int, call: Callable[..., Any], *args: Any
    ) -> asyncio.Future:
        """Run ``call(*args)`` on the worker thread in its turn: ``who`` asks for ``cost`` in
        ``session``. Awaitable from the running event loop; cancelling it before the call
        starts drops the call."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._ready:
            if self._closing:
                raise RuntimeError("the owner's worker has stopped")
            self._queue.push((who, session), (future, call, args), max(int(cost), 1))
            self._waiting += 1
            self._ready.notify()
        return asyncio.wrap_future(future)

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._waiting and not self._closing:
                    self._ready.wait()
                if not self._waiting:
                    return
                (future, call, args), _ = self._queue.pop()
                self._waiting -= 1
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = call(*args)
            except BaseException as exc:  # handed to the caller, as an executor would
                future.set_exception(exc)
            else:
                future.set_result(result)

    def close(self, timeout: float = 30.0) -> None:
        """Run the calls already waiting, then stop the thread (waits up to ``timeout``)."""
        with self._ready:
            self._closing = True
            self._ready.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
