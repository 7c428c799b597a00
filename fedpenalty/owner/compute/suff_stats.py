"""Sufficient-statistic copies (penalty MH for exponential families, docs/design.md §2.2):
every key's exact answer is the owner's Σ_x S(x) ``(s,)``; the noise makes each copy fresh."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...common import SUFF_STATS
from ...models import ExpFamModel
from ..mechanism import HostNoise, Keys
from ..node import OwnerNode
from .noisy import NoisyExact


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
