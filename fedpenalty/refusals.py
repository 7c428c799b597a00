"""What to change when an owner refuses a run (docs/design.md §5): the owner's refusal says
that a plan does not fit its budget; this says by how much and which keys would make it fit.

Every figure comes from the accountants the owners use (``privacy.owner_epsilon``): the plan's
worst case is every answer at the largest sensitivity the owner's policy allows, as the owner
checks it at session open (docs/design.md §2.5).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .common import Policy
from .config import Scenario
from .errors import BudgetExhausted, FedPenaltyError
from .kinds import GaussianKind, KindTerms, QueryKind, query_kind
from .kinds.laplace_stats import LaplaceStats
from .models import Model
from .owner.noise.lattice import lattice_gradient_multiplier
from .privacy import GaussianSpend
from .privacy.events import EpsilonDelta, SelfComposed
from .privacy.owner_epsilon import Row, max_gdp_mu_squared, owner_epsilon
from .privacy.subsampled import SubsampledGaussian, calibrate_noise_multiplier, max_steps
from .privacy.subsampled import epsilon as sampled_epsilon


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
    spent_epsilon: float = 0.0,
) -> PlanNeeds:
    """The needs of ``answers`` answers of kind ``query`` for an owner with ``policy`` that has
    spent ``spent_epsilon`` at its δ before (its budget less the ``epsilon_left`` of its
    refusal), in a session that declares ``session`` (``sampling_rate``, ``max_step``);
    ``lattice``: a deployed owner (exact lattice answers, Rényi-DP accounting).

    The earlier spend is taken as Gaussian answers of the total μ whose ε is
    ``spent_epsilon`` (``_spent``): exact for an owner whose earlier answers were all Gaussian
    (log-likelihood ratios, statistic copies), a stand-in of equal ε at δ otherwise."""
    kind = query_kind(query)
    if isinstance(kind, LaplaceStats):
        return _pure_needs(kind, model, policy, answers, spent_epsilon)
    before = _spent(spent_epsilon, policy, lattice)
    if not isinstance(kind, GaussianKind):
        return _gradient_needs(
            kind, model, policy, answers, session["sampling_rate"], lattice, before
        )
    return _gaussian_needs(kind, model, policy, answers, session.get("max_step"), lattice, before)


def plan_needs_kinds(
    terms: Sequence[KindTerms],
    model: Model,
    policy: Policy,
    lattice: bool,
    spent_epsilon: float,
    total_noise_sd: float | None = None,
) -> PlanNeeds:
    """The needs of a plan of several kinds (``terms``, one per kind, as the session opens
    them), composed as the owner composes them: each kind's answers at its worst-case μ at its
    own level (``Policy.noise_for``), or with secure aggregation at ``total_noise_sd`` s for
    every kind (lattice answers, docs/design.md §2.6). When every kind is Gaussian,
    ``max_answers`` is the most answers of the plan, scaled down in proportion, that fit, and
    ``sigma`` the factor every kind's level (s) must grow by; else both None."""
    lattice = lattice or total_noise_sd is not None
    before = _spent(spent_epsilon, policy, lattice)
    spend, sampled = before, list[Row]()
    for term in terms:
        kind = query_kind(term.kind)
        level = policy.noise_for(kind.ledger_name) if total_noise_sd is None else total_noise_sd
        if isinstance(kind, LaplaceStats):  # pure ε: its own event
            pure = EpsilonDelta(kind.release_epsilon(model, policy), 0.0)
            sampled.append(SelfComposed(pure, term.planned_answers))
            continue
        if not isinstance(kind, GaussianKind):
            width = kind.width(model)
            multiplier = lattice_gradient_multiplier(level, width) if lattice else level
            rate = term.sampling_rate if term.sampling_rate is not None else 1.0
            sampled.append(SubsampledGaussian(rate, multiplier, term.planned_answers))
            continue
        mu = kind.worst_sensitivity(model, policy, term.max_step) / level
        answers = term.planned_answers
        spend = GaussianSpend(
            spend.answers + answers, spend.mu_squared + answers * mu * mu, max(spend.max_mu, mu)
        )
    total = sum(t.planned_answers for t in terms)
    need, _ = owner_epsilon(spend, sampled, policy.delta, policy.neighbour, lattice)
    if sampled:
        return PlanNeeds(total, need, None, None, None)
    budget, delta, neighbour = policy.budget_epsilon, policy.delta, policy.neighbour
    left = max_gdp_mu_squared(budget, delta, neighbour, [], lattice=lattice) - before.mu_squared
    planned = spend.mu_squared - before.mu_squared
    if left <= 0:
        return PlanNeeds(total, need, 0, math.inf, None)
    fraction = min(1.0, left / planned) if planned > 0 else 1.0
    return PlanNeeds(total, need, int(total * fraction), 1 / math.sqrt(fraction), None)


