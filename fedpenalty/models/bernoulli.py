"""Bernoulli outcomes, sampled on the logit scale θ = logit p."""

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
    log_concave_moments,
    truncated_ppf,
    validate_raw,
)
from .base import ExpFamModel, Neighbour, Reference, check_neighbour


def _softplus(t: np.ndarray | float) -> np.ndarray:
    """log(1 + e^t), stable for any t."""
    return np.logaddexp(0.0, t)


def _log_mix(v: float, log_a: float, log_b: float, b: float) -> float:
    """log(a + b·e^v) for weights with a + b = 1: log1p(b·expm1(v)) near v = 0 (no cancellation),
    logaddexp(log a, log b + v) elsewhere (no overflow)."""
    if abs(v) <= 1.0:
        return math.log1p(b * math.expm1(v))
    return float(np.logaddexp(log_a, log_b + v))


class Bernoulli(Configured, ExpFamModel):
    """x ~ Bernoulli(σ(θ)), θ ∈ [-theta_bound, theta_bound] (d = 1).

    * Records: ``(n, 1)`` (or ``(n,)``), column ``x``, values exactly 0 or 1.
    * Prior: Beta(prior_a, prior_b) on p, carried to θ with its Jacobian:
      log p(θ) = a·log σ(θ) + b·log σ(−θ) + const.
    * ℓ = xθ − log(1 + e^θ); S(x) = x, η = θ, A = log(1 + e^θ), h = 1.
    * ∇ℓ = x − σ(θ), |x − σ(θ)| ≤ σ(theta_bound) = L (attained at x = 0, θ = theta_bound).
    * Reference: ∝ σ(θ)^(a+s) σ(−θ)^(b+n−s) on [−B, B] by adaptive quadrature.
    * Capabilities: ``BoundedLogLikelihood`` and ``ConjugateUpdate`` (models/capabilities.py).
    """

    name: ClassVar[str] = "bernoulli"
    PARAMS: ClassVar[dict[str, Param]] = {
        "theta_bound": Param(6.0, "positive", "Θ = [-theta_bound, theta_bound] on the logit scale"),
        "prior_a": Param(1.0, "positive", "Beta prior on p: first shape"),
        "prior_b": Param(1.0, "positive", "Beta prior on p: second shape"),
    }

    def _setup(self) -> None:
        p = self._params
        self.dim = 1
        self.theta_bound = p["theta_bound"]
        self.prior_a = p["prior_a"]
        self.prior_b = p["prior_b"]
        self._lipschitz = float(expit(self.theta_bound))

    @property
    def column_names(self) -> list[str]:
        return ["x"]

    @property
    def param_names(self) -> list[str]:
        return ["logit_p"]

    # --- data ------------------------------------------------------------------------------
    def prepare_records(self, raw: np.ndarray) -> np.ndarray:
        """Validate ``(n, 1)`` / ``(n,)`` records; ``DataError`` for any value other than 0 or 1."""
        arr = validate_raw(raw, self.column_names, self.name)
        check_binary(arr[:, 0], "x", self.name)
        return arr

    def simulate_records(self, rng: np.random.Generator, theta: np.ndarray, n: int) -> np.ndarray:
        """``(n, 1)`` draws of Bernoulli(σ(θ))."""
        p = float(expit(as_point(theta, 1)[0]))
        return (rng.random(int(n)) < p).astype(float)[:, None]

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
        """A = log(1 + e^θ): ``(C, 1)`` → ``(C,)``."""
        return _softplus(as_theta(theta, 1)[:, 0])

    def log_base_measure(self, records: np.ndarray) -> np.ndarray:
        """log h = 0: ``(n, 1)`` → ``(n,)``."""
        return np.zeros(as_prepared(records, 1).shape[0])

    def stat_sensitivity(self, neighbour: Neighbour) -> float:
        """1 for both neighbour relations (|x − x'| ≤ 1, |x| ≤ 1)."""
        check_neighbour(neighbour)
        return 1.0

    def stat_l1_sensitivity(self, neighbour: Neighbour) -> float:
        """1 for both neighbour relations."""
        return self.stat_sensitivity(neighbour)

    # --- likelihood ------------------------------------------------------------------------
    @property
    def lipschitz(self) -> float:
        return self._lipschitz

    def grad_log_lik(self, records: np.ndarray, theta: np.ndarray) -> np.ndarray:
        """x − σ(θ): ``(C, n, 1)``."""
        x = as_prepared(records, 1)[:, 0]
        th = as_theta(theta, 1)[:, 0]
        return (x[None, :] - expit(th)[:, None])[:, :, None]

    # --- prior -----------------------------------------------------------------------------
    def log_prior(self, theta: np.ndarray) -> np.ndarray:
        """a·log σ(θ) + b·log σ(−θ): ``(C, 1)`` → ``(C,)``."""
        th = as_theta(theta, 1)[:, 0]
        return -self.prior_a * _softplus(-th) - self.prior_b * _softplus(th)

    def grad_log_prior(self, theta: np.ndarray) -> np.ndarray:
        """a·σ(−θ) − b·σ(θ): ``(C, 1)``."""
        th = as_theta(theta, 1)
        return self.prior_a * expit(-th) - self.prior_b * expit(th)

    # --- reference -------------------------------------------------------------------------
    def reference_from_stats(self, n: int, stat_sum: np.ndarray) -> Reference:
        """Moments of ∝ σ(θ)^(a+s) σ(−θ)^(b+n−s) on [−B, B]; needs 0 ≤ s ≤ n."""
        s = float(np.asarray(stat_sum, dtype=float).reshape(-1)[0])
        if not (0.0 <= s <= n):
            raise ValueError(f"bernoulli: the number of ones must lie in [0, n={n}], got {s}")
        alpha, beta = self.prior_a + s, self.prior_b + (n - s)
        b = self.theta_bound
        mode = min(max(math.log(alpha) - math.log(beta), -b), b)

        # log of σ(−m) + σ(m)e^u  (= log(1+e^t) − log(1+e^m), u = t − m) and of
        # σ(m) + σ(−m)e^{−u}  (= log(1+e^−t) − log(1+e^−m)), free of cancellation and overflow.
        log_p, log_q = -float(_softplus(-mode)), -float(_softplus(mode))  # log σ(m), log σ(−m)
        p_mode, q_mode = math.exp(log_p), math.exp(log_q)

        def logf(t: float) -> float:
            # log density minus its value at the mode
            u = t - mode
            up = _log_mix(u, log_q, log_p, p_mode)
            down = _log_mix(-u, log_p, log_q, q_mode)
            return -alpha * down - beta * up

        mean, sd = log_concave_moments(logf, mode, -b, b)
        return Reference(mean=np.array([mean]), sd=np.array([sd]), source="closed_form")

    # --- capabilities: BoundedLogLikelihood ------------------------------------------------
    def log_lik_bound(self) -> float:
        """B: ℓ = −log(1 + e^{∓θ}) ∈ [−log(1 + e^{theta_bound}), 0), so
        B = softplus(theta_bound)."""
        return float(np.logaddexp(0.0, self.theta_bound))

    def log_lik_range(self) -> float:
        """C: |ℓ(1, θ) − ℓ(0, θ)| = |θ|, so C = theta_bound."""
        return float(self.theta_bound)

    # --- capabilities: ConjugateUpdate -----------------------------------------------------
    def conjugate_draws(
        self, rng: np.random.Generator, n: float, stat_sum: np.ndarray, size: int, rho: float
    ) -> np.ndarray:
        """p ~ Beta(ρ(a + s), ρ(b + n − s)) truncated to [σ(−B), σ(B)], θ = logit p: ``(size, 1)``
        (the prior is Beta(a, b) on p carried to θ with its Jacobian, so this is exact)."""
        s = np.asarray(stat_sum, dtype=float).reshape(-1)
        b = self.theta_bound
        if not 0.0 <= s[0] <= n:
            raise ValueError(f"bernoulli: the number of ones must lie in [0, n={n}], got {s[0]}")
        from scipy import stats  # here: scipy.stats costs ~0.6 s of every process's start-up

        alpha, beta = rho * (self.prior_a + s[0]), rho * (self.prior_b + n - s[0])
        # draw the smaller of p and 1 − p, where the mass is (full precision near 0 and 1)
        if alpha <= beta:
            p = truncated_ppf(stats.beta(alpha, beta), expit(-b), expit(b), rng.random(size))
            return (np.log(p) - np.log1p(-p))[:, None]
        p1 = truncated_ppf(stats.beta(beta, alpha), expit(-b), expit(b), rng.random(size))
        return (np.log1p(-p1) - np.log(p1))[:, None]

    def project_stats(self, stat_sum: np.ndarray, n: int) -> np.ndarray:
        """The number of ones of n records lies in [0, n]: ``(1,)``."""
        s = np.asarray(stat_sum, dtype=float).reshape(-1).copy()
        return np.clip(s, 0.0, float(n))
