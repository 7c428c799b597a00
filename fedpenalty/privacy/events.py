"""Privacy events: what an owner released, as values (docs/design.md §2.5, "Privacy events").

The model is dp-accounting's ``dp_event``: a release is an event, events compose, and an
accountant turns a composition into ε(δ). Every event is relative to the owner's own neighbour
relation and sensitivity (noise multipliers are noise scale / the owner's Δ), so one owner's
events compose without knowing what produced them:

* ``GaussianSpend`` (``spend.py``) — the affine-μ spend line kept as one fast event type: the
  composition of Gaussian answers summarised as (count, Σ μ_t², max μ_t), μ_t = Δ_t/σ_t;
  μ-GDP composition makes it O(1) per answer;
* ``Gaussian`` — one Gaussian release (dp-accounting's ``GaussianDpEvent``), μ = 1/multiplier;
* ``SubsampledGaussian`` (``subsampled.py``) — ``count`` Poisson-subsampled Gaussian releases
  (``SelfComposedDpEvent`` of ``PoissonSampledDpEvent`` of ``GaussianDpEvent``);
* ``Laplace`` — one Laplace release of scale b·Δ (``LaplaceDpEvent``): pure ε = 1/b;
* ``EpsilonDelta`` — a release known only by its (ε, δ) guarantee, δ = 0 for pure ε
  (``EpsilonDeltaDpEvent``);
* ``Composed`` and ``SelfComposed`` — compositions (``ComposedDpEvent``,
  ``SelfComposedDpEvent``).

``tally`` folds events into a ``Tally`` — the canonical, hashable sum the accountant
(``accountant.OwnerAccountant``) accounts — through the registry ``FOLD`` (event type → how it
adds to a tally). An event of a type not registered is an error, never a fallback. ε is in
nats, δ a probability, multipliers dimensionless.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from .spend import GaussianSpend
from .subsampled import SubsampledGaussian

__all__ = [
    "FOLD",
    "Composed",
    "EpsilonDelta",
    "Event",
    "Gaussian",
    "GaussianSpend",
    "Laplace",
    "SelfComposed",
    "SubsampledGaussian",
    "Tally",
    "tally",
]


def _positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")


@dataclass(frozen=True)
class Gaussian:
    """One Gaussian release of noise sd ``noise_multiplier``·Δ: μ = 1/``noise_multiplier``."""

    noise_multiplier: float

    def __post_init__(self) -> None:
        _positive("noise_multiplier", self.noise_multiplier)


@dataclass(frozen=True)
class Laplace:
    """One Laplace release of scale ``noise_multiplier``·Δ: pure ε = 1/``noise_multiplier``."""

    noise_multiplier: float

    def __post_init__(self) -> None:
        _positive("noise_multiplier", self.noise_multiplier)


@dataclass(frozen=True)
class EpsilonDelta:
    """A release known only to be (``epsilon``, ``delta``)-DP (``delta`` 0: pure ε)."""

    epsilon: float
    delta: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epsilon) and self.epsilon >= 0):
            raise ValueError(f"epsilon must be finite and >= 0, got {self.epsilon!r}")
        if not 0.0 <= self.delta < 1.0:
            raise ValueError(f"delta must be in [0, 1), got {self.delta!r}")


@dataclass(frozen=True)
class Composed:
    """Every event of ``events``, composed."""

    events: tuple[Event, ...]


@dataclass(frozen=True)
class SelfComposed:
    """``event`` composed with itself ``count`` times."""

    event: Event
    count: int

    def __post_init__(self) -> None:
        c = self.count
        if isinstance(c, bool) or int(c) != c or c < 0:
            raise ValueError(f"count must be an integer >= 0, got {c!r}")


Event = (
    GaussianSpend | Gaussian | SubsampledGaussian | Laplace | EpsilonDelta | Composed | SelfComposed
)


@dataclass(frozen=True)
class Tally:
    """Events summed by kind: the Gaussian answers (``gaussian``), the subsampled-Gaussian rows
    (``sampled``), the Laplace releases (``laplace``: (multiplier, count)) and the releases
    known by (ε, δ) (``approximate``: (ε, δ, count)). The accountant canonicalises the order."""

    gaussian: GaussianSpend = field(default_factory=GaussianSpend)
    sampled: tuple[SubsampledGaussian, ...] = ()
    laplace: tuple[tuple[float, int], ...] = ()
    approximate: tuple[tuple[float, float, int], ...] = ()


#: how ``count`` copies of one event of each type add to a tally
Fold = Callable[[Tally, object, int], Tally]


def _spend(t: Tally, e: object, count: int) -> Tally:
    assert isinstance(e, GaussianSpend)
    if count == 0 or e.answers == 0:
        return t
    scaled = e if count == 1 else GaussianSpend(e.answers * count, e.mu_squared * count, e.max_mu)
    return replace(t, gaussian=t.gaussian.combine(scaled))


def _gaussian(t: Tally, e: object, count: int) -> Tally:
    assert isinstance(e, Gaussian)
    mu = 1.0 / e.noise_multiplier
    return _spend(t, GaussianSpend(1, mu * mu, mu), count)


def _sampled(t: Tally, e: object, count: int) -> Tally:
    assert isinstance(e, SubsampledGaussian)
    if count == 0 or e.count == 0:
        return t
    q, sigma = e.sampling_rate, e.noise_multiplier
    row = e if count == 1 else SubsampledGaussian(q, sigma, e.count * count)
    return replace(t, sampled=(*t.sampled, row))


def _laplace(t: Tally, e: object, count: int) -> Tally:
    assert isinstance(e, Laplace)
    return replace(t, laplace=(*t.laplace, (e.noise_multiplier, count))) if count else t


def _approximate(t: Tally, e: object, count: int) -> Tally:
    assert isinstance(e, EpsilonDelta)
    return replace(t, approximate=(*t.approximate, (e.epsilon, e.delta, count))) if count else t


def _composed(t: Tally, e: object, count: int) -> Tally:
    assert isinstance(e, Composed)
    for part in e.events:
        t = fold(t, part, count)
    return t


def _self_composed(t: Tally, e: object, count: int) -> Tally:
    assert isinstance(e, SelfComposed)
    return fold(t, e.event, count * e.count)


#: the registry of event types: a new kind of release registers how it adds to a tally here
#: (and the accountant how it is accounted, ``accountant.OwnerAccountant``)
FOLD: dict[type, Fold] = {
    GaussianSpend: _spend,
    Gaussian: _gaussian,
    SubsampledGaussian: _sampled,
    Laplace: _laplace,
    EpsilonDelta: _approximate,
    Composed: _composed,
    SelfComposed: _self_composed,
}


def fold(t: Tally, event: object, count: int = 1) -> Tally:
    """``t`` with ``count`` copies of ``event`` added; TypeError for an unregistered type."""
    handler = FOLD.get(type(event))
    if handler is None:
        raise TypeError(f"unknown privacy event {event!r}: register its type in events.FOLD")
    return handler(t, event, count)


def tally(events: Iterable[object], start: Tally | None = None) -> Tally:
    """Every event of ``events`` added to ``start`` (default: nothing released)."""
    t = start if start is not None else Tally()
    for event in events:
        t = fold(t, event)
    return t
