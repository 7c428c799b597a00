"""Clipped log-likelihood-ratio sums (penalty MH, docs/design.md §2.1, §2.2): owner k's exact
answer for chain c is Σ_x clip(ℓ(x,θ'_c) − ℓ(x,θ_c), ±c_clip‖θ'_c − θ_c‖), record by record —
or, for an exponential-family model where provably no per-record clip binds, in O(1) from the
owner's sufficient statistics (``ExpFamShortcut``). ``LogRatioPath``: the kind's whole answer
path at one host — its checks, digests and charge μ = Δ/σ per answer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ...common import LOG_RATIO
from ...models import ExpFamModel
from ...models.base import require_lipschitz
from ..ledger_rows import AffineMus
from ..mechanism import HostNoise, Keys, Mechanism
from ..node import OwnerNode
from ..pipeline import Asked, Planned, Request
from ..validation import row_digests
from .noisy import NoisyExact

if TYPE_CHECKING:
    from ...kinds import QueryKind


# per-request record: plain, not frozen (built on every query, never changed; docs/design.md §4)
@dataclass
class LogRatioQuery:
    """A validated log-ratio request: ``theta``, ``theta_prop`` ``(C, d)`` inside Θ and their
    steps ‖θ' − θ‖ ``(C,)``."""

    theta: np.ndarray
    theta_prop: np.ndarray
    step: np.ndarray


def clipped_ratio_sum(
    node: OwnerNode, theta: np.ndarray, theta_prop: np.ndarray, bound: np.ndarray, kind: str
) -> np.ndarray:
    """Σ_x clip(ℓ(x,θ') − ℓ(x,θ), ±bound_c) over ``node``'s records, per chain ``(C,)``
    (``bound`` ``(C,)``); no noise, never released. Counts the records whose clip binds under
    ``kind`` (a ledger name) in simulation diagnostics."""
    diffs = node.model.log_lik_diff(node.records, theta, theta_prop)
    clipped = np.clip(diffs, -bound[:, None], bound[:, None])
    if node.diagnostics is not None:
        node.diagnostics.count(kind, int((diffs != clipped).sum()), diffs.size)
    return clipped.sum(axis=1)


class ExpFamShortcut:
    """Σ_x ℓ(x,θ') − ℓ(x,θ) = Δηᵀ Σ S(x) − n ΔA for every owner at once, O(1) per answer.

    It equals the per-record clipped sum only while no per-record clip binds, so it is a
    capability: ``offered`` gives it only when that is proven, and a clip that could bind
    vetoes it (the per-record path then answers).
    """

    def __init__(self, model: ExpFamModel, stat_sum: np.ndarray, n: np.ndarray, clip: float):
        self.model, self.stat_sum, self.n, self.clip = model, stat_sum, n, clip
        self._n_column = n[:, None]  # (K, 1): the bound's factor, kept

    @classmethod
    def offered(cls, nodes: Sequence[OwnerNode], clip: float) -> ExpFamShortcut | None:
        """The shortcut for ``nodes`` clipping each record's term at ``clip`` per unit step,
        or None unless no per-record clip can bind: an exponential-family model (its records
        are clipped into the data domain when loaded, where L bounds |ℓ(x,θ') − ℓ(x,θ)| by
        L‖θ' − θ‖), a clip of at least L, and no owner asking for per-record evaluation
        (``OwnerNode.per_record``)."""
        model = nodes[0].model
        if not isinstance(model, ExpFamModel) or any(n.per_record for n in nodes):
            return None
        if model.lipschitz is None or clip < model.lipschitz:  # a clip that can bind vetoes it
            return None
        sums = [n.stat_sum for n in nodes]  # set for every exponential-family owner
        n = np.array([len(node.records) for node in nodes], dtype=float)
        return cls(model, np.stack(sums), n, clip)  # type: ignore[arg-type]

    def sums(self, theta: np.ndarray, theta_prop: np.ndarray, step: np.ndarray) -> np.ndarray:
        """``(K, C)`` exact sums, each clipped to ±n·clip·step (a bound the per-record sum
        meets too)."""
        total = self.model.log_lik_diff_from_stats(self.n, self.stat_sum, theta, theta_prop)
        bound = self._n_column * (self.clip * step)
        np.maximum(total, -bound, out=total)  # np.clip, without its wrapper's cost
        return np.minimum(total, bound, out=total)


