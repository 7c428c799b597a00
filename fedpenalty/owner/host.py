"""The answer path of every owner: one or many owners served by one process.

A request (session, iteration, every chain's (θ, θ')) is answered for all hosted owners at once:
validate (``validation.py``) → replay check → charge → compute (``compute/``, one module a
query kind) → store → release (``pipeline.py``), noised by the session's mechanism
(``mechanism.py``). Each owner keeps its own data, noise source, policy and ledger rows;
owners that share a ledger file are charged in one transaction, so a host of hundreds of
owners pays one commit per request instead of one per owner. A refusal by any owner
(validation, budget, replay conflict) fails the whole request and, within one ledger, charges
nobody. A lone ``OwnerNode`` answers through a host of one (``OwnerHost([node])``).

Sessions with secure aggregation (docs/design.md §2.6) answer through the same path: their
noise, lattice step and charge come from the session's ``mechanism.Mechanism``, each owner's
answer is masked (``aggregation.SecureSession``) and stored masked, and the host releases only
the sum of its owners' masked answers (an ``aggregation.Reply``). Transports turn any answer
into a ``Reply`` with ``OwnerHost.reply``.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..common import OwnerDescription, PrivacyReport
from ..errors import InvalidRequest, UnknownSession
from ..kinds import QueryKind, query_kind
from ..kinds.per_owner import has_owner_axis, owner_rows
from ..models.compat import check_session_model
from .aggregation import PeerKey, Reply, SecureOpen
from .mechanism import HostNoise
from .node import SESSION_EVENTS, OwnerNode, close_sessions, open_sessions, privacy_reports
from .pipeline import AnswerPipeline, Asked, KindPath, Planned
from .pipeline import reply as reply_of
from .reveal import check_open, committed_keys, reveal_shares
from .session_request import SessionRequest
from .validation import RequestChecks, StepLimits


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while many long-lived objects are made (owners and
    their sessions at start-up), as it was afterwards: its full passes walk every object made
    so far, which at 10⁵ owners cost about a third of building and opening them (measured;
    docs/design.md §4, "Many owners"). Objects are still freed by reference counting."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class OwnerHost:
    """Owner nodes answering batched requests; values are stacked in node order ``(K, ...)``.

    All hosted owners share one model (the coordinator runs one model anyway).
    """

    def __init__(self, nodes: Sequence[OwnerNode]):
        if not nodes:
            raise ValueError("a host needs at least one owner")
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"owner names must be unique within a host: {names}")
        self.nodes = list(nodes)
        self.model = nodes[0].model
        if any(n.model != self.model for n in nodes):
            raise ValueError("all owners of a host must use the same model")
        self.names = names
        self.label = names[0] if len(names) == 1 else f"host of {len(names)} owners"
        # (session, kind asked) → (session events seen, every owner's open kind, step limits,
        # the query at sub-step 0 as its kind's path takes it)
        self._checked: dict[tuple[str, str], tuple[int, list, StepLimits, Asked]] = {}
        self._checks = RequestChecks(self.nodes, self.label)
        self._pipeline = AnswerPipeline(self.nodes)
        self._noise = HostNoise(self.nodes, self.label)
        #: each kind's answer path (``QueryKind.answer_path``), built when first asked
        self._paths: dict[str, KindPath] = {}
        #: a host of each owner alone, for queries with one θ row per owner (``_answer_each``)
        self._singles: dict[int, OwnerHost] = {}

    def reply(
        self,
        session: str,
        answers: np.ndarray | Reply,
        scale: float = 1.0,
        kind: str | QueryKind | None = None,
    ) -> Reply:
        """Any answer of this host as a transport carries it: plain answers ``(K, ...)`` of
        ``kind`` (the kind, or its v2 or ledger name; None: owners with one noise level for
        every kind)
        with each owner's noise sd σ_k·``scale`` (a secure session's reply is already one)."""
        if isinstance(answers, Reply):  # a secure session's: its sd and lattice step are set
            return answers
        ledger_name = None if kind is None else query_kind(kind, self.label).ledger_name
        return reply_of(self._noise.mechanism(session, ledger_name), answers, scale)

    # --- sessions and reports ---------------------------------------------------------------
    def describe(self) -> list[OwnerDescription]:
        return [node.describe() for node in self.nodes]

    def open_session(
        self,
        session: str,
        algorithm: str,
        planned_answers: int,
        sampling_rate: float | None = None,
        client: str | None = None,
        max_step: float | None = None,
        secure: SecureOpen | None = None,
    ) -> None:
        """Open (or resume) a session of one kind from ``SessionRequest.of``'s fields (``open``):
        ``client`` opens it; a penalty session may declare its largest step ``max_step``;
        ``secure``: with secure aggregation among ``secure.peers`` (docs/design.md §2.6)."""
        self.open(
            SessionRequest.of(
                session, algorithm, planned_answers, sampling_rate, client, max_step, secure
            )
        )

    def open(self, request: SessionRequest) -> None:
        """Open (or resume) ``request.session`` at every hosted owner (``node.open_sessions``)."""
        session, secure = request.session, request.secure
        mechanisms = None
        terms = request.kinds(self.label)  # refuses no kind and a kind twice
        # a session for another model is refused, naming both: checked once per model object
        # the owners share, naming the first owner of each (docs/design.md §4, "Many owners")
        for node in {id(n.model): n for n in reversed(self.nodes)}.values():
            check_session_model(request.model, node.model, node.name)
        if secure is not None:
            kinds = [query_kind(t.kind, self.label).ledger_name for t in terms]
            mechanisms = self._noise.secure_mechanisms(session, kinds, secure)
            check_open(self.nodes, session, secure)  # the graph's revealed shares
        with gc_paused():
            open_sessions(self.nodes, request)
        if mechanisms is not None:
            self._noise.keep_secure(session, mechanisms)
        self._pipeline.refresh_caps()
        for one in self._singles.values():
            one._pipeline.refresh_caps()

    def session_keys(self, session: str) -> list[PeerKey]:
        """Every hosted owner's public X25519 key for ``session`` (secure aggregation: the
        coordinator relays them to every participant before it opens the session), each with
        its commitment to its share of the masking graph's seed (``reveal.committed_keys``)."""
        return committed_keys(self.nodes, session)

    def reveal_shares(self, session: str, peers: Sequence[PeerKey]) -> list[PeerKey]:
        """Every hosted owner's graph share for ``session``, revealed once it holds and has bound
        every owner's commitment ``peers`` (``reveal.reveal_shares``; docs/design.md §2.6)."""
        return reveal_shares(self.nodes, session, peers)

    def close_session(self, session: str) -> None:
        close_sessions(self.nodes, session)
        self._noise.forget_secure(session)

    def _session(self, session: str, algorithm: str) -> tuple[int, list, StepLimits, Asked]:
        """Every owner's open ``session``'s kind ``algorithm``, validated in full, then kept
        until any owner anywhere opens or closes a session (``SESSION_EVENTS``): (session
        events seen, every owner's open kind, the steps it admits, a query of it at sub-step 0
        as a kind's path takes it)."""
        key = (session, algorithm)
        checked = self._checked.get(key) if isinstance(session, str) else None
        if checked is not None and checked[0] == SESSION_EVENTS[0]:
            return checked
        opened = [node.require_session(session, algorithm) for node in self.nodes]
        if any(o.secure is not None for o in opened) != self._noise.is_secure(session):
            raise UnknownSession(
                f"session {session!r} uses secure aggregation, but this host holds no keys for "
                "it: re-open it",
                self.label,
            )
        steps = np.array([np.inf if o.max_step is None else o.max_step for o in opened])
        limits = self._checks.step_limits(steps)
        asked = Asked(session, opened, limits, self._checks, self._noise, self.label)
        checked = self._checked[key] = (SESSION_EVENTS[0], opened, limits, asked)
        return checked

    def privacy_reports(self, session: str | None = None) -> list[PrivacyReport]:
        return privacy_reports(self.nodes, session)

    def session_opener(self, session: str) -> str | None:
        """The client recorded in the ledgers as the opener of ``session`` (None: not recorded,
        or opened without a client identity) — what binds a session to its client across
        restarts (``Ledger.session_opener``)."""
        for part in self._pipeline.parts:
            opener = part.ledger.session_opener(part.names, session)
            if opener is not None:
                return opener
        return None

    def reply_values(self, session: str, answers: int, width: int) -> int:
        """How many numbers the reply to ``answers`` keys of ``width`` carries: every owner's
        answers, or a secure session's one masked sum with its check words — so that a server
        bounds a reply before anything is computed (docs/design.md §3, invariant 9)."""
        if self._noise.is_secure(session):
            return answers * (width + 1)
        return len(self.nodes) * answers * width

    def node(self, name: str) -> OwnerNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise InvalidRequest(f"this host serves no owner named {name!r}")

    # --- queries ------------------------------------------------------------------------------
    def answer(
        self,
        kind: str | QueryKind,
        session: str,
        iteration: int,
        chains: np.ndarray,
        substep: int = 0,
        **arrays: Any,
    ) -> np.ndarray | Reply:
        """Every hosted owner's answers to one query of ``kind`` (the kind, or its v2 or ledger
        name: ``kinds.query_kind``) in ``session``: ``(K, C, ...)`` as the kind shapes them (a
        secure session: their masked sum, a ``Reply``). Keys (session, chain, iteration …) for
        ``chains`` ``(C,)`` at ``substep``; ``arrays``: exactly the kind's named arrays.

        The kind's path (``QueryKind.answer_path``) checks the query, digests it and says what
        each answer costs; the pipeline replays, charges, computes, stores and releases
        (docs/design.md §3, §4). An unknown kind, or a session of another kind, is refused.
        """
        asked_kind = query_kind(kind, self.label)
        asked_kind.check_arrays(arrays)
        if has_owner_axis(arrays, len(self.nodes), self.label):
            return self._answer_each(asked_kind, session, iteration, chains, substep, arrays)
        planned = self._plan(asked_kind, session, iteration, chains, substep, arrays)
        return self._pipeline.run(self._noise, planned)

    def answer_reply(
        self,
        kind: QueryKind,
        session: str,
        iteration: int,
        chains: np.ndarray,
        substep: int = 0,
        **arrays: Any,
    ) -> Reply:
        """``reply`` of ``answer`` (in-process transports), the answers' unit from the checked
        ``arrays`` (``QueryKind.reply_scale``): the noise sd of the mechanism the session's
        kept query holds (``_session``), instead of looking the session's kind up again."""
        values = self.answer(kind, session, iteration, chains, substep, **arrays)
        if isinstance(values, Reply):  # a secure session's: its sd and lattice step are set
            return values
        mechanism = self._session(session, kind.ledger_name)[3].mechanism
        return reply_of(mechanism, values, kind.reply_scale(arrays))

    def _plan(
        self,
        kind: QueryKind,
        session: str,
        iteration: int,
        chains: np.ndarray,
        substep: int,
        arrays: dict[str, Any],
    ) -> Planned:
        """``kind``'s checked, digested and priced plan of one query (nothing recorded yet)."""
        _, opened, limits, asked = self._session(session, kind.ledger_name)
        if type(substep) is not int or substep != 0:  # sub-step 0: the session's kept query
            asked = Asked(session, opened, limits, self._checks, self._noise, self.label, substep)
        return self._path(kind).plan(asked, iteration, chains, arrays)

    def _answer_each(
        self,
        kind: QueryKind,
        session: str,
        iteration: int,
        chains: np.ndarray,
        substep: int,
        arrays: dict[str, Any],
    ) -> np.ndarray:
        """A query with one θ row per owner (``kinds.per_owner``): each owner checks, digests
        and answers its own rows alone, through a host of itself; every owner's rows are
        checked before any owner answers. ``(K, C, ...)``. Refused in a secure session (a
        masked sum over owners asked at different φ_k would mean nothing here)."""
        if self._noise.is_secure(session):
            raise InvalidRequest(
                "a query with one θ row per owner cannot be securely aggregated: set "
                "privacy.aggregation = 'none'",
                self.label,
            )
        singles = [self._single(k) for k in range(len(self.nodes))]
        rows = owner_rows(arrays, len(self.nodes))
        plans = [
            one._plan(kind, session, iteration, chains, substep, own)
            for one, own in zip(singles, rows)
        ]
        return np.concatenate(
            [one._pipeline.run(one._noise, plan) for one, plan in zip(singles, plans)]
        )

    def _single(self, k: int) -> OwnerHost:
        """A host of owner k alone (shares its node: sessions, ledger, noise stream)."""
        one = self._singles.get(k)
        if one is None:
            one = self._singles[k] = OwnerHost([self.nodes[k]])
        return one

    def _path(self, kind: QueryKind) -> KindPath:
        """``kind``'s answer path for this host's owners, built the first time it is asked."""
        path = self._paths.get(kind.name)
        if path is None:
            path = self._paths[kind.name] = kind.answer_path(self.nodes)
        return path

    def log_ratio(
        self,
        session: str,
        iteration: int,
        chains: np.ndarray,
        theta: np.ndarray,
        theta_prop: np.ndarray,
        substep: int = 0,
    ) -> np.ndarray | Reply:
        """Noisy clipped log-likelihood ratios ``(K, C)`` (a secure session: their masked sum,
        a ``Reply``).

        chains ``(C,)`` distinct non-negative ints; theta, theta_prop ``(C, d)`` inside Θ with
        ‖θ' − θ‖ ≤ each owner's ``max_step``. Owner k's answer for chain c is
        Σ_x clip(ℓ(x,θ'_c) − ℓ(x,θ_c), ±L‖θ'_c − θ_c‖) + N(0, σ_k²), keyed (session, c, iteration)
        and charged μ = Δ/σ_k with Δ = 2L‖θ'_c − θ_c‖ (replace-one) or L‖θ'_c − θ_c‖ (add/remove);
        in a secure session the noise variance is s²/(K − t) and μ = (Δ + γ)/s.
        """
        return self.answer(
            "log_ratio", session, iteration, chains, substep, theta=theta, theta_prop=theta_prop
        )

    def suff_stats(
        self, session: str, chains: np.ndarray, start: int, block: int, substep: int = 0
    ) -> np.ndarray | Reply:
        """``block`` fresh noisy copies of each owner's Σ S(x) per chain: ``(K, C, block, s)``
        (a secure session: their masked sum, a ``Reply``).

        Copy j of chain c is keyed (session, c, start + j); each copy is N(Σ S(x), σ_k² I),
        charged μ = Δ_S/σ_k (secure: variance s²/(K − t), μ = (Δ_S + γ√s)/s).
        """
        return self.answer("suff_stats", session, start, chains, substep, block=block)

    def gradient(
        self,
        session: str,
        iteration: int,
        chains: np.ndarray,
        theta: np.ndarray,
        clip: float,
        substep: int = 0,
    ) -> np.ndarray | Reply:
        """Noisy clipped gradient sums ``(K, C, d)`` (federated SG-MCMC, docs/design.md §2.3;
        a secure session: their masked sum, a ``Reply``, with noise sd s·clip/√(K − t)).

        Owner k's answer for chain c: each record sampled with the session's Poisson rate q,
        its ∇_θ ℓ(x, θ_c) clipped to L2 norm ``clip`` (≤ the owner's ``max_clip``), summed, plus
        noise of sd σ_k·clip — for a lattice owner the sample and the exact discrete-Gaussian
        noise come from its keyed stream and the sum is rounded to the lattice first. Keyed
        (session, c, iteration); each is one subsampled-Gaussian release at (q, the owner's
        ``gradient_noise_multiplier``), counted against the session's plan.
        """
        return self.answer("gradient", session, iteration, chains, substep, theta=theta, clip=clip)