def kinds_refusal(
    exc: BudgetExhausted,
    needs: PlanNeeds,
    terms: Sequence[KindTerms],
    policy: Policy,
    deployed: bool,
    secure: bool = False,
) -> PlanRefused:
    """The one-line error for an owner's refusal of a plan of several kinds
    (``plan_needs_kinds``): the ε it needs, the budget, and what would make it fit
    (``secure``: the noise level is privacy.total_noise_sd, every kind's)."""
    owner = exc.owner or "an owner"
    plan = ", ".join(f"{t.planned_answers} {query_kind(t.kind).ledger_name}" for t in terms)
    head = (
        f"owner {owner!r} refused the run at session open: its plan of {needs.answers} answers "
        f"({plan}) needs ε = {_up(needs.epsilon)} at δ = {policy.delta:g} in the worst case its "
        f"policy allows, past its budget ε = {policy.budget_epsilon:g}"
    )
    keys = ", ".join(query_kind(t.kind).noise_key for t in terms)
    where = "its OWNER.toml's [privacy]" if deployed else "privacy.sigma or [privacy.noise]"
    if secure:  # one s for every kind, in the scenario and every owner's policy
        keys, where = "privacy.total_noise_sd", "the scenario and every owner's policy"
    budget = "the owner's budget_epsilon in OWNER.toml" if deployed else "privacy.budget_epsilon"
    options = [f"{budget} ≥ {_up(needs.epsilon)}"]
    if needs.max_answers is None or needs.sigma is None:
        options.append("fewer sampler.warmup + sampler.iterations or sampler.chains")
        options.append(f"larger noise levels ({keys} in {where})")
    elif math.isfinite(needs.sigma):
        options.append(
            f"fewer answers: at most {needs.max_answers} per owner in all (sampler.warmup + "
            "sampler.iterations, or sampler.chains, in proportion)"
        )
        options.append(
            f"every kind's noise level × {_up(needs.sigma)} ({keys} in {where}; noisier answers "
            "mix slower)"
        )
    return PlanRefused(f"{head}. To run, change one of: {'; '.join(options)}")


def _gaussian_needs(
    kind: GaussianKind,
    model: Model,
    policy: Policy,
    answers: int,
    max_step: float | None,
    lattice: bool,
    before: GaussianSpend,
) -> PlanNeeds:
    """``plan_needs`` of Gaussian answers of ``kind`` after the Gaussian spend ``before``, each
    at the kind's worst-case sensitivity (at ``max_step``, never below the owner's
    charged_step: ``QueryKind.worst_sensitivity``, as the owner admits it)."""
    budget, delta, neighbour = policy.budget_epsilon, policy.delta, policy.neighbour
    step = kind.worst_step(policy, max_step)
    sigma = policy.noise_for(kind.ledger_name)
    mu = kind.worst_sensitivity(model, policy, max_step) / sigma
    spend = GaussianSpend(
        before.answers + answers, before.mu_squared + answers * mu * mu, max(before.max_mu, mu)
    )
    need, _ = owner_epsilon(spend, [], delta, neighbour, lattice)
    left = max_gdp_mu_squared(budget, delta, neighbour, [], lattice=lattice) - before.mu_squared
    if left <= 0:  # nothing fits but a larger budget
        return PlanNeeds(answers, need, 0, math.inf, None)
    scale = math.sqrt(left / (answers * mu * mu)) if answers else math.inf
    return PlanNeeds(
        answers,
        need,
        int(left / (mu * mu)),
        sigma / scale,
        step * scale if kind.step_scaled else None,
    )


