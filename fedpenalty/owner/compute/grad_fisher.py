"""DP-SGFS answers (docs/design.md §2.11): owner k's answer for chain c samples each record
with the session's rate q, clips its ∇_θ ℓ(x, θ_c) to L2 norm C (the query's clip), and sums
z(x) = [g, vech(g gᵀ)/C]/√2 — the clipped gradient and the upper triangle of its outer
product, scaled so that ‖z(x)‖ ≤ C — then adds noise of sd σ_k·C: seeded float noise for
simulated owners, exact lattice noise for the others (as ``gradient.py``, whose path this
reuses with its own sums, width and charge)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ...kinds import KINDS
from ...models import Model
from ..mechanism import Mechanism
from ..node import OwnerNode
from ..noise.lattice import lattice_gradient_multiplier
from .gradient import GradientCompute, GradientPath, clipped_gradients

#: The kind's ledger name (``kinds/grad_fisher.py``).
LEDGER = "sgfs"


def fisher_width(dim: int) -> int:
    """Components of one answer: d gradient entries and d(d + 1)/2 outer-product entries."""
    return dim + dim * (dim + 1) // 2


def grad_fisher_sum(
    model: Model, records: np.ndarray, theta: np.ndarray, mask: np.ndarray, clip: float
) -> np.ndarray:
    """Σ over the sampled records of z(x) = [g, vech(g gᵀ)/clip]/√2, g = ∇_θ ℓ(x, θ_c) clipped
    to L2 norm ``clip``: ``(C, d + d(d+1)/2)``. ``records`` ``(n, p)``, ``theta`` ``(C, d)``,
    ``mask`` bool ``(C, n)``. No noise; never released as is."""
    if not (math.isfinite(clip) and clip > 0):
        raise ValueError(f"clip must be finite and > 0, got {clip!r}")
    c, d = theta.shape
    used = mask.any(axis=0)
    if not used.any():
        return np.zeros((c, fisher_width(d)))
    grads, scale = clipped_gradients(model, records[used], theta, clip)
    g = grads * scale[:, :, None]  # (C, m, d), each of norm <= clip
    rows, cols = np.triu_indices(d)
    outer = g[:, :, rows] * g[:, :, cols] / clip  # (C, m, d(d+1)/2)
    weights = mask[:, used].astype(float)
    z = np.concatenate([g, outer], axis=2) / math.sqrt(2.0)
    return np.einsum("cm,cmw->cw", weights, z)


def fisher_multiplier(node: OwnerNode, width: int) -> float:
    """The noise multiplier ``node``'s answers of this kind are charged at: its level of the
    kind (``Policy.noise_for``), lowered with lattice noise by the most rounding of ``width``
    components can add (``lattice_gradient_multiplier``)."""
    sigma = node.policy.noise_for(LEDGER)
    return lattice_gradient_multiplier(sigma, width) if node.lattice else sigma


class GradFisherCompute(GradientCompute):
    """The answers of one host's owners ``nodes``: ``grad_fisher_sum`` plus noise."""

    kind = LEDGER

    def __init__(self, nodes: Sequence[OwnerNode]):
        super().__init__(nodes)
        self.width = fisher_width(self.model.dim)

    def sums(
        self, records: np.ndarray, theta: np.ndarray, mask: np.ndarray, clip: float
    ) -> np.ndarray:
        """The exact answers ``(C, width)``: ``grad_fisher_sum``."""
        return grad_fisher_sum(self.model, records, theta, mask, clip)


class GradFisherPath(GradientPath):
    """The answer path of the ``grad_fisher`` kind at one host: the gradient path's checks,
    digests and Poisson-subsampled charge, with ``GradFisherCompute`` and this kind's own
    noise multipliers (``fisher_multiplier``). Secure aggregation is refused (its masks and
    charges are the gradient kind's)."""

    def computing(self, nodes: Sequence[OwnerNode]) -> GradientCompute:
        self.nodes = list(nodes)
        return GradFisherCompute(nodes)

    def multipliers(self, mechanism: Mechanism) -> np.ndarray:
        """Each owner's ``fisher_multiplier``; ``InvalidRequest`` in a secure session."""
        if mechanism.secure is not None:
            from ...errors import InvalidRequest

            raise InvalidRequest(
                f"{KINDS['grad_fisher'].name} answers do not take secure aggregation"
            )
        return np.array([fisher_multiplier(n, self.dim) for n in self.nodes])
