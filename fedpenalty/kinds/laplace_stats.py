"""The owners' one Laplace release of their sufficient-statistic sums (private Gibbs,
docs/design.md §2.10, "The Laplace release"): ``stat_dim`` numbers per owner, the exact sum
Σ S(x) of its clipped records rounded to its lattice γℤ plus exact discrete Laplace noise of
scale b (its ``laplace_scale``), released ONCE. Each release is pure ε = (Δ₁ + γw)/b′ — one
pure-ε event in the owner's ledger, composed with its Gaussian spend by its accountant."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import InvalidRequest
from ..models import ExpFamModel, Model
from ..privacy.events import EpsilonDelta, SelfComposed
from .base import Event, OwnerCosts, QueryKind

if TYPE_CHECKING:
    from ..common import Policy, SecureTerms
    from ..owner.node import OwnerNode
    from ..owner.pipeline import KindPath

_PURE = (
    "one release of the statistic sum rounded to the owner's lattice plus exact discrete "
    "Laplace noise: pure epsilon = (L1 sensitivity + lattice step x width) / scale per release, "
    "composed with the owner's other answers by adding it (basic composition); ledger_epsilon: "
    "the owner's spend across all its sessions, as its ledger reports it"
)


class LaplaceStats(QueryKind):
    """``laplace_stats`` (ledger ``laplace_stats``). Its noise level (``Policy.noise_for``) is
    the Laplace scale b of each component of the released statistic sum (the statistic's
    units). Sensitivity: the L1 sensitivity Δ₁ of Σ S(x) (``ExpFamModel.stat_l1_sensitivity``),
    whatever the step; one answer costs the pure ε of ``release_epsilon``."""

    name = "laplace_stats"
    ledger_name = "laplace_stats"
    sigma_meaning = "Laplace scale b of each component of the released sufficient-statistic sum"
    noise_key = "laplace_scale"
    report_basis = _PURE
    report_sigma_key = "laplace_scale"
    scenario_noise_key = "[privacy.noise] laplace_scale"
    simulated_noise = "exact discrete Laplace noise on the owner's lattice"
    arrays = ()
    #: private_gibbs asks it once per run (``ChainAlgorithm.once``): sampler.chains adds no spend
    spend_keys = ("privacy.budget_epsilon",)

    def check_model(self, model: Model, public_n: int | None, owner: str) -> None:
        """Only exponential-family models have statistics, and releasing them needs the record
        count n public (replace-one neighbours), as ``suff_stats``."""
        if not isinstance(model, ExpFamModel):
            raise InvalidRequest(f"model {model.name!r} has no sufficient statistics", owner)
        if public_n is None:
            raise InvalidRequest(
                "laplace_stats needs each owner's record count n, which this owner keeps "
                "private under add_remove neighbours",
                owner,
            )

    def answer_path(self, nodes: Sequence[OwnerNode]) -> KindPath:
        """``owner.compute.laplace_stats.LaplaceStatsPath``."""
        from ..owner.compute.laplace_stats import LaplaceStatsPath

        return LaplaceStatsPath(self, nodes)

    def width(self, model: Model) -> int:
        """``stat_dim`` (1 for a model without statistics, whose sessions are refused)."""
        return model.stat_dim if isinstance(model, ExpFamModel) else 1

    def reply_scale(self, arrays: Mapping[str, Any]) -> float:
        """√2: the sd of Laplace noise of scale b is √2·b."""
        return math.sqrt(2.0)

    def sensitivity(self, model: Model, neighbour: str, step: float) -> float:
        """The L1 sensitivity Δ₁ of Σ S(x) (the Laplace release's), whatever ``step``."""
        if not isinstance(model, ExpFamModel):
            raise InvalidRequest(f"model {model.name!r} has no sufficient statistics")
        return model.stat_l1_sensitivity(neighbour)  # type: ignore[arg-type]

    def release_epsilon(self, model: Model, policy: Policy) -> float:
        """Pure ε (nats) of one release by an owner of ``model`` under ``policy``: (Δ₁ + γw)/b′
        at its scale b = its level and its lattice step γ (``noise.laplace``)."""
        from ..owner.noise.laplace import owner_release_epsilon

        l1 = self.sensitivity(model, policy.neighbour, 1.0)
        return owner_release_epsilon(l1, policy.noise_for(self.ledger_name), self.width(model))

    def budget_level(self, model: Model, neighbour: str, epsilon: float) -> float | None:
        """The Laplace scale b whose one release costs at most ``epsilon`` (rounding term
        included; ``noise.laplace.calibrated_scale``)."""
        from ..owner.noise.laplace import calibrated_scale

        return calibrated_scale(self.sensitivity(model, neighbour, 1.0), self.width(model), epsilon)

    def answer_unit(
        self, owner: OwnerCosts, max_step: float | None, secure: SecureTerms | None
    ) -> float:
        """The pure ε of one release (``release_epsilon``); no secure session releases it."""
        if secure is not None:
            raise InvalidRequest("laplace_stats is never released in a secure session")
        return self.release_epsilon(owner.model, owner.policy)

    def event(self, answers: int, unit: float, sampling_rate: float | None) -> Event:
        """``answers`` pure-ε releases of ε = ``unit`` each."""
        return SelfComposed(EpsilonDelta(unit, 0.0), answers)
