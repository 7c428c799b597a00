"""Privacy accounting: exact μ-GDP for Gaussian answers, plus the penalty paper's bound.

Subsampled-Gaussian answers (``subsampled``), the privacy events an owner's releases are
(``events``) and the per-owner accountant that composes them (``accountant.OwnerAccountant``)
live in their own modules, which load dp-accounting.
See docs/design.md §2.5. ε is in nats, δ a probability, μ = Δ/σ dimensionless.
"""

from .gaussian import (
    calibrate_sigma,
    delta_for_epsilon,
    epsilon_for_delta,
    max_queries,
    mu_for_epsilon,
)
from .paper_bound import (
    advanced_composition_epsilon,
    classical_gaussian_epsilon,
    paper_bound_epsilon,
)
from .spend import GaussianSpend

__all__ = [
    "GaussianSpend",
    "advanced_composition_epsilon",
    "calibrate_sigma",
    "classical_gaussian_epsilon",
    "delta_for_epsilon",
    "epsilon_for_delta",
    "max_queries",
    "mu_for_epsilon",
    "paper_bound_epsilon",
]
