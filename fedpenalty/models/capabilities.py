"""Capabilities a model may have beyond ``Model``, which code asks with ``isinstance`` instead of
naming concrete model classes (docs/design.md §6, "Writing a model").

Each is a ``runtime_checkable`` protocol: a model has the capability when it defines the
methods (structurally; no registration). The baselines (``coordinator/baselines.py``) ask:

* ``BoundedLogLikelihood``: OPS's temperature needs B and C of the log-likelihood;
* ``ConjugateUpdate``: OPS's closed-form draws and the noisy-statistics baseline need the
  conjugate posterior given (n, Σ S(x)) and the projection of a noisy sum onto attainable sums.

A model without a capability is refused by what needs it, with an error naming the model.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class BoundedLogLikelihood(Protocol):
    """A model whose per-record log-likelihood ℓ(x, θ) is bounded over its data domain × Θ."""

    def log_lik_bound(self) -> float:
        """B = sup |ℓ(x, θ)| over the data domain × Θ (nats); Wang et al.'s OPS bound."""
        ...

    def log_lik_range(self) -> float:
        """C = sup_θ sup_{x, x'} |ℓ(x', θ) − ℓ(x, θ)| over the data domain and Θ (nats);
        Foulds et al.'s Theorem 2 bound."""
        ...


@runtime_checkable
class ConjugateUpdate(Protocol):
    """An exponential-family model whose posterior over Θ given n records with statistics
    summing to Σ S(x) has a closed form it can draw from."""

    def suff_stat(self, records: np.ndarray) -> np.ndarray:
        """S(x) per record: ``(n, p)`` → ``(n, s)``."""
        ...

    def conjugate_draws(
        self, rng: np.random.Generator, n: float, stat_sum: np.ndarray, size: int, rho: float
    ) -> np.ndarray:
        """``size`` independent draws ``(size, d)`` from the tempered posterior over Θ,
        ∝ [p(θ) Π p(x | θ)]^ρ, given ``n`` records whose statistics sum to ``stat_sum``
        ``(s,)`` (attainable: project a noisy sum first), in the sampled parameterisation;
        ``rho`` ∈ (0, 1] is checked by the caller."""
        ...

    def project_stats(self, stat_sum: np.ndarray, n: int) -> np.ndarray:
        """The attainable sum ``(s,)`` nearest to ``stat_sum`` ``(s,)`` for ``n`` records."""
        ...
