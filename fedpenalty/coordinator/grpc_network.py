"""The network on a real gRPC channel (docs/design.md §5, "Protocol cost"): the bytes gRPC
serialises on each host's ``Query`` stream, and the delays of a modelled network imposed for
real on it.

``MeasuredChannel`` wraps a ``grpc.aio.Channel`` so that the ``Query`` stream's serialiser and
deserialiser count every message's bytes (the protobuf encoding, without gRPC's 5-byte frame
prefix). ``HostDelays`` draws, per query and host, what ``Network`` says its slowest owner
waits — latency both ways, straggling, the request's download and the reply's upload — and
the host's stream sleeps that long once its reply is read (one wake-up a query: each extra
one costs a scheduling delay on a loaded machine), on each host's own stream, so the hosts'
delays overlap with each other's work as an iteration's owners' do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .network import Network

QUERY_METHOD = "/fedpenalty.v1.Owner/Query"


@dataclass
class ByteCount:
    """Bytes serialised to a host (``sent``) and parsed from it (``received``)."""

    sent: int = 0
    received: int = 0
    #: the size of the last reply parsed (for its upload delay)
    last_reply: int = 0


class MeasuredChannel:
    """``channel`` whose ``Query`` stream counts its messages' bytes in ``count``; every
    other method is the channel's own."""

    def __init__(self, channel: Any, count: ByteCount):
        self._channel, self.count = channel, count

    def stream_stream(
        self,
        method: str,
        request_serializer: Callable[[Any], bytes] | None = None,
        response_deserializer: Callable[[bytes], Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        if method != QUERY_METHOD or request_serializer is None or response_deserializer is None:
            return self._channel.stream_stream(
                method, request_serializer, response_deserializer, **kwargs
            )
        serialise, parse, count = request_serializer, response_deserializer, self.count

        def counted_serialise(message: Any) -> bytes:
            data = serialise(message)
            count.sent += len(data)
            return data

        def counted_parse(data: bytes) -> Any:
            count.received += len(data)
            count.last_reply = len(data)
            return parse(data)

        return self._channel.stream_stream(method, counted_serialise, counted_parse, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)


@dataclass
class HostDelays:
    """``network``'s delays for hosts of ``sizes`` owners (owner order), straggling drawn
    from ``rng``. ``waited``: per host, the seconds imposed on the current query."""

    network: Network
    sizes: Sequence[int]
    rng: np.random.Generator
    waited: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._starts = np.cumsum([0, *self.sizes])
        self.waited = [0.0] * len(self.sizes)

    def seconds(self, host: int, request_bytes: int, reply_bytes: int) -> float:
        """Seconds ``host``'s exchange waits besides the host's own time: its slowest owner's
        latency both ways and straggling, the download of ``request_bytes`` and the upload
        of ``reply_bytes``."""
        net = self.network
        owners = slice(self._starts[host], self._starts[host + 1])
        late = self.rng.random(self.sizes[host]) < net.probability if net.probability else 0.0
        delay = float(np.max(2 * net.latency[owners] + late * net.delay))
        delay += request_bytes / net.down + reply_bytes / net.up
        self.waited[host] = delay
        return delay
