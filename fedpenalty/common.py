"""Types every layer shares: query kinds, an owner's policy, its public description and its
privacy reports. This module imports only leaves (errors, models, privacy) and the shared field
types (schema), so owners, transports, kernels, config and the CLI may all import it
(docs/design.md §4).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from .privacy import GaussianSpend
from .privacy.owner_epsilon import owner_epsilon
from .privacy.subsampled import SubsampledGaussian
from .schema import Neighbour, PositiveFloat, PositiveInt, Probability, Rate, check_fields

#: The kinds of query an owner answers (a session is opened for one of them): noisy
#: log-likelihood ratios (penalty MH), noisy sufficient-statistic copies (exponential-family
#: penalty MH), and clipped, Poisson-subsampled, noised gradients (SGLD, SGHMC, SGNHT).
LOG_RATIO = "penalty"
SUFF_STATS = "penalty_expfam"
SGMCMC = "sgmcmc"
QUERY_KINDS = (LOG_RATIO, SUFF_STATS, SGMCMC)


@dataclass(frozen=True)
class Policy:
    """Owner policy (``[privacy]`` of OWNER.toml); every field is checked on construction
    (``ConfigError`` naming ``privacy.<field>``).

    sigma: noise sd of one answer — of the log-likelihood-ratio sum (``penalty``) or of each
        component of the sufficient-statistic sum (``penalty_expfam``); for gradient answers
        (``sgmcmc``) the noise *multiplier*: noise sd σ·clip on each coordinate.
    max_step: the largest ‖θ' − θ‖₂ the owner answers for (bounds each answer's sensitivity).
    budget_epsilon, delta: the owner refuses any answer that would take its cumulative
        ε(δ) past ``budget_epsilon``.
    neighbour: ``replace_one`` or ``add_remove``; sets the sensitivities.
    max_answers_per_request: refuse larger requests outright (chains × block).
    max_sampling_rate, max_clip: the largest Poisson sampling rate q and per-record gradient
        clip norm the owner accepts for gradient answers.
    """

    sigma: PositiveFloat = 1.0
    max_step: PositiveFloat = 0.05
    budget_epsilon: PositiveFloat = 10.0
    delta: Probability = 1e-5
    neighbour: Neighbour = "replace_one"
    max_answers_per_request: PositiveInt = 1_000_000
    max_sampling_rate: Rate = 1.0
    max_clip: PositiveFloat = 10.0

    def __post_init__(self) -> None:
        check_fields(self, "privacy")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class OwnerDescription:
    """What an owner tells anyone who asks: public facts only."""

    name: str
    model: str
    model_params: dict[str, Any]
    dim: int
    n: int
    policy: Policy


@dataclass(frozen=True)
class SpendReport:
    """A spend in the units people read: answers (all kinds), μ of the Gaussian answers, ε at the
    owner's δ of everything (``accountant`` "gdp": exact; "pld": dp-accounting, once gradient
    answers are included) and the penalty paper's bound (inf when it does not apply)."""

    answers: int
    mu: float
    epsilon: float
    epsilon_paper_bound: float
    accountant: str = "gdp"

    @staticmethod
    def of(
        spend: GaussianSpend, sampled: list[SubsampledGaussian], delta: float, neighbour: Neighbour
    ) -> SpendReport:
        epsilon, accountant = owner_epsilon(spend, sampled, delta, neighbour)
        paper = spend.epsilon_paper_bound(delta) if accountant == "gdp" else math.inf
        return SpendReport(
            spend.answers + sum(e.count for e in sampled), spend.mu, epsilon, paper, accountant
        )


@dataclass(frozen=True)
class PrivacyReport:
    """An owner's privacy report: ``session`` for one session (None when not asked), ``total``
    across every session the ledger has seen."""

    owner: str
    n: int
    delta: float
    budget_epsilon: float
    neighbour: Neighbour
    total: SpendReport
    session: SpendReport | None = None

    @property
    def budget_left(self) -> float:
        return max(self.budget_epsilon - self.total.epsilon, 0.0)
