"""Per-owner accounting of Poisson-subsampled Gaussian answers (docs/design.md §2.3, §2.5).

An owner asked for a gradient includes each of its records independently with probability
q (Poisson sampling), clips each sampled record's contribution to L2 norm C (``clip``), sums,
and adds N(0, (σ C)² I). σ is the *noise multiplier*: noise sd in units of the clip. The
accounting itself is Google's ``dp-accounting`` (PLD by default, RDP on request); this module
only maps fedpenalty's parameters onto its events and neighbour relations, and calibrates σ
and the number of steps with the library's ``calibrate_dp_mechanism``.

Neighbour relation (the choice, and why)
----------------------------------------
``dp-accounting``'s noise multiplier is the noise sd divided by the *sensitivity*.

* ``add_remove``: adding or removing one record moves the sum by at most C, so the
  sensitivity is C and the library's multiplier is σ, with
  ``NeighboringRelation.ADD_OR_REMOVE_ONE``.
* ``replace_one``: replacing one record moves the sum by at most 2C.
  - **PLD (default)**: we use the library's own ``NeighboringRelation.REPLACE_ONE`` with
    multiplier σ. For a Poisson-sampled Gaussian its privacy loss is built from the exact pair
    μ₊ = (1−q)N(0, σ²) + q N(−1, σ²) and μ₋ = (1−q)N(0, σ²) + q N(+1, σ²)
    (``privacy_loss_mechanism.AdditiveNoisePrivacyLoss``, REPLACE adjacency). Each record
    contributes at most 1 (= C) on either side, so the pair is 2C apart, and at q = 1 it is
    exactly the Gaussian mechanism with sensitivity 2C (multiplier σ/2). In d dimensions the
    two records are vectors a, b with ‖a‖, ‖b‖ ≤ C, and the problem reduces to the plane
    through 0, a and b. We checked numerically that no such planar configuration has a larger
    hockey-stick divergence than the antipodal one (tests/test_subsampled.py), so the library
    pair is the right pair. For q < 1 it is tighter than "add/remove at σ/2".
  - **RDP**: the library refuses REPLACE_ONE for ``PoissonSampledDpEvent``, so we use
    ADD_OR_REMOVE_ONE at the effective multiplier σ·C/(2C) = σ/2, i.e. sensitivity 2C. This
    is exact at q = 1. For q < 1 it is conservative: at every order α, the Rényi divergence of
    the replace pair above is at most the library's RDP at σ/2 (checked numerically in the
    tests). RDP composes additively order by order, so the bound carries over to T steps.

ε is in nats, δ a probability, q ∈ (0, 1], σ > 0 dimensionless.

Reference values (Poisson sampling, add/remove, δ = 1e-5; reproduced in the tests):
q=0.01, σ=4, T=10⁴ → RDP 1.03549, RDP with the older conversion 1.2586 (Abadi et al.: 1.26),
PLD 0.947; q=150/60000, σ=1.3, T=6000 → RDP 0.7242234026, PLD 0.640; q=0.04, σ=1.5,
T=2250 → RDP 7.3291, PLD 6.7688. The PLD figures need a value-discretisation interval of
1e-4 (the library default, used here): at 1e-3 the first becomes 0.960.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from typing import TYPE_CHECKING, Literal

import numpy as np

from ..models.base import Neighbour, check_neighbour
from .gaussian import check_choice, check_count, check_delta, check_epsilon

if TYPE_CHECKING:  # imported where used: dp-accounting (and the scipy.stats it loads) costs
    # every process ~1 s of start-up, which an owner of penalty sessions never needs
    import dp_accounting

__all__ = [
    "ACCOUNTANTS",
    "DISCRETIZATION",
    "Accountant",
    "SubsampledGaussian",
    "accountant_noise_multiplier",
    "as_events",
    "calibrate_noise_multiplier",
    "dp_event",
    "epsilon",
    "epsilon_rdp_classic",
    "max_steps",
]

Accountant = Literal["pld", "rdp"]
ACCOUNTANTS: tuple[str, ...] = ("pld", "rdp")

#: PLD value-discretisation interval (nats). 1e-4 reproduces the reference values above to
#: the digits given; the estimate is pessimistic (an upper bound on the exact ε).
DISCRETIZATION = 1e-4

# Relative precision of the calibrated noise multiplier.
_SIGMA_RTOL = 1e-6

# calibrate_dp_mechanism's bracket search doubles its step at most 30 times from [1, 2], so it
# spans [1, 2^31]: noise multipliers down to 2^-31 (as r = 1/σ) and step counts up to 2^31.
_SEARCH_SPAN = 2**31
# Upwards, the search doubles log σ; it stops past this noise multiplier.
_MAX_SIGMA = 2.0**63


@dataclass(frozen=True)
class SubsampledGaussian:
    """``count`` answers, each Poisson-sampled at rate ``sampling_rate`` q ∈ (0, 1] with noise
    multiplier ``noise_multiplier`` σ > 0 (noise sd / clip). An owner's ledger holds a list of
    these (one per distinct (q, σ))."""

    sampling_rate: float
    noise_multiplier: float
    count: int = 1

    def __post_init__(self) -> None:
        q, s, c = self.sampling_rate, self.noise_multiplier, self.count
        if isinstance(q, bool) or not isinstance(q, Real) or not 0.0 < float(q) <= 1.0:
            raise ValueError(f"sampling_rate must be in (0, 1], got {q!r}")
        if isinstance(s, bool) or not isinstance(s, Real) or not (math.isfinite(s) and s > 0):
            raise ValueError(f"noise_multiplier must be finite and > 0, got {s!r}")
        if isinstance(c, bool) or not isinstance(c, Integral) or c < 0:
            raise ValueError(f"count must be an integer >= 0, got {c!r}")


def accountant_noise_multiplier(
    noise_multiplier: float, neighbour: Neighbour, accountant: Accountant
) -> tuple[float, dp_accounting.NeighboringRelation]:
    """The (multiplier, relation) handed to ``dp-accounting`` for fedpenalty's σ (noise sd /
    clip): σ with the library's own relation, except RDP + replace-one, which becomes σ/2 under
    add/remove (sensitivity 2C; see the module docstring)."""
    import dp_accounting  # here, not at the top: see the imports

    check_neighbour(neighbour)
    check_choice("accountant", accountant, ACCOUNTANTS)
    rel = dp_accounting.NeighboringRelation
    if neighbour == "add_remove":
        return noise_multiplier, rel.ADD_OR_REMOVE_ONE
    if accountant == "pld":
        return noise_multiplier, rel.REPLACE_ONE
    return noise_multiplier / 2.0, rel.ADD_OR_REMOVE_ONE


def as_events(
    events: SubsampledGaussian | Sequence[SubsampledGaussian],
) -> list[SubsampledGaussian]:
    """``events`` (one event or a sequence) as a list; ValueError for anything else."""
    if isinstance(events, SubsampledGaussian):
        return [events]
    out = list(events)
    if not all(isinstance(e, SubsampledGaussian) for e in out):
        raise ValueError("events must be SubsampledGaussian objects")
    return out


def dp_event(
    events: SubsampledGaussian | Sequence[SubsampledGaussian],
    neighbour: Neighbour,
    accountant: Accountant,
) -> tuple[dp_accounting.DpEvent, dp_accounting.NeighboringRelation]:
    """The composed ``dp-accounting`` event of ``events`` and the relation to account it under."""
    import dp_accounting  # here, not at the top: see the imports

    parts = []
    relation = accountant_noise_multiplier(1.0, neighbour, accountant)[1]
    for e in as_events(events):
        if e.count == 0:
            continue
        mult, _ = accountant_noise_multiplier(float(e.noise_multiplier), neighbour, accountant)
        gaussian = dp_accounting.GaussianDpEvent(mult)
        one = dp_accounting.PoissonSampledDpEvent(float(e.sampling_rate), gaussian)
        parts.append(dp_accounting.SelfComposedDpEvent(one, int(e.count)))
    return dp_accounting.ComposedDpEvent(parts), relation


def _accountant(neighbour: Neighbour, accountant: Accountant) -> dp_accounting.PrivacyAccountant:
    """A fresh ``dp-accounting`` accountant for events built by ``dp_event``."""
    import dp_accounting  # here, not at the top: see the imports

    relation = accountant_noise_multiplier(1.0, neighbour, accountant)[1]
    if accountant == "pld":
        return dp_accounting.pld.PLDAccountant(
            relation, value_discretization_interval=DISCRETIZATION
        )
    return dp_accounting.rdp.RdpAccountant(neighboring_relation=relation)


def epsilon(
    events: SubsampledGaussian | Sequence[SubsampledGaussian],
    delta: float,
    *,
    neighbour: Neighbour,
    accountant: Accountant = "pld",
) -> float:
    """ε (nats) at ``delta`` of all ``events`` composed, for the stated neighbour relation.

    PLD: pessimistic estimate at interval ``DISCRETIZATION``. RDP: the library's conversion
    (Balle et al. 2020 / Canonne et al., tighter than the older one; see
    ``epsilon_rdp_classic``). 0 when no answer was released.
    """
    delta = check_delta(delta)
    event, _ = dp_event(events, neighbour, accountant)
    if not event.events:
        return 0.0
    return float(_accountant(neighbour, accountant).compose(event).get_epsilon(delta))


def epsilon_rdp_classic(
    events: SubsampledGaussian | Sequence[SubsampledGaussian], delta: float, *, neighbour: Neighbour
) -> float:
    """ε by the older RDP → (ε, δ) conversion used with the moments accountant (Abadi et al.
    2016; Mironov 2017, Prop. 3): ε = min_α RDP(α) + log(1/δ)/(α − 1) over the library's
    default orders. Kept for comparison with published figures only; ``epsilon`` is tighter."""
    import dp_accounting  # here, not at the top: see the imports

    delta = check_delta(delta)
    event, relation = dp_event(events, neighbour, "rdp")
    if not event.events:
        return 0.0
    acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=relation)
    acc.compose(event)
    orders = np.asarray(acc.orders, dtype=float)
    return float(np.min(np.asarray(acc.rdp) + math.log(1.0 / delta) / (orders - 1.0)))


def calibrate_noise_multiplier(
    target_epsilon: float,
    delta: float,
    sampling_rate: float,
    steps: int,
    *,
    neighbour: Neighbour,
    accountant: Accountant = "pld",
) -> float:
    """Smallest noise multiplier σ (noise sd / clip) such that ``steps`` answers at
    ``sampling_rate`` are (target_epsilon, delta)-DP, by ``dp_accounting.calibrate_dp_mechanism``.

    The search starts at σ = 1. When that is too little noise it runs over log σ ≥ 0 (the
    library's bracket search doubles log σ: overshooting towards more noise is cheap); when it
    is enough, over r = 1/σ ≥ 1, whose doubling halves σ, so the accountant never sees a σ
    far below the answer (PLD's cost grows fast with ε). Brent's method then finds log σ, or
    r ≥ 1, to within 1e-6. The library checks the σ it returns against the accountant, so it
    meets the target; it exceeds the root by at most a relative 1e-6, or by more only where
    the accountant's ε(σ) is not monotone at that scale. ValueError when no σ in
    [2^-31, 2^63] meets the target.

    Memoised (a search costs seconds of PLD work, and scenarios ask the same question many
    times): the arguments are checked first, then looked up as plain (float, float, float,
    int, str, str), so a bad argument still raises its ValueError and never reaches the cache.
    """
    target = check_epsilon(target_epsilon, "target_epsilon")
    if target == 0.0:
        raise ValueError("target_epsilon must be > 0 (ε = 0 needs infinite noise)")
    delta = check_delta(delta)
    steps = check_count("steps", steps)
    rate = SubsampledGaussian(sampling_rate, 1.0, steps).sampling_rate  # checks q ∈ (0, 1]
    check_neighbour(neighbour)
    check_choice("accountant", accountant, ACCOUNTANTS)
    return _calibrate_noise_multiplier(
        float(target), float(delta), float(rate), int(steps), str(neighbour), str(accountant)
    )


@functools.lru_cache(maxsize=256)
def _calibrate_noise_multiplier(
    target: float,
    delta: float,
    sampling_rate: float,
    steps: int,
    neighbour: Neighbour,
    accountant: Accountant,
) -> float:
    """``calibrate_noise_multiplier`` on checked, hashable arguments (the cached search)."""
    import dp_accounting  # here, not at the top: see the imports
    from dp_accounting.mechanism_calibration import NoBracketIntervalFoundError

    failed = (
        f"no noise multiplier in [2^-31, 2^63] gives ε = {target!r} at δ = {delta!r} for "
        f"{steps} steps at sampling rate {sampling_rate!r}"
    )

    def event(sigma: float) -> dp_accounting.DpEvent:
        """The library event of the ``steps`` answers at noise multiplier ``sigma``."""
        if sigma > _MAX_SIGMA:
            raise ValueError(failed)
        return dp_event(SubsampledGaussian(sampling_rate, sigma, steps), neighbour, accountant)[0]

    one = epsilon(
        SubsampledGaussian(sampling_rate, 1.0, steps),
        delta,
        neighbour=neighbour,
        accountant=accountant,
    )
    to_sigma: Callable[[float], float]
    if one > target:
        to_sigma, start = math.exp, dp_accounting.LowerEndpointAndGuess(0.0, math.log(2.0))
    else:
        to_sigma, start = (lambda r: 1.0 / r), dp_accounting.LowerEndpointAndGuess(1.0, 2.0)
    try:
        x = dp_accounting.calibrate_dp_mechanism(
            lambda: _accountant(neighbour, accountant),
            lambda x: event(to_sigma(x)),
            target,
            delta,
            start,
            tol=_SIGMA_RTOL,
        )
    except NoBracketIntervalFoundError:
        raise ValueError(failed) from None
    return float(to_sigma(x))


class _LimitFits(Exception):
    """Raised from inside ``max_steps``'s search: all of its ``limit`` answers fit."""


def max_steps(
    noise_multiplier: float,
    sampling_rate: float,
    target_epsilon: float,
    delta: float,
    *,
    neighbour: Neighbour,
    accountant: Accountant = "pld",
    limit: int = 10**9,
) -> int:
    """Largest T ≥ 0 such that T answers at (``sampling_rate``, ``noise_multiplier``) are
    (target_epsilon, delta)-DP, at most ``limit`` (an integer in [1, 2^31)).

    ``dp_accounting.calibrate_dp_mechanism`` over the integer T (its bracket search doubles T
    from 1) returns a T that fits and is within 1 of the largest; the next T is then checked
    directly. The accountant never sees a T above ``limit``: the first time the search asks
    for one, ``limit`` itself is checked, and either returned (it fits) or the larger T are
    treated as non-private.
    """
    import dp_accounting  # here, not at the top: see the imports

    target = check_epsilon(target_epsilon, "target_epsilon")
    delta = check_delta(delta)
    limit = check_count("limit", limit)
    if limit >= _SEARCH_SPAN:
        raise ValueError(f"limit must be below 2^31, got {limit!r}")

    def answers(t: int) -> SubsampledGaussian:
        """``t`` answers at the given (q, σ)."""
        return SubsampledGaussian(sampling_rate, noise_multiplier, t)

    @functools.cache
    def fits(t: int) -> bool:
        """Whether ``t`` answers are (target_epsilon, delta)-DP."""
        return epsilon(answers(t), delta, neighbour=neighbour, accountant=accountant) <= target

    def event(t: int) -> dp_accounting.DpEvent:
        """The library event of ``t`` answers; past ``limit``, one that is never private."""
        if t <= limit:
            return dp_event(answers(t), neighbour, accountant)[0]
        if fits(limit):
            raise _LimitFits
        return dp_accounting.NonPrivateDpEvent()

    if not fits(1):
        return 0
    try:
        t = int(
            dp_accounting.calibrate_dp_mechanism(
                lambda: _accountant(neighbour, accountant),
                event,
                target,
                delta,
                dp_accounting.LowerEndpointAndGuess(1, 2),
                discrete=True,
            )
        )
    except _LimitFits:
        return limit
    while t < limit and fits(t + 1):
        t += 1
    return t
