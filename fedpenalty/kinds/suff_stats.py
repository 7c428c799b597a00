"""Noisy copies of an owner's sufficient-statistic sum Σ S(x) (exponential-family penalty MH,
docs/design.md §2.2): ``stat_dim`` numbers per owner and key, each plus N(0, σ²)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InvalidRequest
from ..models import ExpFamModel, Model
from .log_ratio import GaussianKind

if TYPE_CHECKING:
    from ..owner.node import OwnerNode
    from ..owner.pipeline import KindPath


class SuffStats(GaussianKind):
    """``suff_stats`` (ledger ``penalty_expfam``). Its noise level (``Policy.noise_for``) is
    the sd of the noise on each component of the statistic sum (the statistic's units). Sensitivity
    ``ExpFamModel.stat_sensitivity``, whatever the step."""

    name = "suff_stats"
    ledger_name = "penalty_expfam"
    sigma_meaning = "sd of each component of the noisy sufficient-statistic sum"
    noise_key = "stat_sd"
    arrays = ("block",)
    spend_keys = (
        "sampler.chains",
        "sampler.warmup",
        "sampler.iterations",
        "sampler.block",
        "privacy.sigma",
    )

    def check_model(self, model: Model, public_n: int | None, owner: str) -> None:
        """Only exponential-family models have statistics, and answering from them needs the
        record count n, which an owner keeps private under add_remove neighbours."""
        if not isinstance(model, ExpFamModel):
            raise InvalidRequest(f"model {model.name!r} has no sufficient statistics", owner)
        if public_n is None:
            raise InvalidRequest(
                "penalty_expfam needs each owner's record count n, which this owner keeps "
                "private under add_remove neighbours; use the penalty algorithm",
                owner,
            )

    def answer_path(self, nodes: Sequence[OwnerNode]) -> KindPath:
        """``owner.compute.suff_stats.SuffStatsPath``."""
        from ..owner.compute.suff_stats import SuffStatsPath

        return SuffStatsPath(self, nodes)

    def width(self, model: Model) -> int:
        """``stat_dim`` (1 for a model without statistics, whose sessions are refused)."""
        return model.stat_dim if isinstance(model, ExpFamModel) else 1

    def keys_per_chain(self, arrays: Mapping[str, Any]) -> int:
        """``block`` copies per chain (1 for a block that is no integer, which is refused)."""
        block = arrays["block"]
        integer = isinstance(block, (int, np.integer)) and not isinstance(block, bool)
        return int(block) if integer else 1

    def sensitivity(self, model: Model, neighbour: str, step: float) -> float:
        if not isinstance(model, ExpFamModel):
            raise InvalidRequest(f"model {model.name!r} has no sufficient statistics")
        return model.stat_sensitivity(neighbour)  # type: ignore[arg-type]
