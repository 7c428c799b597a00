"""The answer pipeline of one owner host: replay stored answers, charge, compute fresh ones,
store, release (docs/design.md §3, invariants 1 and 11; §4).

Owners that share a ledger file are one ``LedgerPart`` and are charged in one transaction. A
request's answers are computed only once every ledger's charging transaction has decided every
refusal that does not need them (budget, plan, caps, replay), and are stored and committed
before anything is released; a refused request draws no noise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from ..errors import ReplayConflict
from .aggregation import Reply
from .compute import Compute, Fresh
from .ledger import Charge, SampledCharge
from .ledger_rows import AffineMus, span
from .mechanism import HostNoise, Keys, Mechanism, noise_address
from .node import OwnerNode
from .validation import RequestChecks, StepLimits

Q = TypeVar("Q")


class LedgerPart:
    """The hosted owners that share one ledger file, with what every charge needs as arrays:
    positions ``idx`` in the host, names, ledger ids, limits (docs/design.md §4)."""

    def __init__(self, nodes: list[OwnerNode], idx: list[int]):
        self.nodes = [nodes[k] for k in idx]
        self.idx = np.array(idx, dtype=np.int64)
        #: how to take this part's rows of a host array: a view when it is every owner
        self.rows: slice | np.ndarray = slice(None) if idx == list(range(len(nodes))) else self.idx
        self.ledger = self.nodes[0].ledger
        self.names = [n.name for n in self.nodes]
        self.owner_ids = self.ledger.ids(self.names)
        self.budget_epsilon = np.array([n.policy.budget_epsilon for n in self.nodes])
        self.delta = np.array([n.policy.delta for n in self.nodes])
        self.renyi = any(n.renyi_accounting for n in self.nodes)
        self.refresh_caps()

    def refresh_caps(self) -> None:
        """Re-read the owners' μ² caps (opening a session may lower them)."""
        self.max_mu_squared = np.array([n.max_mu_squared for n in self.nodes])


# per-request record: plain, not frozen (built on every query, never changed; docs/design.md §4)
@dataclass
class Request:
    """One request as the pipeline answers it: its ``keys`` with query ``digests[j]`` for key
    j, answered under ``mechanism`` with answers of ``width`` components, charged ``mus`` (a
    Gaussian answer), ``sampled`` (a subsampled-Gaussian one) or ``pure`` (each owner's pure ε
    ``(K,)`` of one answer: the Laplace statistics)."""

    keys: Keys
    digests: list[bytes]
    mechanism: Mechanism
    width: int
    mus: AffineMus | None = None
    sampled: SampledCharge | None = None
    pure: np.ndarray | None = None


@dataclass(frozen=True)
class Asked:
    """One query of an open session as a host hands it to its kind's path (``KindPath``):
    the ``session``, every hosted owner's open session ``opened`` (``OwnerNode.require_session``),
    the steps it admits ``limits``, the host's request ``checks`` and ``noise``, the host's
    ``label`` for errors about no single owner, and the ``substep`` asked."""

    session: str
    opened: list
    limits: StepLimits
    checks: RequestChecks
    noise: HostNoise
    label: str
    substep: Any = 0

    def keys(self, chains: np.ndarray, iterations: np.ndarray) -> Keys:
        """The request's keys ``(M,)`` at ``substep`` (a non-negative int): keyed and charged in
        the asked kind's ledger session, their noise addressed with the sub-step folded in
        when it is not 0 (``noise_address``), under a fresh ``HostNoise.label``."""
        substep, ledger_session, address = self._address
        return Keys(ledger_session, self.noise.label(address), chains, iterations, substep)

    @cached_property
    def _address(self) -> tuple[int, str, str]:
        """The checked sub-step, the ledger session and the noise address of every request
        asked with these terms (a host keeps a session's ``Asked`` for sub-step 0)."""
        substep = self.checks.index("substep", self.substep)
        ledger_session = self.opened[0].ledger_session
        return substep, ledger_session, noise_address(ledger_session, substep)

    @cached_property
    def mechanism(self) -> Mechanism:
        """How the session's answers of the asked kind are noised and charged (kept: a host
        builds a session's ``Asked`` anew after any session opens or closes, and a session's
        mechanisms change only then)."""
        return self.noise.mechanism(self.session, self.opened[0].kind.ledger_name)


