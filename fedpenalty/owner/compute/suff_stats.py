"""Sufficient-statistic copies (penalty MH for exponential families, docs/design.md §2.2):
every key's exact answer is the owner's Σ_x S(x) ``(s,)``; the noise makes each copy fresh.
``SuffStatsPath``: the kind's whole answer path at one host."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ...common import SUFF_STATS
from ...errors import InvalidRequest
from ...models import ExpFamModel
from ..mechanism import HostNoise, Keys
from ..node import OwnerNode
from ..pipeline import Asked, Planned, Request
from .noisy import NoisyExact

if TYPE_CHECKING:
    from ...kinds import QueryKind


class SuffStatsCompute:
    """The statistic answers of one host's owners: their sums Σ S(x) ``stat_sum`` ``(K, s)``."""

    kind = SUFF_STATS

    def __init__(self, stat_sum: np.ndarray):
        self.stat_sum = stat_sum
        self.width = stat_sum.shape[1]

    @classmethod
    def offered(cls, nodes: Sequence[OwnerNode]) -> SuffStatsCompute | None:
        """The statistic answers of ``nodes``, or None for a model without sufficient
        statistics (whose statistic sessions do not open)."""
        if not isinstance(nodes[0].model, ExpFamModel):
            return None
        sums = [n.stat_sum for n in nodes]  # set for every exponential-family owner
        return cls(np.stack(sums))  # type: ignore[arg-type]

    def fresh(self, noise: HostNoise, keys: Keys, query: None) -> NoisyExact:
        """Noisy copies ``(K, M, s)`` of each owner's Σ S(x), one per key."""
        shape = (len(self.stat_sum), len(keys.chains), self.width)
        return NoisyExact(
            noise, keys, self.kind, lambda: np.broadcast_to(self.stat_sum[:, None, :], shape)
        )


class SuffStatsPath:
    """The statistic answer path of one host's owners ``nodes`` (``pipeline.KindPath``) for
    ``kind``: every copy's digest is the hash of the kind's tag alone (the query is the same
    whatever the key), and each copy is charged μ = Δ_S/σ_k per owner."""

    def __init__(self, kind: QueryKind, nodes: Sequence[OwnerNode]):
        #: None for a model without sufficient statistics (whose sessions do not open)
        self.compute = SuffStatsCompute.offered(nodes)
        self.digest = hashlib.sha256(kind.digest_tag).digest()
        model = nodes[0].model
        if isinstance(model, ExpFamModel):
            self.delta = np.array([kind.sensitivity(model, n.policy.neighbour, 1.0) for n in nodes])

    def plan(
        self, asked: Asked, iteration: int, chains: Any, arrays: Mapping[str, Any]
    ) -> Planned[None]:
        """``block`` (``arrays``) fresh copies per chain ``(K, C, block, s)``, copy j of chain c
        keyed (session, c, ``iteration`` + j) — ``iteration`` is the host's ``start``."""
        compute = self.compute
        assert compute is not None  # statistic sessions open for exponential-family models only
        checks = asked.checks
        start = checks.index("start", iteration)
        block = checks.index("block", arrays["block"])
        if block < 1:
            raise InvalidRequest("block must be at least 1", asked.label)
        chains = checks.chains(chains, per_chain=block)
        s = compute.width
        key_chains = np.repeat(chains, block)
        key_iterations = np.tile(start + np.arange(block), len(chains))

        keys = asked.keys(key_chains, key_iterations)
        mechanism = asked.mechanism
        mus = mechanism.mus(self.delta, np.ones(len(key_chains)), s)
        request = Request(keys, [self.digest] * len(key_chains), mechanism, s, mus)
        return Planned(request, compute, None, (len(chains), block, s))
