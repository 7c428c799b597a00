"""One owner's privacy accountant: everything the owner released, composed, and its ε(δ).

``OwnerAccountant`` follows dp-accounting's event → accountant split (compose events, then ask
for ε at a δ) for the two kinds of answer an owner gives (docs/design.md §2.5):

* Gaussian answers, each μ_t = Δ_t/σ_t (dimensionless), kept as a running ``GaussianSpend``
  (count, Σ μ_t², max μ_t): O(1) per answer;
* Poisson-subsampled Gaussian answers (gradients), kept as ``SubsampledGaussian`` rows
  (q, σ, count), one per composed row, in a canonical order.

With Gaussian answers only, ε is the exact analytic-Gaussian ε of μ-GDP (``"gdp"``). Once
subsampled answers are included, everything is composed with dp-accounting's PLD accountant
(``"pld"``, a pessimistic estimate): the Gaussian answers enter as one Gaussian mechanism of
the same μ (multiplier 1/μ against sensitivity 1 for add/remove; 2/μ under replace-one, whose
pair of records sits 2 sensitivities apart).

PLD's memory grows with the privacy loss it represents (a plan worth ε ≈ 10⁶ asks for GiBs), so
RDP — constant memory, always an upper bound — is computed first, and PLD only refines
ε ≤ ``PLD_EPSILON_LIMIT``; above it, or wherever it is the smaller figure, the RDP bound is
reported (``"rdp"``). No budget anyone would set lies up there, and any request an owner
receives may be hostile.

**Lattice answers** (``lattice=True``: owners that release exact discrete-Gaussian noise on a
lattice, docs/design.md §2.7) are accounted by Rényi DP throughout (``"rdp"``): the discrete
Gaussian with lattice-unit sensitivity Δ/γ and scale σ/γ has the same Rényi divergences
α(Δ/σ)²/2 as the continuous Gaussian (Canonne, Kamath & Steinke 2020, Thm 4; their Thm 14 adds
a term τ·d for d-dimensional answers with τ ≤ 10 (σ/γ)² e^(−π²(σ/γ)²), below 10^(−10¹²) at
σ/γ ≥ 2²⁰ and so nothing a float can hold), and Rényi DP composes by adding, so the Gaussian
answers enter as one Gaussian of total μ. The exact μ-GDP curve is not used for them: it is
proved for the continuous Gaussian only. Lattice *gradient* answers (Poisson-subsampled
discrete Gaussians) are accounted by the general subsampled-RDP bounds of ``subsampled_rdp``
(Zhu & Wang 2019, and a ternary bound for replace-one), composed with the Gaussian answers at
integer orders.

**Any privacy event** (``events.py``: Gaussian, subsampled Gaussian, Laplace, (ε, δ),
composed, self-composed) enters through ``compose``, which folds it in through the registry
``events.FOLD``; an unregistered event type is an error. Laplace releases are accounted by
Rényi DP (dp-accounting's Laplace RDP, added to the other answers' RDP at the integer orders
``ORDERS``, ``"rdp"``); a release known only by (ε, δ) by basic composition on top of the rest
(ε adds, δ is taken from the δ asked, ``"basic"``). Without those, ε is exactly what the two
kinds above give, so an owner's spend line and gradient rows composed as events report the ε
the owner always reported. ``admits`` asks about a planned event: does everything spent,
composed with it, stay within a budget.

Accountants are immutable and hashable: ``compose*`` return new objects, and ε is memoised
per (accountant, δ), so the many owners of one host asking the same question pay once.
ε is in nats, δ a probability.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import dp_accounting
import numpy as np
from scipy.optimize.elementwise import find_root

from ..models.base import Neighbour, check_neighbour
from .events import Tally, tally
from .gaussian import check_delta, check_epsilon, check_positive, mu_for_epsilon
from .spend import GaussianSpend
from .subsampled import SubsampledGaussian, as_events
from .subsampled import dp_event as sampled_dp_event
from .subsampled import epsilon as sampled_epsilon
from .subsampled_rdp import ORDERS, epsilon_from_rdp, subsampled_gaussian_rdp

__all__ = ["PLD_EPSILON_LIMIT", "AccountantName", "OwnerAccountant"]

AccountantName = Literal["gdp", "pld", "rdp", "basic"]

#: ε (nats) above which the RDP bound is reported without asking PLD to refine it.
PLD_EPSILON_LIMIT = 50.0


@dataclass(frozen=True)
class OwnerAccountant:
    """What one owner released under ``neighbour`` ("replace_one" | "add_remove"): its Gaussian
    answers (``gaussian``), its subsampled-Gaussian answers (``sampled``, stored sorted by
    (q, σ, count), rows with count 0 dropped, so the order of composition does not matter),
    its Laplace releases (``laplace``: (multiplier, count)) and its releases known by (ε, δ)
    (``approximate``: (ε, δ, count)), both sorted likewise (``events.Tally``)."""

    neighbour: Neighbour
    gaussian: GaussianSpend = field(default_factory=GaussianSpend)
    sampled: tuple[SubsampledGaussian, ...] = ()
    lattice: bool = False
    laplace: tuple[tuple[float, int], ...] = ()
    approximate: tuple[tuple[float, float, int], ...] = ()

    def __post_init__(self) -> None:
        check_neighbour(self.neighbour)
        if not isinstance(self.gaussian, GaussianSpend):
            raise ValueError(f"gaussian must be a GaussianSpend, got {self.gaussian!r}")
        rows = [e for e in as_events(self.sampled) if e.count > 0] if self.sampled else ()
        if rows:
            rows.sort(key=lambda e: (e.sampling_rate, e.noise_multiplier, e.count))
        object.__setattr__(self, "sampled", tuple(rows))
        object.__setattr__(self, "laplace", tuple(sorted(r for r in self.laplace if r[1])))
        object.__setattr__(self, "approximate", tuple(sorted(r for r in self.approximate if r[2])))

    @property
    def tally(self) -> Tally:
        """Everything composed so far, as ``events.Tally``."""
        return Tally(self.gaussian, self.sampled, self.laplace, self.approximate)

    def compose(self, *events: object) -> OwnerAccountant:
        """Also ``events`` (any registered privacy events, ``events.FOLD``; TypeError for an
        unregistered type)."""
        t = tally(events, self.tally)
        return replace(
            self,
            gaussian=t.gaussian,
            sampled=t.sampled,
            laplace=t.laplace,
            approximate=t.approximate,
        )

    def admits(self, planned: object, budget_epsilon: float, delta: float) -> bool:
        """Whether everything composed so far, with the ``planned`` event, keeps ε(``delta``)
        within ``budget_epsilon`` (nats)."""
        return self.compose(planned).epsilon(delta) <= budget_epsilon

    def compose_gaussian(self, mus: np.ndarray | float) -> OwnerAccountant:
        """Also the Gaussian answers with the given μ_t = Δ_t/σ_t (a scalar or any-shape array)."""
        return replace(self, gaussian=self.gaussian.add(mus))

    def compose_subsampled(
        self, events: SubsampledGaussian | Sequence[SubsampledGaussian]
    ) -> OwnerAccountant:
        """Also the subsampled-Gaussian answers ``events`` (one row or a sequence of rows)."""
        return replace(self, sampled=self.sampled + tuple(as_events(events)))

    def account(self, delta: float) -> tuple[float, AccountantName]:
        """(``epsilon(delta)``, ``accountant_name(delta)``) in one memoised look-up."""
        return _account(self, delta)

    def epsilon(self, delta: float) -> float:
        """ε (nats) at ``delta`` of everything composed; 0 when nothing was released."""
        return _account(self, delta)[0]

    def accountant_name(self, delta: float) -> AccountantName:
        """Which accountant produced ``epsilon(delta)``: "gdp", "pld" or "rdp"."""
        return _account(self, delta)[1]

    def max_gaussian_mu_squared(
        self, budget_epsilon: float, delta: float, tolerance: float = 1e-2
    ) -> float:
        """The largest total Σ μ_t² of Gaussian answers (those composed so far included) that,
        with the subsampled answers composed, keeps ε(delta) ≤ ``budget_epsilon`` (nats).

        μ(budget, δ)² exactly without subsampled answers; otherwise a root search on this
        accountant's ε (scipy's ``find_root``, Chandrupatla's method, bracket [0, μ(budget, δ)])
        to a final bracket narrower than ``tolerance`` ∈ (0, 1] times μ(budget, δ) (lattice
        answers alone: to float precision), whose lower end is returned, so it never overstates
        what fits. 0 when the subsampled answers alone
        exceed the budget. Memoised.
        """
        return _max_gaussian_mu_squared(
            self.neighbour, self.sampled, budget_epsilon, delta, tolerance, self.lattice
        )


@functools.lru_cache(maxsize=4096)
def _account(acc: OwnerAccountant, delta: float) -> tuple[float, AccountantName]:
    """(ε at ``delta``, accountant name) of ``acc``; see the module docstring."""
    if acc.approximate:
        return _basic_epsilon(acc, delta), "basic"
    if acc.laplace:
        return epsilon_from_rdp(_rdp(acc), check_delta(delta)), "rdp"
    lattice_answers = acc.lattice and acc.gaussian.mu_squared > 0
    if not acc.sampled and not lattice_answers:
        return acc.gaussian.epsilon(delta), "gdp"
    if acc.lattice and acc.sampled:
        return _lattice_rdp_epsilon(acc, delta), "rdp"
    events = list(acc.sampled)
    if acc.gaussian.mu_squared > 0:
        factor = 2.0 if acc.neighbour == "replace_one" else 1.0
        events.append(SubsampledGaussian(1.0, factor / acc.gaussian.mu, 1))
    bound = sampled_epsilon(events, delta, neighbour=acc.neighbour, accountant="rdp")
    if lattice_answers or bound > PLD_EPSILON_LIMIT:
        return bound, "rdp"
    pld = sampled_epsilon(events, delta, neighbour=acc.neighbour)
    return (pld, "pld") if pld <= bound else (bound, "rdp")


def _lattice_rdp_epsilon(acc: OwnerAccountant, delta: float) -> float:
    """ε at ``delta`` of lattice answers with gradient answers among them (``_lattice_rdp``)."""
    return epsilon_from_rdp(_lattice_rdp(acc), check_delta(delta))


def _lattice_rdp(acc: OwnerAccountant) -> np.ndarray:
    """RDP at ``ORDERS`` of lattice answers: every subsampled discrete-Gaussian row by the
    general bounds of ``subsampled_rdp`` (the continuous Gaussian's tight analysis does not
    carry over), plus the Gaussian answers' RDP α·Σμ²/2 (docs/design.md §2.7)."""
    rdp = np.asarray(ORDERS, dtype=float) * acc.gaussian.mu_squared / 2.0
    for e in acc.sampled:
        rdp = rdp + e.count * subsampled_gaussian_rdp(
            e.sampling_rate, e.noise_multiplier, acc.neighbour
        )
    return rdp


