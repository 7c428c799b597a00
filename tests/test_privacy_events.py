"""The open privacy-event model (``fedpenalty.privacy.events``) and the accountant that composes
events (docs/design.md §2.5, "Privacy events"): today's two event shapes composed as events give
exactly the ε the owner reports; Gaussian, subsampled-Gaussian, Laplace and (ε, δ) events agree
with dp-accounting composing the same events itself; an unknown event is an error."""

from __future__ import annotations

import math

import dp_accounting
import pytest

from fedpenalty.privacy import GaussianSpend
from fedpenalty.privacy.accountant import OwnerAccountant
from fedpenalty.privacy.events import (
    FOLD,
    Composed,
    EpsilonDelta,
    Gaussian,
    Laplace,
    SelfComposed,
    SubsampledGaussian,
    Tally,
    tally,
)
from fedpenalty.privacy.owner_epsilon import owner_epsilon
from fedpenalty.privacy.subsampled_rdp import ORDERS

DELTA = 1e-5
SPEND = GaussianSpend(40, 0.9, 0.2)
ROWS = [SubsampledGaussian(0.01, 2.0, 300), SubsampledGaussian(0.05, 3.0, 40)]
ADD_REMOVE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE


@pytest.mark.parametrize("neighbour", ["replace_one", "add_remove"])
@pytest.mark.parametrize("lattice", [False, True])
@pytest.mark.parametrize(
    "spend, rows",
    [(SPEND, []), (GaussianSpend(), ROWS), (SPEND, ROWS), (GaussianSpend(3, 2e3, 40.0), ROWS)],
    ids=["gaussian", "sampled", "mixed", "past-pld-limit"],
)
def test_todays_event_shapes_composed_as_events_give_todays_epsilon_exactly(
    neighbour, lattice, spend, rows
):
    """The spend line and the gradient rows, composed as events in any order and grouping, give
    bit for bit the (ε, accountant) the owner's accountant gave them as its two fields."""
    today = OwnerAccountant(neighbour, spend, tuple(rows), lattice).account(DELTA)
    fresh = OwnerAccountant(neighbour, lattice=lattice)
    assert fresh.compose(spend, *rows).account(DELTA) == today
    assert fresh.compose(*reversed(rows), spend).account(DELTA) == today
    assert fresh.compose(Composed((spend, Composed(tuple(rows))))).account(DELTA) == today
    assert owner_epsilon(spend, rows, DELTA, neighbour, lattice) == today


def test_self_composition_and_single_gaussians_fold_into_the_spend_line():
    t = tally([SelfComposed(Gaussian(2.0), 4), Gaussian(4.0), SelfComposed(SPEND, 2)])
    assert t.gaussian.answers == 4 + 1 + 80
    assert t.gaussian.mu_squared == pytest.approx(4 * 0.25 + 1 / 16 + 1.8, rel=1e-15)
    assert t.gaussian.max_mu == 0.5
    rows = tally([SelfComposed(ROWS[0], 3)]).sampled
    assert rows == (SubsampledGaussian(0.01, 2.0, 900),)
    assert tally([SelfComposed(Laplace(2.0), 0), SelfComposed(ROWS[1], 0)]) == Tally()


def test_gaussian_and_subsampled_events_agree_with_dp_accounting_composing_them_itself():
    """Float owner, add/remove: Gaussian answers of total μ are one Gaussian of multiplier 1/μ;
    the library's PLD accountant on the library's own events gives the same ε."""
    acc = OwnerAccountant("add_remove").compose(SelfComposed(Gaussian(5.0), 9), *ROWS)
    eps, name = acc.account(DELTA)
    assert name == "pld"
    mu = math.sqrt(9 / 25)
    library = dp_accounting.pld.PLDAccountant(ADD_REMOVE, value_discretization_interval=1e-4)
    library.compose(dp_accounting.GaussianDpEvent(1 / mu))
    for row in ROWS:
        sampled = dp_accounting.PoissonSampledDpEvent(
            row.sampling_rate, dp_accounting.GaussianDpEvent(row.noise_multiplier)
        )
        library.compose(sampled, row.count)
    assert eps == pytest.approx(library.get_epsilon(DELTA), rel=1e-9)


def test_gaussian_events_alone_are_exact_gdp_and_match_the_librarys_pld_closely():
    acc = OwnerAccountant("add_remove").compose(SelfComposed(Gaussian(3.0), 4))
    eps, name = acc.account(DELTA)
    assert name == "gdp"
    library = dp_accounting.pld.PLDAccountant(ADD_REMOVE, value_discretization_interval=1e-4)
    library.compose(dp_accounting.GaussianDpEvent(3.0 / 2.0))  # total μ = 2/3
    assert eps == pytest.approx(library.get_epsilon(DELTA), rel=1e-3)
    assert eps <= library.get_epsilon(DELTA)  # the library's PLD is pessimistic


