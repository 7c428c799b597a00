"""Mixing diagnostics of a run: acceptance, bulk ESS, rank-normalised split R-hat (arviz-stats),
posterior moments, the error against a reference posterior, and the warnings of a run whose
chains have not mixed (R-hat above ``RHAT_LIMIT`` or bulk ESS below ``ESS_PER_CHAIN`` per chain,
Vehtari et al. 2021's thresholds)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from arviz_stats.base import array_stats

from .models import Reference
from .nested_rhat import nested_summary

#: Largest rank-normalised split R-hat of a converged run (Vehtari et al. 2021, §4).
RHAT_LIMIT = 1.01
#: Smallest bulk ESS per chain for reliable R-hat and posterior summaries (ibid.).
ESS_PER_CHAIN = 100


def summarize(
    theta: np.ndarray,
    accepted: np.ndarray | None,
    reference: Reference | None = None,
    names: Sequence[str] | None = None,
    superchains: int = 0,
) -> dict[str, Any]:
    """theta ``(C, T, d)`` draws, accepted ``(C, T)`` → the ``diagnostics.json`` fields.

    ``accepted`` is None for samplers without an accept step (SG-MCMC) and for independent
    draws (the one-shot baselines): the acceptance fields are then null.

    ``error`` (with a reference): ``mean_abs`` |mean − ref mean| per dimension,
    ``mean_in_sd`` the same in reference sds, ``sd_ratio`` posterior sd / reference sd.
    ``warnings``: one line per parameter that has not mixed (``mixing_warnings``), labelled
    by ``names`` (default ``theta[j]``). ``nested_rhat`` (16 chains or more): nested R-hat over
    ``superchains`` (0: the default grouping; ``nested_rhat.nested_summary``).
    """
    mean = theta.mean(axis=(0, 1))
    sd = theta.std(axis=(0, 1), ddof=1)
    out: dict[str, Any] = {
        "acceptance_rate": None if accepted is None else float(np.mean(accepted)),
        "acceptance_rate_per_chain": None
        if accepted is None
        else np.mean(accepted, axis=1).tolist(),
        "ess_bulk": np.atleast_1d(
            array_stats.ess(theta, chain_axis=0, draw_axis=1, method="bulk")
        ).tolist(),
        "rhat": np.atleast_1d(
            array_stats.rhat(theta, chain_axis=0, draw_axis=1, method="rank")
        ).tolist()
        if theta.shape[0] > 1
        else None,
        "posterior_mean": mean.tolist(),
        "posterior_sd": sd.tolist(),
        "mcse_mean": np.atleast_1d(
            array_stats.mcse(theta, chain_axis=0, draw_axis=1, method="mean")
        ).tolist(),
    }
    nested = nested_summary(theta, superchains)
    if nested is not None:
        out["nested_rhat"] = nested
    labels = list(names) if names is not None else [f"theta[{j}]" for j in range(theta.shape[2])]
    out["warnings"] = mixing_warnings(out["ess_bulk"], out["rhat"], theta.shape[0], labels)
    if reference is not None:
        out["reference"] = {
            "mean": reference.mean.tolist(),
            "sd": reference.sd.tolist(),
            "source": reference.source,
        }
        out["error"] = {
            "mean_abs": np.abs(mean - reference.mean).tolist(),
            "mean_in_sd": (np.abs(mean - reference.mean) / reference.sd).tolist(),
            "sd_ratio": (sd / reference.sd).tolist(),
        }
    return out


def mixing_warnings(
    ess_bulk: Sequence[float], rhat: Sequence[float] | None, chains: int, names: Sequence[str]
) -> list[str]:
    """One warning per parameter whose split R-hat exceeds RHAT_LIMIT or whose bulk ESS is
    below ESS_PER_CHAIN × ``chains``, saying what to do."""
    out = []
    need = ESS_PER_CHAIN * chains
    for j, name in enumerate(names):
        problems = []
        if rhat is not None and not rhat[j] <= RHAT_LIMIT:  # NaN counts as not mixed
            problems.append(f"R-hat {rhat[j]:.3g} > {RHAT_LIMIT}")
        if not ess_bulk[j] >= need:
            problems.append(f"bulk ESS {ess_bulk[j]:.3g} < {need} ({ESS_PER_CHAIN} per chain)")
        if problems:
            out.append(
                f"{name}: {' and '.join(problems)}: the chains have not mixed, so the posterior "
                "summaries are unreliable; run longer (sampler.iterations, sampler.warmup) or "
                "tune sampler.step"
            )
    return out
