"""Owners hosted by Ray actors (docs/design.md §4, "The Ray transport").

Each actor is one ``OwnerHost`` serving a contiguous block of owners, with its own ledger file.
It builds its owners itself from ``HostSpec``: their records come from sources it makes or
reads (a synthetic owner's seed stream, a file path), so records never pass through the
coordinator. Every request is one call per actor, answered for all of its owners at once.

``connect_ray`` starts a local Ray sized to the machine (no dashboard, quiet logs, a small
object store, replies of up to ``INLINE_REPLY_BYTES`` passed inline) or connects to an existing
cluster; ``RayHosts`` starts the actors and reaches them. Errors the owners raise on purpose
travel back as ``Failure`` values and are raised again in the coordinator with their own class;
an actor that dies becomes ``OwnerUnavailable`` naming the owners it hosted.

Ray is imported only when it is used, so that the rest of fedpenalty starts without it.
"""

from __future__ import annotations

import logging
import os
import resource
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from .. import errors
from ..common import OwnerDescription, Policy
from ..data import RecordSource
from ..errors import ConfigError, FedPenaltyError, OwnerError, OwnerUnavailable
from ..extras import require
from ..kinds import query_kind
from ..models import Model, build_model
from ..owner import Ledger, OwnerHost, OwnerNode, wire
from ..owner.aggregation import Reply
from ..owner.host import gc_paused
from ..owner.noise.sources import NoiseKey

#: Object store of a local Ray. Per-iteration replies travel inline (below), so the store holds
#: only the actors' start-up specs (about 1 kB per owner) and larger one-off replies.
OBJECT_STORE_BYTES = 512 * 2**20
#: Replies up to this size are passed inline in the reply message instead of through the object
#: store (Ray's default, 100 kB, would send the answers of more than ~3,000 owners × 4 chains
#: through shared memory, measured 2–4× slower per call).
INLINE_REPLY_BYTES = 16 * 2**20
#: ``OwnerHost`` methods the coordinator may call on an actor.
HOST_METHODS = frozenset(
    {
        "describe",
        "session_keys",
        "reveal_shares",
        "open",
        "close_session",
        "privacy_reports",
    }
)


@dataclass(frozen=True)
class OwnerSpec:
    """One owner as an actor builds it: ``records`` (an array, or the source it makes them
    from) and ``policy``; its noise either from ``seed`` — a simulated owner made exactly as
    ``OwnerNode.simulated`` makes it in process (seeded float noise, or with a secure-aggregation
    policy seeded lattice noise and keys) — or else from ``rng`` (None: a deployed-style owner),
    ``noise_key``, ``seeded_streams``, ``fresh_attempts`` and ``simulated_peers`` as
    ``OwnerNode`` takes them. ``simulation`` keeps the simulation-only counters."""

    name: str
    policy: Policy
    rng: np.random.Generator | None
    records: np.ndarray | RecordSource
    simulation: bool = True
    noise_key: NoiseKey | None = None
    seeded_streams: bool = False
    seed: np.random.SeedSequence | None = None
    fresh_attempts: bool | None = None
    simulated_peers: bool = False

    def node(
        self, model: Model, ledger: Ledger, answered_on_lattice: bool | None = None
    ) -> OwnerNode:
        """The owner, its records made or read here; ``answered_on_lattice`` as ``OwnerNode``
        takes it (its host's builder asks the ledger once for all its owners)."""
        records = self.records if isinstance(self.records, np.ndarray) else self.records.make(model)
        if self.seed is not None:
            return OwnerNode.simulated(
                self.name,
                model,
                records,
                self.policy,
                ledger,
                self.seed,
                self.simulation,
                answered_on_lattice,
            )
        return OwnerNode(
            self.name,
            model,
            records,
            self.policy,
            ledger,
            self.rng,
            simulation=self.simulation,
            noise_key=self.noise_key,
            seeded_streams=self.seeded_streams,
            fresh_attempts=self.fresh_attempts,
            simulated_peers=self.simulated_peers,
            answered_on_lattice=answered_on_lattice,
        )


