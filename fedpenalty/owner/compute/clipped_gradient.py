"""Per-record-clipped gradient sums over all of an owner's records (docs/design.md §2.8):
owner k's exact answer for chain c is Σ_x ∇_θ ℓ(x, θ_c) clipped to L2 norm ``clip``, noised at
sd σ_k·clip on each coordinate — summed from Σ S(x) where the model certifies that the clip
cannot bind (``clip_free``). ``ClippedGradientPath``: the kind's answer path at one host —
its checks, digests and charge μ = Δ/σ_k per answer (Δ per unit clip: 2 or 1)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ...models import ExpFamModel, Model
from ..mechanism import HostNoise, Keys
from ..node import OwnerNode
from ..pipeline import Asked, Planned, Request
from .clip_free import clip_free
from .gradient import clipped_gradients
from .noisy import NoisyExact

if TYPE_CHECKING:
    from ...kinds import QueryKind


@dataclass(frozen=True)
class ClippedGradientQuery:
    """A validated request: ``theta`` ``(C, d)`` inside Θ and the ``clip`` (within every
    owner's min_clip and max_clip)."""

    theta: np.ndarray
    clip: float


#: The most per-record gradient components held at once (C × records × d): the records are
#: taken in chunks, so one request's memory stays bounded whatever the owner's n.
CHUNK_COMPONENTS = 1 << 22


def clipped_gradient_total(
    node: OwnerNode, theta: np.ndarray, clip: float, kind: str, certified: np.ndarray | None
) -> np.ndarray:
    """Σ over ``node``'s records of ∇_θ ℓ(x, θ_c) clipped to L2 norm ``clip``: ``(C, d)``; no
    noise, never released. Chains whose clip the model's ``certified`` bound ``(C,)``
    (``Model.gradient_norm_bound``, asked once per request) shows cannot bind (``clip_free``)
    are summed from Σ S(x); the others record by record. Counts the records whose clip binds
    under ``kind`` (a ledger name) in simulation diagnostics (none on a certified chain)."""
    c, d = theta.shape
    model, n = node.model, len(node.records)
    free = clip_free(node, certified, np.full(c, clip))
    total = np.zeros((c, d))
    if free.any():
        # clip_free certifies only exponential-family owners that keep Σ S(x)
        assert isinstance(model, ExpFamModel) and node.stat_sum is not None
        summed = model.grad_log_lik_from_stats(n, node.stat_sum, theta[free])
        if summed is None:  # the model bounds the gradient but cannot sum it from Σ S(x)
            free[:] = False
        else:
            total[free] = summed
    hits = 0
    if not free.all():
        total[~free], hits = _per_record_total(model, node.records, theta[~free], clip)
    if node.diagnostics is not None:
        node.diagnostics.count(kind, hits, c * n)
    return total


def _per_record_total(
    model: Model, records: np.ndarray, theta: np.ndarray, clip: float
) -> tuple[np.ndarray, int]:
    """Σ_x ∇_θ ℓ(x, θ_c) clipped to L2 norm ``clip`` ``(C, d)``, record by record in chunks
    of at most ``CHUNK_COMPONENTS`` components, and how many records' clip bound."""
    c, d = theta.shape
    chunk = max(1, CHUNK_COMPONENTS // (c * d))
    total = np.zeros((c, d))
    hits = 0
    for first in range(0, len(records), chunk):
        grads, scale = clipped_gradients(model, records[first : first + chunk], theta, clip)
        total += np.einsum("cm,cmd->cd", scale, grads)
        hits += int((scale < 1.0).sum())
    return total, hits


class ClippedGradientCompute:
    """The clipped gradient answers of one host's owners ``nodes``."""

    def __init__(self, kind: str, nodes: Sequence[OwnerNode]):
        self.kind = kind
        self.nodes = list(nodes)

    def fresh(self, noise: HostNoise, keys: Keys, query: ClippedGradientQuery) -> NoisyExact:
        """Noisy answers ``(K, C, d)`` to ``keys`` (one per chain of ``query``), sd σ_k·clip."""

        def exact() -> np.ndarray:
            theta, clip = query.theta, query.clip
            certified = self.nodes[0].model.gradient_norm_bound(theta)  # one model per host
            return np.stack(
                [clipped_gradient_total(n, theta, clip, self.kind, certified) for n in self.nodes]
            )

        return NoisyExact(noise, keys, self.kind, exact, query.clip)


class ClippedGradientPath:
    """The answer path of ``kind`` at one host of ``nodes`` (``pipeline.KindPath``): each
    answer's digest is the kind's tag, the clip and θ_c as little-endian float64; each is
    charged μ = Δ/σ_k (Δ per unit clip, the noise sd being σ_k·clip)."""

    def __init__(self, kind: QueryKind, nodes: Sequence[OwnerNode]):
        self.compute = ClippedGradientCompute(kind.ledger_name, nodes)
        self.tag = kind.digest_tag
        model = nodes[0].model
        self.dim = model.dim
        self.delta = np.array([kind.sensitivity(model, n.policy.neighbour, 1.0) for n in nodes])

    def plan(
        self, asked: Asked, iteration: int, chains: Any, arrays: Mapping[str, Any]
    ) -> Planned[ClippedGradientQuery]:
        """Answers ``(K, C, d)`` to θ ``(C, d)`` clipped at ``clip`` (``arrays``) at
        ``iteration`` for ``chains`` ``(C,)``, keyed (session, c, iteration)."""
        checks = asked.checks
        iteration = checks.index("iteration", iteration)
        chains = checks.chains(chains)
        theta = checks.theta("theta", arrays["theta"], len(chains))
        clip = checks.clip(arrays["clip"])
        checks.work(len(chains))
        tag = self.tag + np.float64(clip).astype("<f8").tobytes()
        digests = [hashlib.sha256(tag + row.astype("<f8").tobytes()).digest() for row in theta]

        keys = asked.keys(chains, np.full(len(chains), iteration))
        mechanism = asked.mechanism
        mus = mechanism.mus(self.delta, np.ones(len(chains)), self.dim)
        request = Request(keys, digests, mechanism, self.dim, mus)
        query = ClippedGradientQuery(theta, clip)
        return Planned(request, self.compute, query, (len(chains), self.dim), clip)
