"""The Barker test's correction variable (docs/design.md §2.12; Seita et al. 2017): a
distribution X_corr on a grid such that N(0, C) + X_corr has the standard logistic law, so a
normal estimate of the log acceptance ratio of variance C, plus X_corr, is the exact Barker
test's logistic noise. Found by deconvolution: on grids y_j ∈ [−V, V] (2n + 1 points) and
x_i ∈ [−2V, 2V] (4n + 1 points), u = argmin ‖M u − F(x)‖² + λ‖u‖² with M_ij = Φ((x_i − y_j)/√C)
and F the logistic CDF; clipped at 0 and normalised, u is X_corr's probability mass on y.
Only C ≤ ``MAX_NORMAL_VARIANCE`` is offered: beyond it the deconvolution's CDF error grows past
``CDF_TOLERANCE`` (tests/test_barker.py measures it)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy.special import expit
from scipy.stats import norm

#: Largest normal variance C the correction absorbs (the logistic law's own is π²/3 ≈ 3.29;
#: the deconvolution stays within CDF_TOLERANCE only up to about 1).
MAX_NORMAL_VARIANCE = 1.0
#: Sup-distance between the CDF of N(0, C) + X_corr and the logistic CDF, for 0 < C ≤ 1.
CDF_TOLERANCE = 1e-3
#: Grid half-width V, grid half-size n and ridge λ of the deconvolution.
GRID_BOUND, GRID_HALF, RIDGE = 10.0, 200, 0.1


@dataclass(frozen=True)
class Correction:
    """X_corr for normal variance ``variance`` (C): mass ``prob`` ``(2n+1,)`` on ``grid``."""

    variance: float
    grid: np.ndarray
    prob: np.ndarray

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """``size`` independent draws of X_corr ``(size,)``."""
        return self.grid[rng.choice(len(self.grid), size=size, p=self.prob)]

    def convolved_cdf(self, z: np.ndarray) -> np.ndarray:
        """CDF of N(0, C) + X_corr at ``z`` ``(m,)``: Σ_j u_j Φ((z − y_j)/√C)."""
        sd = math.sqrt(self.variance)
        return norm.cdf((np.asarray(z)[:, None] - self.grid[None, :]) / sd) @ self.prob


def check_variance(variance: float, key: str) -> float:
    """``variance`` as a float; ``ValueError`` naming ``key`` unless 0 < C ≤ 1."""
    if not (math.isfinite(variance) and 0 < variance <= MAX_NORMAL_VARIANCE):
        raise ValueError(
            f"{key} = {variance!r}: the Barker correction absorbs a normal variance in "
            f"(0, {MAX_NORMAL_VARIANCE:g}] only; lower {key}"
        )
    return float(variance)


@functools.lru_cache(maxsize=8)
def correction(variance: float) -> Correction:
    """X_corr for normal variance C = ``variance`` (0 < C ≤ 1), by the ridge deconvolution."""
    c = check_variance(variance, "the normal variance")
    y = np.linspace(-GRID_BOUND, GRID_BOUND, 2 * GRID_HALF + 1)
    x = np.linspace(-2 * GRID_BOUND, 2 * GRID_BOUND, 4 * GRID_HALF + 1)
    m = norm.cdf((x[:, None] - y[None, :]) / math.sqrt(c))
    u = np.linalg.solve(m.T @ m + RIDGE * np.eye(len(y)), m.T @ expit(x))
    u = np.maximum(u, 0.0)
    prob = u / u.sum()
    prob.setflags(write=False)
    y.setflags(write=False)
    return Correction(c, y, prob)