@dataclass(frozen=True)
class OwnerBlock(Sequence[OwnerSpec]):
    """Simulated owners as an actor builds them, owner j's ``OwnerSpec`` made when indexed
    from its name, policy, record source and seed. Sources and seeds made on demand
    (``data.SyntheticSources``, ``data.ChildSeeds``) and shared policies pickle to a few
    numbers, so a million owners travel to their actors as a few arrays rather than a million
    objects (docs/design.md §4, "Many owners")."""

    names: Sequence[str]
    policies: Sequence[Policy]
    records: Sequence[np.ndarray | RecordSource]
    seeds: Sequence[np.random.SeedSequence]

    def __len__(self) -> int:
        return len(self.names)

    @overload
    def __getitem__(self, k: int) -> OwnerSpec: ...

    @overload
    def __getitem__(self, k: slice) -> OwnerBlock: ...

    def __getitem__(self, k: int | slice) -> OwnerSpec | OwnerBlock:
        if isinstance(k, slice):
            return OwnerBlock(self.names[k], self.policies[k], self.records[k], self.seeds[k])
        return OwnerSpec(self.names[k], self.policies[k], None, self.records[k], seed=self.seeds[k])


@dataclass(frozen=True)
class HostSpec:
    """One actor: the ``model`` (``{"name": ..., **params}``), its ``ledger`` file (an absolute
    path on the node the actor runs on) with its SQLite ``synchronous`` mode, and its owners."""

    model: dict[str, Any]
    ledger: str
    owners: Sequence[OwnerSpec]
    synchronous: str = "NORMAL"

    @property
    def names(self) -> list[str]:
        """Its owners' names, in order (an ``OwnerBlock``'s without making its specs)."""
        owners = self.owners
        return list(owners.names) if isinstance(owners, OwnerBlock) else [o.name for o in owners]


@dataclass(frozen=True)
class Failure:
    """An error raised on purpose inside an actor, carried back as a value: its class name,
    message, owner and (budget refusals) ε left."""

    error: str
    message: str
    owner: str | None = None
    epsilon_left: float = 0.0

    @classmethod
    def of(cls, exc: FedPenaltyError) -> Failure:
        owner = exc.owner if isinstance(exc, OwnerError) else None
        return cls(type(exc).__name__, str(exc), owner, getattr(exc, "epsilon_left", 0.0))

    def exception(self, where: str) -> FedPenaltyError:
        """The error again, with its own class; owner refusals name ``where`` (the actor)."""
        cls = getattr(errors, self.error, FedPenaltyError)
        if isinstance(cls, type) and issubclass(cls, OwnerError):
            return wire.make_error(
                self.error, "", f"{self.message} [{where}]", self.owner, self.epsilon_left
            )
        if isinstance(cls, type) and issubclass(cls, FedPenaltyError):
            return cls(self.message)
        return FedPenaltyError(self.message)


def _build(spec: HostSpec) -> OwnerHost:
    """The actor's host: its ledger opened, its owners' records made or read."""
    ledger = Ledger.simulation(spec.ledger, spec.synchronous)
    try:
        model = build_model(spec.model)
        with gc_paused():
            answered = ledger.answered_on_lattice_of([o.name for o in spec.owners])
            return OwnerHost(
                [o.node(model, ledger, lattice) for o, lattice in zip(spec.owners, answered)]
            )
    except BaseException:
        ledger.close()
        raise


class OwnerHostActor:
    """An ``OwnerHost`` in a Ray actor process (``RayHosts.create`` makes it a Ray actor); it
    hosts no owners until ``build``."""

    def __init__(self) -> None:
        self.host: OwnerHost | None = None

    def build(self, spec: HostSpec) -> list[OwnerDescription] | Failure:
        """Host the owners of ``spec`` (closing any earlier host's ledger); their
        descriptions, or the ``Failure`` of a start-up error (a missing data file, a ledger in
        use)."""
        self.shutdown()
        try:
            self.host = _build(spec)
        except FedPenaltyError as exc:
            return Failure.of(exc)
        return self.host.describe()

    def call(self, method: str, args: tuple, kwargs: dict[str, Any]) -> Any:
        """``OwnerHost.method(*args, **kwargs)``, or the ``Failure`` of an owner's refusal.
        (``args`` is one tuple: Ray serialises it in one piece, measured 1.5 ms faster per call
        than five separate arguments.)"""
        if method not in HOST_METHODS:
            raise ValueError(f"not an owner-host method: {method!r}")
        if self.host is None:
            return Failure("OwnerUnavailable", "this Ray actor hosts no owners")
        try:
            return getattr(self.host, method)(*args, **kwargs)
        except FedPenaltyError as exc:
            return Failure.of(exc)

    def answer(self, query: tuple) -> Reply | Failure:
        """A query's answers as the host's ``Reply`` (``OwnerHost.reply``: plain answers with
        each owner's noise sd × the kind's ``reply_scale``, or a secure session's masked sum),
        or the ``Failure`` of an owner's refusal. ``query``: (kind, session, iteration, chains,
        arrays, substep), the kind by name (``kinds.query_kind``; an unknown one is refused),
        the sub-step checked by the host."""
        name, session, iteration, chains, arrays, substep = query
        if self.host is None:
            return Failure("OwnerUnavailable", "this Ray actor hosts no owners")
        try:
            kind = query_kind(name)
            values = kind.ask(self.host, session, iteration, chains, arrays, substep)
        except FedPenaltyError as exc:
            return Failure.of(exc)
        return self.host.reply(session, values, kind.reply_scale(arrays), kind.ledger_name)

    def simulation_counters(
        self,
    ) -> list[tuple[bool, int, int, dict[str, list[int]]]] | None:
        """Per owner (answers from sufficient statistics, clip binds, log-ratio terms, clip hits
        and evaluations per kind), or None when some owner keeps no simulation counters."""
        nodes = self.host.nodes if self.host is not None else []
        if not nodes or any(node.diagnostics is None for node in nodes):
            return None
        return [
            (
                not node.per_record,
                node.simulation_diagnostics().clip_binds,
                node.simulation_diagnostics().log_ratio_terms,
                dict(node.simulation_diagnostics().by_kind),
            )
            for node in nodes
        ]

    def process(self) -> tuple[str, int, int]:
        """(host name, process id, peak resident memory in bytes) of this actor's process."""
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
        return socket.gethostname(), os.getpid(), peak

    def shutdown(self) -> None:
        """Close the ledger and drop the owners."""
        if self.host is not None:
            self.host.nodes[0].ledger.close()
            self.host = None


