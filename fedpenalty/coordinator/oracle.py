"""The oracle: how the coordinator asks all owners for noisy answers, whatever the transport.

Every transport (``transports.py``: in-process, gRPC, Ray) implements ``Oracle`` and passes the same
contract tests (tests/test_oracle_contract.py). Answers come back per owner together with the
noise sd each owner declared, so the samplers can subtract the exact noise variance. With
secure aggregation (docs/design.md §2.6) they come back as one row: the decoded sum over all
owners with the sd of its noise (``secure_sum.combine``); the samplers read both the same way
(``Answers.total``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..common import OwnerDescription, PrivacyReport
from ..kinds import KindTerms
from .network import Network


# per-request record: plain, not frozen (built on every query, never changed; docs/design.md §4)
@dataclass
class Answers:
    """Noisy answers in rows: one per owner, or (secure aggregation) one row holding the
    decoded sum over all owners. ``values``: ``(R, ...)``; ``noise_sd``: ``(R,)``, the sd of the
    Gaussian noise in each row's components (a sum's: √(Σ_k sd_k²))."""

    values: np.ndarray
    noise_sd: np.ndarray

    def total(self) -> tuple[np.ndarray, float]:
        """Sum over the rows and its total noise variance Σ_r sd_r²."""
        return self.values.sum(axis=0), float(np.sum(self.noise_sd**2))


@dataclass(frozen=True)
class SecureAggregation:
    """Ask the owners for secure aggregation (docs/design.md §2.6): ``total_noise_sd`` s, the
    sd of the noise the honest owners' sum carries (same units as the owners' sigma), and
    ``colluders`` t, the owners assumed to collude with the coordinator. Each owner checks both
    against its own policy and adds noise of variance s²/(K − t)."""

    total_noise_sd: float
    colluders: int = 0


@dataclass(frozen=True)
class Unreported:
    """An owner that gave no privacy report when asked: ``status`` ``"unreachable"`` (its
    host could not be reached) or ``"refused"``, the ``error`` saying why, and
    ``answers_received``: how many answers (keys: chain × iteration) this coordinator received
    from it since the run or its last resume started (None: the transport does not count)."""

    owner: str
    status: str
    error: str
    answers_received: int | None = None


class Oracle(Protocol):
    """All owners, as seen by the coordinator. A transport subclasses it and implements
    ``query`` (one generic call that knows no kind) and the session and report methods; the
    per-kind ``log_ratio``, ``suff_stats`` and ``gradient`` are wrappers over ``query``."""

    def describe(self) -> list[OwnerDescription]:
        """Public facts of every owner, in a fixed order (the order of ``Answers.values``)."""

    def open_session(
        self,
        algorithm: str,
        planned_answers: int,
        session: str | None = None,
        sampling_rate: float | None = None,
        max_step: float | None = None,
        secure: SecureAggregation | None = None,
    ) -> str:
        """Open (or, with an existing id, resume) a session of one kind at every owner
        (``open_kinds`` with its one ``KindTerms``); returns its id. ``sgmcmc`` sessions name the
        owners' Poisson ``sampling_rate``; ``penalty`` sessions may declare the largest step
        ``max_step`` they will ask about (≤ each owner's), which the owners check the plan and
        every request against. ``secure``: with secure aggregation — every owner's session key
        is relayed to all of them first, and every answer comes back as the decoded sum."""
        terms = KindTerms(algorithm, planned_answers, sampling_rate, max_step)
        return self.open_kinds([terms], session, secure)

    def open_kinds(
        self,
        terms: Sequence[KindTerms],
        session: str | None = None,
        secure: SecureAggregation | None = None,
    ) -> str:
        """Open (or resume) a session of the kinds ``terms`` (one ``KindTerms`` each: plan,
        rate, step) at every owner; returns its id (docs/design.md §4, "Sessions of several
        kinds"). What a transport implements."""
        raise NotImplementedError

    def query(
        self, kind: str, iteration: int, chains: np.ndarray, substep: int = 0, **arrays: Any
    ) -> Answers:
        """One query of ``kind`` (its protocol-v2 name, ``kinds.KINDS``) at every owner, for
        ``chains`` ``(C,)`` keyed from ``iteration`` on at ``substep`` (one of several answers
        of one kind in one iteration; part of the key), carrying the kind's ``arrays``
        (``QueryKind.arrays``). What every transport implements (each carries the sub-step to
        the owners, which check it); the kernels call the thin per-kind methods below."""
        ...

    def log_ratio(
        self, iteration: int, chains: np.ndarray, theta: np.ndarray, theta_prop: np.ndarray
    ) -> Answers:
        """Noisy log-likelihood ratios: chains ``(C,)``, theta/theta_prop ``(C, d)`` →
        values ``(K, C)``."""
        return self.query("log_ratio", iteration, chains, theta=theta, theta_prop=theta_prop)

    def suff_stats(self, chains: np.ndarray, start: int, block: int) -> Answers:
        """``block`` noisy copies of each owner's Σ S(x) per chain → values ``(K, C, block, s)``;
        copy j of chain c is keyed (c, start + j)."""
        return self.query("suff_stats", start, chains, block=block)

    def gradient(
        self, iteration: int, chains: np.ndarray, theta: np.ndarray, clip: float
    ) -> Answers:
        """Noisy clipped gradient sums: chains ``(C,)``, theta ``(C, d)`` → values ``(K, C, d)``;
        ``noise_sd`` is σ_k·clip. Divide by the session's sampling rate for an unbiased sum."""
        return self.query("gradient", iteration, chains, theta=theta, clip=clip)

    def privacy_reports(self) -> list[PrivacyReport]:
        """Each owner's own report (its ledger is the authority), for the open session."""

    def reachable_reports(self) -> list[PrivacyReport | Unreported]:
        """Every owner's report as ``privacy_reports``, asked host by host: an owner whose host
        cannot be reached (or refuses) gives an ``Unreported`` in its place, and the other hosts'
        reports are kept (a run that stopped reports what it can, docs/design.md §5)."""

    def close(self) -> None:
        """Close the session and release the transport."""

    def disconnect(self) -> None:
        """Release the transport but leave the session open at the owners (a stopped run that
        will be resumed)."""

    def simulation_diagnostics(self) -> dict[str, Any] | None:
        """Data-dependent counters of simulated owners (clip binds), or None where owners never
        release them (every deployed owner)."""

    def persist(self) -> None:
        """Make every charge so far durable before the run records a checkpoint (owners whose
        ledgers commit charges in groups, ``Ledger.simulation(batched=True)``); every other
        ledger has committed each charge before its answers were released."""
        return None

    # --- protocol cost (``cost.py``, docs/design.md §5) -------------------------------------
    def host_sizes(self) -> list[int]:
        """Owners per host, in ``describe`` order (one host: every owner)."""
        return [len(self.describe())]

    def impose_network(self, network: Network) -> bool:
        """Impose ``network``'s delays for real on every later query; False: this transport
        cannot (the cost meter then only prices them)."""
        return False

    def injected_seconds(self) -> float:
        """Seconds of imposed network delay the last query waited for (its slowest host's)."""
        return 0.0

    def measured_bytes(self) -> list[tuple[int, int]] | None:
        """Per host, the query bytes the transport itself serialised (sent to the host,
        received from it); None where nothing is serialised (in-process) or counted."""
        return None
