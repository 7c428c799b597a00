"""The owner server: the ``fedpenalty.v1.Owner`` gRPC service in front of an ``OwnerHost``.

Transport only: every answer, refusal and charge comes from the host (one process may serve
many owners, each with its own data, noise and ledger). The server adds standard health
checking and reflection, TLS, one log line per session, and a clean stop on SIGTERM/SIGINT.
Requests are answered one at a time on one worker thread, off the event loop, so the host is
never re-entered and the loop stays free for health checks; the waiting requests are served
fairly between clients and their sessions (``fair.FairWorker``), so a client that floods the
owner with large requests does not make the others wait behind its queue.

Who may ask: with mutual TLS (``tls.ca``) a client needs a certificate signed by that CA that
names (SAN DNS name or subject CN) one of ``allowed_clients``; every Owner RPC of any other
client is refused with PERMISSION_DENIED before any work. A session belongs to the allowed
name that opened it: other clients are refused on it. Without mutual TLS the server listens
on loopback only, unless ``insecure`` (``owner serve --insecure``); there clients have no
identity and sessions are not bound.

Secure aggregation (docs/design.md §2.6): with ``peers`` (OWNER.toml ``server.peer_ca`` and
``server.allowed_peers``) the server signs its owners' session keys with its TLS key (whose
certificate must name every owner it serves) and refuses (PERMISSION_DENIED) a secure session
unless every other owner's key is signed under a peer certificate naming that owner, an allowed
one (``peer_auth.PeerAuth``); only then are the peers ``authenticated`` for its owners. Without
it a deployed owner refuses secure sessions, or by its policy is charged at its own noise alone
(``aggregation.agree``).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import ipaddress
import logging
import signal
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from ..common import PrivacyReport
from ..errors import ConfigError, InvalidRequest, NotPermitted, OwnerError
from ..kinds import QueryKind, query_kind
from ..proto import owner_pb2 as pb
from ..proto import owner_pb2_grpc as pb_grpc
from . import wire
from .fair import FairWorker
from .host import OwnerHost
from .key_requests import KeyRequests
from .owner_config import TlsFiles
from .peer_auth import PeerAuth

log = logging.getLogger("fedpenalty.owner")
SERVICE = pb.DESCRIPTOR.services_by_name["Owner"].full_name
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
#: seconds a thread holds the GIL while another waits for it, in an owner server process
SWITCH_INTERVAL = 0.0005
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
#: who the ledger probes run for in the fair queue (client keys are names or gRPC peers)
_OWNER = ("owner",)


class OwnerServicer(pb_grpc.OwnerServicer):
    """Checks who asks, decodes requests, calls the host, encodes answers or refusals."""

    def __init__(
        self,
        host: OwnerHost,
        allowed_clients: Sequence[str] = (),
        peers: PeerAuth | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        key_requests: KeyRequests | None = None,
    ):
        self.host = host
        self._peers = peers
        #: new secure sessions a client may ask keys for per day (``key_requests``)
        self._key_requests = key_requests if key_requests is not None else KeyRequests()
        self._max_message_bytes = max_message_bytes
        self._names = [d.name for d in host.describe()]
        self._allowed = tuple(allowed_clients)
        self._opened_by: dict[str, str] = {}  # session → the allowed name that opened it
        self.health = HealthServicer()  # standard gRPC health, served next to this
        # the host's work (validation, accounting, answers, charges) runs on this one thread:
        # never on the event loop, which stays free for health checks and other calls, and
        # never two at once, so the host is not re-entered (docs/design.md §3, invariant 9);
        # waiting calls take turns fairly between clients and sessions (invariant 14)
        self._work = FairWorker()
        self._ledgers = list({id(node.ledger): node.ledger for node in host.nodes}.values())
        self._serving = True
        self._recovery: asyncio.Task | None = None
        self._closing = False
        self._waiting_streams: set[asyncio.Task] = set()  # Query streams awaiting a request
        #: seconds between probe writes while a ledger is unwritable
        self.probe_seconds = 2.0

    # --- storage health -------------------------------------------------------------------
    async def _report_storage(self) -> None:
        """Health NOT_SERVING while some ledger cannot be written, SERVING again once it can;
        checked after every request (a ledger's ``writable`` is set by its last write) and,
        while not serving, by a probe write every ``probe_seconds`` (``_recover``), so health
        recovers without waiting for a request that a health-checking client would not send."""
        serving = all(ledger.writable for ledger in self._ledgers)
        if serving == self._serving:
            return
        self._serving = serving
        status = health_pb2.HealthCheckResponse.SERVING if serving else _NOT_SERVING
        log.warning(
            "ledger %s", "writable again: serving" if serving else "unwritable: not serving"
        )
        for name in ("", SERVICE):
            await self.health.set(name, status)
        if not serving and (self._recovery is None or self._recovery.done()):
            self._recovery = asyncio.get_running_loop().create_task(self._recover())

    async def _recover(self) -> None:
        """Probe the unwritable ledgers (on the host's worker thread) until all can be written."""
        while not all(ledger.writable for ledger in self._ledgers):
            await asyncio.sleep(self.probe_seconds)
            if self._closing:
                return
            for ledger in self._ledgers:
                if not ledger.writable:
                    await self._work.submit(_OWNER, "", 1, ledger.probe)
        await self._report_storage()

    async def _unary(
        self,
        context: grpc.aio.ServicerContext,
        client: str | None,
        session: str,
        call: Callable,
        cost: int = 1,
    ):
        """Run ``call`` off the event loop, in ``client``'s and ``session``'s turn for ``cost``
        answers (``_work``); an owner refusal becomes its status code with the error's
        metadata."""
        try:
            return await self._work.submit(_who(context, client), session, cost, call)
        except OwnerError as exc:
            await _abort(context, exc)
        finally:
            await self._report_storage()

    # --- who asks ---------------------------------------------------------------------------
    async def _client(self, context: grpc.aio.ServicerContext) -> str | None:
        """The ``allowed_clients`` entry the caller's certificate names (None when there is no
        allow-list); any other caller is aborted with PERMISSION_DENIED before any work. Cheap
        and free of host state, so it runs on the event loop: a refusal never waits for the
        host's work."""
        try:
            return self._identify(context)
        except NotPermitted as exc:
            await _abort(context, exc)
            raise  # not reached: abort ends the call by raising

    def _identify(self, context: grpc.aio.ServicerContext) -> str | None:
        if not self._allowed:
            return None
        names = certificate_names(context.auth_context())
        folded = {n.casefold() for n in names}
        for entry in self._allowed:
            if entry.casefold() in folded:
                return entry
        who = f"({', '.join(names)})" if names else "(none: no DNS name or CN)"
        log.warning("refused client %s from %s: not in server.allowed_clients", who, context.peer())
        raise NotPermitted(
            f"the client certificate's names {who} are not in this owner's server.allowed_clients"
        )

    def _own(self, session: str, client: str | None) -> str:
        """``session``, once sure it is not another client's (``NotPermitted`` otherwise): the
        opener this server saw, or after a restart the one its ledger recorded (runs on the
        host's worker thread)."""
        if client is not None and session not in self._opened_by:
            opener = self.host.session_opener(session)
            if opener is not None:
                self._opened_by[session] = opener
        if self._opened_by.get(session, client) != client:
            log.warning("refused %s: session %s belongs to another client", client, session)
            raise NotPermitted(f"session {session!r} was opened by another client, not {client!r}")
        return session

    def _open(self, request: pb.OpenSessionRequest, client: str | None) -> None:
        secure = wire.secure_open(request.secure) if request.HasField("secure") else None
        session = self._own(request.session, client)
        if secure is not None and self._peers is not None:
            self._peers.check(session, secure.peers, self._names)
            # only here, never from the wire: every other key is of a distinct owner identity
            # this server allows (docs/design.md §2.6)
            secure = replace(secure, authenticated=True)
        # the ledger binds the session to ``client`` too, so a restarted server still refuses
        # another client's re-open
        self.host.open(wire.session_request(request, client, secure))
        if client is not None:
            self._opened_by[session] = client

    def _privacy_reports(self, session: str, client: str | None) -> list[PrivacyReport]:
        return self.host.privacy_reports(self._own(session, client) if session else None)

    def _check_reply(self, session: str, answers: int, width: int) -> None:
        """``InvalidRequest`` before any work when the reply to ``answers`` keys of ``width``
        would pass ``server.max_message_bytes`` (8 bytes a number, a few kB of framing): a
        reply that cannot be sent is never computed, charged or stored."""
        values = self.host.reply_values(session, answers, width)
        size = 8 * values + 8 * len(self._names) + 4096
        if size > self._max_message_bytes:
            raise InvalidRequest(
                f"the reply would carry {values} numbers (about {size} bytes), above this "
                f"owner's server.max_message_bytes {self._max_message_bytes}; ask for fewer "
                "chains (or a smaller block) per request"
            )

    # --- the host's operations on decoded messages -------------------------------------------
    def _query(
        self,
        kind: QueryKind,
        session: str,
        chains,
        keys: int,
        decode: Callable[[], tuple[int, dict[str, Any]]],
        client: str | None,
        substep: int = 0,
    ) -> pb.Answers:
        """One query of ``kind`` in ``session`` for ``chains`` at ``substep``, asking ``keys``
        answers per chain: the reply's size checked, the session's client checked, then its
        (iteration, arrays) ``decode``d and the kind asks the host (which checks the
        sub-step)."""
        chains = np.asarray(chains, dtype=np.int64)
        self._check_reply(session, len(chains) * keys, kind.width(self.host.model))
        owned = self._own(session, client)
        iteration, arrays = decode()
        values = kind.ask(self.host, owned, iteration, chains, arrays, substep)
        return wire.answers_message(
            self.host.reply(session, values, kind.reply_scale(arrays), kind.ledger_name)
        )

    def _v1_query(self, name: str, r, client: str | None) -> pb.Answers:
        """A query in the v1 message of the kind ``name`` (``wire.QUERY_CODECS``)."""
        kind = query_kind(name)
        codec = wire.query_codec(kind.name)
        decode = functools.partial(codec.arrays, r, len(r.chains))
        return self._query(kind, r.session, r.chains, codec.keys(r), decode, client)

    def _kind_query(self, r: pb.KindQuery, client: str | None) -> pb.Answers:
        """A ``KindQuery`` of any registered kind (``kinds.KINDS``) at its sub-step; an unknown
        kind, arrays other than the kind's, or a negative sub-step are refused."""
        kind = query_kind(r.kind)
        arrays = wire.kind_query_arrays(r)
        kind.check_arrays(arrays)
        decoded = (r.iteration, arrays)
        keys = kind.keys_per_chain(arrays)
        return self._query(kind, r.session, r.chains, keys, lambda: decoded, client, r.substep)

    def _session_keys(self, r: pb.SessionKeysRequest, client: str | None) -> pb.SessionKeysReply:
        self._key_requests.admit(client, self._own(r.session, client))  # before any key
        keys = self.host.session_keys(r.session)
        if self._peers is not None:
            keys = [self._peers.sign(r.session, k) for k in keys]
        return pb.SessionKeysReply(keys=[wire.peer_key_message(k) for k in keys])

    def _reveal_shares(self, r: pb.RevealSharesRequest, client: str | None) -> pb.RevealSharesReply:
        """Each hosted owner's graph share, once the relayed keys and commitments are checked
        (authenticated, with ``peers``: commitments are signed with the keys)."""
        session = self._own(r.session, client)
        self._key_requests.admit(client, session)  # before any check or write
        peers = [wire.peer_key(k) for k in r.peers]
        if self._peers is not None:
            self._peers.check(session, peers, self._names)
        shares = self.host.reveal_shares(session, peers)
        return pb.RevealSharesReply(shares=[wire.peer_key_message(k) for k in shares])

    # --- unary RPCs -----------------------------------------------------------------------
    async def Describe(self, request, context):
        await self._client(context)
        return pb.DescribeReply(owners=[wire.owner_info(d) for d in self.host.describe()])

    async def OpenSession(self, request, context):
        client = await self._client(context)
        await self._unary(context, client, request.session, lambda: self._open(request, client))
        log.info(
            "session %s: %s%s%s, plan of %d answers per owner, %d owner(s) [%s], from %s%s",
            request.session,
            request.kind or request.algorithm,
            f" at sampling rate {request.sampling_rate:g}"
            if request.HasField("sampling_rate")
            else "",
            f" with secure aggregation over {len(request.secure.peers)} owners"
            if request.HasField("secure")
            else "",
            request.planned_answers,
            len(self._names),
            ", ".join(self._names),
            context.peer(),
            "" if client is None else f" ({client})",
        )
        return pb.OpenSessionReply()

    async def CloseSession(self, request, context):
        client = await self._client(context)
        await self._unary(
            context,
            client,
            request.session,
            lambda: self.host.close_session(self._own(request.session, client)),
        )
        return pb.CloseSessionReply()

    async def LogRatio(self, request, context):
        client = await self._client(context)
        return await self._unary(
            context,
            client,
            request.session,
            lambda: self._v1_query("log_ratio", request, client),
            _cost("log_ratio", request),
        )

    async def SuffStats(self, request, context):
        client = await self._client(context)
        return await self._unary(
            context,
            client,
            request.session,
            lambda: self._v1_query("suff_stats", request, client),
            _cost("suff_stats", request),
        )

    async def Gradient(self, request, context):
        client = await self._client(context)
        return await self._unary(
            context,
            client,
            request.session,
            lambda: self._v1_query("gradient", request, client),
            _cost("gradient", request),
        )

    async def Ask(self, request, context):
        client = await self._client(context)
        return await self._unary(
            context,
            client,
            request.session,
            lambda: self._kind_query(request, client),
            _kind_query_cost(request),
        )

    async def SessionKeys(self, request, context):
        client = await self._client(context)
        return await self._unary(
            context, client, request.session, lambda: self._session_keys(request, client)
        )

    async def RevealShares(self, request, context):
        client = await self._client(context)
        return await self._unary(
            context, client, request.session, lambda: self._reveal_shares(request, client)
        )

    async def PrivacyReport(self, request, context):
        client = await self._client(context)
        reports = await self._unary(
            context,
            client,
            request.session,
            lambda: self._privacy_reports(request.session, client),
        )
        return pb.PrivacyReportReply(owners=[wire.owner_privacy(r) for r in reports])

    # --- the per-iteration stream ---------------------------------------------------------
    async def Query(self, request_iterator, context):
        client = await self._client(context)
        who = _who(context, client)
        stream = asyncio.current_task()
        assert stream is not None
        try:
            while not self._closing:
                self._waiting_streams.add(stream)
                try:
                    request = await context.read()
                finally:
                    self._waiting_streams.discard(stream)
                if request is grpc.aio.EOF:
                    return
                session, cost = _turn(request)
                await context.write(
                    await self._work.submit(who, session, cost, self._answer, request, client)
                )
                await self._report_storage()
        except asyncio.CancelledError:
            pass
        # the server is stopping (``end_streams``): end the stream quietly (the coordinator sees
        # it end without a reply and retries elsewhere or reports the owner unreachable); an
        # answer being computed was finished, charged and sent first
        log.info("query stream from %s closed: the server is stopping", context.peer())

    def end_streams(self) -> None:
        """Stopping: end the Query streams that wait for a request now, and the others once
        their answer is sent — before gRPC's grace period ends, after which it would cancel
        them itself and log a CancelledError traceback per stream."""
        self._closing = True
        for stream in self._waiting_streams:
            stream.cancel()

    def close(self) -> None:
        """Stop the worker thread once the calls already waiting have run."""
        self._work.close()

    def _answer(self, request: pb.QueryRequest, client: str | None) -> pb.QueryReply:
        v1 = request.WhichOneof("query")
        try:
            if (v1 is None) == (not request.HasField("kind_query")):
                raise InvalidRequest(
                    "a query must carry one of kind_query, "
                    f"{', '.join(wire.QUERY_CODECS)}, and only one"
                )
            if v1 is None:
                answers = self._kind_query(request.kind_query, client)
            else:
                answers = self._v1_query(v1, getattr(request, v1), client)
            return pb.QueryReply(id=request.id, answers=answers)
        except OwnerError as exc:
            return pb.QueryReply(id=request.id, refusal=wire.refusal(exc))
        except Exception as exc:  # a bug must not end the stream: refuse this query in-band
            log.exception("query %d failed inside the owner", request.id)
            failure = OwnerError(
                f"the owner failed to answer ({type(exc).__name__}: {exc}); anything it charged "
                "is replayed, not charged again, when the query is retried"
            )
            return pb.QueryReply(id=request.id, refusal=wire.refusal(failure))


def _who(context: grpc.aio.ServicerContext, client: str | None) -> str:
    """Whose turn a call takes in the fair queue: the client's allowed name, or (no identity:
    loopback, ``--insecure``) its connection's peer address."""
    return client if client is not None else context.peer()


def _cost(kind: str, query) -> int:
    """What a query of ``kind`` costs in the fair queue: the answers it asks (chains × the
    keys per chain of its codec, ``wire.QUERY_CODECS``; 1 for a kind the wire does not
    carry, which is refused when its turn comes)."""
    codec = wire.QUERY_CODECS.get(kind)
    return len(query.chains) * (codec.keys(query) if codec is not None else 1)


def _kind_query_cost(query: pb.KindQuery) -> int:
    """What a ``KindQuery`` costs in the fair queue: chains × its kind's keys per chain (1 per
    chain for a query that is refused when its turn comes)."""
    try:
        kind = query_kind(query.kind)
        return len(query.chains) * kind.keys_per_chain(wire.kind_query_arrays(query))
    except (OwnerError, KeyError):
        return len(query.chains)


def _turn(request: pb.QueryRequest) -> tuple[str, int]:
    """The session and cost (``_cost``, ``_kind_query_cost``) of a query on the stream."""
    kind = request.WhichOneof("query")
    if kind is None:
        if request.HasField("kind_query"):
            return request.kind_query.session, _kind_query_cost(request.kind_query)
        return "", 1
    query = getattr(request, kind)
    return query.session, _cost(kind, query)


async def _abort(context: grpc.aio.ServicerContext, exc: OwnerError) -> None:
    """End the call with the owner error's status code, message and metadata."""
    await context.abort(
        getattr(grpc.StatusCode, exc.grpc_code), str(exc), wire.refusal_metadata(exc)
    )


def certificate_names(auth: dict[str, list[bytes]]) -> list[str]:
    """The names a verified client certificate carries: its SAN DNS names, then its subject CN
    (from gRPC's ``auth_context()``; empty without a client certificate)."""
    names = [v.decode() for key in ("peer_dns", "x509_common_name") for v in auth.get(key, ())]
    return list(dict.fromkeys(names))


def is_loopback(listen: str) -> bool:
    """Whether ``listen`` (HOST:PORT) binds loopback only: 127.0.0.0/8, ::1 or localhost."""
    host = listen.rsplit(":", 1)[0].strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(
    listen: str, tls: TlsFiles | None, allowed_clients: Sequence[str], insecure: bool = False
) -> None:
    """``ConfigError`` for a server that would let in clients it cannot name: mutual TLS
    without ``allowed_clients`` (or the reverse), or no mutual TLS on a non-loopback address
    unless ``insecure``."""
    mutual = tls is not None and tls.ca is not None
    if mutual and not allowed_clients:
        raise ConfigError(
            "mutual TLS needs server.allowed_clients: the certificate names (SAN DNS name or "
            'CN) of the clients that may connect, e.g. ["coordinator.example.org"]'
        )
    if allowed_clients and not mutual:
        raise ConfigError(
            "server.allowed_clients needs mutual TLS: give server.tls_cert, server.tls_key "
            "and server.tls_ca"
        )
    if not mutual and not insecure and not is_loopback(listen):
        what = "plaintext" if tls is None else "TLS without client certificates"
        raise ConfigError(
            f"refusing to serve {what} on {listen}, which is not a loopback address: give "
            "server.tls_cert, tls_key, tls_ca and allowed_clients in OWNER.toml, or listen on "
            "127.0.0.1, or pass --insecure"
        )


def server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    """TLS with the server's certificate; with ``tls.ca``, client certificates signed by that CA
    are required (mutual TLS) and every other client is rejected during the handshake."""
    cert, key, ca = tls.read()
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
    )


async def start(
    host: OwnerHost,
    listen: str,
    tls: TlsFiles | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    allowed_clients: Sequence[str] = (),
    insecure: bool = False,
    peers: PeerAuth | None = None,
    key_requests: KeyRequests | None = None,
) -> tuple[grpc.aio.Server, int, OwnerServicer]:
    """Start serving ``host`` on ``listen`` (HOST:PORT; port 0 picks a free one) to the clients
    ``check_exposure`` lets in. Returns the server, the bound port and the owner servicer.
    ``peers``: authenticate secure-aggregation peer keys (``peer_auth.PeerAuth``);
    ``key_requests``: how many new secure sessions a client may ask keys for (default 100 a day)."""
    check_exposure(listen, tls, allowed_clients, insecure)
    if peers is not None:
        peers.check_hosted([d.name for d in host.describe()])
    options = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),
    ]
    server = grpc.aio.server(options=options)
    servicer = OwnerServicer(host, allowed_clients, peers, max_message_bytes, key_requests)
    pb_grpc.add_OwnerServicer_to_server(servicer, server)
    health_pb2_grpc.add_HealthServicer_to_server(servicer.health, server)
    reflection.enable_server_reflection(
        [
            SERVICE,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ],
        server,
    )
    try:
        port = (
            server.add_secure_port(listen, server_credentials(tls))
            if tls
            else server.add_insecure_port(listen)
        )
    except RuntimeError as exc:
        raise ConfigError(_bind_failure(listen, exc)) from exc
    await server.start()
    for name in ("", SERVICE):
        await servicer.health.set(name, health_pb2.HealthCheckResponse.SERVING)
    _log_serving(len(host.describe()), _bound(listen, port), tls, allowed_clients)
    return server, port, servicer


