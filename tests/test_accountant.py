"""Tests of fedpenalty.privacy.accountant: one owner's accountant of Gaussian and subsampled
answers, against the functional entry points and against dp-accounting's own PLD accountant."""

from __future__ import annotations

import dataclasses
import math

import dp_accounting
import numpy as np
import pytest

from fedpenalty.privacy import GaussianSpend, mu_for_epsilon
from fedpenalty.privacy.accountant import PLD_EPSILON_LIMIT, OwnerAccountant
from fedpenalty.privacy.owner_epsilon import max_gdp_mu_squared, owner_epsilon
from fedpenalty.privacy.subsampled import SubsampledGaussian

DELTA = 1e-5
MUS = [0.3, 0.2, 0.25, 0.1]
ROWS = [SubsampledGaussian(0.01, 2.0, 300), SubsampledGaussian(0.05, 3.0, 40)]
NOTHING = OwnerAccountant("add_remove")


def _mixed(neighbour: str) -> OwnerAccountant:
    """Gaussian and subsampled answers, interleaved."""
    return (
        OwnerAccountant(neighbour)
        .compose_gaussian(MUS[:2])
        .compose_subsampled(ROWS[0])
        .compose_gaussian(MUS[2:])
        .compose_subsampled(ROWS[1])
    )


def _library_epsilon(neighbour: str) -> float:
    """ε of the same history by dp-accounting's PLD accountant, one event per answer. In the
    library's convention the multiplier is noise sd / per-record bound, and under REPLACE_ONE
    the pair of records sits 2 bounds apart: a Gaussian answer of μ (sd units) has multiplier
    2/μ there and 1/μ under ADD_OR_REMOVE_ONE."""
    relation, factor = {
        "replace_one": (dp_accounting.NeighboringRelation.REPLACE_ONE, 2.0),
        "add_remove": (dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE, 1.0),
    }[neighbour]
    acc = dp_accounting.pld.PLDAccountant(relation, value_discretization_interval=1e-4)
    for mu in MUS:
        acc.compose(dp_accounting.GaussianDpEvent(factor / mu))
    for row in ROWS:
        gaussian = dp_accounting.GaussianDpEvent(row.noise_multiplier)
        acc.compose(dp_accounting.PoissonSampledDpEvent(row.sampling_rate, gaussian), row.count)
    return acc.get_epsilon(DELTA)


@pytest.mark.parametrize("neighbour", ["replace_one", "add_remove"])
def test_mixed_history_matches_dp_accounting_and_counts_the_gaussian_part(neighbour):
    acc = _mixed(neighbour)
    eps, name = acc.account(DELTA)
    assert name == "pld" and acc.accountant_name(DELTA) == "pld" and acc.epsilon(DELTA) == eps
    # The Gaussian answers enter as one exact Gaussian of μ = √Σμ²; the library composes four
    # discretised ones. Both are pessimistic PLD estimates of the same ε.
    assert eps == pytest.approx(_library_epsilon(neighbour), rel=1e-4)
    # Dropping the Gaussian answers (or misreading their μ) would be far off.
    sampled_only = OwnerAccountant(neighbour, sampled=tuple(ROWS)).epsilon(DELTA)
    assert eps > sampled_only + 0.5


def test_composition_order_does_not_change_epsilon():
    # Dyadic μ keep Σμ² exact in any order, so the two accountants are equal, not just close.
    mus = [0.5, 0.25, 0.125]
    one = OwnerAccountant("replace_one").compose_subsampled(ROWS).compose_gaussian(mus)
    nothing = SubsampledGaussian(0.3, 1.0, 0)
    two = (
        OwnerAccountant("replace_one")
        .compose_gaussian(mus[2])
        .compose_subsampled(ROWS[1])
        .compose_gaussian(mus[:2])
        .compose_subsampled([ROWS[0], nothing])
    )
    assert one == two and hash(one) == hash(two)
    assert one.sampled == tuple(ROWS)  # sorted by (q, σ, count); count-0 rows dropped
    assert one.gaussian == GaussianSpend(3, 0.328125, 0.5)
    assert one.epsilon(DELTA) == two.epsilon(DELTA) > 0


