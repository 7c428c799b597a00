"""The Laplace release of the owners' sufficient-statistic sums (private Gibbs, docs/design.md
§2.10, "The Laplace release"): each owner's Σ_x S(x) ``(s,)`` of its clipped records, rounded
to its lattice and released with exact discrete Laplace noise from its counter-addressed words
(ChaCha20 under its noise key when deployed; seeded Philox for simulated owners), charged its
pure ε in its ledger. ``LaplaceStatsPath``: the kind's whole answer path at one host."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import InvalidRequest
from ...models import ExpFamModel
from ..mechanism import HostNoise, Keys
from ..node import OwnerNode
from ..noise.laplace import laplace_answers, laplace_gamma
from ..noise.seeded import seed_material
from ..noise.sources import NoiseKey, WordSource, word_source
from ..pipeline import Asked, Planned, Request

if TYPE_CHECKING:
    from ...kinds.laplace_stats import LaplaceStats


def owner_words(nodes: Sequence[OwnerNode]) -> WordSource:
    """The hosted owners' word sources (owner k: index k): each one's noise key, or, for a
    simulated owner without one, a key derived from its seed (SIMULATION ONLY: whoever knows
    the seed knows the noise)."""
    keys = [
        n.noise_key
        if n.noise_key is not None
        else NoiseKey.derive(seed_material(n.rng), f"{n.name}/laplace")
        for n in nodes
    ]
    return word_source(keys, simulation=all(n.seeded_streams for n in nodes))


class LaplaceFresh:
    """The released answers to ``keys``: owner k's exact sum ``stat_sum[k]`` plus its discrete
    Laplace noise of scale ``scale[k]`` on its lattice ``gamma[k]``, drawn under the keys'
    label (``pipeline.Fresh``)."""

    def __init__(self, compute: LaplaceStatsCompute, keys: Keys):
        self._c, self._keys = compute, keys

    def one(self, k: int, new: np.ndarray) -> np.ndarray:
        """Owner k's answers ``(Σ new, s)`` to the keys selected by ``new``."""
        c, keys = self._c, self._keys
        chains, iterations = keys.subset(new)
        values = np.broadcast_to(c.stat_sum[k], (len(chains), c.width))
        return laplace_answers(
            c.source, keys.label, c.kind, values, c.scale[k], c.gamma[k], k, chains, iterations
        )

    def every(self) -> np.ndarray:
        """Every owner's answers ``(K, M, s)`` to every key."""
        every = np.ones(len(self._keys.chains), dtype=bool)
        return np.stack([self.one(k, every) for k in range(len(self._c.stat_sum))])


class LaplaceStatsCompute:
    """The Laplace answers of one host's owners: their sums Σ S(x) ``stat_sum`` ``(K, s)``,
    scales b ``(K,)`` (answer units) and lattice steps γ ``(K,)``."""

    def __init__(self, kind: str, nodes: Sequence[OwnerNode], stat_sum: np.ndarray):
        self.kind = kind
        self.stat_sum = stat_sum
        self.width = stat_sum.shape[1]
        self.scale = [n.policy.noise_for(kind) for n in nodes]
        self.gamma = [laplace_gamma(b) for b in self.scale]
        self.source = owner_words(nodes)

    def fresh(self, noise: HostNoise, keys: Keys, query: None) -> LaplaceFresh:
        """The answers to ``keys`` (drawn only when the pipeline asks, after the charge)."""
        return LaplaceFresh(self, keys)


class LaplaceStatsPath:
    """The Laplace answer path of one host's owners ``nodes`` (``pipeline.KindPath``): one
    answer per asked chain, keyed (session, chain, iteration); every digest the hash of the
    kind's tag alone; each answer charged its owner's pure ε (``LaplaceStats.release_epsilon``,
    computed by the owner from its own policy and model)."""

    def __init__(self, kind: LaplaceStats, nodes: Sequence[OwnerNode]):
        model = nodes[0].model
        #: None for a model without sufficient statistics (whose sessions do not open)
        self.compute: LaplaceStatsCompute | None = None
        if isinstance(model, ExpFamModel):
            sums = np.stack([n.stat_sum for n in nodes])  # type: ignore[misc]
            self.compute = LaplaceStatsCompute(kind.ledger_name, nodes, sums)
            self.epsilon = np.array([kind.release_epsilon(n.model, n.policy) for n in nodes])
        self.digest = hashlib.sha256(kind.digest_tag).digest()

    def plan(
        self, asked: Asked, iteration: int, chains: Any, arrays: Mapping[str, Any]
    ) -> Planned[None]:
        """One release per chain of ``chains`` at ``iteration`` ``(K, C, s)``; refused in a
        secure session (a Laplace release is never masked)."""
        compute = self.compute
        assert compute is not None  # statistic sessions open for exponential-family models only
        mechanism = asked.mechanism
        if mechanism.secure is not None:
            raise InvalidRequest("laplace_stats is never released in a secure session", asked.label)
        checks = asked.checks
        at = checks.index("iteration", iteration)
        chains = checks.chains(chains)
        keys = asked.keys(chains, np.full(len(chains), at, dtype=np.int64))
        s = compute.width
        request = Request(keys, [self.digest] * len(chains), mechanism, s, pure=self.epsilon)
        return Planned(request, compute, None, (len(chains), s))
