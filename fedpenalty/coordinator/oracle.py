"""The oracle: how the coordinator asks all owners for noisy answers, whatever the transport.

Every transport (in-process, gRPC, Ray) implements ``Oracle`` and passes the same contract
tests. Answers come back per owner together with the noise sd each owner declared, so the
samplers can subtract the exact noise variance.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from ..owner import OwnerDescription, OwnerNode, PrivacyReport
from ..owner.host import OwnerHost


@dataclass(frozen=True)
class Answers:
    """Per-owner noisy answers. ``values``: ``(K, ...)``; ``noise_sd``: ``(K,)``, the sd of the
    Gaussian noise each owner added to each component."""

    values: np.ndarray
    noise_sd: np.ndarray

    def total(self) -> tuple[np.ndarray, float]:
        """Sum over owners and its total noise variance Σ_k σ_k²."""
        return self.values.sum(axis=0), float(np.sum(self.noise_sd**2))


class Oracle(Protocol):
    """All owners, as seen by the coordinator."""

    def describe(self) -> list[OwnerDescription]:
        """Public facts of every owner, in a fixed order (the order of ``Answers.values``)."""

    def open_session(self, algorithm: str, planned_answers: int, session: str | None = None,
                     sampling_rate: float | None = None) -> str:
        """Open (or, with an existing id, resume) a session at every owner; returns its id.
        ``sgmcmc`` sessions name the owners' Poisson ``sampling_rate``."""

    def log_ratio(self, iteration: int, chains: np.ndarray, theta: np.ndarray, theta_prop: np.ndarray) -> Answers:
        """Noisy log-likelihood ratios: chains ``(C,)``, theta/theta_prop ``(C, d)`` →
        values ``(K, C)``."""

    def suff_stats(self, chains: np.ndarray, start: int, block: int) -> Answers:
        """``block`` noisy copies of each owner's Σ S(x) per chain → values ``(K, C, block, s)``."""

    def gradient(self, iteration: int, chains: np.ndarray, theta: np.ndarray, clip: float) -> Answers:
        """Noisy clipped gradient sums: chains ``(C,)``, theta ``(C, d)`` → values ``(K, C, d)``;
        ``noise_sd`` is σ_k·clip. Divide by the session's sampling rate for an unbiased sum."""

    def privacy_reports(self) -> list[PrivacyReport]:
        """Each owner's own report (its ledger is the authority), for the open session."""

    def close(self) -> None:
        """Close the session and release the transport."""


class InProcessOracle:
    """Owners living in this process, served by one ``OwnerHost`` (no serialisation)."""

    def __init__(self, nodes: Sequence[OwnerNode]):
        self.host = OwnerHost(nodes)
        self._sigma = np.array([node.policy.sigma for node in self.host.nodes])
        self.session: str | None = None

    def describe(self) -> list[OwnerDescription]:
        return self.host.describe()

    def open_session(self, algorithm: str, planned_answers: int, session: str | None = None,
                     sampling_rate: float | None = None) -> str:
        session = session or uuid.uuid4().hex
        self.host.open_session(session, algorithm, planned_answers, sampling_rate)
        self.session = session
        return session

    def _require_session(self) -> str:
        if self.session is None:
            raise RuntimeError("open_session must be called first")
        return self.session

    def log_ratio(self, iteration: int, chains: np.ndarray, theta: np.ndarray, theta_prop: np.ndarray) -> Answers:
        return Answers(self.host.log_ratio(self._require_session(), iteration, chains, theta, theta_prop), self._sigma)

    def suff_stats(self, chains: np.ndarray, start: int, block: int) -> Answers:
        return Answers(self.host.suff_stats(self._require_session(), chains, start, block), self._sigma)

    def gradient(self, iteration: int, chains: np.ndarray, theta: np.ndarray, clip: float) -> Answers:
        values = self.host.gradient(self._require_session(), iteration, chains, theta, clip)
        return Answers(values, self._sigma * clip)

    def privacy_reports(self) -> list[PrivacyReport]:
        return self.host.privacy_reports(self.session)

    def close(self) -> None:
        if self.session is not None:
            self.host.close_session(self.session)
            self.session = None
