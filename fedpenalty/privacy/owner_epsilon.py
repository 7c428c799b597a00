"""Functional entry points to ``OwnerAccountant`` (``accountant.py``): ε of everything one owner
released (its privacy events, ``events.py``), and the Gaussian μ² that still fits a budget.
ε is in nats, δ a probability."""

from __future__ import annotations

from collections.abc import Sequence

from ..models.base import Neighbour
from .accountant import AccountantName, OwnerAccountant
from .spend import GaussianSpend
from .subsampled import SubsampledGaussian

__all__ = ["max_gdp_mu_squared", "owner_epsilon"]


def owner_epsilon(
    spend: GaussianSpend,
    sampled: Sequence[SubsampledGaussian],
    delta: float,
    neighbour: Neighbour,
    lattice: bool = False,
) -> tuple[float, AccountantName]:
    """(ε at ``delta``, accountant name: "gdp" | "pld" | "rdp") of the Gaussian answers
    ``spend`` and the subsampled answers ``sampled`` together: the events composed by the
    owner's accountant (``events.py``). Memoised."""
    return OwnerAccountant(neighbour, lattice=lattice).compose(spend, *sampled).account(delta)


def max_gdp_mu_squared(
    budget_epsilon: float,
    delta: float,
    neighbour: Neighbour,
    sampled: Sequence[SubsampledGaussian],
    tolerance: float = 1e-2,
    lattice: bool = False,
) -> float:
    """The largest μ² of Gaussian answers that, with ``sampled``, keeps ε(δ) ≤ the budget
    (``OwnerAccountant.max_gaussian_mu_squared``: never overstates what fits; 0 when
    ``sampled`` alone already exceeds the budget). Memoised."""
    acc = OwnerAccountant(neighbour, sampled=tuple(sampled), lattice=lattice)
    return acc.max_gaussian_mu_squared(budget_epsilon, delta, tolerance)