def _rdp(acc: OwnerAccountant) -> np.ndarray:
    """RDP at ``ORDERS`` of the Gaussian, subsampled and Laplace releases of ``acc``: lattice
    answers by ``_lattice_rdp``, float ones by dp-accounting (the Gaussian answers as one
    Gaussian of total μ, as ``_account`` enters them), each Laplace release by dp-accounting's
    Laplace RDP (add/remove of sensitivity 1: the owner's Δ between any two neighbours)."""
    relation = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    rdp = dp_accounting.rdp.RdpAccountant(orders=list(ORDERS), neighboring_relation=relation)
    for multiplier, count in acc.laplace:
        rdp.compose(dp_accounting.LaplaceDpEvent(multiplier), count)
    if acc.lattice:
        return np.asarray(rdp.rdp) + _lattice_rdp(acc)
    events = list(acc.sampled)
    if acc.gaussian.mu_squared > 0:
        factor = 2.0 if acc.neighbour == "replace_one" else 1.0
        events.append(SubsampledGaussian(1.0, factor / acc.gaussian.mu, 1))
    event, _ = sampled_dp_event(events, acc.neighbour, "rdp")
    if event.events:
        rdp.compose(event)
    return np.asarray(rdp.rdp)


def _basic_epsilon(acc: OwnerAccountant, delta: float) -> float:
    """ε at ``delta`` with the releases known by (ε_i, δ_i) composed by basic composition on
    top of the rest: Σ ε_i plus the rest's ε at δ − Σ δ_i (inf when Σ δ_i ≥ ``delta``)."""
    delta = check_delta(delta)
    spent = sum(e * c for e, _, c in acc.approximate)
    left = delta - sum(d * c for _, d, c in acc.approximate)
    if left <= 0:
        return math.inf
    rest = replace(acc, approximate=())
    return spent + (rest.epsilon(left) if rest.tally != Tally() else 0.0)


