"""The oracle over gRPC: the coordinator's side of the ``fedpenalty.v1.Owner`` protocol.

One persistent channel per owner host. Each iteration's request is written to every host's
long-lived ``Query`` stream at once and the replies are awaited together (asyncio), so an
iteration costs one round trip to the slowest host, not one per owner. Every call has a
deadline; a host that is unreachable, times out or drops its stream is retried with backoff —
safe because every request except ``CloseSession`` is idempotent (owners replay stored answers
for a re-sent (session, chain, iteration)) — and after ``retry_seconds`` it is reported as
``OwnerUnavailable`` — except an owner whose TLS certificate does not name the address
dialled, which no retry can fix: that is said at once, with the names the certificate holds
(``tls_names``). Owner refusals come back as the ``fedpenalty.errors`` class the owner
raised (``BudgetExhausted`` with the owner's name and ε left). An owner host restarted inside
the retry window knows the run's session only once it is re-opened: a query it refuses as an
unknown session re-opens the session at that host (the same ``OpenSession`` as the first,
through the owner's full admission: a plan it re-admits reserves only what is still
unanswered, and keys it answered before replay from its ledger uncharged) and is asked once
more (``_reopen``). ``reachable_reports`` asks each host for its owners' reports on its own,
so a host that is gone (tried once more, briefly, when a query already gave up on it) loses
only its owners' reports.

Ctrl-C (SIGINT) while a call runs cancels it at its next await and raises ``KeyboardInterrupt``
once the event loop is idle (``_run``): an interrupt raised inside the loop would leave
half-run tasks and a pending stop of the loop behind, which broke the next call (the run then
exited with a traceback or 130 instead of stopping resumably; docs/design.md §4).

Secure aggregation (docs/design.md §2.6): ``open_session`` first collects every owner's session
key (``SessionKeys``) and relays all of them in ``OpenSession``; each host then replies with its
owners' masked sum, and ``secure_sum.combine`` adds the hosts' sums and decodes — only when
every host answered, so a host that drops out stops the run (resumably) and nothing is decoded.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import numpy as np

from ..cluster.local import LocalCluster, default_owner_hosts
from ..common import OwnerDescription, PrivacyReport
from ..errors import ConfigError, OwnerError, OwnerUnavailable, UnknownSession
from ..kinds import KINDS, KindTerms, query_kind
from ..kinds.per_owner import split_by_host
from ..models import Model, check_owner_models
from ..models.compat import ModelIdentity
from ..owner import wire
from ..owner.aggregation import PeerKey
from ..owner.owner_config import TlsFiles
from ..owner.session_request import SessionRequest
from ..proto import owner_pb2 as pb
from ..proto import owner_pb2_grpc as pb_grpc
from .grpc_network import ByteCount, HostDelays, MeasuredChannel
from .network import Network
from .oracle import Answers, Oracle, SecureAggregation, Unreported
from .secure_sum import combine, owner_noise_sd, secure_open
from .tls_names import is_name_mismatch, mismatch_message
from .transport_base import Launched, OwnerSetup, Transport

_RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
}


def _transport_failure(exc: grpc.aio.AioRpcError) -> bool:
    """The call failed in transport, not by an owner's refusal: retry it (every query is
    idempotent). An owner that stops while a call is in flight ends it with INTERNAL
    "Internal error from Core" — gRPC's own failure, never one the owner raises."""
    if exc.code() in _RETRYABLE:
        return True
    return exc.code() == grpc.StatusCode.INTERNAL and "from Core" in (exc.details() or "")


