"""The in-process transport: owners living in the coordinator's process, served by one
``OwnerHost`` (no serialisation; tests and the fastest simulations)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..common import OwnerDescription, PrivacyReport
from ..owner import Ledger, OwnerHost, OwnerNode
from .oracle import Answers
from .transport_base import Launched, OwnerSetup, Transport


class InProcessOracle:
    """Owners living in this process, served by one ``OwnerHost`` (no serialisation)."""

    def __init__(self, nodes: Sequence[OwnerNode]):
        self.host = OwnerHost(nodes)
        self._sigma = np.array([node.policy.sigma for node in self.host.nodes])
        self.session: str | None = None

    def describe(self) -> list[OwnerDescription]:
        return self.host.describe()

    def open_session(
        self,
        algorithm: str,
        planned_answers: int,
        session: str | None = None,
        sampling_rate: float | None = None,
        max_step: float | None = None,
    ) -> str:
        session = session or uuid.uuid4().hex
        self.host.open_session(
            session, algorithm, planned_answers, sampling_rate, max_step=max_step
        )
        self.session = session
        return session

    def _require_session(self) -> str:
        if self.session is None:
            raise RuntimeError("open_session must be called first")
        return self.session

    def log_ratio(
        self, iteration: int, chains: np.ndarray, theta: np.ndarray, theta_prop: np.ndarray
    ) -> Answers:
        return Answers(
            self.host.log_ratio(self._require_session(), iteration, chains, theta, theta_prop),
            self._sigma,
        )

    def suff_stats(self, chains: np.ndarray, start: int, block: int) -> Answers:
        return Answers(
            self.host.suff_stats(self._require_session(), chains, start, block), self._sigma
        )

    def gradient(
        self, iteration: int, chains: np.ndarray, theta: np.ndarray, clip: float
    ) -> Answers:
        values = self.host.gradient(self._require_session(), iteration, chains, theta, clip)
        return Answers(values, self._sigma * clip)

    def privacy_reports(self) -> list[PrivacyReport]:
        return self.host.privacy_reports(self.session)

    def close(self) -> None:
        if self.session is not None:
            self.host.close_session(self.session)
            self.session = None

    def disconnect(self) -> None:
        """Nothing to release: the owners live in this process (the session stays open)."""

    def simulation_diagnostics(self) -> dict[str, Any] | None:
        nodes = self.host.nodes
        if any(node.diagnostics is None for node in nodes):
            return None
        return {
            "note": "data-dependent counters kept by simulated owners only; deployed owners never "
            "release them. "
            "Owners answering from sufficient statistics evaluate no per-record terms: for records "
            "inside "
            "the data domain the per-record clip cannot bind there",
            "answered_from_sufficient_statistics": [not node.per_record for node in nodes],
            "clip_binds": [node.simulation_diagnostics().clip_binds for node in nodes],
            "log_ratio_terms": [node.simulation_diagnostics().log_ratio_terms for node in nodes],
        }


def launch(setup: OwnerSetup) -> Launched:
    """The simulation's owners in this process, on one ledger in the run directory."""
    ledger = Ledger(setup.folder / "ledger.sqlite", synchronous="NORMAL")
    nodes = [
        OwnerNode(
            name, setup.model, records, policy, ledger, np.random.default_rng(seed), simulation=True
        )
        for name, records, policy, seed in zip(
            setup.names, setup.records, setup.policies, setup.seeds
        )
    ]
    return Launched(InProcessOracle(nodes), ledger.close)


INPROCESS = Transport("inprocess", "owners in the coordinator's process (fastest)", launch)
