"""ε of everything one owner released: Gaussian (GDP) answers and subsampled-Gaussian answers.

With Gaussian answers only, the exact analytic-Gaussian ε of μ-GDP (``"gdp"``). Once the owner
has released Poisson-subsampled Gaussian answers (gradients), everything is composed with
dp-accounting's PLD accountant (``"pld"``, a pessimistic estimate): the Gaussian answers enter
as one Gaussian mechanism of the same μ (multiplier 1/μ against sensitivity 1 for add/remove;
2/μ under replace-one, whose pair of records sits 2 sensitivities apart).

PLD's memory grows with the privacy loss it represents (a plan worth ε ≈ 10⁶ asks for GiBs), so
RDP — constant memory, always an upper bound — is computed first, and PLD only refines
ε ≤ ``PLD_EPSILON_LIMIT``; above it the RDP bound is reported (``"rdp"``). No budget anyone
would set lies up there, and any request an owner receives may be hostile.
"""

from __future__ import annotations

import functools
from typing import Sequence

from .gaussian import mu_for_epsilon
from .spend import GaussianSpend
from .subsampled import SubsampledGaussian, epsilon as sampled_epsilon

PLD_EPSILON_LIMIT = 50.0


def owner_epsilon(spend: GaussianSpend, sampled: Sequence[SubsampledGaussian], delta: float,
                  neighbour: str) -> tuple[float, str]:
    """(ε at ``delta``, accountant name) of ``spend`` and ``sampled`` together. Memoised: the
    owners of one host usually ask the very same question."""
    return _owner_epsilon(spend, _canonical(sampled), delta, neighbour)


def _canonical(sampled: Sequence[SubsampledGaussian]) -> tuple[SubsampledGaussian, ...]:
    """The events that released something, in a fixed order (a hashable cache key)."""
    return tuple(sorted((e for e in sampled if e.count > 0), key=lambda e: (e.sampling_rate, e.noise_multiplier, e.count)))


@functools.lru_cache(maxsize=4096)
def _owner_epsilon(spend: GaussianSpend, sampled: tuple[SubsampledGaussian, ...], delta: float,
                   neighbour: str) -> tuple[float, str]:
    if not sampled:
        return spend.epsilon(delta), "gdp"
    events = list(sampled)
    if spend.mu_squared > 0:
        factor = 2.0 if neighbour == "replace_one" else 1.0
        events.append(SubsampledGaussian(1.0, factor / spend.mu, 1))
    bound = sampled_epsilon(events, delta, neighbour=neighbour, accountant="rdp")
    if bound > PLD_EPSILON_LIMIT:
        return bound, "rdp"
    pld = sampled_epsilon(events, delta, neighbour=neighbour)
    return (pld, "pld") if pld <= bound else (bound, "rdp")


def max_gdp_mu_squared(budget_epsilon: float, delta: float, neighbour: str,
                       sampled: Sequence[SubsampledGaussian], tolerance: float = 1e-2) -> float:
    """The largest μ² of Gaussian answers that, with ``sampled``, keeps ε(δ) ≤ the budget.

    Analytic without subsampled answers; otherwise a bisection on the PLD accountant that
    returns the lower end of its final bracket (relative width ``tolerance``), so it never
    overstates what fits. 0 when ``sampled`` alone already exceeds the budget.
    """
    return _max_gdp_mu_squared(budget_epsilon, delta, neighbour, _canonical(sampled),
                               tolerance)


@functools.lru_cache(maxsize=1024)
def _max_gdp_mu_squared(budget_epsilon: float, delta: float, neighbour: str, sampled: tuple[SubsampledGaussian, ...],
                        tolerance: float) -> float:
    upper = mu_for_epsilon(budget_epsilon, delta)
    if not sampled:
        return upper**2

    def fits(mu: float) -> bool:
        return owner_epsilon(GaussianSpend(1, mu * mu, mu), sampled, delta, neighbour)[0] <= budget_epsilon

    if not fits(0.0):
        return 0.0
    lo, hi = 0.0, upper
    while hi - lo > tolerance * upper:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo**2
