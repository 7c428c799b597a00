"""Poisson-subsampled clipped log-likelihood-ratio sums (the Barker test, docs/design.md §2.12):
owner k's answer for chain c samples each record with the session's rate q, clips its
ℓ(x,θ'_c) − ℓ(x,θ_c) to ±clip, sums, and adds noise of sd σ_k·clip — seeded float noise for
simulated owners, exact lattice noise (the sum rounded to the lattice first) for the others.
``SampledLogRatioPath``: the kind's whole answer path at one host (the gradient path's sampling,
keys and charge with this kind's sums and multipliers). Secure aggregation is refused."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import InvalidRequest
from ..ledger import SampledCharge
from ..mechanism import HostNoise, Keys
from ..node import OwnerNode
from ..noise.exact import poisson_sample
from ..noise.lattice import lattice_gradient_multiplier
from ..pipeline import Asked, Planned, Request
from ..validation import row_digests

if TYPE_CHECKING:
    from ...kinds import QueryKind

#: The kind's ledger name (``kinds/sampled_log_ratio.py``).
LEDGER = "barker"


def ratio_multiplier(node: OwnerNode) -> float:
    """The noise multiplier ``node``'s answers are charged at: its level of the kind, lowered
    with lattice noise by the most rounding one component can add."""
    sigma = node.policy.noise_for(LEDGER)
    return lattice_gradient_multiplier(sigma, 1) if node.lattice else sigma


def sampled_ratio_sum(
    node: OwnerNode,
    theta: np.ndarray,
    theta_prop: np.ndarray,
    sample: tuple[np.ndarray, np.ndarray],
    clip: float,
) -> np.ndarray:
    """Σ over chain c's sampled records of clip(ℓ(x,θ'_c) − ℓ(x,θ_c), ±clip): ``(C,)``, nats.
    ``sample``: the record indices ``(m,)`` any chain sampled and which chain took which
    ``(C, m)`` bool; only those m records are evaluated. No noise; never released."""
    used, mask = sample
    if not used.size:
        return np.zeros(len(theta))
    diffs = node.model.log_lik_diff(node.records[used], theta, theta_prop)  # (C, m)
    clipped = np.clip(diffs, -clip, clip)
    if node.diagnostics is not None:
        node.diagnostics.count(LEDGER, int((diffs != clipped)[mask].sum()), int(mask.sum()))
    return (clipped * mask).sum(axis=1)


@dataclass(frozen=True)
class SampledRatioQuery:
    """A validated request: θ, θ′ ``(C, d)`` inside Θ at ``iteration``, the ``clip`` and the
    session's Poisson rate ``q``."""

    theta: np.ndarray
    theta_prop: np.ndarray
    iteration: int
    clip: float
    q: float


class SampledRatioCompute:
    """The answers of one host's owners ``nodes``."""

    kind = LEDGER

    def __init__(self, nodes: Sequence[OwnerNode]):
        self.nodes = list(nodes)

    def fresh(self, noise: HostNoise, keys: Keys, query: SampledRatioQuery) -> SampledAnswers:
        """Noisy answers ``(K, C, 1)`` to ``keys`` (one per chain of ``query``)."""
        return SampledAnswers(self, noise, keys, query)


