"""Logistic regression without intercept: y ~ Bernoulli(σ(xᵀθ)), features in an L2 ball."""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
from scipy.special import expit

from .api import (
    Configured,
    Param,
    as_point,
    as_prepared,
    as_theta,
    check_binary,
    project_to_ball,
    uniform_ball,
    validate_raw,
)
from .base import Model


class Logistic(Configured, Model):
    """y | x ~ Bernoulli(σ(xᵀθ)), θ ∈ [-theta_bound, theta_bound]^d (not an exponential family
    in the sense used here: no finite-dimensional S(x) with θ-free log h).

    * Records: ``(n, d + 1)``, columns ``x0 .. x{d-1}, y``; ‖x‖₂ ≤ ``data_bound`` (longer rows
      are rescaled onto the sphere), y exactly 0 or 1. Add a constant feature yourself if you
      want an intercept.
    * Prior: N(0, prior_sd² I).
    * ℓ = y·z − log(1 + e^z) with z = xᵀθ, evaluated as −softplus((1 − 2y)·z);
      ∇ℓ = (y − σ(z))x.
    * |z| ≤ data_bound·theta_bound·√d on the domain, hence
      L = data_bound·σ(data_bound·theta_bound·√d) (attained at a corner of Θ with x opposite).
    * No closed-form reference (``reference_posterior`` returns None).
    * Capabilities: ``BoundedLogLikelihood`` (models/capabilities.py); no ``ConjugateUpdate``.
    """

    name: ClassVar[str] = "logistic"
    PARAMS: ClassVar[dict[str, Param]] = {
        "dim": Param(2, "dim", "number of features d (= dimension of θ)"),
        "data_bound": Param(1.0, "positive", "features satisfy ‖x‖₂ ≤ data_bound"),
        "theta_bound": Param(5.0, "positive", "Θ = [-theta_bound, theta_bound]^d"),
        "prior_sd": Param(2.0, "positive", "prior sd of every coordinate of θ"),
    }

    def _setup(self) -> None:
        p = self._params
        self.dim = p["dim"]
        self.data_bound = p["data_bound"]
        self.theta_bound = p["theta_bound"]
        self.prior_sd = p["prior_sd"]
        zmax = self.data_bound * self.theta_bound * math.sqrt(self.dim)
        self._lipschitz = self.data_bound * float(expit(zmax))

    @property
    def column_names(self) -> list[str]:
        return [f"x{i}" for i in range(self.dim)] + ["y"]

    @property
    def param_names(self) -> list[str]:
        """The coefficient of each feature: ``w0 .. w{d-1}`` (feature ``x{j}``)."""
        return [f"w{j}" for j in range(self.dim)]

    # --- data ------------------------------------------------------------------------------
    def prepare_records(self, raw: np.ndarray) -> np.ndarray:
        """Validate ``(n, d + 1)`` records (``DataError`` when y is not exactly 0 or 1) and
        rescale feature rows with ‖x‖₂ > data_bound onto the sphere."""
        arr = validate_raw(raw, self.column_names, self.name)
        check_binary(arr[:, -1], "y", self.name)
        arr[:, :-1] = project_to_ball(arr[:, :-1], self.data_bound)
        return arr

    def simulate_records(self, rng: np.random.Generator, theta: np.ndarray, n: int) -> np.ndarray:
        """``(n, d + 1)``: x uniform in the ball of radius data_bound (Gaussian direction,
        radius data_bound·U^(1/d)), then y ~ Bernoulli(σ(xᵀθ))."""
        th = as_point(theta, self.dim)
        x = uniform_ball(rng, int(n), self.dim, self.data_bound)
        y = (rng.random(int(n)) < expit(x @ th)).astype(float)
        return np.column_stack([x, y])

    def _split(self, records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        arr = as_prepared(records, self.dim + 1)
        return arr[:, :-1], arr[:, -1]

    # --- likelihood ------------------------------------------------------------------------
    @property
    def lipschitz(self) -> float:
        return self._lipschitz

    def log_lik(self, records: np.ndarray, theta: np.ndarray) -> np.ndarray:
        """y·z − log(1 + e^z), z = xᵀθ, as −softplus((1 − 2y)·z): ``(C, n)``."""
        x, y = self._split(records)
        return -_softplus((as_theta(theta, self.dim) @ x.T) * (1.0 - 2.0 * y))

    def log_lik_diff(
        self, records: np.ndarray, theta: np.ndarray, theta_prop: np.ndarray
    ) -> np.ndarray:
        """ℓ(x, θ') − ℓ(x, θ) = softplus(s·xᵀθ) − softplus(s·xᵀθ'), s = 1 − 2y, with both
        linear predictors from one matrix product: ``(C, n)``."""
        x, y = self._split(records)
        chains = as_theta(theta, self.dim)
        both = np.vstack([chains, as_theta(theta_prop, self.dim)]) @ x.T
        both *= 1.0 - 2.0 * y
        terms = _softplus(both)
        return terms[: len(chains)] - terms[len(chains) :]

    def grad_log_lik(self, records: np.ndarray, theta: np.ndarray) -> np.ndarray:
        """(y − σ(xᵀθ))·x: ``(C, n, d)``."""
        x, y = self._split(records)
        z = as_theta(theta, self.dim) @ x.T
        return (y[None, :] - expit(z))[:, :, None] * x[None, :, :]

    # --- prior -----------------------------------------------------------------------------
    def log_prior(self, theta: np.ndarray) -> np.ndarray:
        """−‖θ‖²/(2 s²): ``(C, d)`` → ``(C,)``."""
        th = as_theta(theta, self.dim) / self.prior_sd
        return -0.5 * np.sum(th * th, axis=1)

    def grad_log_prior(self, theta: np.ndarray) -> np.ndarray:
        """−θ/s²: ``(C, d)``."""
        return -as_theta(theta, self.dim) / self.prior_sd**2

    # --- capabilities: BoundedLogLikelihood ------------------------------------------------
    def log_lik_bound(self) -> float:
        """B: ℓ = −log(1 + e^{∓z}), |z| = |xᵀθ| ≤ data_bound·theta_bound·√d, so
        B = softplus(data_bound·theta_bound·√d)."""
        return float(np.logaddexp(0.0, self.data_bound * self.theta_bound * math.sqrt(self.dim)))

    def log_lik_range(self) -> float:
        """C: at fixed θ, ℓ ranges from −softplus(R‖θ‖) to −softplus(−R‖θ‖) (x aligned with θ,
        label wrong or right), a range of R‖θ‖. So C = data_bound·theta_bound·√d."""
        return self.data_bound * self.theta_bound * math.sqrt(self.dim)


def _softplus(u: np.ndarray) -> np.ndarray:
    """log(1 + e^u) elementwise, stable for every finite u: max(u, 0) + log1p(e^{−|u|})
    (the same values as ``np.logaddexp(0, u)`` to rounding, and faster)."""
    return np.maximum(u, 0.0) + np.log1p(np.exp(-np.abs(u)))
