"""Per-record-clipped log-likelihood-ratio sums at a query's clip (docs/design.md §2.8): owner
k's exact answer for chain c is Σ_x clip(ℓ(x,θ'_c) − ℓ(x,θ_c), ±clip), record by record, noised
at sd σ_k·clip — summed from Σ S(x) where the model certifies that the clip cannot bind
(``clip_free``). ``ClippedLogRatioPath``: the kind's answer path at one host — its checks,
digests and charge μ = Δ/σ_k per answer (Δ per unit clip: 2 or 1), whatever the step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import InvalidRequest
from ...models import ExpFamModel
from ..mechanism import HostNoise, Keys
from ..node import OwnerNode
from ..pipeline import Asked, Planned, Request
from ..validation import row_digests
from .clip_free import clip_free
from .log_ratio import clipped_ratio_sum
from .noisy import NoisyExact

if TYPE_CHECKING:
    from ...kinds import QueryKind


@dataclass(frozen=True)
class ClippedLogRatioQuery:
    """A validated request: ``theta``, ``theta_prop`` ``(C, d)`` inside Θ and the ``clip``
    (within every owner's min_clip and max_clip); ``distance`` ``(C,)``: ‖θ' − θ‖ > 0 of a
    query clipped per unit distance, None for an absolute clip."""

    theta: np.ndarray
    theta_prop: np.ndarray
    clip: float
    distance: np.ndarray | None = None


#: What a query clipped per unit distance digests after the kind's tag (absolute: nothing, as
#: before), so the two forms of one key never match each other.
PER_DISTANCE = b"\x00per unit distance"


def step_lengths(theta: np.ndarray, theta_prop: np.ndarray, label: str) -> np.ndarray:
    """‖θ' − θ‖ ``(C,)`` of a query clipped per unit distance; ``InvalidRequest`` unless each
    is finite and > 0 (a bound c·0 would answer with no noise)."""
    distance = np.linalg.norm(theta_prop - theta, axis=1)
    if not (np.all(np.isfinite(distance)) and np.all(distance > 0)):
        raise InvalidRequest(
            "a clipped_log_ratio query per unit distance needs θ' ≠ θ for every chain (its "
            "bound and noise are clip_per_distance × ‖θ' − θ‖)",
            label,
        )
    return distance


def clip_free_ratio_sum(
    node: OwnerNode,
    theta: np.ndarray,
    theta_prop: np.ndarray,
    bound: np.ndarray,
    kind: str,
    certified: np.ndarray | None,
) -> np.ndarray:
    """``clipped_ratio_sum`` ``(C,)`` (each record's term clipped to ±bound_c), with the chains
    whose clip the model's ``certified`` bound ``(C,)`` (``Model.log_lik_diff_bound``, asked
    once per request) shows cannot bind (``clip_free``) summed from Σ S(x); their records
    count as evaluated with no hit in simulation diagnostics."""
    model, n = node.model, len(node.records)
    free = clip_free(node, certified, bound)
    if not free.any():
        return clipped_ratio_sum(node, theta, theta_prop, bound, kind)
    stats = node.stat_sum
    # clip_free certifies only exponential-family owners that keep Σ S(x)
    assert isinstance(model, ExpFamModel) and stats is not None
    total = np.empty(len(theta))
    total[free] = model.log_lik_diff_from_stats(n, stats, theta[free], theta_prop[free])
    rest = ~free
    if rest.any():
        total[rest] = clipped_ratio_sum(node, theta[rest], theta_prop[rest], bound[rest], kind)
    if node.diagnostics is not None:
        node.diagnostics.count(kind, 0, int(free.sum()) * n)
    return total


class ClippedLogRatioCompute:
    """The clipped log-ratio answers of one host's owners ``nodes``."""

    def __init__(self, kind: str, nodes: Sequence[OwnerNode]):
        self.kind = kind
        self.nodes = list(nodes)

    def fresh(self, noise: HostNoise, keys: Keys, query: ClippedLogRatioQuery) -> NoisyExact:
        """Noisy answers ``(K, C, 1)`` to ``keys`` (one per chain of ``query``), sd σ_k·clip.
        Per unit distance: Σ_x clip(Δℓ, ±clip·‖θ' − θ‖)/‖θ' − θ‖ = Σ_x clip(Δℓ/‖θ' − θ‖, ±clip)."""
        distance = query.distance
        unit = np.ones(len(query.theta)) if distance is None else distance
        bound = query.clip * unit

        def exact() -> np.ndarray:
            theta, prop = query.theta, query.theta_prop
            certified = self.nodes[0].model.log_lik_diff_bound(theta, prop)  # one model per host
            sums = [
                clip_free_ratio_sum(n, theta, prop, bound, self.kind, certified) / unit
                for n in self.nodes
            ]
            return np.stack(sums)[:, :, None]

        return NoisyExact(noise, keys, self.kind, exact, query.clip)


class ClippedLogRatioPath:
    """The answer path of ``kind`` at one host of ``nodes`` (``pipeline.KindPath``): each
    answer's digest is the kind's tag, the clip and (θ, θ′) as little-endian float64; each is
    charged μ = Δ/σ_k (Δ per unit clip, the noise sd being σ_k·clip) at any step. A query
    clipped per unit distance digests its own tag (``PER_DISTANCE``) after the kind's."""

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
        theta, theta_prop, pairs = checks.moves(arrays, len(chains))
        per_distance = "clip_per_distance" in arrays
        clip = checks.clip(arrays["clip_per_distance" if per_distance else "clip"])
        distance = step_lengths(theta, theta_prop, checks.label) if per_distance else None
        checks.work(len(chains))
        tag = self.tag + (PER_DISTANCE if per_distance else b"")
        tag += np.float64(clip).astype("<f8").tobytes()
        digests = row_digests(tag, pairs)

        keys = asked.keys(chains, np.full(len(chains), iteration))
        mechanism = asked.mechanism
        mus = mechanism.mus(self.delta, np.ones(len(chains)), 1)
        request = Request(keys, digests, mechanism, 1, mus)
        query = ClippedLogRatioQuery(theta, theta_prop, clip, distance)
        return Planned(request, self.compute, query, (len(chains),), clip)