class LogRatioCompute:
    """The log-ratio answers of one host's owners ``nodes``, each record's term clipped at
    ``clip`` per unit step (default the model's Lipschitz bound L, what the charge assumes)."""

    kind = LOG_RATIO

    def __init__(self, nodes: Sequence[OwnerNode], clip: float | None = None):
        self.nodes = list(nodes)
        self.model = nodes[0].model
        self.clip = require_lipschitz(self.model) if clip is None else clip
        self.shortcut = ExpFamShortcut.offered(self.nodes, self.clip)

    @property
    def per_record(self) -> bool:
        """Whether answers cost one evaluation per record (``max_record_evaluations`` applies)."""
        return self.shortcut is None

    def sums(self, theta: np.ndarray, theta_prop: np.ndarray, step: np.ndarray) -> np.ndarray:
        """``(K, C)`` exact clipped sums; all owners at once when the shortcut is offered."""
        if self.shortcut is not None:
            return self.shortcut.sums(theta, theta_prop, step)
        bound = self.clip * step
        return np.stack(
            [clipped_ratio_sum(node, theta, theta_prop, bound, self.kind) for node in self.nodes]
        )

    def fresh(self, noise: HostNoise, keys: Keys, query: LogRatioQuery) -> NoisyExact:
        """Noisy answers ``(K, C, 1)`` to ``keys`` (one per chain of ``query``)."""

        def exact() -> np.ndarray:
            return self.sums(query.theta, query.theta_prop, query.step)[:, :, None]

        return NoisyExact(noise, keys, self.kind, exact)


class LogRatioPath:
    """The log-ratio answer path of one host's owners ``nodes`` (``pipeline.KindPath``) for
    ``kind``: each answer's digest is the kind's tag and its (θ, θ′) as little-endian float64,
    and it is charged μ = Δ(step)/σ_k per owner, at a step of no less than the owners' largest
    ``charged_step`` (docs/design.md §3, invariant 14)."""

    def __init__(self, kind: QueryKind, nodes: Sequence[OwnerNode]):
        self.compute = LogRatioCompute(nodes)
        self.tag = kind.digest_tag
        # one floor for the host's one AffineMus (charging an owner more is never less private)
        self.charged_step = max(n.policy.charged_step for n in nodes)
        # sensitivity per unit step of one answer: (2 or 1)·L per owner
        model = nodes[0].model
        self.delta_per_step = np.array(
            [kind.sensitivity(model, n.policy.neighbour, 1.0) for n in nodes]
        )
        #: the last mechanism asked and its μ (slope, offset): the ledger keeps the usual
        #: charge's spend line by the identity of these arrays (``SpendLines._of_every``)
        self._unit: tuple[Mechanism, AffineMus] | None = None

    def plan(
        self, asked: Asked, iteration: int, chains: Any, arrays: Mapping[str, Any]
    ) -> Planned[LogRatioQuery]:
        """Answers ``(K, C)`` to θ, θ′ ``(C, d)`` (``arrays``) at ``iteration`` for ``chains``
        ``(C,)``, keyed (session, c, iteration); θ, θ′ inside Θ with an admitted step."""
        checks = asked.checks
        iteration = checks.index("iteration", iteration)
        chains = checks.chains(chains)
        theta, theta_prop, pairs = checks.moves(arrays, len(chains))
        step = asked.limits.check(theta, theta_prop)
        if self.compute.per_record:
            checks.work(len(chains))
        digests = row_digests(self.tag, pairs)
        iterations = np.empty(len(chains), dtype=np.int64)
        iterations.fill(iteration)  # np.full's value, without its wrapper's cost
        keys = asked.keys(chains, iterations)
        mechanism = asked.mechanism
        charged = np.maximum(step, self.charged_step)
        unit = self._unit
        if unit is None or unit[0] is not mechanism:  # μ per unit step: kept per mechanism
            unit = self._unit = (mechanism, mechanism.mus(self.delta_per_step, charged, 1))
        mus = AffineMus(unit[1].slope, unit[1].offset, charged)
        request = Request(keys, digests, mechanism, 1, mus)
        query = LogRatioQuery(theta, theta_prop, step)
        return Planned(request, self.compute, query, (len(chains),))