@dataclass(frozen=True)
class RayRuntime:
    """This process's connection to Ray; ``started``: fedpenalty started that Ray (and stops
    it), else it was there already (a cluster, or a connection this process made before)."""

    address: str
    started: bool

    def cpus(self, need: float | None = None, wait: float = 5.0) -> float:
        """CPUs of the cluster not yet taken by other work; waits up to ``wait`` seconds for
        ``need`` of them (default: all the cluster's CPUs), since actors that just ended
        release theirs a moment later."""
        import ray

        if need is None:
            need = float(ray.cluster_resources().get("CPU", 0.0))
        deadline = time.monotonic() + wait
        while True:
            free = float(ray.available_resources().get("CPU", 0.0))
            if free >= need - 1e-9 or time.monotonic() > deadline:
                return free
            time.sleep(0.1)

    def stop(self) -> None:
        """Shut down the Ray this runtime started; disconnect from a cluster it connected to."""
        import ray

        if self.started and ray.is_initialized():
            ray.shutdown()


def check_address(address: str) -> str:
    """``address`` itself when it is empty, ``auto``, ``host:port`` or ``ray://host[:port]``;
    ``ValueError`` saying what is allowed otherwise."""
    client = address.startswith("ray://")
    rest = address.removeprefix("ray://")
    host, colon, port = rest.rpartition(":")
    if not colon:  # no port: only a Ray client address may leave it out
        host, port = rest, ""
    port_ok = (port.isdigit() and 0 < int(port) < 65536) or (client and not colon)
    if address in ("", "auto") or (host and "/" not in host and port_ok):
        return address
    raise ValueError("must be '' (start a local Ray), 'auto', 'host:port' or 'ray://host[:port]'")


def connect_ray(address: str) -> RayRuntime:
    """Connect this process to Ray: ``address`` empty starts a local Ray sized to the machine
    (stopped by ``RayRuntime.stop``); otherwise the existing cluster there (``auto``,
    ``host:port``, ``ray://…``). A process already connected keeps its connection; without
    Ray installed, a ``ConfigError`` naming the extra that installs it."""
    ray = require("ray", "run.transport = 'ray'", "choose another run.transport")

    if ray.is_initialized():
        return RayRuntime(address, started=False)
    quiet = {"logging_level": logging.ERROR, "log_to_driver": False}
    try:
        if address:
            ray.init(address=address, **quiet)
        else:
            ray.init(
                address="local",  # a new instance, never one found on this machine
                num_cpus=os.cpu_count() or 1,
                include_dashboard=False,
                object_store_memory=OBJECT_STORE_BYTES,
                _system_config={"max_direct_call_object_size": INLINE_REPLY_BYTES},
                **quiet,
            )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(_connect_failure(address, exc)) from None
    return RayRuntime(address, started=not address)


def _connect_failure(address: str, exc: Exception) -> str:
    """The one-line message of a failed ``ray.init``, with how to authenticate."""
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if not address:
        return f"cannot start a local Ray (run.ray_address = ''): {reason}"
    hint = (
        "; if the cluster uses token authentication (Ray's default), export RAY_AUTH_MODE=token "
        "and the cluster's token in RAY_AUTH_TOKEN or ~/.ray/auth_token (`ray get-auth-token` on "
        "the head node prints it)"
    )
    return f"cannot connect to the Ray cluster at run.ray_address = {address!r}: {reason}{hint}"


