"""The papers' baselines as registry entries (docs/design.md §2.4): ``ops`` and ``noisy_stats``
are one-shot releases the simulation computes from the owners' records; ``hybrid`` is SGLD
through the owners, started from OPS draws. The mathematics is in ``baselines.py``; this
module only says what each one draws and how its privacy.json reads.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import Field

from ..common import SGMCMC
from ..models import MODELS, ConjugateUpdate, Model
from ..schema import PositiveInt, Section
from . import baselines, sgld, sgmcmc
from .base import ChainAlgorithm, Release, ReleaseAlgorithm, Sections, Start, require

_POOLED = (
    "computed by the simulation on every owner's records pooled (a trusted curator); no owner "
    "ledger is "
    "involved"
)


class OPSSettings(Section):
    """The ``[sampler]`` key of OPS (and of hybrid's OPS starts)."""

    ops_mh_steps: PositiveInt = Field(
        default=2000,
        description="ops, hybrid on models without a closed-form tempered posterior: exact-MH "
        "steps per released draw (after tuning)",
    )


class HybridSettings(sgmcmc.SGMCMCSettings, OPSSettings):
    """The ``[sampler]`` keys of hybrid: SGLD's and OPS's."""


def _check_ops_form(sections: Sections, model: Model) -> None:
    privacy = sections["privacy"]
    require(
        privacy["ops_form"] != "foulds" or privacy["neighbour"] == "replace_one",
        "privacy.ops_form = 'foulds' (the 2C form) is for replace_one neighbours; use ops_form = "
        "'wang' with "
        "add_remove",
    )


def _ops(
    rng: np.random.Generator, model: Model, records: list[np.ndarray], sections: Sections
) -> Release:
    """OPS on the pooled records: chains × iterations draws, each at ε/(chains × iterations),
    so that every owner spends privacy.epsilon."""
    sampler, p = sections["sampler"], sections["privacy"]
    draws = sampler["chains"] * sampler["iterations"]
    result = baselines.ops(
        rng,
        model,
        np.concatenate(records),
        p["epsilon"] / draws,
        form=p["ops_form"],
        neighbour=p["neighbour"],
        samples=draws,
        mh_steps=sampler["ops_mh_steps"],
    )
    theta = np.asarray(result.theta).reshape(sampler["chains"], sampler["iterations"], model.dim)
    extra: dict[str, Any] = {}
    if result.method == "mh":
        extra["note"] = (
            "this model has no closed-form tempered posterior: each draw is the last state of a "
            "tempered exact-MH chain (sampler.ops_mh_steps steps after tuning); the guarantee is "
            "for an "
            "exact draw"
        )
    return Release(
        theta,
        result.epsilon_per_owner,
        0.0,
        "OPS (one draw from the tempered posterior at temperature rho per release): each draw is "
        "(epsilon / draws, 0)-DP (Wang et al. Thm 1 / Foulds et al. Thm 2), composed by basic "
        "composition",
        _POOLED,
        True,
        {
            "rho": result.rho,
            "ops_form": result.form,
            "draws": draws,
            "method": result.method,
            "epsilon_per_draw": p["epsilon"] / draws,
        },
        extra,
    )


_NOISY_STATS_ACCOUNTING = {
    "laplace": "one release of Σ S(x) + Laplace(L1 sensitivity / ε) per component: (ε, 0)-DP; the "
    "conjugate draws "
    "are post-processing",
    "gaussian": "one release of Σ S(x) + N(0, σ² I) with σ calibrated exactly (μ-GDP, analytic "
    "Gaussian) to (ε, δ) "
    "for the L2 sensitivity; the conjugate draws are post-processing",
}


def _noisy_stats(
    rng: np.random.Generator, model: Model, records: list[np.ndarray], sections: Sections
) -> Release:
    """Each owner releases its noisy sufficient statistics once; chains × iterations conjugate
    draws given their sum."""
    sampler, p = sections["sampler"], sections["privacy"]
    assert isinstance(model, baselines.ExpFamModel)
    result = baselines.noisy_stats(
        rng,
        model,
        records,
        p["epsilon"],
        neighbour=p["neighbour"],
        draws=sampler["chains"] * sampler["iterations"],
        mechanism=p["mechanism"],
        delta=p["delta"],
    )
    theta = result.theta.reshape(sampler["chains"], sampler["iterations"], model.dim)
    return Release(
        theta,
        result.epsilon_per_owner,
        result.delta,
        _NOISY_STATS_ACCOUNTING[result.mechanism],
        "computed by the simulation from each owner's own records with the formulas of "
        "coordinator.baselines.noisy_stats (one release per owner); the owners' ledgers are not "
        "involved",
        False,
        {
            "mechanism": result.mechanism,
            "scale": result.scale,
            "sensitivity": result.sensitivity,
            "mu": result.mu,
        },
        {},
    )


def _check_noisy_stats(sections: Sections, model: Model) -> None:
    """The model must have a closed-form posterior given sufficient statistics."""
    conjugate = [name for name, cls in MODELS.items() if issubclass(cls, ConjugateUpdate)]
    require(
        isinstance(model, ConjugateUpdate),
        "sampler.algorithm = 'noisy_stats' needs a model with a conjugate "
        f"posterior ({', '.join(conjugate)}); {model.name!r} has none",
    )


def _hybrid_start(
    rng: np.random.Generator, model: Model, pooled: np.ndarray, sections: Sections
) -> Start:
    """Wang et al.'s Algorithm 3: OPS at ε/2 starts the chains; the owners' noise multiplier is
    calibrated to the remaining ε/2 at δ for the planned gradient answers."""
    sampler, p = sections["sampler"], sections["privacy"]
    ops_part, sigma = baselines.hybrid_start(
        rng,
        model,
        pooled,
        p["epsilon"],
        p["delta"],
        sampling_rate=sampler["sampling_rate"],
        answers=HYBRID.planned_answers(sampler),
        chains=sampler["chains"],
        neighbour=p["neighbour"],
        ops_form=p["ops_form"],
        mh_steps=sampler["ops_mh_steps"],
    )

    def privacy(summary: dict[str, Any]) -> None:
        """Fold the OPS starts into the owners' ledger report of the DP-SGLD part."""
        summary["trusted_curator"] = True
        summary["release"] = (
            "OPS starts: computed by the simulation on every owner's records pooled (a trusted "
            "curator); DP-SGLD answers: through each owner's own ledger"
        )
        summary["accounting"] = (
            "epsilon = epsilon_ops + epsilon_sgld by basic composition: epsilon_ops from the OPS "
            "starts (δ = 0, "
            "computed by the simulation on the pooled records), epsilon_sgld from each owner's "
            "ledger (PLD) for the "
            "DP-SGLD answers at the noise multiplier calibrated to ε/2"
        )
        summary["ops_rho"] = ops_part.rho
        for owner in summary["owners"]:
            owner["epsilon_sgld"] = owner["epsilon"]
            owner["epsilon_ops"] = ops_part.epsilon_per_owner
            owner["epsilon"] = owner["epsilon_sgld"] + ops_part.epsilon_per_owner

    return Start(np.atleast_2d(ops_part.theta), sigma, privacy)


OPS = ReleaseAlgorithm(
    "ops",
    "OPS: draws from the tempered posterior (trusted curator)",
    _ops,
    _check_ops_form,
    OPSSettings,
)
NOISY_STATS = ReleaseAlgorithm(
    "noisy_stats",
    "noisy sufficient statistics released once, conjugate draws",
    _noisy_stats,
    _check_noisy_stats,
)
HYBRID = ChainAlgorithm(
    "hybrid",
    "OPS starts at ε/2, then DP-SGLD at ε/2 (Wang et al. Alg. 3)",
    sgld.build,
    HybridSettings,
    sgld.SGLDState,
    SGMCMC,
    check=_check_ops_form,
    start=_hybrid_start,
)
