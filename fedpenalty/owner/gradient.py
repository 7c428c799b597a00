"""One owner's clipped gradient sums (federated SG-MCMC, docs/design.md §2.3): pure numpy."""

from __future__ import annotations

import math

import numpy as np

from ..models import Model


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
    grads = model.grad_log_lik(records[used], theta)  # (C, m, d)
    norms = np.linalg.norm(grads, axis=2)
    scale = np.minimum(1.0, clip / np.maximum(norms, np.finfo(float).tiny))
    return np.einsum("cm,cmd->cd", mask[:, used] * scale, grads)