@functools.lru_cache(maxsize=1024)
def _max_gaussian_mu_squared(
    neighbour: Neighbour,
    sampled: tuple[SubsampledGaussian, ...],
    budget_epsilon: float,
    delta: float,
    tolerance: float,
    lattice: bool,
) -> float:
    """``OwnerAccountant.max_gaussian_mu_squared`` for the subsampled answers ``sampled``
    (canonical order). The exact GDP μ(budget, δ) bounds the search: every other accountant's
    ε is at least the GDP one at the same μ."""
    budget = check_epsilon(budget_epsilon, "budget_epsilon")
    tolerance = check_positive("tolerance", tolerance)
    if tolerance > 1.0:
        raise ValueError(f"tolerance must be in (0, 1], got {tolerance!r}")
    upper = mu_for_epsilon(budget, check_delta(delta))
    if not sampled and not lattice:
        return upper**2
    acc = OwnerAccountant(neighbour, sampled=sampled, lattice=lattice)

    def excess(mu: float) -> float:
        """ε − budget with Gaussian answers of total μ (``acc`` itself at 0, so memoised)."""
        mu = float(mu)
        at = replace(acc, gaussian=GaussianSpend(1, mu * mu, mu)) if mu > 0 else acc
        return at.epsilon(delta) - budget

    if excess(0.0) > 0:
        return 0.0
    if not sampled:  # lattice answers alone: RDP is cheap, so the cap is found to float precision
        tolerance = 1e-12
    width = {"xatol": tolerance * upper, "xrtol": 0.0, "fatol": 0.0, "frtol": 0.0}
    res = find_root(np.vectorize(excess, otypes=[float]), (0.0, upper), tolerances=width)
    return max(float(x) for x, f in zip(res.bracket, res.f_bracket) if f <= 0) ** 2
