"""Noisy per-record-clipped log-likelihood ratios (penalty MH and DP-HMC without a Lipschitz
bound, docs/design.md §2.8): one number per owner and key, Σ_x clip(ℓ(x,θ') − ℓ(x,θ), ±c) plus
N(0, (σ·c)²), for a clip c the query names. One record moves the sum by at most 2c
(replace_one) or c (add_remove) whatever the step, so one answer is a Gaussian event of
μ = 2/σ or 1/σ."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

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
    spend_keys = ("sampler.chains", "sampler.warmup", "sampler.iterations", "privacy.sigma")

    def reply_scale(self, arrays: Mapping[str, Any]) -> float:
        """The clip: the noise sd of an answer is σ·clip."""
        return arrays["clip"]

    def answer_path(self, nodes: Sequence[OwnerNode]) -> KindPath:
        """``owner.compute.clipped_log_ratio.ClippedLogRatioPath``."""
        from ..owner.compute.clipped_log_ratio import ClippedLogRatioPath

        return ClippedLogRatioPath(self, nodes)

    def width(self, model: Model) -> int:
        return 1

    def sensitivity(self, model: Model, neighbour: str, step: float) -> float:
        """Per unit clip, whatever the step: 2 (replace_one) or 1 (add_remove)."""
        return 2.0 if neighbour == "replace_one" else 1.0
