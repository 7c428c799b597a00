"""The Ray transport: the simulation's owners packed into Ray actors (docs/design.md §4).

Owners are split into contiguous blocks, one per actor; each actor is an ``OwnerHost`` with its
own ledger file that makes or reads its owners' records itself (``cluster/ray_hosts.py``). An
iteration is one call per actor — all issued, then all awaited — so it costs one round trip to
the slowest actor, never one per owner. Each actor answers with its host's ``Reply`` and the
oracle combines them (``secure_sum.combine``) only once every actor has answered: plain answers
come back in ``describe`` order (actor order, then each actor's owners) with each owner's noise
sd; with secure aggregation (docs/design.md §2.6) ``open_session`` first gathers every actor's
session keys and sends all of them to every actor, and each query's masked sums are added and
decoded. Owner refusals are raised again with the owner's own error class, and an actor that
dies stops the run with ``OwnerUnavailable`` naming the owners it hosted (nothing decoded).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..cluster.ray_hosts import Failure, HostSpec, OwnerBlock, RayHosts, RayRuntime, connect_ray
from ..common import OwnerDescription, PrivacyReport
from ..data import OwnerRecords
from ..errors import ConfigError, OwnerError, OwnerUnavailable
from ..kinds import KindTerms
from ..kinds.per_owner import split_by_host
from ..models import Model
from ..models.compat import ModelIdentity
from ..owner.aggregation import PeerKey
from ..owner.session_request import SessionRequest
from .inprocess import simulation_only
from .oracle import Answers, Oracle, SecureAggregation, Unreported
from .secure_sum import combine, secure_open
from .transport_base import Launched, OwnerSetup, Transport


class RayOracle(Oracle):
    """All owners hosted by ``hosts`` (Ray actors), in actor order, then each actor's order.
    ``model``: the scenario's model, named in every session request (each owner refuses a
    session for a model other than its own); None names none."""

    def __init__(self, hosts: RayHosts, owners: list[OwnerDescription], model: Model | None = None):
        self.hosts = hosts
        self._owners = owners
        self.session: str | None = None
        self._model = None if model is None else ModelIdentity.of(model)

    # --- the Oracle interface ---------------------------------------------------------------
    def describe(self) -> list[OwnerDescription]:
        return list(self._owners)

    def open_kinds(
        self,
        terms: Sequence[KindTerms],
        session: str | None = None,
        secure: SecureAggregation | None = None,
    ) -> str:
        """Open (or resume) a session of the kinds ``terms`` at every actor
        (``OwnerHost.open``); returns its id."""
        session = session or uuid.uuid4().hex
        request = None
        if secure is not None:
            request = secure_open(self._session_keys(session), secure, self._revealer(session))
        asked = SessionRequest.several(session, terms, secure=request, model=self._model)
        self._each("open", asked)
        self.session = session
        return session

    def _session_keys(self, session: str) -> list[PeerKey]:
        """Every owner's public key for ``session``, in owner order (secure aggregation)."""
        keys = [k for block in self._each("session_keys", session) for k in block]
        if [k.owner for k in keys] != [o.name for o in self._owners]:
            raise OwnerError("the Ray actors sent session keys of other owners than they describe")
        return keys

    def _revealer(self, session: str):
        """The reveal round of ``session`` (``secure_sum.secure_open``): every actor's owners'
        graph shares, given every owner's key and commitment."""
        return lambda keys: [
            k for block in self._each("reveal_shares", session, keys) for k in block
        ]

    def query(
        self, kind: str, iteration: int, chains: np.ndarray, substep: int = 0, **arrays: Any
    ) -> Answers:
        """One query on every actor (``OwnerHostActor.answer``), combined
        (``secure_sum.combine``) once all have answered: plain answers stacked in owner order
        ``(K, …)``, a secure session's masked sums decoded into one row."""
        session = self._require_session()
        parts = split_by_host(arrays, [len(names) for names in self.hosts.names])
        if all(part is arrays for part in parts):  # a flat request: the same query to every actor
            replies = self.hosts.answer((kind, session, iteration, chains, arrays, substep))
        else:
            queries = [(kind, session, iteration, chains, part, substep) for part in parts]
            replies = self.hosts.answer_each(queries)
        return combine(self.hosts.raise_failures(replies))

    def privacy_reports(self) -> list[PrivacyReport]:
        return [r for block in self._each("privacy_reports", self.session) for r in block]

    def reachable_reports(self) -> list[PrivacyReport | Unreported]:
        """Each actor's owners' reports; an actor that died (or refuses) gives an
        ``Unreported`` for each owner it hosted, without losing the other actors' reports."""
        import ray
        from ray.exceptions import RayActorError

        refs = [a.call.remote("privacy_reports", (self.session,), {}) for a in self.hosts.actors]
        entries: list[PrivacyReport | Unreported] = []
        for h, ref in enumerate(refs):
            try:
                reply = ray.get(ref)
            except RayActorError as exc:
                cause = str(exc).strip().splitlines()[0] if str(exc).strip() else "it died"
                error, status = f"{self.hosts.label(h)} stopped: {cause}", "unreachable"
            else:
                if not isinstance(reply, Failure):
                    entries.extend(reply)
                    continue
                error, status = str(reply.exception(f"Ray actor {h}")), "refused"
            entries.extend(Unreported(name, status, error) for name in self.hosts.names[h])
        return entries

    def close(self) -> None:
        """Close the session at every owner (the actors run until the transport stops)."""
        if self.session is not None:
            self._each("close_session", self.session)
            self.session = None

    def disconnect(self) -> None:
        """Leave the session open at the owners (a stopped run); the actors end with the
        transport (``Launched.stop``)."""

    def simulation_diagnostics(self) -> dict[str, Any] | None:
        """The simulated owners' counters; None when some owner keeps none or its actor has
        stopped (a run that stopped early)."""
        try:
            blocks = self.hosts.simulation_counters()
        except OwnerUnavailable:
            return None
        if any(block is None for block in blocks):
            return None
        counters = [c for block in blocks for c in block]
        return simulation_only(*(list(column) for column in zip(*counters)))

    def host_sizes(self) -> list[int]:
        return [len(names) for names in self.hosts.names]

    # --- machinery --------------------------------------------------------------------------
    def _require_session(self) -> str:
        if self.session is None:
            raise RuntimeError("open_session must be called first")
        return self.session

    def _each(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """``OwnerHost.method(*args, **kwargs)`` on every actor; the first refusal is raised."""
        return self.hosts.raise_failures(self.hosts.call(method, *args, **kwargs))


#: In ``<run>/owners``: how many owners each actor hosts, so that the transport started again
#: for the same run (a resumed run) hosts every owner on the ledger file it had.
PACKING = "ray-actors.json"


def host_specs(setup: OwnerSetup, blocks: list[np.ndarray]) -> list[HostSpec]:
    """One actor per contiguous block of owner indices (``packing``), each with a ledger file
    in ``<run>/owners``. Owners made from sources (``OwnerRecords``) travel as their sources,
    every actor's as one ``OwnerBlock``."""
    model = {"name": setup.model.name, **setup.model.params()}
    folder = (setup.folder / "owners").resolve()
    records = setup.records
    sources = records.sources if isinstance(records, OwnerRecords) else list(records)
    owners = OwnerBlock(setup.names, setup.policies, sources, setup.seeds)
    return [
        HostSpec(model, str(folder / f"ray-{h}.sqlite"), owners[block[0] : block[-1] + 1])
        for h, block in enumerate(blocks)
    ]


def packing(setup: OwnerSetup, runtime: RayRuntime) -> list[np.ndarray]:
    """Owner indices per actor, in contiguous blocks: as recorded in ``<run>/owners`` when
    the transport ran there before, else ``run.ray_actors`` blocks (0: one per free CPU of the
    cluster), recorded. ``ConfigError`` when the actors do not fit the cluster's free CPUs."""
    path, owners, run = setup.folder / "owners" / PACKING, len(setup.names), setup.run
    cpus = run["ray_actor_cpus"]
    if path.exists():
        sizes = json.loads(path.read_text())["owners_per_actor"]
        if sum(sizes) != owners:
            raise ConfigError(f"{path} packs {sum(sizes)} owners into Ray actors, not {owners}")
    else:
        actors = min(run["ray_actors"] or int(runtime.cpus() / cpus + 1e-9), owners)
        sizes = [len(b) for b in np.array_split(np.arange(owners), max(actors, 1))]
    free = runtime.cpus(need=len(sizes) * cpus)
    if len(sizes) * cpus > free + 1e-9:
        raise ConfigError(
            f"run.ray_actors = {len(sizes)} actors × run.ray_actor_cpus = {cpus:g} CPUs need "
            f"{len(sizes) * cpus:g} CPUs, but the Ray cluster has {free:g} free: lower "
            "run.ray_actors or run.ray_actor_cpus"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"owners_per_actor": sizes}))
    return np.split(np.arange(owners), np.cumsum(sizes)[:-1])


def launch(setup: OwnerSetup) -> Launched:
    """The simulation's owners in Ray actors (``run.ray_address``: '' starts a local Ray that
    ``stop`` shuts down; otherwise an existing cluster, left running)."""
    runtime = connect_ray(setup.run["ray_address"])
    try:
        specs = host_specs(setup, packing(setup, runtime))
        hosts = RayHosts.start(specs, setup.run["ray_actor_cpus"])
    except BaseException:
        runtime.stop()
        raise

    def stop() -> None:
        try:
            hosts.stop()
        finally:
            runtime.stop()

    owners = [d for block in hosts.described for d in block]
    return Launched(RayOracle(hosts, owners, setup.model), stop)


RAY = Transport(
    "ray",
    "owners packed into Ray actors, locally or on an existing Ray cluster (scaling experiments)",
    launch,
    needs="ray",
)
