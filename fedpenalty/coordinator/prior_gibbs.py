"""Exact, free updates of the coordinates no record's likelihood touches (docs/design.md §2.9,
"Prior-only coordinates"): given the other coordinates, such a coordinate's conditional is the
prior's alone, so the coordinator samples it with no owner's answer and no privacy cost — by
univariate slice sampling (Neal 2003: stepping out, then shrinkage), which needs no step size
and leaves the conditional exactly invariant. A Gibbs update of the chain's state: the owners'
noisy gradient kept with the state was asked at the old point, and stays one at the new point
because its distribution does not depend on these coordinates.
"""

from __future__ import annotations

import numpy as np

from ..models import Model

#: the initial slice width in units of θ (stepping out grows it, shrinkage trims it) and the most
#: widths stepping out may add on the two sides together (Neal's m, split at random: exact)
WIDTH, MAX_WIDTHS = 1.0, 1000


def update(
    rng: np.random.Generator,
    theta: np.ndarray,
    log_prior: np.ndarray,
    model: Model,
    coordinates: tuple[int, ...],
) -> tuple[np.ndarray, np.ndarray]:
    """θ ``(C, d)`` with each of ``coordinates`` redrawn in turn from its prior conditional
    restricted to Θ, and the new log prior ``(C,)``; ``log_prior`` is the one at ``theta``."""
    theta, log_prior = np.array(theta, dtype=float), np.array(log_prior, dtype=float)
    for i in coordinates:
        theta[:, i], log_prior = _slice(rng, theta, log_prior, model, i)
    return theta, log_prior


def _slice(
    rng: np.random.Generator, theta: np.ndarray, log_prior: np.ndarray, model: Model, i: int
) -> tuple[np.ndarray, np.ndarray]:
    """One slice-sampling draw of coordinate ``i`` for every chain: its new values ``(C,)`` and
    the log prior there ``(C,)``."""
    c = len(theta)

    def density(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
        points = theta[rows].copy()
        points[:, i] = x
        out = np.full(len(rows), -np.inf)
        inside = model.in_theta_space(points)
        out[inside] = model.log_prior(points[inside])
        return out

    level = log_prior - rng.standard_exponential(c)
    start = theta[:, i].copy()
    left = start - WIDTH * rng.random(c)
    right = left + WIDTH
    budget_left = np.floor(MAX_WIDTHS * rng.random(c)).astype(int)
    budgets = ((left, budget_left, -1.0), (right, MAX_WIDTHS - 1 - budget_left, 1.0))
    for end, budget, sign in budgets:
        rows = np.flatnonzero(budget > 0)
        while rows.size:
            rows = rows[density(end[rows], rows) > level[rows]]
            end[rows] += sign * WIDTH
            budget[rows] -= 1
            rows = rows[budget[rows] > 0]
    new, new_log_prior = start.copy(), log_prior.copy()
    rows = np.arange(c)
    while rows.size:
        x = left[rows] + rng.random(rows.size) * (right[rows] - left[rows])
        f = density(x, rows)
        inside = f > level[rows]
        new[rows[inside]], new_log_prior[rows[inside]] = x[inside], f[inside]
        rows, x = rows[~inside], x[~inside]
        below = x < start[rows]
        left[rows[below]], right[rows[~below]] = x[below], x[~below]
    return new, new_log_prior
