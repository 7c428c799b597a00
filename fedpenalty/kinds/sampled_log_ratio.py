"""Poisson-subsampled, per-record-clipped, noised log-likelihood-ratio sums (the Barker test,
docs/design.md §2.12): one number per owner and key, Σ over a Poisson sample of rate q of
clip(ℓ(x,θ') − ℓ(x,θ), ±c), plus N(0, (σ·c)²), c the query's clip. One record moves the sum by
at most c (add_remove) or 2c (replace_one) whatever the step, so an answer is one
Poisson-subsampled Gaussian release of noise multiplier σ, accounted as a gradient answer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from ..models import Model
from .gradient import Gradient

if TYPE_CHECKING:
    from ..common import SecureTerms
    from ..owner.node import OwnerNode
    from ..owner.pipeline import KindPath
    from .base import OwnerCosts


class SampledLogRatio(Gradient):
    """``sampled_log_ratio`` (ledger ``barker``). Its noise level (``Policy.noise_for``) is a
    noise multiplier: the noise sd of one owner's sum is σ·clip (nats)."""

    name = "sampled_log_ratio"
    ledger_name = "barker"
    sigma_meaning = (
        "noise multiplier: the noise sd of the sampled clipped log-ratio sum is sigma × clip"
    )
    noise_key = "barker_noise_multiplier"
    report_basis = (
        "Poisson-subsampled Gaussian answers of clipped log-likelihood-ratio sums (rate "
        "sampling_rate, noise sd noise_multiplier × clip) composed by dp-accounting's PLD "
        "accountant (pessimistic) in each owner's ledger; epsilon_paper_bound: not applicable; "
        "ledger_epsilon: the owner's spend across all its sessions, as its ledger reports it"
    )
    arrays = ("theta", "theta_prop", "clip")  # type: ignore[assignment]

    def report_noise(self, sigma: float, sampler: Mapping[str, Any]) -> dict[str, Any]:
        """The noise multiplier with the sampling rate and ratio clip the run asked for."""
        return {
            "noise_multiplier": sigma,
            "sampling_rate": sampler["sampling_rate"],
            "clip": sampler["barker_clip"],
        }

    def answer_path(self, nodes: Sequence[OwnerNode]) -> KindPath:
        """``owner.compute.sampled_log_ratio.SampledLogRatioPath``."""
        from ..owner.compute.sampled_log_ratio import SampledLogRatioPath

        return SampledLogRatioPath(self, nodes)

    def width(self, model: Model) -> int:
        return 1

    def answer_unit(
        self, owner: OwnerCosts, max_step: float | None, secure: SecureTerms | None
    ) -> float:
        """The noise multiplier the owner's answers of this kind are accounted at."""
        from ..owner.compute.sampled_log_ratio import ratio_multiplier

        return ratio_multiplier(cast("OwnerNode", owner))

    def session_multiplier(self, owner: OwnerCosts, secure: SecureTerms | None) -> float | None:
        return self.answer_unit(owner, None, secure)
