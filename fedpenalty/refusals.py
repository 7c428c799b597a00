"""What to change when an owner refuses a run (docs/design.md §5): the owner's refusal says
that a plan does not fit its budget; this says by how much and which keys would make it fit.

Every figure comes from the accountants the owners use (``privacy.owner_epsilon``): the plan's
worst case is every answer at the largest sensitivity the owner's policy allows, as the owner
checks it at session open (docs/design.md §2.5).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from .common import LOG_RATIO, SGMCMC, Policy
from .errors import BudgetExhausted, FedPenaltyError
from .models import ExpFamModel, Model
from .owner.noise import lattice_gradient_multiplier
from .privacy import GaussianSpend
from .privacy.owner_epsilon import max_gdp_mu_squared, owner_epsilon
from .privacy.subsampled import SubsampledGaussian, calibrate_noise_multiplier, max_steps


class PlanRefused(FedPenaltyError):
    """An owner refused the run's plan at session open; the message says what to change."""


@dataclass(frozen=True)
class PlanNeeds:
    """What a plan of ``answers`` answers per owner needs against one owner's policy:
    ``epsilon`` at the policy's δ, and what would fit the budget — ``max_answers``, ``sigma``
    (the smallest noise) and ``max_step`` (penalty only: the largest step); None where not
    computed."""

    answers: int
    epsilon: float
    max_answers: int | None
    sigma: float | None
    max_step: float | None


def plan_needs(
    query: str,
    model: Model,
    policy: Policy,
    answers: int,
    session: Mapping[str, float],
    lattice: bool,
) -> PlanNeeds:
    """The needs of ``answers`` answers of kind ``query`` for an owner with ``policy`` that has
    spent nothing yet, in a session that declares ``session`` (``sampling_rate``,
    ``max_step``); ``lattice``: a deployed owner (exact lattice answers, Rényi-DP accounting)."""
    budget, delta, neighbour = policy.budget_epsilon, policy.delta, policy.neighbour
    if query == SGMCMC:
        return _gradient_needs(model, policy, answers, session["sampling_rate"], lattice)
    step = min(policy.max_step, session.get("max_step", policy.max_step))
    if query == LOG_RATIO:
        sensitivity = float(model.log_ratio_sensitivity(step, neighbour))
    else:
        assert isinstance(model, ExpFamModel)
        sensitivity = model.stat_sensitivity(neighbour)
    mu = sensitivity / policy.sigma
    spend = GaussianSpend(answers, answers * mu * mu, mu)
    need, _ = owner_epsilon(spend, [], delta, neighbour, lattice)
    cap = max_gdp_mu_squared(budget, delta, neighbour, [], lattice=lattice)
    scale = math.sqrt(cap / (answers * mu * mu)) if answers else math.inf
    return PlanNeeds(
        answers,
        need,
        int(cap / (mu * mu)),
        policy.sigma / scale,
        step * scale if query == LOG_RATIO else None,
    )


def _gradient_needs(
    model: Model, policy: Policy, answers: int, rate: float, lattice: bool
) -> PlanNeeds:
    """``plan_needs`` of gradient answers. Simulated owners account them by the smaller of
    dp-accounting's PLD and RDP figures, so the PLD answers count and noise multiplier fit
    (never overstated); deployed owners' lattice bounds are not inverted here (None)."""
    budget, delta, neighbour = policy.budget_epsilon, policy.delta, policy.neighbour
    sigma = lattice_gradient_multiplier(policy.sigma, model.dim) if lattice else policy.sigma
    event = SubsampledGaussian(rate, sigma, answers)
    need, _ = owner_epsilon(GaussianSpend(), [event], delta, neighbour, lattice)
    if lattice:
        return PlanNeeds(answers, need, None, None, None)
    fit = max_steps(sigma, rate, budget, delta, neighbour=neighbour)
    least = calibrate_noise_multiplier(budget, delta, rate, max(answers, 1), neighbour=neighbour)
    return PlanNeeds(answers, need, fit, least, None)


def _up(x: float) -> str:
    """``x`` rounded up to 3 significant digits (a noise that is surely enough)."""
    digits = 2 - math.floor(math.log10(abs(x)))
    return f"{math.ceil(x * 10**digits) / 10**digits:.3g}"


def _down(x: float) -> str:
    digits = 2 - math.floor(math.log10(abs(x)))
    return f"{math.floor(x * 10**digits) / 10**digits:.3g}"


def budget_refusal(
    exc: BudgetExhausted,
    needs: PlanNeeds,
    policy: Policy,
    query: str,
    chains: int,
    deployed: bool,
) -> PlanRefused:
    """The one-line error for an owner's refusal of the plan: the ε it needs, the budget, and
    the keys that would make it fit (scenario keys, or the owner's OWNER.toml for deployed
    owners, whose policy the coordinator cannot change)."""
    owner = exc.owner or "an owner"
    spent = exc.epsilon_left < policy.budget_epsilon * (1 - 1e-9)
    head = (
        f"owner {owner!r} refused the run at session open: its plan of {needs.answers} "
        f"{query} answers needs ε = {_up(needs.epsilon)} at δ = {policy.delta:g} in the worst "
        f"case its policy allows, past its budget ε = {policy.budget_epsilon:g}"
        + (f" ({exc.epsilon_left:.3g} left: it has spent before)" if spent else "")
    )
    budget_key = (
        "the owner's budget_epsilon in the [privacy] table of its OWNER.toml"
        if deployed
        else "privacy.budget_epsilon"
    )
    sigma_key = ("the owner's [privacy] sigma in OWNER.toml" if deployed else "privacy.sigma") + (
        " (noise multiplier)" if query == SGMCMC else ""
    )
    options = [f"{budget_key} ≥ {_up(needs.epsilon)}"]
    if needs.max_answers is None:
        options.append(
            "fewer answers per owner: sampler.warmup + sampler.iterations, or sampler.chains"
        )
    elif needs.max_answers >= max(chains, 1):
        options.append(
            f"fewer answers: at most {needs.max_answers} per owner, i.e. sampler.warmup + "
            f"sampler.iterations ≤ {needs.max_answers // max(chains, 1)} with {chains} chains "
            "(or fewer sampler.chains)"
        )
    elif needs.max_answers > 0:  # not one iteration of every chain: fewer chains
        options.append(
            f"fewer answers: at most {needs.max_answers} per owner, fewer than one per chain "
            f"(sampler.chains ≤ {needs.max_answers})"
        )
    if needs.sigma is None:
        options.append(f"a larger {sigma_key} (noisier answers mix slower)")
    elif math.isfinite(needs.sigma):
        options.append(f"{sigma_key} ≥ {_up(needs.sigma)} (noisier answers mix slower)")
    if needs.max_step is not None:
        step_key = "sampler.step" if deployed else "sampler.step (and privacy.max_step, if set)"
        options.append(f"{step_key} ≤ {_down(needs.max_step)} (smaller moves mix slower)")
    note = " (figures for an owner that has spent nothing yet)" if spent else ""
    return PlanRefused(f"{head}. To run, change one of{note}: {'; '.join(options)}")


def policy_refusal(cause: Exception) -> str:
    """The message for a request an owner's policy refuses (a step above its max_step, a
    sampling rate or clip above its limits, ...): resuming would repeat the same request, so
    say what to change instead."""
    return (
        f"{cause}. The owner's policy refuses this request, so resuming would only repeat the "
        "refusal: change the scenario to fit its policy (sampler.step ≤ its max_step, "
        "sampler.sampling_rate ≤ its max_sampling_rate, sampler.clip ≤ its max_clip) and start "
        "a new run"
    )
