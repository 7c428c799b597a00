"""Noisy clipped log-likelihood ratios (penalty MH, docs/design.md §2.1): one number per
owner and key, Σ_x clip(ℓ(x,θ') − ℓ(x,θ), ±L‖θ' − θ‖) plus N(0, σ²)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import InvalidRequest
from ..models import Model
from ..privacy import GaussianSpend
from .base import Event, OwnerCosts, QueryKind

if TYPE_CHECKING:
    from ..common import Policy, SecureTerms
    from ..owner.node import OwnerNode
    from ..owner.pipeline import KindPath

_GDP = (
    "Gaussian answers composed by their total μ (each μ = Δ/σ): accountant 'gdp' is the exact "
    "μ-GDP ε(δ) (analytic Gaussian) of float noise (simulated owners); 'rdp' is the Rényi-DP ε of "
    "the same μ, for owners releasing exact lattice answers (deployed owners, docs/design.md "
    "§2.7); epsilon_paper_bound: classical Gaussian mechanism + advanced composition (null: not "
    "applicable); ledger_epsilon: the owner's spend across all its sessions, as its ledger "
    "reports it"
)


class GaussianKind(QueryKind):
    """A kind whose answers carry Gaussian noise of sd σ and are accounted by μ = Δ/σ."""

    report_basis = _GDP

    def answer_unit(
        self, owner: OwnerCosts, max_step: float | None, secure: SecureTerms | None
    ) -> float:
        """The μ of the most expensive answer the owner's policy allows."""
        return owner.worst_case_mu(self.name, max_step, secure)

    def event(self, answers: int, unit: float, sampling_rate: float | None) -> Event:
        """``answers`` Gaussian answers of μ = ``unit`` each."""
        return GaussianSpend(answers, answers * unit**2, unit)


class LogRatio(GaussianKind):
    """``log_ratio`` (ledger ``penalty``). Its noise level (``Policy.noise_for``) is the sd of
    the noise added to one owner's log-likelihood-ratio sum (nats). Sensitivity 2L‖θ' − θ‖
    (replace_one) or L‖θ' − θ‖ (add_remove), charged at no less than ``Policy.charged_step``."""

    name = "log_ratio"
    ledger_name = "penalty"
    sigma_meaning = "sd of the noisy log-likelihood-ratio sum (nats)"
    noise_key = "log_ratio_sd"
    step_scaled = True
    arrays = ("theta", "theta_prop")
    spend_keys = (
        "sampler.chains",
        "sampler.warmup",
        "sampler.iterations",
        "sampler.step",
        "privacy.max_step",
        "privacy.sigma",
    )

    def answer_path(self, nodes: Sequence[OwnerNode]) -> KindPath:
        """``owner.compute.log_ratio.LogRatioPath``."""
        from ..owner.compute.log_ratio import LogRatioPath

        return LogRatioPath(self, nodes)

    def check_model(self, model: Model, public_n: int | None, owner: str) -> None:
        """A model without a declared Lipschitz bound has no sensitivity for this kind."""
        if model.lipschitz is None:
            raise InvalidRequest(
                f"model {model.name!r} declares no Lipschitz bound, which log_ratio answers "
                "need: set sampler.ratio_clip > 0 (clipped log ratios) or declare the model's "
                "lipschitz",
                owner,
            )

    def width(self, model: Model) -> int:
        return 1

    def sensitivity(self, model: Model, neighbour: str, step: float) -> float:
        return float(model.log_ratio_sensitivity(step, neighbour))  # type: ignore[arg-type]

    def _check_step(self, step: float | None, policy: Policy, owner: str) -> float | None:
        """The session's largest step: the declared one, in [min_step, max_step] of
        ``policy``, or the policy's max_step."""
        if step is None:
            return policy.max_step
        ok = isinstance(step, (int, float)) and not isinstance(step, bool)
        if not ok or not policy.min_step <= step <= policy.max_step:
            raise InvalidRequest(
                f"the session's max_step {step!r} must lie in [{policy.min_step:g}, "
                f"{policy.max_step:g}] (this owner's min_step and max_step)",
                owner,
            )
        return float(step)