MAX_MESSAGE_BYTES = 256 * 1024 * 1024
#: Seconds one more report request to a host that a query already gave up on may take.
LOST_HOST_SECONDS = 5.0
T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass
class _Host:
    """One owner host: its channel, stub, owners and (lazily opened) Query stream;
    ``answers``: the answers (keys) each of its owners gave this coordinator; ``lost``: a call
    gave up on it (``OwnerUnavailable``)."""

    address: str
    channel: grpc.aio.Channel
    stub: pb_grpc.OwnerStub
    owners: list[OwnerDescription] = field(default_factory=list)
    stream: Any = None
    next_id: int = 0
    answers: int = 0
    lost: bool = False
    #: the bytes of its Query stream (``grpc_network.MeasuredChannel``)
    count: ByteCount = field(default_factory=ByteCount)

    def drop_stream(self) -> None:
        if self.stream is not None:
            self.stream.cancel()
            self.stream = None

    def label(self) -> str:
        names = ", ".join(o.name for o in self.owners[:5]) + (", …" if len(self.owners) > 5 else "")
        return f"owner host {self.address}" + (f" ({names})" if names else "")


def channel_credentials(tls: TlsFiles) -> grpc.ChannelCredentials:
    """Verify owners against ``tls.ca`` and present ``tls.cert``/``tls.key`` (for mTLS)."""
    cert, key, ca = tls.read()
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )


class GrpcOracle(Oracle):
    """All owners behind ``addresses`` (HOST:PORT of owner hosts), in address order then each
    host's owner order. ``model``: when given, every owner must serve exactly this model.
    ``deadline``: seconds one call may take; ``retry_seconds``: how long an unreachable host
    is retried before ``OwnerUnavailable``."""

    def __init__(
        self,
        addresses: Sequence[str],
        model: Model | None = None,
        tls: TlsFiles | None = None,
        *,
        deadline: float = 60.0,
        retry_seconds: float = 20.0,
    ):
        if not addresses:
            raise ConfigError("give at least one owner address HOST:PORT")
        self.deadline, self.retry_seconds = deadline, retry_seconds
        self.session: str | None = None
        #: the run's ``OpenSession`` request, sent again to a host that restarted (``_reopen``)
        self._opened: pb.OpenSessionRequest | None = None
        self._loop = asyncio.new_event_loop()
        options = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ]
        creds = channel_credentials(tls) if tls else None
        self._plaintext, self._tls = creds is None, tls
        self._hosts: list[_Host] = []
        for address in addresses:
            channel = self._run(self._open_channel(address, creds, options))
            count = ByteCount()
            stub = pb_grpc.OwnerStub(MeasuredChannel(channel, count))
            self._hosts.append(_Host(address, channel, stub, count=count))
        #: a modelled network's delays, imposed on every query (``impose_network``)
        self._delays: HostDelays | None = None
        try:
            replies = self._run(
                self._each(lambda h: self._unary(h, h.stub.Describe, pb.DescribeRequest()))
            )
            for host, reply in zip(self._hosts, replies):
                host.owners = [wire.owner_description(o) for o in reply.owners]
            names = [o.name for o in self.describe()]
            if len(set(names)) != len(names):
                raise ConfigError(f"owner names must be unique across hosts: {names}")
            if model is not None:
                check_owner_models(self.describe(), model)
        except BaseException:
            self._run(self._close_channels())
            self._loop.close()
            raise
        policies = [o.policy for o in self.describe()]
        #: each kind's described noise level σ_k ``(K,)`` by ledger name (``Policy.noise_for``)
        self._levels = {
            kind.ledger_name: np.array([p.noise_for(kind.ledger_name) for p in policies])
            for kind in KINDS.values()
        }
        self._secure: SecureAggregation | None = None
        #: the scenario's model, named in every session request (the owners check it)
        self._model = None if model is None else ModelIdentity.of(model)

    @staticmethod
    async def _open_channel(address: str, creds, options) -> grpc.aio.Channel:
        if creds is None:
            return grpc.aio.insecure_channel(address, options=options)
        return grpc.aio.secure_channel(address, creds, options=options)

    # --- the Oracle interface ---------------------------------------------------------------
    def describe(self) -> list[OwnerDescription]:
        return [o for h in self._hosts for o in h.owners]

    def open_kinds(
        self,
        terms: Sequence[KindTerms],
        session: str | None = None,
        secure: SecureAggregation | None = None,
    ) -> str:
        """Open (or resume) a session of the kinds ``terms`` at every host: one kind in the
        single-kind fields of ``OpenSession`` (as before sessions of several kinds), several
        in its ``kinds`` (``wire.open_message``)."""
        session = session or uuid.uuid4().hex
        peers = None
        if secure is not None:
            keys = self._session_keys(session)
            peers = secure_open(keys, secure, lambda k: self._reveal_shares(session, k))
        asked = SessionRequest.several(session, terms, secure=peers, model=self._model)
        request = wire.open_message(asked)
        self._run(self._each(lambda h: self._unary(h, h.stub.OpenSession, request)))
        self._secure = secure
        self.session, self._opened = session, request
        return session

    def _session_keys(self, session: str) -> list:
        """Every owner's public key for ``session``, in owner order (secure aggregation)."""
        request = pb.SessionKeysRequest(session=session)
        replies = self._run(self._each(lambda h: self._unary(h, h.stub.SessionKeys, request)))
        keys = [wire.peer_key(k) for reply in replies for k in reply.keys]
        if [k.owner for k in keys] != [o.name for o in self.describe()]:
            raise OwnerError("the owner hosts sent session keys of other owners than they describe")
        return keys

    def _reveal_shares(self, session: str, keys: Sequence[PeerKey]) -> list[PeerKey]:
        """Every host's owners' graph shares for ``session``, given every owner's key and
        commitment ``keys`` (``RevealShares``; secure aggregation with a sparse graph)."""
        request = pb.RevealSharesRequest(session=session)
        request.peers.extend(wire.peer_key_message(k) for k in keys)
        replies = self._run(self._each(lambda h: self._unary(h, h.stub.RevealShares, request)))
        return [wire.peer_key(k) for reply in replies for k in reply.shares]

    def query(
        self, kind: str, iteration: int, chains: np.ndarray, substep: int = 0, **arrays: Any
    ) -> Answers:
        """One query on every host's stream, as a ``KindQuery`` (any registered kind) at
        ``substep``."""
        asked = query_kind(kind)
        session = self._require_session()
        parts = split_by_host(arrays, [len(h.owners) for h in self._hosts])
        messages = {  # one message when the request is flat; each host's rows otherwise
            id(part): wire.kind_query(asked.name, session, iteration, chains, part, substep)
            for part in parts
        }
        by_host = {id(h): messages[id(part)] for h, part in zip(self._hosts, parts)}
        keys = len(chains) * asked.keys_per_chain(arrays)

        def fill(request: pb.QueryRequest, host: _Host) -> None:
            request.kind_query.CopyFrom(by_host[id(host)])

        levels = self._levels[asked.ledger_name]
        declared = owner_noise_sd(self._secure, levels, len(levels))
        return self._query(fill, declared * asked.reply_scale(arrays), keys)

    def privacy_reports(self) -> list[PrivacyReport]:
        request = pb.PrivacyReportRequest(session=self.session or "")
        replies = self._run(self._each(lambda h: self._unary(h, h.stub.PrivacyReport, request)))
        return [wire.privacy_report(o) for reply in replies for o in reply.owners]

    def reachable_reports(self) -> list[PrivacyReport | Unreported]:
        request = pb.PrivacyReportRequest(session=self.session or "")

        async def host_reports(host: _Host) -> list[PrivacyReport | Unreported]:
            quick = LOST_HOST_SECONDS if host.lost else None
            try:
                reply = await self._unary(host, host.stub.PrivacyReport, request, quick)
            except OwnerError as exc:
                status = "unreachable" if isinstance(exc, OwnerUnavailable) else "refused"
                return [Unreported(o.name, status, str(exc), host.answers) for o in host.owners]
            return [wire.privacy_report(o) for o in reply.owners]

        return [r for block in self._run(self._each(host_reports)) for r in block]

    def close(self) -> None:
        """Close the session at every owner (not retried: closing is not idempotent), then the
        streams and channels. Safe to call twice."""
        if self._loop.is_closed():
            return
        try:
            if self.session is not None:
                request = pb.CloseSessionRequest(session=self.session)
                self._run(self._each(lambda h: self._close_at(h, request)))
                self.session, self._opened = None, None
        finally:
            self._run(self._close_channels())
            self._loop.close()

    async def _close_at(self, host: _Host, request: pb.CloseSessionRequest) -> None:
        """``CloseSession`` at ``host``, once (closing is not idempotent); a host that restarted
        and no longer knows the session has it re-opened (``_reopen``) and then closed, so that
        what its plan reserved is released."""
        for attempt in range(2):
            try:
                await host.stub.CloseSession(request, timeout=self.deadline)
                return
            except grpc.aio.AioRpcError as exc:
                unknown = exc.code() == grpc.StatusCode.NOT_FOUND and self._opened is not None
                if attempt or not unknown:
                    raise _owner_error(exc, host) from None
            await self._unary(host, host.stub.OpenSession, self._opened)

    def disconnect(self) -> None:
        """Drop the channels without closing the session (it stays open for a resumed run)."""
        if not self._loop.is_closed():
            self._run(self._close_channels())
            self._loop.close()

    def simulation_diagnostics(self) -> None:
        """Owners behind a transport never release data-dependent counters."""
        return None

    def host_sizes(self) -> list[int]:
        return [len(h.owners) for h in self._hosts]

    def impose_network(self, network: Network) -> bool:
        """Delay every later query on each host's stream as ``network`` says (straggling
        drawn from a fixed seed): ``grpc_network.HostDelays``."""
        rng = np.random.default_rng(np.random.SeedSequence([0, 0x44454C41]))
        self._delays = HostDelays(network, self.host_sizes(), rng)
        return True

    def injected_seconds(self) -> float:
        return 0.0 if self._delays is None else max(self._delays.waited, default=0.0)

    def measured_bytes(self) -> list[tuple[int, int]]:
        return [(h.count.sent, h.count.received) for h in self._hosts]

    # --- machinery --------------------------------------------------------------------------
    def _require_session(self) -> str:
        if self.session is None:
            raise RuntimeError("open_session must be called first")
        return self.session

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the oracle's event loop; Ctrl-C cancels it (module docstring): the
        streams are dropped, since a cancelled request's reply must not answer the next one,
        and ``KeyboardInterrupt`` is raised here."""
        task = self._loop.create_task(coro)
        with _sigint_cancels(self._loop, task) as interrupted:
            try:
                result = self._loop.run_until_complete(task)
            except asyncio.CancelledError:
                if not interrupted:
                    raise
                for host in self._hosts:
                    host.drop_stream()
        if interrupted:
            raise KeyboardInterrupt
        return result

    async def _each(self, call: Callable[[_Host], Awaitable]) -> list:
        """``call`` on every host concurrently; waits for all, then raises the first error."""
        if len(self._hosts) == 1:
            return [await call(self._hosts[0])]
        results = await asyncio.gather(*(call(h) for h in self._hosts), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return results

    def _query(
        self, fill: Callable[[pb.QueryRequest, _Host], None], declared: np.ndarray, keys: int
    ) -> Answers:
        """One query of ``keys`` answers per owner on every host's stream. Each owner's noise
        sd must be ``declared`` ``(K,)``: what its described policy gives for the asked kind
        (σ_k, or s/√(K − t) with secure aggregation) times the answer unit (1, or the clip of
        gradient answers)."""
        messages = self._run(self._each(lambda h: self._stream_query(h, fill, keys)))
        replies = []
        for host, message in zip(self._hosts, messages):
            reply = wire.answers_reply(message.answers)
            if len(reply.noise_sd) != len(host.owners):
                raise OwnerError(
                    f"{host.label()} answered for {len(reply.noise_sd)} owners, it described "
                    f"{len(host.owners)}"
                )
            replies.append(reply)
        noise_sd = np.concatenate([r.noise_sd for r in replies])
        # np.isclose(rtol=1e-12, atol=0) without its cost (~0.2 ms); NaN and inf are wrong
        wrong = ~(np.abs(noise_sd - declared) <= 1e-12 * np.abs(declared))
        if wrong.any():
            k = int(np.argmax(wrong))
            raise OwnerError(
                f"owner {self.describe()[k].name!r} answered with noise sd {noise_sd[k]:g}, but "
                f"its "
                f"described policy gives {declared[k]:g}"
            )
        return combine(replies)

    async def _stream_query(
        self, host: _Host, fill: Callable[[pb.QueryRequest, _Host], None], keys: int
    ) -> pb.QueryReply:
        async def attempt() -> pb.QueryReply:
            if host.stream is None:
                host.stream = host.stub.Query()
            host.next_id += 1
            request = pb.QueryRequest(id=host.next_id)
            fill(request, host)
            await host.stream.write(request)
            reply = await host.stream.read()
            if reply is grpc.aio.EOF:
                raise _Dropped("the owner host ended the stream")
            await self._delay(host, request)
            if reply.id != request.id:
                raise OwnerError(
                    f"{host.label()} answered request {reply.id} to request {request.id}"
                )
            return reply

        reply = await self._retrying(host, attempt, stream=True)
        if reply.HasField("refusal") and await self._reopen(host, reply.refusal):
            reply = await self._retrying(host, attempt, stream=True)
        if reply.HasField("refusal"):
            raise wire.error_from_refusal(reply.refusal, host.address)
        host.answers += keys
        return reply

    async def _delay(self, host: _Host, request: pb.QueryRequest) -> None:
        """An imposed network's delay (``impose_network``) for ``request``, whose reply was
        just read: ``grpc_network.HostDelays.seconds``."""
        if self._delays is not None:
            index, size = self._hosts.index(host), request.ByteSize()
            await asyncio.sleep(self._delays.seconds(index, size, host.count.last_reply))

    async def _reopen(self, host: _Host, refusal: pb.Refusal) -> bool:
        """Re-open the run's session at ``host`` when ``refusal`` says it does not know it (it
        restarted and lost its open sessions): True once re-opened, False for any other
        refusal. The owner admits the re-open as it admits any open (its client check, the
        same terms, the plan against its budget less what the session already spent); a
        refusal of it (a session the owner closed, say) is raised."""
        error = wire.error_from_refusal(refusal, host.address)
        if self._opened is None or not isinstance(error, UnknownSession):
            return False
        await self._unary(host, host.stub.OpenSession, self._opened)
        log.warning(
            "%s no longer knew session %s (restarted?): re-opened it; answered queries replay "
            "from its ledger, uncharged",
            host.label(),
            self._opened.session,
        )
        return True

    async def _unary(self, host: _Host, method, request, quick: float | None = None):
        """``method(request)`` on ``host``, retried; ``quick``: one try of at most that many
        seconds instead (a host already given up on)."""
        timeout = self.deadline if quick is None else min(quick, self.deadline)
        return await self._retrying(
            host, lambda: method(request, timeout=timeout), stream=False, retry=quick is None
        )

    async def _retrying(
        self, host: _Host, attempt: Callable[[], Awaitable], stream: bool, retry: bool = True
    ):
        """Run an idempotent ``attempt``, retrying transport failures for ``retry_seconds``
        (``retry`` False: once). Giving up marks the host ``lost``."""
        give_up = time.monotonic() + (self.retry_seconds if retry else 0.0)
        pause, tries = 0.05, 0
        while True:
            tries += 1
            try:
                if stream:
                    async with asyncio.timeout(self.deadline):
                        return await attempt()
                return await attempt()
            except grpc.aio.AioRpcError as exc:
                if stream:
                    host.drop_stream()
                if not _transport_failure(exc):
                    raise _owner_error(exc, host) from None
                if self._tls is not None and is_name_mismatch(exc.details()):
                    host.lost = True  # no retry can change the owner's certificate
                    raise OwnerUnavailable(
                        await mismatch_message(host.address, self._tls)
                    ) from None
                failure = f"{exc.code().name}: {exc.details()}"
            except (TimeoutError, _Dropped) as exc:
                host.drop_stream()
                failure = str(exc) or f"no reply within {self.deadline:g} s"
            except asyncio.InvalidStateError:  # a write to a stream the host ended (it stopped)
                host.drop_stream()
                failure = "the owner host ended the stream"
            if time.monotonic() + pause > give_up:
                host.lost = True
                over = f" over {self.retry_seconds:g} s" if retry else ""
                raise OwnerUnavailable(
                    f"{host.label()} is unreachable after {tries} "
                    f"attempt{'s' if tries > 1 else ''}{over} ({failure}){self._tls_hint(failure)}"
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)

    def _tls_hint(self, failure: str) -> str:
        """A likely TLS mismatch, said plainly: a plaintext client sees a TLS owner close the
        socket; a TLS client sees a failed handshake from a plaintext owner or a foreign CA."""
        if self._plaintext and "Socket closed" in failure:
            return (
                "; if the owner serves TLS, this plaintext client cannot talk to it: give the "
                "coordinator --tls-cert, --tls-key and --tls-ca"
            )
        if not self._plaintext and ("ssl" in failure.lower() or "handshake" in failure.lower()):
            return (
                "; the TLS handshake failed: the owner may serve plaintext, or its certificate is "
                "not signed by --tls-ca"
            )
        return ""

    async def _close_channels(self) -> None:
        for host in self._hosts:
            host.drop_stream()
            await host.channel.close()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        await asyncio.gather(*others, return_exceptions=True)  # the cancelled streams' bookkeeping


class _Dropped(Exception):
    """A stream ended without a reply (the host stopped)."""


@contextmanager
def _sigint_cancels(loop: asyncio.AbstractEventLoop, task: asyncio.Task) -> Iterator[list[bool]]:
    """While inside, SIGINT cancels ``task`` (through ``loop``'s thread-safe queue, which also
    wakes it) instead of raising ``KeyboardInterrupt`` inside ``loop``; the yielded list is
    non-empty once it did. Only where Python's default SIGINT handler is in place, in the main
    thread (an ignored or custom handler is left alone). ``signal.signal`` rather than
    ``loop.add_signal_handler``, which took about 0.8 ms a call (it lists the valid signals)."""
    interrupted: list[bool] = []
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield interrupted
        return

    def cancel(signum: int, frame: Any) -> None:
        interrupted.append(True)
        loop.call_soon_threadsafe(task.cancel)

    signal.signal(signal.SIGINT, cancel)
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _owner_error(exc: grpc.aio.AioRpcError, host: _Host) -> OwnerError:
    meta = {k: v for k, v in (exc.trailing_metadata() or ())}
    left = float(meta.get(wire.EPSILON_LEFT_KEY, 0.0))
    message = exc.details() or exc.code().name
    if wire.ERROR_KEY not in meta:
        message = f"{host.label()} refused the request: {exc.code().name}: {message}"
    return wire.make_error(
        meta.get(wire.ERROR_KEY, ""),
        exc.code().name,
        f"{message} [{host.address}]",
        meta.get(wire.OWNER_KEY) or None,
        left,
    )


def launch(setup: OwnerSetup) -> Launched:
    """The simulation's owners as local owner-host processes on loopback gRPC
    (``run.owner_hosts`` of them; 0: one per CPU core but the coordinator's)."""
    cluster = LocalCluster.start(
        setup.folder / "owners",
        setup.model,
        setup.records,
        setup.policies,
        setup.seeds,
        hosts=setup.run["owner_hosts"] or default_owner_hosts(),
        names=setup.names,
    )
    try:
        oracle = GrpcOracle(
            cluster.addresses, setup.model, retry_seconds=setup.run["retry_seconds"]
        )
    except BaseException:
        cluster.stop()
        raise
    return Launched(oracle, cluster.stop)


GRPC = Transport(
    "grpc", "owners as local processes on loopback gRPC (the deployed protocol)", launch
)