def test_agrees_with_the_functional_entry_points():
    spend = GaussianSpend().add(MUS)
    acc = OwnerAccountant("replace_one", spend, tuple(ROWS))
    assert owner_epsilon(spend, ROWS[::-1], DELTA, "replace_one") == acc.account(DELTA)
    assert acc == _mixed("replace_one")
    # Gaussian answers only: the exact GDP figure.
    gdp = OwnerAccountant("add_remove").compose_gaussian(MUS)
    assert gdp.account(DELTA) == (spend.epsilon(DELTA), "gdp")
    assert owner_epsilon(spend, [], DELTA, "add_remove") == gdp.account(DELTA)
    assert OwnerAccountant("add_remove").account(DELTA) == (0.0, "gdp")


def test_hostile_plan_is_bounded_by_rdp():
    acc = OwnerAccountant("replace_one").compose_subsampled(SubsampledGaussian(0.5, 0.3, 10**6))
    eps, name = acc.account(DELTA)
    assert name == "rdp" and eps > PLD_EPSILON_LIMIT


def test_max_gaussian_mu_squared_fits_and_is_tight():
    budget, tol = 3.0, 1e-2
    rows = [SubsampledGaussian(0.05, 2.0, 100)]
    acc = OwnerAccountant("add_remove", sampled=tuple(rows))
    upper = mu_for_epsilon(budget, DELTA)
    m2 = acc.max_gaussian_mu_squared(budget, DELTA, tol)
    assert 0 < m2 < upper**2
    mu = math.sqrt(m2)
    assert acc.compose_gaussian(mu).epsilon(DELTA) <= budget
    assert acc.compose_gaussian(mu + tol * upper).epsilon(DELTA) > budget
    # a total over all Gaussian answers: answers composed so far do not change it
    assert acc.compose_gaussian([0.1, 0.2]).max_gaussian_mu_squared(budget, DELTA, tol) == m2
    assert max_gdp_mu_squared(budget, DELTA, "add_remove", rows, tol) == m2
    # no subsampled answers: analytic; subsampled answers alone over the budget: nothing left
    assert OwnerAccountant("add_remove").max_gaussian_mu_squared(budget, DELTA) == upper**2
    assert acc.max_gaussian_mu_squared(0.05, DELTA) == 0.0


def test_accountant_is_immutable():
    acc = OwnerAccountant("replace_one")
    more = acc.compose_gaussian(np.array([[0.1, 0.2]]))
    assert acc.gaussian == GaussianSpend() and more.gaussian.answers == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        acc.neighbour = "add_remove"  # type: ignore[misc]


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: OwnerAccountant("swap"), "neighbour"),
        (lambda: OwnerAccountant("replace_one", gaussian=0.3), "gaussian"),  # type: ignore
        (lambda: OwnerAccountant("replace_one").compose_subsampled([(0.1, 1.0, 3)]), "events"),
        (lambda: OwnerAccountant("replace_one").compose_gaussian(-0.1), "mus"),
        (lambda: OwnerAccountant("replace_one").epsilon(0.0), "delta"),
        (lambda: NOTHING.max_gaussian_mu_squared(-1.0, DELTA), "budget_epsilon"),
        (lambda: NOTHING.max_gaussian_mu_squared(1.0, 1.5), "delta"),
        (lambda: NOTHING.max_gaussian_mu_squared(1.0, DELTA, 0.0), "tolerance"),
        (lambda: NOTHING.max_gaussian_mu_squared(1.0, DELTA, 2.0), "tolerance"),
        (lambda: owner_epsilon(GaussianSpend(), ROWS, DELTA, "replace"), "neighbour"),
    ],
)
def test_bad_arguments_raise(call, name):
    with pytest.raises(ValueError, match=name):
        call()
