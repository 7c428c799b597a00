"""Noisy per-record-clipped log-likelihood ratios (penalty MH and DP-HMC without a Lipschitz
bound, docs/design.md §2.8): one number per owner and key, Σ_x clip(ℓ(x,θ') − ℓ(x,θ), ±c) plus
N(0, (σ·c)²), for a clip c the query names (``clip``, nats) — or, asked with
``clip_per_distance`` c (nats per unit of θ), the difference quotient
Σ_x clip((ℓ(x,θ') − ℓ(x,θ))/‖θ' − θ‖, ±c) plus N(0, (σ·c)²), which the asker multiplies by
‖θ' − θ‖: each chain's bound is then c·‖θ' − θ‖ and its noise sd σ·c·‖θ' − θ‖ (docs/design.md
§2.9). Either way one record moves the answer by at most 2c (replace_one) or c (add_remove)
whatever the step, so one answer is a Gaussian event of μ = 2/σ or 1/σ."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import InvalidRequest
from ..models import Model
from .log_ratio import GaussianKind

if TYPE_CHECKING:
    from ..owner.node import OwnerNode
    from ..owner.pipeline import KindPath


class ClippedLogRatio(GaussianKind):
    """``clipped_log_ratio`` (ledger ``penalty_clipped``). Its noise level
    (``Policy.noise_for``) is a noise *multiplier*: the noise sd of one owner's clipped sum is
    σ·clip (nats). Needs no Lipschitz bound from the model and no max_step."""

    name = "clipped_log_ratio"
    ledger_name = "penalty_clipped"
    sigma_meaning = "noise multiplier: the noise sd of the clipped log-ratio sum is sigma × clip"
    noise_key = "ratio_noise_multiplier"
    report_sigma_key = "noise_multiplier"
    clip_scaled = True
    arrays = ("theta", "theta_prop", "clip")
    #: the arrays of a query clipped per unit distance (``clip_per_distance`` for ``clip``)
    per_distance_arrays = ("theta", "theta_prop", "clip_per_distance")
    spend_keys = ("sampler.chains", "sampler.warmup", "sampler.iterations", "privacy.sigma")

    def check_arrays(self, arrays: Mapping[str, Any]) -> None:
        """``InvalidRequest`` unless ``arrays`` are named exactly ``arrays`` or exactly
        ``per_distance_arrays``."""
        if set(arrays) not in (set(self.arrays), set(self.per_distance_arrays)):
            given = ", ".join(sorted(arrays)) or "nothing"
            raise InvalidRequest(
                f"a {self.name} query carries {', '.join(self.arrays)} or "
                f"{', '.join(self.per_distance_arrays)}, not {given}"
            )

    def reply_scale(self, arrays: Mapping[str, Any]) -> float:
        """The clip (``clip`` or ``clip_per_distance``): the noise sd of an answer is σ·clip."""
        return arrays["clip_per_distance" if "clip_per_distance" in arrays else "clip"]

    def answer_path(self, nodes: Sequence[OwnerNode]) -> KindPath:
        """``owner.compute.clipped_log_ratio.ClippedLogRatioPath``."""
        from ..owner.compute.clipped_log_ratio import ClippedLogRatioPath

        return ClippedLogRatioPath(self, nodes)

    def width(self, model: Model) -> int:
        return 1

    def sensitivity(self, model: Model, neighbour: str, step: float) -> float:
        """Per unit clip, whatever the step: 2 (replace_one) or 1 (add_remove)."""
        return 2.0 if neighbour == "replace_one" else 1.0