def _pure_needs(
    kind: LaplaceStats, model: Model, policy: Policy, answers: int, spent_epsilon: float
) -> PlanNeeds:
    """``plan_needs`` of pure-ε releases (the Laplace statistics), which add their ε to the
    ``spent_epsilon`` before (basic composition, as the owner's accountant): the releases and
    the least scale (``QueryKind.budget_level``) that fit what is left."""
    each = kind.release_epsilon(model, policy)
    need = spent_epsilon + answers * each
    left = policy.budget_epsilon - spent_epsilon
    if left <= 0:
        return PlanNeeds(answers, need, 0, math.inf, None)
    least = kind.budget_level(model, policy.neighbour, left / max(answers, 1))
    return PlanNeeds(answers, need, math.floor(left / each), least, None)


def _spent(epsilon: float, policy: Policy, lattice: bool) -> GaussianSpend:
    """Gaussian answers whose ε at the policy's δ is ``epsilon``: μ² by the owner's own
    accountant (exact GDP, or RDP for lattice answers), so composing them with a plan gives
    the ε the owner checks."""
    if epsilon <= 0:
        return GaussianSpend()
    mu2 = max_gdp_mu_squared(epsilon, policy.delta, policy.neighbour, [], lattice=lattice)
    return GaussianSpend(1, mu2, math.sqrt(mu2))


def _gradient_needs(
    kind: QueryKind,
    model: Model,
    policy: Policy,
    answers: int,
    rate: float,
    lattice: bool,
    before: GaussianSpend,
) -> PlanNeeds:
    """``plan_needs`` of subsampled answers of ``kind`` (gradients, sampled log ratios) after
    the Gaussian spend ``before``, at the kind's own noise level. Simulated owners
    account them by the smaller of dp-accounting's PLD and RDP figures, so the answer count and
    noise multiplier found here (PLD for an owner that has spent nothing, RDP after earlier
    spend) fit (never overstated); deployed owners' lattice bounds are not inverted here
    (None)."""
    budget, delta, neighbour = policy.budget_epsilon, policy.delta, policy.neighbour
    level = policy.noise_for(kind.ledger_name)
    sigma = lattice_gradient_multiplier(level, kind.width(model)) if lattice else level
    event = SubsampledGaussian(rate, sigma, answers)
    need, _ = owner_epsilon(before, [event], delta, neighbour, lattice)
    if lattice:
        return PlanNeeds(answers, need, None, None, None)
    if before.answers == 0:
        fit = max_steps(sigma, rate, budget, delta, neighbour=neighbour)
        least = calibrate_noise_multiplier(
            budget, delta, rate, max(answers, 1), neighbour=neighbour
        )
        return PlanNeeds(answers, need, fit, least, None)

    # the earlier Gaussian answers as the accountant composes them with gradient answers; RDP
    # alone, an upper bound on the owner's figure (the smaller of PLD and RDP), so what fits
    # here fits the owner's check, at a few accountant calls per candidate
    factor = 2.0 if neighbour == "replace_one" else 1.0
    earlier = SubsampledGaussian(1.0, factor / before.mu, 1)

    def fits(count: int, multiplier: float) -> bool:
        events = [earlier, SubsampledGaussian(rate, multiplier, count)]
        return sampled_epsilon(events, delta, neighbour=neighbour, accountant="rdp") <= budget

    if not fits(0, sigma):
        return PlanNeeds(answers, need, 0, math.inf, None)
    fit = _largest(lambda count: fits(count, sigma), answers)
    least = _smallest(lambda multiplier: fits(max(answers, 1), multiplier), sigma)
    return PlanNeeds(answers, need, fit, least, None)


