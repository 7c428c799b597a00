"""The masking graph of secure aggregation (docs/design.md §2.6, "The masking graph"): which
pairs of owners share pairwise masks. Pure functions of public values only.

Small sessions use the complete graph (every pair masks, as Bonawitz et al. 2017). Larger ones
use the sparse graph of SecAgg+ (Bell, Bonawitz, Gascón, Lepoint & Raykova 2020): the Harary
graph H(K, k) — owners on a ring, each adjacent to the k/2 nearest on either side — over a
uniformly random ring order. The order is the rank of SHA-256(graph seed ‖ name), and the seed
hashes the session, s, t, K, every (name, key) and every owner's share, each committed to before
any is revealed (``aggregation.graph_seed``), so each owner computes its own neighbours from what
it was shown: no one chooses the graph, and owners shown different peers, terms or shares get
different graphs (and masks that do not cancel).

Removing the t colluders disconnects H(K, k) only if they fill two disjoint runs of k/2
consecutive ring places; a union bound over the K(K − k − 1)/2 pairs of such runs, each filled
with probability (t)_k/(K)_k under a uniform order, bounds the failure probability
(``log_disconnect_bound``). The degree is the smallest even k whose bound is at most
2^−``FAILURE_BITS``; the bound is added to the owner's δ (``graph_failure``).
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .ledger_records import PART_SEPARATOR, SecureSpend

#: The sparse graph's failure bound is at most 2⁻⁴⁰ a session (as SecAgg+'s parameters).
FAILURE_BITS = 40
#: Sessions of at most this many owners mask along the complete graph (its cost is small).
COMPLETE_UP_TO = 64


def log_disconnect_bound(owners: int, colluders: int, degree: int) -> float:
    """ln of a bound on P(the Harary graph H(K, k) over a uniform ring order is disconnected
    once ``colluders`` t owners are removed): ln[K(K − k − 1)/2 · (t)_k/(K)_k]; −inf when
    k > t (two runs of k/2 colluders need k of them) or the graph is complete."""
    k = degree
    if k > colluders or k >= owners - 1:
        return -math.inf
    pairs = math.log(owners) + math.log(owners - k - 1) - math.log(2)
    filled = (
        math.lgamma(colluders + 1)
        - math.lgamma(colluders - k + 1)
        + math.lgamma(owners - k + 1)
        - math.lgamma(owners + 1)
    )
    return pairs + filled


@functools.lru_cache(maxsize=256)
def graph_degree(owners: int, colluders: int) -> tuple[int, float]:
    """(degree k, failure bound) of a session of ``owners`` K with ``colluders`` t: the
    complete graph (K − 1, 0) for K ≤ ``COMPLETE_UP_TO`` or when no even k < K − 1 meets the
    bound, else the smallest even k whose ``log_disconnect_bound`` is ≤ 2^−``FAILURE_BITS``."""
    if owners <= COMPLETE_UP_TO:
        return owners - 1, 0.0
    limit = -FAILURE_BITS * math.log(2)
    for k in range(2, owners - 1, 2):
        bound = log_disconnect_bound(owners, colluders, k)
        if bound <= limit:
            return k, math.exp(bound)
    return owners - 1, 0.0


def graph_failure(owners: int, colluders: int) -> float:
    """The probability the owner's δ carries for one secure session of K ``owners`` and t
    ``colluders`` (0 for the complete graph, or t = K − 1: charged at its own noise alone)."""
    if colluders >= owners - 1:
        return 0.0
    return graph_degree(owners, colluders)[1]


def ring_order(seed: bytes, names: list[str]) -> np.ndarray:
    """The ring place ``(K,)`` of each of ``names`` (in the order given): the rank of
    SHA-256(seed ‖ name) — a uniformly random order for a seed nobody chose."""
    digests = [hashlib.sha256(seed + name.encode()).digest() for name in names]
    order = sorted(range(len(names)), key=digests.__getitem__)
    place = np.empty(len(names), dtype=np.int64)
    place[order] = np.arange(len(names))
    return place


@dataclass(frozen=True)
class MaskGraph:
    """The session's masking graph over owners 0 … K − 1 (name order): ``degree`` k (K − 1:
    complete), ``failure`` its bound, ``place`` ``(K,)`` each owner's ring place (sparse only)."""

    owners: int
    degree: int
    failure: float
    place: np.ndarray | None

    @classmethod
    def of(cls, seed: bytes, names: list[str], colluders: int) -> MaskGraph:
        """The graph of owners ``names`` (name order) with ``colluders`` t from ``seed``."""
        degree, failure = graph_degree(len(names), colluders)
        sparse = degree < len(names) - 1
        return cls(len(names), degree, failure, ring_order(seed, names) if sparse else None)

    @property
    def complete(self) -> bool:
        return self.place is None

    def neighbours(self, owners: np.ndarray) -> np.ndarray:
        """``(H, k)`` the neighbours of each of ``owners`` ``(H,)``, in name order."""
        count = self.owners
        if self.place is None:
            every = np.broadcast_to(np.arange(count), (owners.size, count))
            return every[every != owners[:, None]].reshape(owners.size, count - 1)
        at = np.empty(count, dtype=np.int64)
        at[self.place] = np.arange(count)
        half = np.arange(1, self.degree // 2 + 1)
        offsets = np.concatenate([-half[::-1], half])
        return at[(self.place[owners][:, None] + offsets[None, :]) % count]

    def pairs(self, owners: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The edges (low, high) ``(P,)`` with at least one end among ``owners``, each once,
        sorted by (low, high)."""
        ends = self.neighbours(owners)
        mine = np.broadcast_to(owners[:, None], ends.shape)
        count = self.owners
        code = np.unique(np.minimum(mine, ends) * count + np.maximum(mine, ends))
        return code // count, code % count


def sessions_failure(sessions: Iterable[tuple[str, int, int]]) -> float:
    """Σ ``graph_failure`` over an owner's secure sessions given as (ledger session, K, t
    charged); the parts of a session of several kinds (``session\\x1fkind``) share one graph,
    counted once."""
    distinct = {name.partition(PART_SEPARATOR)[0]: (k, t) for name, k, t in sessions}
    return math.fsum(graph_failure(k, t) for k, t in distinct.values())


def accounting_delta(delta: float, failure: float) -> float:
    """The δ an owner's accountant is asked for so that ε holds at ``delta`` overall: its
    releases are (ε, δ')-DP given connected honest subgraphs, which fail with probability at
    most ``failure`` (``sessions_failure``), so (ε, δ' + failure)-DP: δ' = δ − failure.
    ``ValueError`` naming privacy.delta when nothing is left."""
    left = delta - failure
    if not left > 0:
        raise ValueError(
            f"the masking graphs' failure bound {failure:.3g} uses up privacy.delta = {delta:g}"
        )
    return left


def secure_delta(delta: float, secure: Sequence[SecureSpend]) -> float:
    """``accounting_delta`` of an owner whose ledger recorded the secure sessions ``secure``
    (their charged terms: the graph claim is void at t = K − 1, charged at its own noise)."""
    rows = ((r.session, r.terms.owners, r.terms.colluders) for r in secure)
    return accounting_delta(delta, sessions_failure(rows))