class SampledAnswers:
    """One request's fresh answers (``pipeline.Fresh``): each owner's sample and noise drawn
    only when asked for, keyed (session, owner, chain, iteration)."""

    def __init__(
        self, compute: SampledRatioCompute, noise: HostNoise, keys: Keys, query: SampledRatioQuery
    ):
        self._compute, self._noise, self._keys, self._query = compute, noise, keys, query

    def one(self, k: int, new: np.ndarray) -> np.ndarray:
        """Owner k's answers ``(Σ new, 1)`` to the chains selected by ``new``."""
        chains = self._keys.chains[new]
        query, node = self._query, self._compute.nodes[k]
        sample = self._sample(k, chains, len(node.records))
        sums = sampled_ratio_sum(node, query.theta[new], query.theta_prop[new], sample, query.clip)
        iterations = np.full(len(chains), query.iteration)
        if not self._noise.lattice:
            seeded, session = self._noise.seeded, self._keys.address
            owner = np.array([k])
            normals = seeded.normals(session, LEDGER, owner, chains, iterations, 1)[0]
            return sums[:, None] + self._noise.levels[LEDGER][k] * query.clip * normals
        mechanism = self._noise.mechanism(self._keys.session, LEDGER)
        answers = self._noise.lattice_answers(
            mechanism,
            self._keys.label,
            LEDGER,
            np.array([k]),
            sums[None, :, None],
            chains,
            iterations,
            query.clip,
            self._keys.substep,
        )
        return answers[0]

    def every(self) -> np.ndarray:
        """Every owner's answers ``(K, C, 1)``, owner by owner."""
        every = np.ones(len(self._keys.chains), dtype=bool)
        return np.stack([self.one(k, every) for k in range(len(self._compute.nodes))])

    def _sample(self, k: int, chains: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Owner k's Poisson samples for ``chains``: the records any chain took ``(m,)`` and
        which chain took which ``(M, m)`` — seeded (O(q·n) draws) or exact (lattice owners),
        keyed as the gradient kind's."""
        query, noise = self._query, self._noise
        if noise.lattice:
            full = poisson_sample(
                noise.source,
                self._keys.label,
                LEDGER,
                query.q,
                n,
                owner=k,
                chain=chains,
                iteration=query.iteration,
            )
            used = np.flatnonzero(full.any(axis=0))
            return used, full[:, used]
        address, seeded = self._keys.address, noise.seeded
        samples = [
            seeded.sample(address, LEDGER, k, c, query.iteration, n, query.q)
            for c in chains.tolist()
        ]
        used = np.unique(np.concatenate(samples)) if samples else np.zeros(0, dtype=int)
        mask = np.zeros((len(chains), len(used)), dtype=bool)
        for row, sample in enumerate(samples):
            mask[row, np.searchsorted(used, sample)] = True
        return used, mask


class SampledLogRatioPath:
    """The answer path of ``kind`` at one host of ``nodes`` (``pipeline.KindPath``): each
    answer's digest is the kind's tag, the clip and (θ, θ′) as little-endian float64; each is
    charged as one Poisson-subsampled Gaussian release at (q, ``ratio_multiplier``)."""

    def __init__(self, kind: QueryKind, nodes: Sequence[OwnerNode]):
        self.compute = SampledRatioCompute(nodes)
        self.tag = kind.digest_tag
        self.nodes = list(nodes)
        self.neighbours = [n.policy.neighbour for n in nodes]

    def plan(
        self, asked: Asked, iteration: int, chains: Any, arrays: Mapping[str, Any]
    ) -> Planned[SampledRatioQuery]:
        """Answers ``(K, C, 1)`` to θ, θ′ ``(C, d)`` clipped at ``clip`` (``arrays``) at
        ``iteration`` for ``chains`` ``(C,)``, keyed (session, c, iteration), in nats."""
        checks = asked.checks
        q = checks.sampling_rate(asked.opened)
        iteration = checks.index("iteration", iteration)
        chains = checks.chains(chains)
        theta, theta_prop, pairs = checks.moves(arrays, len(chains))
        clip = checks.clip(arrays["clip"])
        checks.work(len(chains))
        mechanism = asked.mechanism
        if mechanism.secure is not None:
            raise InvalidRequest("sampled_log_ratio answers do not take secure aggregation")
        tag = self.tag + np.float64(clip).astype("<f8").tobytes()
        digests = row_digests(tag, pairs)

        keys = asked.keys(chains, np.full(len(chains), iteration))
        multipliers = np.array([ratio_multiplier(n) for n in self.nodes])
        sampled = SampledCharge(q, multipliers, self.neighbours)
        request = Request(keys, digests, mechanism, 1, sampled=sampled)
        query = SampledRatioQuery(theta, theta_prop, iteration, clip, q)
        return Planned(request, self.compute, query, (len(chains), 1), clip)
