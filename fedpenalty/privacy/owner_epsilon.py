"""Functional entry points to ``OwnerAccountant`` (``accountant.py``): ε of everything one owner
released (its privacy events, ``events.py``), and the Gaussian μ² that still fits a budget.
An owner's ledger rows besides its Gaussian spend are its subsampled-Gaussian answers and its
pure-ε releases (``SelfComposed(EpsilonDelta(ε), count)``: the Laplace statistics, docs/design.md
§2.10). ε is in nats, δ a probability."""

from __future__ import annotations

from collections.abc import Sequence

from ..models.base import Neighbour
from .accountant import AccountantName, OwnerAccountant
from .events import EpsilonDelta, SelfComposed
from .spend import GaussianSpend
from .subsampled import SubsampledGaussian

__all__ = ["Row", "max_gdp_mu_squared", "owner_epsilon", "pure_epsilon"]

#: one ledger row of an owner besides its Gaussian spend line
Row = SubsampledGaussian | SelfComposed


def pure_epsilon(rows: Sequence[Row]) -> float:
    """Σ ε of the pure-ε releases among ``rows`` (``SelfComposed`` of ``EpsilonDelta`` with δ 0)."""
    total = 0.0
    for row in rows:
        if isinstance(row, SelfComposed):
            event = row.event
            if not (isinstance(event, EpsilonDelta) and event.delta == 0.0):
                raise TypeError(f"a ledger row is a pure-ε release or a gradient row, not {row!r}")
            total += event.epsilon * row.count
    return total


def owner_epsilon(
    spend: GaussianSpend,
    sampled: Sequence[Row],
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
    sampled: Sequence[Row],
    tolerance: float = 1e-2,
    lattice: bool = False,
) -> float:
    """The largest μ² of Gaussian answers that, with ``sampled``, keeps ε(δ) ≤ the budget
    (``OwnerAccountant.max_gaussian_mu_squared``: never overstates what fits; 0 when
    ``sampled`` alone already exceeds the budget). Pure-ε rows compose by adding their ε
    (the accountant's basic composition), so the rest must fit the budget less their ε.
    Memoised."""
    pure = pure_epsilon(sampled)
    if pure >= budget_epsilon:
        return 0.0
    gradients = tuple(e for e in sampled if isinstance(e, SubsampledGaussian))
    acc = OwnerAccountant(neighbour, sampled=gradients, lattice=lattice)
    return acc.max_gaussian_mu_squared(budget_epsilon - pure, delta, tolerance)
