"""Per-record-clipped log-likelihood-ratio sums at a query's clip (docs/design.md §2.8): owner
k's exact answer for chain c is Σ_x clip(ℓ(x,θ'_c) − ℓ(x,θ_c), ±clip), record by record, noised
at sd σ_k·clip. ``ClippedLogRatioPath``: the kind's answer path at one host — its checks,
digests and charge μ = Δ/σ_k per answer (Δ per unit clip: 2 or 1), whatever the step."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..mechanism import HostNoise, Keys
from ..node import OwnerNode
from ..pipeline import Asked, Planned, Request
from .log_ratio import clipped_ratio_sum
from .noisy import NoisyExact

if TYPE_CHECKING:
    from ...kinds import QueryKind


@dataclass(frozen=True)
class ClippedLogRatioQuery:
    """A validated request: ``theta``, ``theta_prop`` ``(C, d)`` inside Θ and the ``clip``
    (within every owner's min_clip and max_clip)."""

    theta: np.ndarray
    theta_prop: np.ndarray
    clip: float


class ClippedLogRatioCompute:
    """The clipped log-ratio answers of one host's owners ``nodes``."""

    def __init__(self, kind: str, nodes: Sequence[OwnerNode]):
        self.kind = kind
        self.nodes = list(nodes)

    def fresh(self, noise: HostNoise, keys: Keys, query: ClippedLogRatioQuery) -> NoisyExact:
        """Noisy answers ``(K, C, 1)`` to ``keys`` (one per chain of ``query``), sd σ_k·clip."""
        bound = np.full(len(query.theta), query.clip)

        def exact() -> np.ndarray:
            sums = [
                clipped_ratio_sum(n, query.theta, query.theta_prop, bound, self.kind)
                for n in self.nodes
            ]
            return np.stack(sums)[:, :, None]

        return NoisyExact(noise, keys, self.kind, exact, query.clip)


class ClippedLogRatioPath:
    """The answer path of ``kind`` at one host of ``nodes`` (``pipeline.KindPath``): each
    answer's digest is the kind's tag, the clip and (θ, θ′) as little-endian float64; each is
    charged μ = Δ/σ_k (Δ per unit clip, the noise sd being σ_k·clip) at any step."""

    def __init__(self, kind: QueryKind, nodes: Sequence[OwnerNode]):
        self.compute = ClippedLogRatioCompute(kind.ledger_name, nodes)
        self.tag = kind.digest_tag
        model = nodes[0].model
        self.delta = np.array([kind.sensitivity(model, n.policy.neighbour, 1.0) for n in nodes])

    def plan(
        self, asked: Asked, iteration: int, chains: Any, arrays: Mapping[str, Any]
    ) -> Planned[ClippedLogRatioQuery]:
        """Answers ``(K, C)`` to θ, θ′ ``(C, d)`` clipped at ``clip`` (``arrays``) at
        ``iteration`` for ``chains`` ``(C,)``, keyed (session, c, iteration), in nats."""
        checks = asked.checks
        iteration = checks.index("iteration", iteration)
        chains = checks.chains(chains)
        theta = checks.theta("theta", arrays["theta"], len(chains))
        theta_prop = checks.theta("theta_prop", arrays["theta_prop"], len(chains))
        clip = checks.clip(arrays["clip"])
        checks.work(len(chains))
        tag = self.tag + np.float64(clip).astype("<f8").tobytes()
        pairs = np.concatenate([theta, theta_prop], axis=1).astype("<f8", copy=False)
        digests = [hashlib.sha256(tag + row.tobytes()).digest() for row in pairs]

        keys = asked.keys(chains, np.full(len(chains), iteration))
        mechanism = asked.mechanism
        mus = mechanism.mus(self.delta, np.ones(len(chains)), 1)
        request = Request(keys, digests, mechanism, 1, mus)
        query = ClippedLogRatioQuery(theta, theta_prop, clip)
        return Planned(request, self.compute, query, (len(chains),), clip)
