"""Clipped, Poisson-subsampled gradient sums (federated SG-MCMC, docs/design.md §2.3): owner
k's answer for chain c samples each record with the session's rate q, clips its ∇_θ ℓ(x, θ_c)
to L2 norm ``clip``, sums, and adds noise of sd σ_k·clip — seeded float noise for simulated
owners, exact lattice noise (the sum rounded to the lattice first) for the others.
``GradientPath``: the kind's whole answer path at one host."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ...common import SGMCMC
from ...models import Model
from ..ledger import SampledCharge
from ..mechanism import HostNoise, Keys, Mechanism
from ..node import OwnerNode
from ..noise.exact import poisson_sample
from ..pipeline import Asked, Planned, Request

if TYPE_CHECKING:
    from ...kinds import QueryKind


def clipped_gradient_sum(
    model: Model, records: np.ndarray, theta: np.ndarray, mask: np.ndarray, clip: float
) -> np.ndarray:
    """Σ over the sampled records of ∇_θ ℓ(x, θ_c) clipped to L2 norm ``clip``: ``(C, d)``.

    ``records`` prepared ``(n, p)``; ``theta`` ``(C, d)``; ``mask`` bool ``(C, n)``, the records
    each chain's answer includes. No noise; never released as is.
    """
    if not (math.isfinite(clip) and clip > 0):
        raise ValueError(f"clip must be finite and > 0, got {clip!r}")
    c, d = theta.shape
    used = mask.any(axis=0)
    if not used.any():
        return np.zeros((c, d))
    grads, scale = clipped_gradients(model, records[used], theta, clip)
    return np.einsum("cm,cmd->cd", mask[:, used] * scale, grads)


def clipped_gradients(
    model: Model, records: np.ndarray, theta: np.ndarray, clip: float
) -> tuple[np.ndarray, np.ndarray]:
    """Each record's ∇_θ ℓ(x, θ_c) ``(C, n, d)`` and the factor ``(C, n)`` in (0, 1] that
    clips it to L2 norm ``clip`` (1: the clip does not bind)."""
    grads = model.grad_log_lik(records, theta)  # (C, n, d)
    norms = np.linalg.norm(grads, axis=2)
    return grads, np.minimum(1.0, clip / np.maximum(norms, np.finfo(float).tiny))


@dataclass(frozen=True)
class GradientQuery:
    """A validated gradient request: ``theta`` ``(C, d)`` inside Θ at ``iteration``, the
    ``clip`` (within every owner's limits) and the session's Poisson rate ``q``."""

    theta: np.ndarray
    iteration: int
    clip: float
    q: float


class GradientCompute:
    """The gradient answers of one host's owners ``nodes``."""

    kind = SGMCMC

    def __init__(self, nodes: Sequence[OwnerNode]):
        self.nodes = list(nodes)
        self.model = nodes[0].model
        #: components of one answer
        self.width = self.model.dim

    def sums(
        self, records: np.ndarray, theta: np.ndarray, mask: np.ndarray, clip: float
    ) -> np.ndarray:
        """The exact (noiseless) answers ``(C, width)``: ``clipped_gradient_sum``."""
        return clipped_gradient_sum(self.model, records, theta, mask, clip)

    def fresh(self, noise: HostNoise, keys: Keys, query: GradientQuery) -> GradientAnswers:
        """Noisy gradient answers ``(K, C, d)`` to ``keys`` (one per chain of ``query``)."""
        return GradientAnswers(self, noise, keys, query)


class GradientAnswers:
    """One request's fresh gradient answers (``pipeline.Fresh``): each owner's sample and
    noise drawn only when asked for, keyed (session, owner, chain, iteration)."""

    def __init__(
        self, compute: GradientCompute, noise: HostNoise, keys: Keys, query: GradientQuery
    ):
        self._compute, self._noise, self._keys, self._query = compute, noise, keys, query

    def one(self, k: int, new: np.ndarray) -> np.ndarray:
        """Owner k's answers ``(Σ new, d')`` to the chains selected by ``new``."""
        chains, theta = self._keys.chains[new], self._query.theta[new]
        if not self._noise.lattice:
            return self._seeded(k, chains, theta)
        return self._lattice(k, chains, theta)

    def every(self) -> np.ndarray:
        """Every owner's answers ``(K, C, d')``, owner by owner."""
        all_keys = np.ones(len(self._keys.chains), dtype=bool)
        return np.stack([self.one(k, all_keys) for k in range(len(self._compute.nodes))])

    def _seeded(self, k: int, chains: np.ndarray, theta: np.ndarray) -> np.ndarray:
        """A simulated owner k's answers ``(M, d)``: Poisson sample (O(q·n) work,
        ``SeededNormals.sample``) and float noise of sd σ_k·clip, both addressed by (session,
        owner, chain, iteration)."""
        session, kind = self._keys.address, self._compute.kind
        iteration, clip, q = self._scalars()
        records = self._compute.nodes[k].records
        seeded = self._noise.seeded
        samples = [
            seeded.sample(session, kind, k, c, iteration, len(records), q) for c in chains.tolist()
        ]
        every = np.sort(np.concatenate(samples))
        used = every[np.r_[True, every[1:] != every[:-1]]] if every.size else every
        mask = np.zeros((len(chains), len(used)), dtype=bool)
        for row, sample in enumerate(samples):
            mask[row, np.searchsorted(used, sample)] = True
        sums = self._compute.sums(records[used], theta, mask, clip)
        iterations = np.full(len(chains), iteration)
        width = self._compute.width
        normals = seeded.normals(session, kind, np.array([k]), chains, iterations, width)[0]
        return sums + self._noise.levels[kind][k] * clip * normals

    def _lattice(self, k: int, chains: np.ndarray, theta: np.ndarray) -> np.ndarray:
        """Owner k's lattice answers ``(M, d)`` (masked words ``(M, d + 1)`` in a secure
        session): Poisson sample and exact discrete-Gaussian noise of sd σ_k·clip, both keyed
        under the request's noise label; clipped sum, rounded (docs/design.md §2.7)."""
        keys, kind, (iteration, clip, q) = self._keys, self._compute.kind, self._scalars()
        records = self._compute.nodes[k].records
        noise = self._noise
        mask = poisson_sample(
            noise.source,
            keys.label,
            kind,
            q,
            len(records),
            owner=k,
            chain=chains,
            iteration=iteration,
        )
        sums = self._compute.sums(records, theta, mask, clip)
        iterations = np.full(len(chains), iteration)
        mechanism = noise.mechanism(keys.session, kind)
        answers = noise.lattice_answers(
            mechanism,
            keys.label,
            kind,
            np.array([k]),
            sums[None],
            chains,
            iterations,
            clip,
            keys.substep,
        )
        return answers[0]

    def _scalars(self) -> tuple[int, float, float]:
        """(iteration, clip, q) of the request."""
        return self._query.iteration, self._query.clip, self._query.q


class GradientPath:
    """The gradient answer path of one host's owners ``nodes`` (``pipeline.KindPath``) for
    ``kind``: each answer's digest is the kind's tag, the clip and θ_c as little-endian
    float64; each is charged as one Poisson-subsampled Gaussian release at (q, the owner's
    gradient noise multiplier) under its neighbour relation."""

    def __init__(self, kind: QueryKind, nodes: Sequence[OwnerNode]):
        self.compute = self.computing(nodes)
        self.tag = kind.digest_tag
        self.dim = self.compute.width
        self.neighbours = [n.policy.neighbour for n in nodes]

    def computing(self, nodes: Sequence[OwnerNode]) -> GradientCompute:
        """The answers' computation: ``GradientCompute``."""
        return GradientCompute(nodes)

    def multipliers(self, mechanism: Mechanism) -> np.ndarray:
        """The noise multipliers ``(K,)`` the answers are charged at: the mechanism's
        gradient multipliers."""
        return mechanism.gradient_multiplier

    def plan(
        self, asked: Asked, iteration: int, chains: Any, arrays: Mapping[str, Any]
    ) -> Planned[GradientQuery]:
        """Answers ``(K, C, d)`` to θ ``(C, d)`` at ``iteration`` clipped at ``clip``
        (``arrays``), keyed (session, c, iteration), in units of the clip."""
        checks = asked.checks
        q = checks.sampling_rate(asked.opened)
        iteration = checks.index("iteration", iteration)
        chains = checks.chains(chains)
        theta = checks.theta("theta", arrays["theta"], len(chains))
        clip = checks.clip(arrays["clip"])
        checks.work(len(chains))
        tag = self.tag + np.float64(clip).tobytes()
        digests = [
            hashlib.sha256(tag + theta[c].astype("<f8").tobytes()).digest()
            for c in range(len(chains))
        ]

        keys = asked.keys(chains, np.full(len(chains), iteration))
        mechanism = asked.mechanism
        sampled = SampledCharge(q, self.multipliers(mechanism), self.neighbours)
        request = Request(keys, digests, mechanism, self.dim, sampled=sampled)
        query = GradientQuery(theta, iteration, clip, q)
        return Planned(request, self.compute, query, (len(chains), self.dim), clip)
