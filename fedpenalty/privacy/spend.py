"""A running, O(1)-size record of the Gaussian answers one owner has released."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .gaussian import check_delta, epsilon_for_delta
from .paper_bound import paper_bound_epsilon

__all__ = ["GaussianSpend"]


@dataclass(frozen=True)
class GaussianSpend:
    """Privacy spent by Gaussian answers: their count, Σ μ_t² and max μ_t (μ_t = Δ_t/σ_t).

    Immutable: ``add`` and ``combine`` return new objects. ε values are in nats.
    """

    answers: int = 0
    mu_squared: float = 0.0
    max_mu: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.answers, bool) or int(self.answers) != self.answers or self.answers < 0:
            raise ValueError(f"answers must be an integer >= 0, got {self.answers!r}")
        for name in ("mu_squared", "max_mu"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")

    @property
    def mu(self) -> float:
        """Total GDP parameter μ = √(Σ μ_t²)."""
        return math.sqrt(self.mu_squared)

    def add(self, mus: np.ndarray | float) -> GaussianSpend:
        """Spend after also releasing answers with the given μ_t = Δ_t/σ_t (scalar or array)."""
        m = np.asarray(mus, dtype=float).ravel()
        if m.size == 0:
            return self
        if not np.all(np.isfinite(m)) or np.any(m < 0):
            raise ValueError("mus must be finite and >= 0")
        return GaussianSpend(
            answers=self.answers + int(m.size),
            mu_squared=self.mu_squared + float(np.dot(m, m)),
            max_mu=max(self.max_mu, float(m.max())),
        )

    def combine(self, other: GaussianSpend) -> GaussianSpend:
        """Spend of both sets of answers together (answers and μ² add; max of max_mu)."""
        return GaussianSpend(
            answers=self.answers + other.answers,
            mu_squared=self.mu_squared + other.mu_squared,
            max_mu=max(self.max_mu, other.max_mu),
        )

    def epsilon(self, delta: float) -> float:
        """Exact ε (nats) at ``delta`` of the composed answers (μ-GDP curve)."""
        return epsilon_for_delta(self.mu, delta)

    def epsilon_paper_bound(self, delta: float) -> float:
        """The penalty paper's ε at ``delta`` (worst-case max_mu per answer); inf where it does
        not apply."""
        delta = check_delta(delta)
        if self.answers == 0:
            return 0.0
        return paper_bound_epsilon(self.max_mu, self.answers, delta)
