"""An owner's privacy policy: what it adds as noise and what it is willing to answer."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import ConfigError
from ..models.base import NEIGHBOURS

#: What an owner answers: log-likelihood ratios (penalty MH) or sufficient-statistic copies.
LOG_RATIO = "penalty"
SUFF_STATS = "penalty_expfam"
SGMCMC = "sgmcmc"  # clipped, Poisson-subsampled, noised gradients (SGLD, SGHMC, SGNHT)
ALGORITHMS = (LOG_RATIO, SUFF_STATS, SGMCMC)


@dataclass(frozen=True)
class Policy:
    """Owner policy.

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

    sigma: float = 1.0
    max_step: float = 0.05
    budget_epsilon: float = 10.0
    delta: float = 1e-5
    neighbour: str = "replace_one"
    max_answers_per_request: int = 1_000_000
    max_sampling_rate: float = 1.0
    max_clip: float = 10.0

    def __post_init__(self) -> None:
        for key in ("sigma", "max_step", "budget_epsilon", "max_clip"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"privacy.{key} must be a positive finite number, got {value!r}")
        if isinstance(self.delta, bool) or not isinstance(self.delta, (int, float)) or not 0 < self.delta < 1:
            raise ConfigError(f"privacy.delta must be a number in (0, 1), got {self.delta!r}")
        if isinstance(self.max_sampling_rate, bool) or not isinstance(self.max_sampling_rate, (int, float)) or \
                not 0 < self.max_sampling_rate <= 1:
            raise ConfigError(f"privacy.max_sampling_rate must be a number in (0, 1], got {self.max_sampling_rate!r}")
        if self.neighbour not in NEIGHBOURS:
            raise ConfigError(f"privacy.neighbour must be one of {', '.join(NEIGHBOURS)}, got {self.neighbour!r}")
        if not isinstance(self.max_answers_per_request, int) or self.max_answers_per_request < 1:
            raise ConfigError(
                f"privacy.max_answers_per_request must be a positive integer, got {self.max_answers_per_request!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
