"""Many owners served by one process: one request answers for all of them.

Each owner keeps its own data, noise source and policy; owners that share a ledger file are
charged in one transaction per request, so a host of hundreds of owners pays one commit per
iteration instead of one per owner. A refusal by any owner (budget, validation) fails the whole
request and, within one ledger, charges nobody.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import numpy as np

from ..errors import InvalidRequest
from .node import OwnerDescription, OwnerNode, Pending, PrivacyReport, release


class OwnerHost:
    """A list of owner nodes answering batched requests: values are stacked in node order."""

    def __init__(self, nodes: Sequence[OwnerNode]):
        if not nodes:
            raise ValueError("a host needs at least one owner")
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"owner names must be unique within a host: {names}")
        self.nodes = list(nodes)

    def describe(self) -> list[OwnerDescription]:
        return [node.describe() for node in self.nodes]

    def open_session(self, session: str, algorithm: str, planned_answers: int) -> None:
        for node in self.nodes:
            node.open_session(session, algorithm, planned_answers)

    def close_session(self, session: str) -> None:
        for node in self.nodes:
            node.close_session(session)

    def log_ratio(self, session: str, iteration: int, chains: np.ndarray, theta: np.ndarray,
                  theta_prop: np.ndarray) -> np.ndarray:
        """``(K, C)`` noisy log-ratios, one row per hosted owner."""
        return np.stack(self._release([n.prepare_log_ratio(session, iteration, chains, theta, theta_prop)
                                       for n in self.nodes]))

    def suff_stats(self, session: str, chains: np.ndarray, start: int, block: int) -> np.ndarray:
        """``(K, C, block, s)`` noisy statistic copies, one slab per hosted owner."""
        return np.stack(self._release([n.prepare_suff_stats(session, chains, start, block) for n in self.nodes]))

    def privacy_reports(self, session: str | None = None) -> list[PrivacyReport]:
        return [node.privacy_report(session) for node in self.nodes]

    def _release(self, pending: list[Pending]) -> list[np.ndarray]:
        by_ledger: dict[int, list[int]] = defaultdict(list)
        for i, node in enumerate(self.nodes):
            by_ledger[id(node.ledger)].append(i)
        out: list[np.ndarray | None] = [None] * len(pending)
        for idx in by_ledger.values():
            for i, values in zip(idx, release(self.nodes[idx[0]].ledger, [pending[i] for i in idx])):
                out[i] = values
        return out  # type: ignore[return-value]

    def node(self, name: str) -> OwnerNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise InvalidRequest(f"this host serves no owner named {name!r}")
