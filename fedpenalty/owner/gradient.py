"""One owner's noisy gradient answer (federated SG-MCMC, docs/design.md §2.3): pure numpy."""

from __future__ import annotations

import math

import numpy as np

from ..models import Model


def owner_gradient(
    model: Model,
    records: np.ndarray,
    theta: np.ndarray,
    rng: np.random.Generator,
    q: float,
    clip: float,
    sigma: float,
) -> np.ndarray:
    """One owner's noisy gradient answer for each chain: ``(C, d)``.

    For each row of ``theta`` ``(C, d)`` independently, include each record with probability
    ``q`` (Poisson sampling), clip each included record's ∇_θ ℓ(x, θ) to L2 norm ``clip``, sum,
    and add N(0, (sigma·clip)² I). ``records`` are prepared records ``(n, p)``. Pure numpy; the
    only randomness is ``rng``. The caller divides by q.
    """
    theta = np.array(theta, dtype=float, ndmin=2)
    if not 0.0 < q <= 1.0:
        raise ValueError(f"q must be in (0, 1], got {q!r}")
    if not (math.isfinite(clip) and clip > 0):
        raise ValueError(f"clip must be finite and > 0, got {clip!r}")
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma must be finite and >= 0, got {sigma!r}")
    c, d = theta.shape
    mask = rng.random((c, len(records))) < q
    used = mask.any(axis=0)
    total = np.zeros((c, d))
    if used.any():
        grads = model.grad_log_lik(records[used], theta)  # (C, m, d)
        norms = np.linalg.norm(grads, axis=2)
        scale = np.minimum(1.0, clip / np.maximum(norms, np.finfo(float).tiny))
        total = np.einsum("cm,cmd->cd", mask[:, used] * scale, grads)
    return total + sigma * clip * rng.standard_normal((c, d))