def _largest(fits: Callable[[int], bool], above: int) -> int:
    """The largest count in [0, ``above``) that ``fits`` (monotone; ``fits(0)``), by bisection."""
    low, high = 0, above
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def _smallest(fits: Callable[[float], bool], above: float, rtol: float = 1e-3) -> float:
    """A noise multiplier that ``fits`` (monotone in it), within ``rtol`` of the smallest one,
    above ``above`` (which does not fit): doubling, then bisection in log space."""
    low, high = above, 2 * above
    while not fits(high):
        low, high = high, 2 * high
    while high > low * (1 + rtol):
        mid = math.sqrt(low * high)
        low, high = (low, mid) if fits(mid) else (mid, high)
    return high


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
    causes: str = "",
    per_iteration: int = 1,
) -> PlanRefused:
    """The one-line error for an owner's refusal of the plan: the ε it needs, the budget, the
    ``causes`` (``plan_causes``), and the keys that would make it fit with what the owner has
    left (scenario keys, or the owner's OWNER.toml for deployed owners, whose policy the
    coordinator cannot change)."""
    owner = exc.owner or "an owner"
    spent = exc.epsilon_left < policy.budget_epsilon * (1 - 1e-9)
    head = (
        f"owner {owner!r} refused the run at session open: its plan of {needs.answers} "
        f"{query} answers needs ε = {_up(needs.epsilon)} at δ = {policy.delta:g} in the worst "
        f"case its policy allows, past its budget ε = {policy.budget_epsilon:g}"
        + (f" ({exc.epsilon_left:.3g} left: it has spent before)" if spent else "")
        + (f". The plan's spend comes from {causes}" if causes else "")
    )
    budget_key = (
        "the owner's budget_epsilon in the [privacy] table of its OWNER.toml"
        if deployed
        else "privacy.budget_epsilon"
    )
    kind = query_kind(query)
    sigma_key = (
        f"the owner's [privacy] {kind.noise_key} (or sigma) in OWNER.toml"
        if deployed
        else kind.scenario_noise_key
    ) + (" (noise multiplier)" if not isinstance(kind, (GaussianKind, LaplaceStats)) else "")
    options = [f"{budget_key} ≥ {_up(needs.epsilon)}"]
    if needs.max_answers is None:
        options.append(
            "fewer answers per owner: sampler.warmup + sampler.iterations, or sampler.chains"
        )
    elif needs.max_answers >= max(chains, 1):
        options.append(
            f"fewer answers: at most {needs.max_answers} per owner, i.e. sampler.warmup + "
            f"sampler.iterations ≤ {needs.max_answers // max(chains * per_iteration, 1)} with "
            f"{chains} chains"
            + (f" and {per_iteration} answers per iteration " if per_iteration > 1 else " ")
            + "(or fewer sampler.chains)"
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
    note = f" (figures for the ε {exc.epsilon_left:.3g} it has left)" if spent else ""
    return PlanRefused(f"{head}. To run, change one of{note}: {'; '.join(options)}")


def spend_keys(query: str) -> tuple[str, ...]:
    """The scenario keys whose values set the worst-case spend of a plan of kind ``query``
    (docs/design.md §2.5; the kind's ``spend_keys``); ``privacy.max_step`` only when set."""
    return query_kind(query).spend_keys


def plan_causes(scenario: Scenario, query: str, policy: Policy, deployed: bool) -> str:
    """The keys that drive a plan's spend, each with its value and where the value came from,
    e.g. "sampler.step = 0.05 (the generic default in fedpenalty/config.py)"; a deployed
    owner's noise and step limit come from its OWNER.toml instead."""
    words = []
    for key in spend_keys(query):
        section, name = key.split(".")
        if deployed and section == "privacy":
            continue
        value = scenario[section][name]
        if value is not None:
            shown = f"{value:g}" if isinstance(value, (int, float)) else str(value)
            words.append(f"{key} = {shown} ({scenario.origin(key)})")
    if deployed:
        kind = query_kind(query)
        level = policy.noise_for(kind.ledger_name)
        words.append(f"the owner's {kind.noise_key} = {level:g} (its OWNER.toml)")
    return ", ".join(words)


def policy_refusal(cause: Exception) -> str:
    """The message for a request an owner's policy refuses (a step above its max_step, a
    sampling rate or clip above its limits, ...): resuming would repeat the same request, so
    say what to change instead."""
    return (
        f"{cause}. The owner's policy refuses this request, so resuming would only repeat the "
        "refusal: change the scenario to fit its policy (sampler.step ≤ its max_step, "
        "sampler.sampling_rate ≤ its max_sampling_rate, sampler.clip and sampler.ratio_clip "
        "within its min_clip and max_clip) and start a new run"
    )
