"""Poisson regression y ~ Poisson(exp(xᵀβ)) (docs/design.md §6, "Regression models")."""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
from scipy.special import gammaln

from ..errors import DataError
from .api import (
    Configured,
    Param,
    as_point,
    as_prepared,
    as_theta,
    project_to_ball,
    uniform_ball,
    validate_raw,
)
from .base import Model


class PoissonRegression(Configured, Model):
    """y | x ~ Poisson(e^z), z = xᵀβ, no intercept (add a constant feature yourself);
    β ∈ [−B, B]^d, B = ``theta_bound``.

    * Records ``(n, d + 1)``, columns ``x0 .. x{d-1}, y``; ‖x‖₂ ≤ R = ``data_bound`` (longer
      rows rescaled onto the sphere); y a non-negative integer, clipped to ``count_bound`` = Y.
    * Prior: N(0, prior_sd² I).
    * ℓ = y z − e^z − log y!; ∇ℓ = (y − e^z) x.
    * |z| ≤ ‖x‖·B√d, so for ‖x‖ = t: ‖∇ℓ‖ ≤ t·max(Y − e^{−tB√d}, e^{tB√d}), increasing in t:
      L = R·max(Y − e^{−RB√d}, e^{RB√d}) (attained at a corner of Θ with x along or against it).
    * No closed-form reference: the coordinator samples it (``coordinator/reference.py``).
    * Capabilities: ``BoundedLogLikelihood``; not an exponential family in the sense used here
      (e^{xᵀβ} has no finite-dimensional statistic).
    """

    name: ClassVar[str] = "poisson_regression"
    PARAMS: ClassVar[dict[str, Param]] = {
        "dim": Param(2, "dim", "number of covariates d (= dimension of β)"),
        "data_bound": Param(1.0, "positive", "covariates satisfy ‖x‖₂ ≤ data_bound"),
        "count_bound": Param(4, "count", "counts are clipped to [0, count_bound]"),
        "theta_bound": Param(0.5, "positive", "Θ = [-theta_bound, theta_bound]^d"),
        "prior_sd": Param(2.0, "positive", "prior sd of every coefficient of β"),
    }

    def _setup(self) -> None:
        p = self._params
        self.dim = p["dim"]
        self.data_bound, self.count_bound = p["data_bound"], p["count_bound"]
        self.theta_bound, self.prior_sd = p["theta_bound"], p["prior_sd"]
        self._log_factorial = gammaln(np.arange(self.count_bound + 1, dtype=float) + 1.0)
        try:
            zmax = self.zmax()
            self._lipschitz = self.data_bound * max(
                self.count_bound - math.exp(-zmax), math.exp(zmax)
            )
        except OverflowError:
            self._lipschitz = math.inf  # rejected by Configured.__init__

    def zmax(self) -> float:
        """sup |xᵀβ| = R·B√d over the domain × Θ."""
        return self.data_bound * self.theta_bound * math.sqrt(self.dim)

    @property
    def column_names(self) -> list[str]:
        return [f"x{i}" for i in range(self.dim)] + ["y"]

    @property
    def param_names(self) -> list[str]:
        """The coefficient of each covariate: ``beta0 .. beta{d-1}``."""
        return [f"beta{j}" for j in range(self.dim)]

    # --- data ------------------------------------------------------------------------------
    def prepare_records(self, raw: np.ndarray) -> np.ndarray:
        """Validate ``(n, d + 1)`` records (``DataError`` when y is negative or not an integer),
        rescale rows with ‖x‖₂ > R onto the sphere and clip y to ``count_bound``."""
        arr = validate_raw(raw, self.column_names, self.name)
        y = arr[:, -1]
        bad = (y < 0) | (y != np.floor(y))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DataError(
                f"{self.name}: column 'y' must hold non-negative integers; "
                f"{int(bad.sum())} bad value(s), first at record {i}: {y[i]!r}"
            )
        arr[:, :-1] = project_to_ball(arr[:, :-1], self.data_bound)
        np.minimum(arr[:, -1], float(self.count_bound), out=arr[:, -1])
        return arr

    def simulate_records(self, rng: np.random.Generator, theta: np.ndarray, n: int) -> np.ndarray:
        """``(n, d + 1)``: x uniform in the ball of radius R, y ~ Poisson(e^{xᵀβ}) clipped."""
        beta = as_point(theta, self.dim)
        x = uniform_ball(rng, int(n), self.dim, self.data_bound)
        y = np.minimum(rng.poisson(np.exp(x @ beta)), self.count_bound).astype(float)
        return np.column_stack([x, y])

    def _split(self, records: np.ndarray, theta: np.ndarray) -> tuple[np.ndarray, ...]:
        """x ``(n, d)``, y ``(n,)`` and z = xᵀβ ``(C, n)``."""
        arr = as_prepared(records, self.dim + 1)
        x = arr[:, :-1]
        return x, arr[:, -1], as_theta(theta, self.dim) @ x.T

    # --- likelihood ------------------------------------------------------------------------
    @property
    def lipschitz(self) -> float:
        return self._lipschitz

    def log_lik(self, records: np.ndarray, theta: np.ndarray) -> np.ndarray:
        """y z − e^z − log y! (log y! looked up: prepared counts are integers in 0..Y):
        ``(C, n)``."""
        _, y, z = self._split(records, theta)
        out = y * z
        out -= np.exp(z)
        out -= self._log_factorial[y.astype(np.intp)]
        return out

    def log_lik_diff(
        self, records: np.ndarray, theta: np.ndarray, theta_prop: np.ndarray
    ) -> np.ndarray:
        """y(z' − z) − (e^{z'} − e^z), the second as e^z·expm1(z' − z) (no cancellation for a
        short step; log y! cancels exactly): ``(C, n)``."""
        _, y, z = self._split(records, theta)
        dz = as_theta(theta_prop, self.dim) @ as_prepared(records, self.dim + 1)[:, :-1].T - z
        return y * dz - np.exp(z) * np.expm1(dz)

    def grad_log_lik(self, records: np.ndarray, theta: np.ndarray) -> np.ndarray:
        """(y − e^z)·x: ``(C, n, d)``."""
        x, y, z = self._split(records, theta)
        return (y[None, :] - np.exp(z))[:, :, None] * x[None, :, :]

    # --- prior -----------------------------------------------------------------------------
    def log_prior(self, theta: np.ndarray) -> np.ndarray:
        """−‖β‖²/(2 s²): ``(C, d)`` → ``(C,)``."""
        beta = as_theta(theta, self.dim) / self.prior_sd
        return -0.5 * np.sum(beta * beta, axis=1)

    def grad_log_prior(self, theta: np.ndarray) -> np.ndarray:
        """−β/s²: ``(C, d)``."""
        return -as_theta(theta, self.dim) / self.prior_sd**2

    # --- capabilities: BoundedLogLikelihood ------------------------------------------------
    def _log_lik_table(self) -> np.ndarray:
        """ℓ for every count y ∈ {0..Y} (rows) at z = −zmax, +zmax and the maximiser
        clip(log y) (columns): ``(Y + 1, 3)``. ℓ is concave in z, so over |z| ≤ zmax its
        maximum is at the clipped maximiser and its minimum at an end."""
        b = self.zmax()
        y = np.arange(self.count_bound + 1, dtype=float)
        mode = np.clip(np.log(np.maximum(y, 1e-300)), -b, b)
        z = np.column_stack([np.full_like(y, -b), np.full_like(y, b), mode])
        return y[:, None] * z - np.exp(z) - gammaln(y + 1.0)[:, None]

    def log_lik_bound(self) -> float:
        """B = sup |ℓ| over the domain × Θ: the largest |ℓ| in ``_log_lik_table``."""
        return float(np.abs(self._log_lik_table()).max())

    def log_lik_range(self) -> float:
        """C: at fixed β the attainable z fill [−R‖β‖, R‖β‖] (x in the ball), which grows with
        ‖β‖, so C = sup ℓ − inf ℓ over y ∈ {0..Y}, |z| ≤ zmax."""
        table = self._log_lik_table()
        return float(table.max() - table[:, :2].min())