def _bind_failure(listen: str, exc: RuntimeError) -> str:
    """Why ``listen`` could not be bound, in words an operator can act on (gRPC only says
    "Failed to bind"): a plain socket on the same address tells a taken port from the rest."""
    fix = "choose another with --listen HOST:PORT (or server.listen in OWNER.toml)"
    host, _, port = listen.rpartition(":")
    try:
        with socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET) as probe:
            probe.bind((host.strip("[]") or "0.0.0.0", int(port)))
    except OSError as os_error:
        if os_error.errno == errno.EADDRINUSE:
            return f"port in use: {listen} is taken by another process; {fix}"
        if os_error.errno == errno.EACCES:
            return (
                f"cannot listen on {listen}: permission denied (ports below 1024 need root); {fix}"
            )
        return f"cannot listen on {listen}: {os_error.strerror}; {fix}"
    except ValueError:
        pass
    return f"cannot listen on {listen!r}: {exc}"


def _log_serving(
    owners: int, address: str, tls: TlsFiles | None, allowed_clients: Sequence[str]
) -> None:
    mutual = tls is not None and tls.ca is not None
    if mutual:
        mode = f"mutual, clients allowed: {', '.join(allowed_clients)}"
    else:
        mode = "server-only" if tls else "off"
    log.info("serving %d owner(s) on %s (TLS %s)", owners, address, mode)
    if not mutual and not is_loopback(address):
        log.warning(
            "no client authentication on %s: anyone who reaches it can query these owners "
            "and spend their budgets",
            address,
        )


