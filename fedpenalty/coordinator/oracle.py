"""The oracle: how the coordinator asks all owners for noisy answers, whatever the transport.

Every transport (``transports.py``: in-process, gRPC) implements ``Oracle`` and passes the same
contract tests (tests/test_oracle_contract.py). Answers come back per owner together with the
noise sd each owner declared, so the samplers can subtract the exact noise variance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..common import OwnerDescription, PrivacyReport


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

    def open_session(
        self,
        algorithm: str,
        planned_answers: int,
        session: str | None = None,
        sampling_rate: float | None = None,
        max_step: float | None = None,
    ) -> str:
        """Open (or, with an existing id, resume) a session at every owner; returns its id.
        ``sgmcmc`` sessions name the owners' Poisson ``sampling_rate``; ``penalty`` sessions may
        declare the largest step ``max_step`` they will ask about (≤ each owner's), which the
        owners check the plan and every request against."""

    def log_ratio(
        self, iteration: int, chains: np.ndarray, theta: np.ndarray, theta_prop: np.ndarray
    ) -> Answers:
        """Noisy log-likelihood ratios: chains ``(C,)``, theta/theta_prop ``(C, d)`` →
        values ``(K, C)``."""

    def suff_stats(self, chains: np.ndarray, start: int, block: int) -> Answers:
        """``block`` noisy copies of each owner's Σ S(x) per chain → values ``(K, C, block, s)``."""

    def gradient(
        self, iteration: int, chains: np.ndarray, theta: np.ndarray, clip: float
    ) -> Answers:
        """Noisy clipped gradient sums: chains ``(C,)``, theta ``(C, d)`` → values ``(K, C, d)``;
        ``noise_sd`` is σ_k·clip. Divide by the session's sampling rate for an unbiased sum."""

    def privacy_reports(self) -> list[PrivacyReport]:
        """Each owner's own report (its ledger is the authority), for the open session."""

    def close(self) -> None:
        """Close the session and release the transport."""

    def disconnect(self) -> None:
        """Release the transport but leave the session open at the owners (a stopped run that
        will be resumed)."""

    def simulation_diagnostics(self) -> dict[str, Any] | None:
        """Data-dependent counters of simulated owners (clip binds), or None where owners never
        release them (every deployed owner)."""
