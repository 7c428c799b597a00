"""Poisson counts, sampled on the log-rate scale θ = log λ."""

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
    log_concave_moments,
    truncated_ppf,
    validate_raw,
)
from .base import ExpFamModel, Neighbour, Reference, check_neighbour


class Poisson(Configured, ExpFamModel):
    """x ~ Poisson(e^θ), θ ∈ [-theta_bound, theta_bound] (d = 1).

    * Records: ``(n, 1)`` (or ``(n,)``), column ``x``: non-negative integers; counts above
      ``count_bound`` are clipped to it (the data domain is {0, ..., count_bound}).
    * Prior: Gamma(prior_shape, rate=prior_rate) on λ, carried to θ with its Jacobian:
      log p(θ) = shape·θ − rate·e^θ + const.
    * ℓ = xθ − e^θ − log x!; S(x) = x, η = θ, A = e^θ, log h = −log x!.
    * ∇ℓ = x − e^θ, so L = max(e^B, count_bound − e^−B) (both attained at the corners).
    * Reference: ∝ exp((shape + Σx)θ − (rate + n)e^θ) on [−B, B] by adaptive quadrature.
    * Capabilities: ``BoundedLogLikelihood`` and ``ConjugateUpdate`` (models/capabilities.py).
    """

    name: ClassVar[str] = "poisson"
    PARAMS: ClassVar[dict[str, Param]] = {
        "count_bound": Param(50, "count", "counts are clipped to [0, count_bound]"),
        "theta_bound": Param(
            5.0, "positive", "Θ = [-theta_bound, theta_bound] on the log-rate scale"
        ),
        "prior_shape": Param(1.0, "positive", "Gamma prior on the rate: shape"),
        "prior_rate": Param(1.0, "positive", "Gamma prior on the rate: rate"),
    }

    def _setup(self) -> None:
        p = self._params
        self.dim = 1
        self.count_bound = p["count_bound"]
        self.theta_bound = p["theta_bound"]
        self.prior_shape = p["prior_shape"]
        self.prior_rate = p["prior_rate"]
        b = self.theta_bound
        try:
            self._lipschitz = max(math.exp(b), self.count_bound - math.exp(-b))
        except OverflowError:
            self._lipschitz = math.inf  # rejected by Configured.__init__

    @property
    def column_names(self) -> list[str]:
        return ["x"]

    @property
    def param_names(self) -> list[str]:
        return ["log_rate"]

    # --- data ------------------------------------------------------------------------------
    def prepare_records(self, raw: np.ndarray) -> np.ndarray:
        """Validate ``(n, 1)`` / ``(n,)`` counts (``DataError`` for negative or non-integer
        values) and clip them to ``count_bound``."""
        arr = validate_raw(raw, self.column_names, self.name)
        x = arr[:, 0]
        bad = (x < 0) | (x != np.floor(x))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DataError(
                f"{self.name}: column 'x' must hold non-negative integers; "
                f"{int(bad.sum())} bad value(s), first at record {i}: {x[i]!r}"
            )
        np.minimum(arr, float(self.count_bound), out=arr)
        return arr

    def simulate_records(self, rng: np.random.Generator, theta: np.ndarray, n: int) -> np.ndarray:
        """``(n, 1)`` draws of Poisson(e^θ), clipped to ``count_bound``."""
        lam = math.exp(as_point(theta, 1)[0])
        x = np.minimum(rng.poisson(lam, int(n)), self.count_bound)
        return x.astype(float)[:, None]

    # --- exponential family ----------------------------------------------------------------
    @property
    def stat_dim(self) -> int:
        return 1

    def suff_stat(self, records: np.ndarray) -> np.ndarray:
        """S(x) = x: ``(n, 1)`` → ``(n, 1)``."""
        return as_prepared(records, 1).copy()

    def natural_param(self, theta: np.ndarray) -> np.ndarray:
        """η = θ: ``(C, 1)`` → ``(C, 1)``."""
        return as_theta(theta, 1).copy()

    def log_partition(self, theta: np.ndarray) -> np.ndarray:
        """A = e^θ: ``(C, 1)`` → ``(C,)``."""
        return np.exp(as_theta(theta, 1)[:, 0])

    def log_base_measure(self, records: np.ndarray) -> np.ndarray:
        """log h = −log x!: ``(n, 1)`` → ``(n,)``."""
        return -gammaln(as_prepared(records, 1)[:, 0] + 1.0)

    def stat_sensitivity(self, neighbour: Neighbour) -> float:
        """count_bound for both neighbour relations."""
        check_neighbour(neighbour)
        return float(self.count_bound)

    def stat_l1_sensitivity(self, neighbour: Neighbour) -> float:
        """count_bound for both neighbour relations."""
        return self.stat_sensitivity(neighbour)

    # --- likelihood ------------------------------------------------------------------------
    @property
    def lipschitz(self) -> float:
        return self._lipschitz

    def grad_log_lik(self, records: np.ndarray, theta: np.ndarray) -> np.ndarray:
        """x − e^θ: ``(C, n, 1)``."""
        x = as_prepared(records, 1)[:, 0]
        th = as_theta(theta, 1)[:, 0]
        return (x[None, :] - np.exp(th)[:, None])[:, :, None]

    # --- prior -----------------------------------------------------------------------------
    def log_prior(self, theta: np.ndarray) -> np.ndarray:
        """shape·θ − rate·e^θ: ``(C, 1)`` → ``(C,)``."""
        th = as_theta(theta, 1)[:, 0]
        return self.prior_shape * th - self.prior_rate * np.exp(th)

    def grad_log_prior(self, theta: np.ndarray) -> np.ndarray:
        """shape − rate·e^θ: ``(C, 1)``."""
        th = as_theta(theta, 1)
        return self.prior_shape - self.prior_rate * np.exp(th)

    # --- reference -------------------------------------------------------------------------
    def reference_from_stats(self, n: int, stat_sum: np.ndarray) -> Reference:
        """Moments of ∝ exp((shape + s)θ − (rate + n)e^θ) on [−B, B]; needs s ≥ 0."""
        s = float(np.asarray(stat_sum, dtype=float).reshape(-1)[0])
        if not s >= 0.0:
            raise ValueError(f"poisson: the sum of counts must be >= 0, got {s}")
        alpha, beta = self.prior_shape + s, self.prior_rate + n
        b = self.theta_bound
        mode = min(max(math.log(alpha) - math.log(beta), -b), b)

        scale = beta * math.exp(mode)

        def logf(t: float) -> float:
            # log density minus its value at the mode: α(t − m) − β(e^t − e^m), with
            # β(e^t − e^m) = βe^m·expm1(t − m) near the mode (no cancellation)
            u = t - mode
            if abs(u) <= 1.0:
                return alpha * u - scale * math.expm1(u)
            return alpha * u - (beta * math.exp(t) - scale)

        mean, sd = log_concave_moments(logf, mode, -b, b)
        return Reference(mean=np.array([mean]), sd=np.array([sd]), source="closed_form")

    # --- capabilities: BoundedLogLikelihood ------------------------------------------------
    def log_lik_bound(self) -> float:
        """B: ℓ_x(θ) = xθ − e^θ − log x! is concave in θ. For each count x ∈ {0..count_bound},
        |ℓ_x| is largest at θ = ±theta_bound or at the maximiser θ = log x (clipped to Θ), and
        B is the maximum over that finite set."""
        b = self.theta_bound
        x = np.arange(self.count_bound + 1, dtype=float)
        mode = np.clip(np.log(np.maximum(x, 1e-300)), -b, b)
        values = [
            x * t - np.exp(t) - gammaln(x + 1)
            for t in (np.full_like(x, -b), np.full_like(x, b), mode)
        ]
        return float(np.max(np.abs(values)))

    def log_lik_range(self) -> float:
        """C: f_x(θ) = xθ − log x!. For each pair (x, x') the difference is linear in θ, so the
        supremum is at θ = ±theta_bound: C = max over θ = ±B of (max_x f_x − min_x f_x)."""
        x = np.arange(self.count_bound + 1, dtype=float)
        f = [x * t - gammaln(x + 1) for t in (-self.theta_bound, self.theta_bound)]
        return float(max(v.max() - v.min() for v in f))

    # --- capabilities: ConjugateUpdate -----------------------------------------------------
    def conjugate_draws(
        self, rng: np.random.Generator, n: float, stat_sum: np.ndarray, size: int, rho: float
    ) -> np.ndarray:
        """λ ~ Gamma(ρ(shape + s), rate ρ(rate + n)) truncated to [e^−B, e^B], θ = log λ:
        ``(size, 1)``."""
        s = np.asarray(stat_sum, dtype=float).reshape(-1)
        b = self.theta_bound
        if not s[0] >= 0.0:
            raise ValueError(f"poisson: the sum of counts must be >= 0, got {s[0]}")
        from scipy import stats  # here: scipy.stats costs ~0.6 s of every process's start-up

        shape, rate = rho * (self.prior_shape + s[0]), rho * (self.prior_rate + n)
        lam = truncated_ppf(
            stats.gamma(shape, scale=1.0 / rate), math.exp(-b), math.exp(b), rng.random(size)
        )
        return np.log(lam)[:, None]

    def project_stats(self, stat_sum: np.ndarray, n: int) -> np.ndarray:
        """A sum of n counts lies in [0, n·count_bound]: ``(1,)``."""
        s = np.asarray(stat_sum, dtype=float).reshape(-1).copy()
        return np.clip(s, 0.0, float(n) * self.count_bound)
