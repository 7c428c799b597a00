"""The owner server: the ``fedpenalty.v1.Owner`` gRPC service in front of an ``OwnerHost``.

Transport only: every answer, refusal and charge comes from the host (one process may serve
many owners, each with its own data, noise and ledger). The server adds standard health
checking and reflection, optional TLS (with ``tls.ca``: mutual TLS, client certificates
required and verified), one log line per session, and a clean stop on SIGTERM/SIGINT.
Requests are answered one at a time on the event loop, so the host is never re-entered.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from ..errors import ConfigError, InvalidRequest, OwnerError
from ..proto import owner_pb2 as pb
from ..proto import owner_pb2_grpc as pb_grpc
from . import wire
from .host import OwnerHost
from .owner_config import TlsFiles

log = logging.getLogger("fedpenalty.owner")
SERVICE = pb.DESCRIPTOR.services_by_name["Owner"].full_name
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class OwnerServicer(pb_grpc.OwnerServicer):
    """Decodes requests, calls the host, encodes answers or refusals."""

    def __init__(self, host: OwnerHost, health: HealthServicer | None = None):
        self.host = host
        self._noise_sd = np.array([d.policy.sigma for d in host.describe()])
        self._names = [d.name for d in host.describe()]
        self._health = health
        self._ledgers = list({id(node.ledger): node.ledger for node in host.nodes}.values())
        self._serving = True

    # --- storage health -------------------------------------------------------------------
    async def _report_storage(self) -> None:
        """Health NOT_SERVING while some ledger cannot be written, SERVING again once its next
        write succeeds; checked after every request (a ledger's ``writable`` is set by its
        last write)."""
        serving = all(ledger.writable for ledger in self._ledgers)
        if self._health is None or serving == self._serving:
            return
        self._serving = serving
        status = health_pb2.HealthCheckResponse.SERVING if serving else _NOT_SERVING
        log.warning(
            "ledger %s", "writable again: serving" if serving else "unwritable: not serving"
        )
        for name in ("", SERVICE):
            await self._health.set(name, status)

    async def _unary(self, context: grpc.aio.ServicerContext, call: Callable):
        """Run ``call``; an owner refusal becomes its status code with the error's metadata."""
        try:
            return call()
        except OwnerError as exc:
            await context.abort(
                getattr(grpc.StatusCode, exc.grpc_code), str(exc), wire.refusal_metadata(exc)
            )
        finally:
            await self._report_storage()

    # --- the host's operations on decoded messages -------------------------------------------
    def _log_ratio(self, r: pb.LogRatioRequest) -> pb.Answers:
        chains = np.asarray(r.chains, dtype=np.int64)
        values = self.host.log_ratio(
            r.session,
            r.iteration,
            chains,
            wire.rows(r.theta, len(chains), "theta"),
            wire.rows(r.theta_prop, len(chains), "theta_prop"),
        )
        return wire.answers_message(values, self._noise_sd)

    def _suff_stats(self, r: pb.SuffStatsRequest) -> pb.Answers:
        values = self.host.suff_stats(
            r.session, np.asarray(r.chains, dtype=np.int64), r.start, r.block
        )
        return wire.answers_message(values, self._noise_sd)

    def _gradient(self, r: pb.GradientRequest) -> pb.Answers:
        chains = np.asarray(r.chains, dtype=np.int64)
        values = self.host.gradient(
            r.session, r.iteration, chains, wire.rows(r.theta, len(chains), "theta"), r.clip
        )
        return wire.answers_message(values, self._noise_sd * r.clip)

    # --- unary RPCs -----------------------------------------------------------------------
    async def Describe(self, request, context):
        return pb.DescribeReply(owners=[wire.owner_info(d) for d in self.host.describe()])

    async def OpenSession(self, request, context):
        rate = request.sampling_rate if request.HasField("sampling_rate") else None
        await self._unary(
            context,
            lambda: self.host.open_session(
                request.session, request.algorithm, request.planned_answers, rate
            ),
        )
        log.info(
            "session %s: %s%s, plan of %d answers per owner, %d owner(s) [%s], from %s",
            request.session,
            request.algorithm,
            "" if rate is None else f" at sampling rate {rate:g}",
            request.planned_answers,
            len(self._names),
            ", ".join(self._names),
            context.peer(),
        )
        return pb.OpenSessionReply()

    async def CloseSession(self, request, context):
        await self._unary(context, lambda: self.host.close_session(request.session))
        return pb.CloseSessionReply()

    async def LogRatio(self, request, context):
        return await self._unary(context, lambda: self._log_ratio(request))

    async def SuffStats(self, request, context):
        return await self._unary(context, lambda: self._suff_stats(request))

    async def Gradient(self, request, context):
        return await self._unary(context, lambda: self._gradient(request))

    async def PrivacyReport(self, request, context):
        reports = await self._unary(
            context, lambda: self.host.privacy_reports(request.session or None)
        )
        return pb.PrivacyReportReply(owners=[wire.owner_privacy(r) for r in reports])

    # --- the per-iteration stream ---------------------------------------------------------
    async def Query(self, request_iterator, context):
        while (request := await context.read()) is not grpc.aio.EOF:
            await context.write(self._answer(request))
            await self._report_storage()

    def _answer(self, request: pb.QueryRequest) -> pb.QueryReply:
        kind = request.WhichOneof("query")
        try:
            if kind == "log_ratio":
                return pb.QueryReply(id=request.id, answers=self._log_ratio(request.log_ratio))
            if kind == "suff_stats":
                return pb.QueryReply(id=request.id, answers=self._suff_stats(request.suff_stats))
            if kind == "gradient":
                return pb.QueryReply(id=request.id, answers=self._gradient(request.gradient))
            raise InvalidRequest("a query must carry log_ratio, suff_stats or gradient")
        except OwnerError as exc:
            return pb.QueryReply(id=request.id, refusal=wire.refusal(exc))


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
) -> tuple[grpc.aio.Server, int, HealthServicer]:
    """Start serving ``host`` on ``listen`` (HOST:PORT; port 0 picks a free one). Returns the
    server, the bound port and the health servicer."""
    options = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),
    ]
    server = grpc.aio.server(options=options)
    health = HealthServicer()
    pb_grpc.add_OwnerServicer_to_server(OwnerServicer(host, health), server)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
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
        raise ConfigError(f"cannot listen on {listen!r}: {exc}") from exc
    await server.start()
    for name in ("", SERVICE):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    mode = (
        "off"
        if tls is None
        else ("mutual (client certificates required)" if tls.ca else "server-only")
    )
    log.info("serving %d owner(s) on %s (TLS %s)", len(host.describe()), _bound(listen, port), mode)
    return server, port, health