async def stop(server: grpc.aio.Server, servicer: OwnerServicer, grace: float = 2.0) -> None:
    """Report NOT_SERVING, end the query streams, let in-flight calls finish for up to
    ``grace`` seconds, stop."""
    await servicer.health.enter_graceful_shutdown()
    servicer.end_streams()
    await server.stop(grace)
    await asyncio.to_thread(servicer.close)


def _bound(listen: str, port: int) -> str:
    return f"{listen.rsplit(':', 1)[0]}:{port}"


def serve(
    host: OwnerHost,
    listen: str,
    tls: TlsFiles | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    port_file: Path | None = None,
    allowed_clients: Sequence[str] = (),
    insecure: bool = False,
    peers: PeerAuth | None = None,
    key_requests: KeyRequests | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT, then stop cleanly. ``port_file``: written (atomically)
    with the bound port once serving — how a launcher learns a port picked with ``:0``;
    ``allowed_clients`` and ``insecure``: see ``check_exposure``; ``peers``, ``key_requests``:
    see ``start``."""

    # the host's worker thread holds the GIL while it computes; the event loop, which receives
    # requests and sends replies, waits for it up to the switch interval (5 ms by default) at
    # every step of a call, so other clients' calls would wait several of them (invariant 14)
    sys.setswitchinterval(SWITCH_INTERVAL)

    async def main() -> None:
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        server, port, servicer = await start(
            host, listen, tls, max_message_bytes, allowed_clients, insecure, peers, key_requests
        )
        if port_file is not None:
            tmp = port_file.with_suffix(".tmp")
            tmp.write_text(str(port))
            tmp.replace(port_file)
        await stopping.wait()
        log.info("stopping (signal received)")
        await stop(server, servicer)

    asyncio.run(main())


class ServerThread:
    """An owner server on its own event loop in a background thread of this process (tests,
    embedding). ``port`` is the bound port; ``close()`` stops it."""

    def __init__(
        self,
        host: OwnerHost,
        listen: str = "127.0.0.1:0",
        tls: TlsFiles | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        allowed_clients: Sequence[str] = (),
        peers: PeerAuth | None = None,
        key_requests: KeyRequests | None = None,
    ):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="owner-server"
        )
        self._thread.start()
        try:
            self._server, self.port, self._servicer = asyncio.run_coroutine_threadsafe(
                start(
                    host,
                    listen,
                    tls,
                    max_message_bytes,
                    allowed_clients,
                    False,
                    peers,
                    key_requests,
                ),
                self._loop,
            ).result(timeout=30)
        except BaseException:
            self._stop_loop()
            raise
        self.address = _bound(listen, self.port)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(
            stop(self._server, self._servicer, grace=0.5), self._loop
        ).result(timeout=30)
        self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