class RayHosts:
    """Running owner-host actors; ``names[h]`` are the owners actor h hosts, in owner order,
    and ``described[h]`` their descriptions."""

    def __init__(self, actors: list[Any]):
        self.actors = actors
        self.names: list[list[str]] = [[] for _ in actors]
        self.described: list[list[OwnerDescription]] = []

    @classmethod
    def create(cls, count: int, cpus: float) -> RayHosts:
        """``count`` actors hosting no owners yet, each reserving ``cpus`` CPUs."""
        import ray

        remote = ray.remote(OwnerHostActor).options(num_cpus=cpus, max_restarts=0)
        return cls([remote.remote() for _ in range(count)])

    @classmethod
    def start(cls, specs: Sequence[HostSpec], cpus: float) -> RayHosts:
        """One actor per spec, each reserving ``cpus`` CPUs; all build their owners at once."""
        hosts = cls.create(len(specs), cpus)
        try:
            hosts.build(specs)
        except BaseException:
            hosts.stop()
            raise
        return hosts

    def build(self, specs: Sequence[HostSpec]) -> None:
        """Actor h hosts the owners of ``specs[h]``: one call per actor, all at once; returns
        when every actor has built its owners, or raises the first start-up error."""
        self.names = [s.names for s in specs]
        refs = [a.build.remote(spec) for a, spec in zip(self.actors, specs)]
        self.described = self.raise_failures(self.gather(refs))

    def label(self, h: int) -> str:
        """Actor ``h`` and the owners it hosts (first and last when there are many)."""
        names = self.names[h]
        shown = ", ".join(names) if len(names) <= 4 else f"{names[0]} … {names[-1]}"
        return f"Ray actor {h} (owners {shown}; {len(names)} owners)"

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """``OwnerHost.method(*args, **kwargs)`` on every actor: every call is issued, then
        every reply awaited. Replies are values or ``Failure``; a dead actor raises
        ``OwnerUnavailable``."""
        return self.gather([a.call.remote(method, args, kwargs) for a in self.actors])

    def answer(self, query: tuple) -> list[Any]:
        """A query on every actor (``OwnerHostActor.answer``), issued and awaited as ``call``
        does: each actor's ``Reply`` or ``Failure``."""
        return self.gather([a.answer.remote(query) for a in self.actors])

    def answer_each(self, queries: Sequence[tuple]) -> list[Any]:
        """``queries[h]`` on actor h, as ``answer``: a request with one θ row per owner, each
        actor receiving its own owners' rows (``kinds.per_owner``)."""
        return self.gather([a.answer.remote(q) for a, q in zip(self.actors, queries, strict=True)])

    def gather(self, refs: list[Any]) -> list[Any]:
        """The replies to ``refs`` (one per actor, in actor order)."""
        import ray
        from ray.exceptions import RayActorError

        try:
            return ray.get(refs)
        except RayActorError as exc:
            cause = str(exc).strip().splitlines()[0] if str(exc).strip() else "it died"
            stopped = [h for h, ref in enumerate(refs) if _raises(ref, RayActorError)]
            actors = "; ".join(self.label(h) for h in stopped) or "a Ray actor"
            raise OwnerUnavailable(f"{actors} stopped: {cause}") from None

    def raise_failures(self, replies: list[Any]) -> list[Any]:
        """``replies`` unless some actor returned a ``Failure``: then the first one's error."""
        for h, reply in enumerate(replies):
            if isinstance(reply, Failure):
                raise reply.exception(f"Ray actor {h}")
        return replies

    def simulation_counters(self) -> list[Any]:
        return self.gather([a.simulation_counters.remote() for a in self.actors])

    def processes(self) -> list[tuple[str, int, int]]:
        """(host name, process id, peak resident bytes) of every actor."""
        return self.gather([a.process.remote() for a in self.actors])

    def release(self, timeout: float = 30.0) -> None:
        """Every live actor closes its ledger and drops its owners (the actors stay)."""
        import ray

        done = [a.shutdown.remote() for a in self.actors]
        ray.wait(done, num_returns=len(done), timeout=timeout)

    def stop(self) -> None:
        """Close every live actor's ledger, then end the actors."""
        import ray

        self.release()
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []


def _raises(ref: Any, error: type[Exception]) -> bool:
    """Getting ``ref`` raises ``error`` (the reply is ready: its call has ended)."""
    import ray

    try:
        ray.get(ref)
    except error:
        return True
    return False
