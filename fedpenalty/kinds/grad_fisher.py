"""DP-SGFS answers (docs/design.md §2.11): per owner and key, the sum over a Poisson sample of
rate q of z(x) = [g, vech(g gᵀ)/C]/√2 (g: the record's gradient clipped to L2 norm C, the
query's clip; vech: the upper triangle), plus N(0, (σ·C)² I). ‖z(x)‖ ≤ C, so one answer is
one Poisson-subsampled Gaussian release of noise multiplier σ, accounted exactly as a gradient
answer; the coordinator recovers the gradient sum (noise sd √2·σC) and the outer-product sum
(noise sd √2·σC²)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from ..models import Model
from .gradient import Gradient

if TYPE_CHECKING:
    from ..common import SecureTerms
    from ..owner.node import OwnerNode
    from ..owner.pipeline import KindPath
    from .base import OwnerCosts


class GradFisher(Gradient):
    """``grad_fisher`` (ledger ``sgfs``). Its noise level (``Policy.noise_for``) is the noise
    multiplier of the whole answer vector z; the neighbour relation enters the accounting as
    for gradients (per unit clip: add_remove 1, replace_one 2)."""

    name = "grad_fisher"
    ledger_name = "sgfs"
    sigma_meaning = (
        "noise multiplier: the noise sd on each component of [g, vech(g gᵀ)/clip]/√2 is "
        "sigma × clip"
    )
    noise_key = "sgfs_noise_multiplier"
    report_basis = (
        "Poisson-subsampled Gaussian answers of clipped gradients and their outer products "
        "(rate sampling_rate, noise sd noise_multiplier × clip on [g, vech(g gᵀ)/clip]/√2) "
        "composed by dp-accounting's PLD accountant (pessimistic) in each owner's ledger; "
        "epsilon_paper_bound: not applicable; ledger_epsilon: the owner's spend across all its "
        "sessions, as its ledger reports it"
    )

    def answer_path(self, nodes: Sequence[OwnerNode]) -> KindPath:
        """``owner.compute.grad_fisher.GradFisherPath``."""
        from ..owner.compute.grad_fisher import GradFisherPath

        return GradFisherPath(self, nodes)

    def width(self, model: Model) -> int:
        """d + d(d + 1)/2."""
        return model.dim + model.dim * (model.dim + 1) // 2

    def answer_unit(
        self, owner: OwnerCosts, max_step: float | None, secure: SecureTerms | None
    ) -> float:
        """The noise multiplier the owner's answers of this kind are accounted at."""
        from ..owner.compute.grad_fisher import fisher_multiplier

        node = cast("OwnerNode", owner)
        return fisher_multiplier(node, self.width(node.model))

    def session_multiplier(self, owner: OwnerCosts, secure: SecureTerms | None) -> float | None:
        return self.answer_unit(owner, None, secure)