async def stop(server: grpc.aio.Server, health: HealthServicer, grace: float = 2.0) -> None:
    """Report NOT_SERVING, let in-flight calls finish for up to ``grace`` seconds, stop."""
    await health.enter_graceful_shutdown()
    await server.stop(grace)


def _bound(listen: str, port: int) -> str:
    return f"{listen.rsplit(':', 1)[0]}:{port}"


def serve(
    host: OwnerHost,
    listen: str,
    tls: TlsFiles | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    port_file: Path | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT, then stop cleanly. ``port_file``: written (atomically)
    with the bound port once serving — how a launcher learns a port picked with ``:0``."""

    async def main() -> None:
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        server, port, health = await start(host, listen, tls, max_message_bytes)
        if port_file is not None:
            tmp = port_file.with_suffix(".tmp")
            tmp.write_text(str(port))
            tmp.replace(port_file)
        await stopping.wait()
        log.info("stopping (signal received)")
        await stop(server, health)

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
    ):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="owner-server"
        )
        self._thread.start()
        self._server, self.port, self._health = asyncio.run_coroutine_threadsafe(
            start(host, listen, tls, max_message_bytes), self._loop
        ).result(timeout=30)
        self.address = _bound(listen, self.port)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(
            stop(self._server, self._health, grace=0.5), self._loop
        ).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