@pytest.mark.parametrize("lattice", [False, True])
def test_laplace_events_are_accounted_by_the_librarys_renyi_dp(lattice):
    """Laplace releases with Gaussian answers: ε is dp-accounting's RDP ε of the same events
    at the same orders; pure ε (n/b) bounds it, and the library's PLD is no larger."""
    acc = OwnerAccountant("replace_one", lattice=lattice)
    acc = acc.compose(SelfComposed(Laplace(20.0), 30), SelfComposed(Gaussian(10.0), 5))
    eps, name = acc.account(DELTA)
    assert name == "rdp"
    library = dp_accounting.rdp.RdpAccountant(orders=list(ORDERS), neighboring_relation=ADD_REMOVE)
    library.compose(dp_accounting.LaplaceDpEvent(20.0), 30)
    library.compose(dp_accounting.GaussianDpEvent(1 / math.sqrt(5 / 100)))
    assert eps == pytest.approx(library.get_epsilon(DELTA), rel=1e-9)
    alone = OwnerAccountant("add_remove").compose(SelfComposed(Laplace(20.0), 30)).epsilon(DELTA)
    assert alone <= 30 / 20.0
    pld = dp_accounting.pld.PLDAccountant(ADD_REMOVE, value_discretization_interval=1e-4)
    pld.compose(dp_accounting.LaplaceDpEvent(20.0), 30)
    assert pld.get_epsilon(DELTA) <= alone


def test_releases_known_by_epsilon_delta_compose_by_basic_composition():
    pure = OwnerAccountant("replace_one").compose(
        EpsilonDelta(0.5), SelfComposed(EpsilonDelta(0.1), 3)
    )
    assert pure.account(DELTA) == (pytest.approx(0.8, rel=1e-15), "basic")
    mixed = OwnerAccountant("replace_one").compose(SPEND, EpsilonDelta(0.25, 4e-6))
    rest = OwnerAccountant("replace_one").compose(SPEND).epsilon(DELTA - 4e-6)
    assert mixed.account(DELTA) == (pytest.approx(rest + 0.25, rel=1e-15), "basic")
    assert (
        OwnerAccountant("replace_one").compose(EpsilonDelta(0.1, 2e-5)).epsilon(DELTA) == math.inf
    )


def test_admission_asks_about_a_planned_event():
    spent = OwnerAccountant("replace_one").compose(SPEND)
    planned = SelfComposed(Gaussian(10.0), 100)  # μ² 1 more
    after = OwnerAccountant("replace_one").compose(GaussianSpend(140, 1.9, 0.2)).epsilon(DELTA)
    assert spent.admits(planned, after * (1 + 1e-9), DELTA)
    assert not spent.admits(planned, after * (1 - 1e-9), DELTA)


def test_an_unknown_event_is_an_error_never_a_fallback():
    class Unregistered:
        pass

    with pytest.raises(TypeError, match="unknown privacy event"):
        OwnerAccountant("replace_one").compose(SPEND, Unregistered())
    with pytest.raises(TypeError, match="unknown privacy event"):
        tally([Composed((SPEND, dp_accounting.GaussianDpEvent(1.0)))])
    assert set(FOLD) >= {GaussianSpend, SubsampledGaussian, Gaussian, Laplace, EpsilonDelta}


@pytest.mark.parametrize(
    "make",
    [lambda: Gaussian(0.0), lambda: Laplace(-1.0), lambda: EpsilonDelta(-0.1),
     lambda: EpsilonDelta(1.0, 1.0), lambda: SelfComposed(Gaussian(1.0), -1)],
)  # fmt: skip
def test_malformed_events_are_refused(make):
    with pytest.raises(ValueError):
        make()


@pytest.mark.parametrize("lattice", [False, True])
def test_a_plan_view_composes_what_is_spent_and_reserved_and_asks_about_the_planned_event(lattice):
    """The plan check's worst case (spend plus the planned answers at the worst μ, with every
    gradient answer given or reserved) is the plan view's events composed with the planned
    event: the same ε bit for bit."""
    from fedpenalty.owner.ledger_records import PlanView

    view = PlanView(None, SPEND, ROWS[:1], ROWS[1:], True)
    worst_mu, remaining = 0.05, 120
    worst_spend = GaussianSpend(
        SPEND.answers + remaining, SPEND.mu_squared + remaining * worst_mu**2, SPEND.max_mu
    )
    today, _ = owner_epsilon(worst_spend, ROWS, DELTA, "replace_one", lattice)
    planned = SelfComposed(GaussianSpend(1, worst_mu**2, worst_mu), remaining)
    committed = view.committed("replace_one", lattice)
    assert committed.compose(planned).epsilon(DELTA) == today
    assert committed.admits(planned, today, DELTA)
    assert not committed.admits(planned, today * (1 - 1e-9), DELTA)