# per-request record: plain, not frozen (built on every query, never changed; docs/design.md §4)
@dataclass
class Planned(Generic[Q]):
    """A validated query, ready for the pipeline: its keys, digests and charge (``request``),
    the kind's ``compute`` of the kind's ``query`` value, and how the answers are released:
    ``shape`` per owner and the answer unit ``scale`` (a gradient's clip)."""

    request: Request
    compute: Compute[Q]
    query: Q
    shape: tuple[int, ...]
    scale: float = 1.0


class KindPath(Protocol):
    """One query kind's answer path at one host (``QueryKind.answer_path``): ``plan`` checks a
    query's ``iteration``, ``chains`` and named ``arrays`` (``InvalidRequest`` for anything out
    of shape or of policy), digests each answer's query, and gives the charge of each answer
    and the compute of the fresh ones."""

    def plan(
        self, asked: Asked, iteration: int, chains: Any, arrays: Mapping[str, Any]
    ) -> Planned[Any]: ...


class AnswerPipeline:
    """Replay, charge, compute and release for the owners ``nodes`` of one host."""

    def __init__(self, nodes: Sequence[OwnerNode]):
        self.nodes = list(nodes)
        self.names = [n.name for n in nodes]
        by_ledger: dict[int, list[int]] = {}
        for i, node in enumerate(nodes):
            by_ledger.setdefault(id(node.ledger), []).append(i)
        self.parts = [LedgerPart(self.nodes, idx) for idx in by_ledger.values()]
        #: the usual request's new answers ``(K, M)`` (all of them), read-only, by M
        self._every: dict[int, np.ndarray] = {}

    def refresh_caps(self) -> None:
        """Re-read every owner's μ² cap (after a session opens)."""
        for part in self.parts:
            part.refresh_caps()

    def run(self, noise: HostNoise, planned: Planned[Q]) -> np.ndarray | Reply:
        """``answer`` the planned request with its compute's fresh answers, noised by ``noise``
        (drawn only when needed), then ``release`` them shaped ``(K, *shape)``."""
        request = planned.request
        fresh = planned.compute.fresh(noise, request.keys, planned.query)
        return release(request.mechanism, self.answer(request, fresh), planned.shape, planned.scale)

    def answer(self, request: Request, fresh: Fresh) -> np.ndarray:
        """The reply ``(K, M, w')`` of ``Mechanism.dtype`` (float64; masked uint64 words in a
        secure session) to the request's keys.

        A key an owner answered before gets its stored answer (nothing drawn, nothing charged);
        a simulated ledger's answered key, stored without its answer, gets it recomputed from
        the seeded noise, which is a pure function of the owner's seed and the key's address
        (the same answer; nothing charged).
        For the others, every ledger's charging transaction first decides every refusal that
        does not need the answers — budget, plan, caps, replay — and only then does
        ``fresh.one(k, new)`` compute owner k's noisy answers (``fresh.every()``: every owner
        and key at once, for the usual request where nothing was answered before); they are
        stored and committed before anything is returned (docs/design.md §3, invariants 1 and
        11). A refused request draws no noise.
        """
        keys = request.keys
        first, last = span(keys.iterations)
        stored = [
            {}
            if part.ledger.book.unanswered_from(keys.session, first, keys.substep)
            else part.ledger.stored_ids_at(part.owner_ids, keys.session, first, last, keys.substep)
            for part in self.parts
        ]
        if len(self.parts) == 1 and not stored[0]:
            # the usual request: one ledger file, nothing answered before — one charge
            part = self.parts[0]
            every = self._all_new(len(keys.chains))
            return part.ledger.book.charge_drawn(self._charge(part, request, every), fresh.every)
        new = np.ones((len(self.nodes), len(keys.chains)), dtype=bool)
        return self._answer_parts(request, fresh, new, stored)

    def _all_new(self, keys: int) -> np.ndarray:
        """``(K, keys)`` all True, read-only: the new answers of the usual request."""
        every = self._every.get(keys)
        if every is None:
            every = self._every[keys] = np.ones((len(self.nodes), keys), dtype=bool)
            every.flags.writeable = False
        return every

    def _answer_parts(
        self, request: Request, fresh: Fresh, new: np.ndarray, stored_by_part: list[dict]
    ) -> np.ndarray:
        """``answer`` for any parts: replay each part's ``stored_by_part`` answers, charge
        every part's new ones, then draw and store (``new`` ``(K, M)``: all True on entry)."""
        keys = request.keys
        width, dtype = request.mechanism.width(request.width), request.mechanism.dtype
        # answered keys whose answers a simulated ledger recomputes instead of storing
        redo = np.zeros_like(new)
        out: np.ndarray | None = None
        for part, stored in zip(self.parts, stored_by_part):
            if stored:
                if out is None:
                    out = np.empty((len(self.nodes), len(keys.chains), width), dtype=dtype)
                self._replay(stored, part, request, out, new, redo)
        charges = [
            (part, self._charge(part, request, new)) for part in self.parts if new[part.rows].any()
        ]
        with ExitStack() as transactions:
            stores = [
                (part, transactions.enter_context(part.ledger.charging(charge)))
                for part, charge in charges
            ]
            # every refusal that does not need the answers has been decided: draw them now
            drawn = new | redo
            if out is None or drawn.all():
                out = fresh.every()
            else:
                for k in range(len(self.nodes)):
                    if drawn[k].any():
                        out[k, drawn[k]] = fresh.one(k, drawn[k])
            for part, store in stores:
                store(out[part.rows])
        return out

    def _charge(self, part: LedgerPart, request: Request, new: np.ndarray) -> Charge:
        """The charge of ``part``'s owners' ``new`` answers, without the answers themselves."""
        rows, sampled, mus = part.rows, request.sampled, request.mus
        sub = None
        if sampled is not None:
            sub = SampledCharge(
                sampled.q,
                sampled.noise_multiplier[rows],
                [sampled.neighbour[k] for k in part.idx.tolist()],
            )
        return Charge(
            request.keys.session,
            part.names,
            request.keys.chains,
            request.keys.iterations,
            request.digests,
            None,
            mus if mus is None or isinstance(rows, slice) else mus[rows],
            new[rows],
            part.max_mu_squared,
            part.budget_epsilon,
            part.delta,
            sub,
            part.renyi,
            part.owner_ids,
            request.keys.substep,
            None if request.pure is None else request.pure[rows],
        )

    def _replay(
        self,
        stored: dict,
        part: LedgerPart,
        request: Request,
        out: np.ndarray,
        new: np.ndarray,
        redo: np.ndarray,
    ) -> None:
        """Put the stored answers of ``part``'s owners into ``out`` (and clear ``new``); an
        answer stored as nothing (a simulated ledger's) is marked in ``redo`` instead, to be
        recomputed; a key answered for a different query is a ``ReplayConflict``."""
        keys, digests = request.keys, request.digests
        for k, owner_id in zip(part.idx.tolist(), part.owner_ids.tolist()):
            for j, key in enumerate(zip(keys.chains.tolist(), keys.iterations.tolist())):
                row = stored.get((owner_id, *key))
                if row is None:
                    continue
                if row[0] != digests[j]:
                    at = f", sub-step {keys.substep}" if keys.substep else ""
                    raise ReplayConflict(
                        f"(session, chain {key[0]}, iteration {key[1]}{at}) was already answered "
                        "for a "
                        f"different query; "
                        "an owner never gives two independent noisy answers to one query",
                        self.names[k],
                    )
                if row[1]:
                    out[k, j] = np.frombuffer(row[1], dtype=out.dtype.newbyteorder("<"))
                else:
                    redo[k, j] = True
                new[k, j] = False


def release(
    mechanism: Mechanism, out: np.ndarray, shape: tuple[int, ...], scale: float = 1.0
) -> np.ndarray | Reply:
    """What a host releases from its owners' answers ``(K, M, w')``: them, shaped
    ``(K, *shape)``; in a secure session only their masked sum (``SecureSession.reply``)."""
    if mechanism.secure is None:
        return out.reshape(out.shape[0], *shape)
    return mechanism.secure.reply(out, shape, scale)


def reply(mechanism: Mechanism, answers: np.ndarray | Reply, scale: float = 1.0) -> Reply:
    """Any answer of a host as a transport carries it: plain answers ``(K, ...)`` with each
    owner's noise sd σ_k·``scale`` (a secure session's reply is already one)."""
    if isinstance(answers, Reply):
        return answers
    sd = mechanism.sd
    return Reply(answers, sd if scale == 1.0 else sd * scale)
