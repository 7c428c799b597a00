"""What a run costs its owners (docs/design.md §5, "cost.json"): requests, round trips, bytes
and compute per owner, counted around the ONE generic oracle call (``Oracle.query``), so a new
kind or kernel is counted without touching this module.

Bytes are the protocol's encoded message sizes (``fedpenalty.v1`` protobuf, ``owner/wire.py``)
as if each owner served itself — its ``QueryRequest`` in, its ``QueryReply`` out — computed
the same way on every transport, so the figures agree across in-process, Ray and gRPC (on
gRPC with one owner per host they equal the bytes gRPC serialises, ``grpc_network``).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..common import OwnerDescription, PrivacyReport
from ..kinds import KindTerms, query_kind
from ..kinds.per_owner import has_owner_axis, owner_rows
from ..owner import wire
from ..owner.aggregation import Reply
from ..proto import owner_pb2 as pb
from .network import Network
from .oracle import Answers, Oracle, SecureAggregation, Unreported


def varint_bytes(n: int) -> int:
    """Bytes of the protobuf varint of the int64 ``n`` (negative: ten)."""
    return 10 if n < 0 else max(1, (int(n).bit_length() + 6) // 7)


def _varints(values: np.ndarray) -> int:
    """Bytes of the varints of the integers ``values`` (int64: negative ones take ten; uint64
    as they are), packed, without tag and length."""
    flat = np.asarray(values).ravel()
    if not flat.size or (flat.min() >= 0 and flat.max() < 128):
        return int(flat.size)
    return sum(varint_bytes(int(v)) for v in flat)


def _field(payload: int) -> int:
    """A length-delimited field of ``payload`` bytes with its one-byte tag."""
    return 1 + varint_bytes(payload) + payload


def _packed(payload: int) -> int:
    """A packed repeated field: nothing when empty (proto3), else ``_field``."""
    return _field(payload) if payload else 0


def _array_bytes(name: str, value: Any) -> int:
    """Bytes of ``wire._named_array(name, value)`` inside its ``KindQuery`` (tag and length
    included): integer arrays as zigzag varints, the rest as float64 (whose size depends only
    on the name and shape: cached)."""
    if isinstance(value, float):
        return _float_array_bytes(name, ())
    arr = np.asarray(value)
    if arr.dtype.kind not in "iu":
        return _float_array_bytes(name, arr.shape)
    flat = arr.astype(np.int64).ravel()
    size = _field(len(name.encode())) + _packed(_varints(np.asarray(arr.shape)))
    size += _packed(_varints(((flat << 1) ^ (flat >> 63)).view(np.uint64)))  # zigzag
    return _field(size)


@functools.lru_cache(maxsize=256)
def _float_array_bytes(name: str, shape: tuple[int, ...]) -> int:
    payload = 8 * math.prod(shape)
    return _field(
        _field(len(name.encode())) + _packed(_varints(np.asarray(shape))) + _packed(payload)
    )


@functools.lru_cache(maxsize=256)
def _chain_bytes(chains: bytes) -> int:
    """Bytes of the packed chain ids (``chains``: their int64 buffer)."""
    return _packed(_varints(np.frombuffer(chains, dtype=np.int64)))


def request_bytes(
    kind: str, session: str, iteration: int, chains: np.ndarray, arrays: Mapping[str, Any],
    substep: int, request_id: int,
) -> int:  # fmt: skip
    """Bytes of the ``QueryRequest`` (id ``request_id`` ≥ 1) carrying this query to one owner:
    ``wire.kind_query``'s message, sized by the protobuf encoding rules without building it
    (tests/test_cost.py checks it against ``ByteSize``)."""
    query = (
        _packed(len(kind.encode()))
        + _packed(len(session.encode()))
        + (1 + varint_bytes(iteration) if iteration else 0)
        + _chain_bytes(np.asarray(chains, dtype=np.int64).tobytes())
        + sum(_array_bytes(name, value) for name, value in arrays.items())
        + (1 + varint_bytes(substep) if substep else 0)
    )
    return 1 + varint_bytes(request_id) + _field(query)


def reply_bytes(row_shape: tuple[int, ...], keys: int, secure: bool, request_id: int) -> int:
    """Bytes of one owner's ``QueryReply`` (id ``request_id``): answers of ``row_shape`` (one
    owner's, without the owner axis) — plain float64, or in a secure session its masked
    uint64 words with ``keys`` check words — and its noise sd. Every field but the shape is
    fixed-width, so zeros give the exact size."""
    shape = (1, *row_shape)
    if secure:
        reply = Reply(np.zeros(shape, np.uint64), np.ones(1), 1.0, np.zeros((1, keys), np.uint64))
    else:
        reply = Reply(np.zeros(shape), np.ones(1))
    answers = wire.answers_message(reply)
    return pb.QueryReply(id=request_id, answers=answers).ByteSize()


@dataclass
class CostMeter:
    """Counters of one run's protocol cost for owners packed ``host_sizes`` per host (owner
    order). Every owner receives every query, so ``requests`` and ``answers`` (keys) are
    one count for all; bytes are counted once for all owners when a query is the same for
    each (``uniform_*``) and per owner otherwise (``owner_*``, θ rows per owner);
    ``session_calls``: open and report round trips (each to every owner). Per query (for the
    network model): the slowest host's seconds net of imposed delays and one owner's bytes in
    and out (the most any owner had)."""

    host_sizes: list[int]
    requests: int = 0
    answers: int = 0
    session_calls: int = 0
    uniform_received: int = 0
    uniform_sent: int = 0
    owner_received: np.ndarray = field(init=False)
    query_seconds: list[float] = field(default_factory=list)
    query_in: list[int] = field(default_factory=list)
    query_out: list[int] = field(default_factory=list)
    imposed_seconds: float = 0.0
    started: float | None = None
    ended: float | None = None

    def __post_init__(self) -> None:
        self.owner_received = np.zeros(sum(self.host_sizes), np.int64)
        #: each owner's share of its host's time (1 / its host's owners)
        self.share = np.repeat([1.0 / n for n in self.host_sizes], self.host_sizes)

    @property
    def bytes_received(self) -> np.ndarray:
        """Query bytes each owner received ``(K,)``."""
        return self.uniform_received + self.owner_received

    @property
    def bytes_sent(self) -> np.ndarray:
        """Reply bytes each owner sent ``(K,)``."""
        return np.full(len(self.share), self.uniform_sent, np.int64)

    @property
    def compute_seconds(self) -> np.ndarray:
        """Each owner's share of its host's answer time ``(K,)``, s."""
        return sum(self.query_seconds) * self.share

    def mark(self) -> None:
        """A call ended now (the first one also starts the wall clock)."""
        now = time.perf_counter()
        self.started = now if self.started is None else self.started
        self.ended = now

    def record(
        self, received: int | np.ndarray, sent: int, keys: int, seconds: float, imposed: float
    ) -> None:
        """One query: the bytes each owner ``received`` (one number for all, or ``(K,)``) and
        ``sent``, its ``keys`` answers, in ``seconds`` of which ``imposed`` were network
        delays imposed for real."""
        net = max(seconds - imposed, 0.0)
        self.requests += 1
        self.answers += keys
        if isinstance(received, np.ndarray):
            self.owner_received += received
            self.query_in.append(int(received.max()))
        else:
            self.uniform_received += received
            self.query_in.append(received)
        self.uniform_sent += sent
        self.query_seconds.append(net)
        self.query_out.append(sent)
        self.imposed_seconds += imposed

    @property
    def wall_seconds(self) -> float:
        """From the session's opening to the last call's end (s)."""
        return 0.0 if self.started is None or self.ended is None else self.ended - self.started

    def simulated_wall(self, network: Network, seed: int) -> float:
        """The run's wall clock on ``network`` (s): the coordinator's own time (the wall clock
        less the queries' and any imposed delays) plus each query's slowest owner
        (``Network.query_seconds``: its compute share, latency, transfer, straggling drawn
        from ``seed``)."""
        rng = np.random.default_rng(np.random.SeedSequence([seed, 0x434F5354]))
        own = self.wall_seconds - sum(self.query_seconds) - self.imposed_seconds
        priced = sum(
            network.query_seconds(t * self.share, b_in, b_out, rng)
            for t, b_in, b_out in zip(self.query_seconds, self.query_in, self.query_out)
        )
        return max(own, 0.0) + priced


class MeteredOracle(Oracle):
    """``inner`` with every call counted in ``meter`` (a ``CostMeter``); answers unchanged.
    ``network``: imposed for real when the transport can (``Oracle.impose_network``: gRPC),
    else only priced (``CostMeter.simulated_wall``)."""

    def __init__(self, inner: Oracle, network: Network | None = None):
        self.inner = inner
        self.meter = CostMeter(inner.host_sizes())
        self.network = network
        self.imposed = network is not None and inner.impose_network(network)
        self.session = ""
        self.secure = False
        self._reply_sizes: dict[tuple[Any, ...], int] = {}

    def describe(self) -> list[OwnerDescription]:
        return self.inner.describe()

    def host_sizes(self) -> list[int]:
        return self.inner.host_sizes()

    def open_kinds(
        self,
        terms: Sequence[KindTerms],
        session: str | None = None,
        secure: SecureAggregation | None = None,
    ) -> str:
        self.meter.mark()
        self.session = self.inner.open_kinds(terms, session, secure)
        self.secure = secure is not None
        self._session_call()
        return self.session

    def query(
        self, kind: str, iteration: int, chains: np.ndarray, substep: int = 0, **arrays: Any
    ) -> Answers:
        start = time.perf_counter()
        answers = self.inner.query(kind, iteration, chains, substep, **arrays)
        seconds = time.perf_counter() - start
        asked = query_kind(kind)
        owners, request_id = len(self.meter.share), self.meter.requests + 1
        received: int | np.ndarray
        if has_owner_axis(arrays, owners):
            rows = owner_rows(arrays, owners)
            received = np.array(
                [request_bytes(asked.name, self.session, iteration, chains, r, substep, request_id)
                for r in rows]
            )  # fmt: skip
        else:
            received = request_bytes(
                asked.name, self.session, iteration, chains, arrays, substep, request_id
            )
        keys = len(chains) * asked.keys_per_chain(arrays)
        sent = self._reply_size(tuple(answers.values.shape[1:]), keys, request_id)
        imposed = self.inner.injected_seconds() if self.imposed else 0.0
        self.meter.record(received, sent, keys, seconds, imposed)
        self.meter.mark()
        return answers

    def _reply_size(self, row_shape: tuple[int, ...], keys: int, request_id: int) -> int:
        """``reply_bytes`` through a cache keyed by everything but the id's value (only its
        varint's length varies)."""
        key = (row_shape, keys, self.secure)
        if key not in self._reply_sizes:
            self._reply_sizes[key] = reply_bytes(row_shape, keys, self.secure, 1) - 1
        return self._reply_sizes[key] + varint_bytes(request_id)

    def _session_call(self) -> None:
        self.meter.session_calls += 1
        self.meter.mark()

    def privacy_reports(self) -> list[PrivacyReport]:
        reports = self.inner.privacy_reports()
        self._session_call()
        return reports

    def reachable_reports(self) -> list[PrivacyReport | Unreported]:
        reports = self.inner.reachable_reports()
        self._session_call()
        return reports

    def close(self) -> None:
        self.inner.close()

    def disconnect(self) -> None:
        self.inner.disconnect()

    def simulation_diagnostics(self) -> dict[str, Any] | None:
        return self.inner.simulation_diagnostics()

    def persist(self) -> None:
        self.inner.persist()

    def measured_bytes(self) -> list[tuple[int, int]] | None:
        return self.inner.measured_bytes()


#: cost.json's ``note``: what its figures are.
COST_NOTE = (
    "per owner: requests = queries it answered (one round trip each), round_trips = requests "
    "+ session calls (open, privacy reports), answers = keys (chain × iteration) answered; "
    "bytes = the fedpenalty.v1 protobuf QueryRequest received and QueryReply sent, as if the "
    "owner served itself (the same on every transport); compute_seconds = its share of its "
    "host's answer time as the coordinator measured it (the host's seconds / its owners)"
)


def _network_mode(oracle: MeteredOracle) -> str | None:
    """cost.json's ``network``: None, "simulated" (priced) or "imposed" (for real)."""
    if oracle.network is None:
        return None
    return "imposed" if oracle.imposed else "simulated"


def _per_thousand(value: float, ess: float | None) -> float | None:
    return None if not ess else 1000.0 * value / ess


def cost_report(
    oracle: MeteredOracle, names: Sequence[str], ess: float | None, seed: int, transport: str
) -> dict[str, Any]:
    """cost.json's content (docs/design.md §5) for the run behind ``oracle``: per owner
    (``names``) and totals, per-1,000-ESS figures at bulk ``ess`` (the least over the
    parameters; None: no ESS), the wall clock, and with a network the simulated one (in-process
    and Ray; straggling drawn from ``seed``) or the delays imposed for real (gRPC)."""
    m = oracle.meter
    received, sent, compute = m.bytes_received, m.bytes_sent, m.compute_seconds
    rows: list[dict[str, Any]] = [
        {
            "owner": name,
            "requests": m.requests,
            "round_trips": m.requests + m.session_calls,
            "answers": m.answers,
            "bytes_received": int(received[k]),
            "bytes_sent": int(sent[k]),
            "compute_seconds": float(compute[k]),
        }
        for k, name in enumerate(names)
    ]
    keys = ("requests", "round_trips", "answers", "bytes_received", "bytes_sent")
    totals: dict[str, Any] = {key: sum(r[key] for r in rows) for key in keys}
    totals["compute_seconds"] = float(compute.sum())
    owners = max(len(rows), 1)
    megabytes = (totals["bytes_received"] + totals["bytes_sent"]) / 1e6 / owners
    wall = m.wall_seconds
    simulated = None
    if oracle.network is not None and not oracle.imposed:
        simulated = m.simulated_wall(oracle.network, seed)
    hours = (simulated if simulated is not None else wall) / 3600
    return {
        "note": COST_NOTE,
        "transport": transport,
        "owners": rows,
        "totals": totals,
        "ess_bulk_min": ess,
        "per_1000_ess": {
            "round_trips_per_owner": _per_thousand(totals["round_trips"] / owners, ess),
            "megabytes_per_owner": _per_thousand(megabytes, ess),
            "compute_seconds_per_owner": _per_thousand(totals["compute_seconds"] / owners, ess),
        },
        "wall_seconds": wall,
        "query_seconds": float(sum(m.query_seconds)),
        "network": None
        if oracle.network is None
        else ("imposed" if oracle.imposed else "simulated"),
        "imposed_delay_seconds": m.imposed_seconds,
        "simulated_wall_seconds": simulated,
        "ess_per_hour": None if not ess or hours <= 0 else ess / hours,
        "measured_host_bytes": oracle.measured_bytes(),
    }


def cost_line(cost: Mapping[str, Any]) -> str:
    """The console's one line about ``cost`` (``cost_report``)."""
    per = cost["per_1000_ess"]
    owners = max(len(cost["owners"]), cost.get("owners_summary", {}).get("owners", 0), 1)
    trips = cost["totals"]["round_trips"] / owners
    megabytes = (cost["totals"]["bytes_received"] + cost["totals"]["bytes_sent"]) / 1e6 / owners
    line = f"\nProtocol cost per owner: {trips:,.0f} round trips, {megabytes:.3g} MB"
    if per["megabytes_per_owner"] is not None:
        line += (
            f" ({per['round_trips_per_owner']:,.0f} round trips, "
            f"{per['megabytes_per_owner']:.3g} MB per 1,000 ESS)"
        )
    clock = cost["simulated_wall_seconds"]
    if clock is not None:
        line += f"; simulated wall clock on the modelled network {clock:,.1f} s"
    elif cost["network"] == "imposed":
        line += f"; wall clock with the network imposed {cost['wall_seconds']:,.1f} s"
    return line + " (cost.json)"
