"""Noisy per-record-clipped gradient sums over all records (DP-HMC, docs/design.md §2.8): ``d``
numbers per owner and key, each record's ∇_θ ℓ(x, θ) clipped to L2 norm c (the query's clip),
summed, plus N(0, (σ·c)² I). No subsampling: one answer is a Gaussian event of μ = 2/σ
(replace_one) or 1/σ (add_remove)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..models import Model
from .log_ratio import GaussianKind

if TYPE_CHECKING:
    from ..owner.node import OwnerNode
    from ..owner.pipeline import KindPath


class ClippedGradient(GaussianKind):
    """``clipped_gradient`` (ledger ``gradient_clipped``). Its noise level
    (``Policy.noise_for``) is a noise *multiplier*: the noise sd on each coordinate is σ·clip."""

    name = "clipped_gradient"
    ledger_name = "gradient_clipped"
    sigma_meaning = "noise multiplier: the noise sd on each coordinate is sigma × clip"
    noise_key = "clipped_gradient_noise_multiplier"
    report_sigma_key = "noise_multiplier"
    clip_scaled = True
    arrays = ("theta", "clip")
    spend_keys = ("sampler.chains", "sampler.warmup", "sampler.iterations", "privacy.sigma")

    def reply_scale(self, arrays: Mapping[str, Any]) -> float:
        """The clip: the noise sd of each coordinate is σ·clip."""
        return arrays["clip"]

    def answer_path(self, nodes: Sequence[OwnerNode]) -> KindPath:
        """``owner.compute.clipped_gradient.ClippedGradientPath``."""
        from ..owner.compute.clipped_gradient import ClippedGradientPath

        return ClippedGradientPath(self, nodes)

    def width(self, model: Model) -> int:
        return model.dim

    def sensitivity(self, model: Model, neighbour: str, step: float) -> float:
        """Per unit clip: 2 (replace_one: one clipped gradient swapped) or 1 (add_remove)."""
        return 2.0 if neighbour == "replace_one" else 1.0
