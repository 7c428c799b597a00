"""Clipped, Poisson-subsampled, noised gradient sums (federated SG-MCMC, docs/design.md §2.3):
``d`` numbers per owner and key, each record's gradient clipped to L2 norm ``clip``, summed
over a Poisson sample of rate q, plus N(0, (σ·clip)² I)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import InvalidRequest
from ..models import Model
from ..privacy.subsampled import SubsampledGaussian
from .base import Event, OwnerCosts, QueryKind

if TYPE_CHECKING:
    from ..common import Policy, SecureTerms
    from ..owner.node import OwnerNode
    from ..owner.pipeline import KindPath


class Gradient(QueryKind):
    """``gradient`` (ledger ``sgmcmc``). Its noise level (``Policy.noise_for``) is the noise
    *multiplier*: the noise sd on each coordinate is σ·clip. Answers are accounted as
    Poisson-subsampled Gaussian events (dp-accounting), whose neighbour relation sets the
    sensitivity per unit clip."""

    name = "gradient"
    ledger_name = "sgmcmc"
    sigma_meaning = "noise multiplier: the noise sd on each coordinate is sigma × clip"
    noise_key = "gradient_noise_multiplier"
    report_basis = (
        "Poisson-subsampled Gaussian gradient answers (rate sampling_rate, noise sd "
        "noise_multiplier × clip) composed by dp-accounting's PLD accountant (pessimistic) in "
        "each owner's ledger; epsilon_paper_bound: not applicable; ledger_epsilon: the owner's "
        "spend across all its sessions, as its ledger reports it"
    )
    report_sigma_key = "noise_multiplier"
    clip_scaled = True
    takes_rate = True
    arrays = ("theta", "clip")
    spend_keys = (
        "sampler.chains",
        "sampler.warmup",
        "sampler.iterations",
        "sampler.sampling_rate",
        "privacy.sigma",
    )

    def report_noise(self, sigma: float, sampler: Mapping[str, Any]) -> dict[str, Any]:
        """The noise multiplier with the sampling rate and clip the run asked for."""
        return {
            "noise_multiplier": sigma,
            "sampling_rate": sampler["sampling_rate"],
            "clip": sampler["clip"],
        }

    def reply_scale(self, arrays: Mapping[str, Any]) -> float:
        """The clip: the noise sd of a gradient answer is σ·clip."""
        return arrays["clip"]

    def answer_path(self, nodes: Sequence[OwnerNode]) -> KindPath:
        """``owner.compute.gradient.GradientPath``."""
        from ..owner.compute.gradient import GradientPath

        return GradientPath(self, nodes)

    def width(self, model: Model) -> int:
        return model.dim

    def sensitivity(self, model: Model, neighbour: str, step: float) -> float:
        """Per unit clip: 2 (replace_one: one clipped gradient swapped) or 1 (add_remove)."""
        return 2.0 if neighbour == "replace_one" else 1.0

    def _check_rate(self, rate: float | None, policy: Policy, owner: str) -> float | None:
        """The session's Poisson rate q, in (0, the policy's max_sampling_rate]."""
        limit = policy.max_sampling_rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= limit:
            raise InvalidRequest(
                f"sgmcmc sessions need a sampling_rate in (0, {limit:g}] (this owner's "
                f"max_sampling_rate), got {rate!r}",
                owner,
            )
        return float(rate)

    def answer_unit(
        self, owner: OwnerCosts, max_step: float | None, secure: SecureTerms | None
    ) -> float:
        """The noise multiplier the owner's gradient answers are accounted at."""
        return owner.gradient_multiplier(secure)

    def session_multiplier(self, owner: OwnerCosts, secure: SecureTerms | None) -> float | None:
        return owner.gradient_multiplier(secure)

    def event(self, answers: int, unit: float, sampling_rate: float | None) -> Event:
        """``answers`` gradient answers of noise multiplier ``unit`` at rate ``sampling_rate``."""
        assert sampling_rate is not None  # check_terms requires it
        return SubsampledGaussian(sampling_rate, unit, answers)
