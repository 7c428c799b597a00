"""Mixing diagnostics of a run: acceptance, bulk ESS, rank-normalised split R-hat (arviz-stats),
posterior moments and the error against a reference posterior."""

from __future__ import annotations

from typing import Any

import numpy as np
from arviz_stats.base import array_stats

from .models import Reference


def summarize(
    theta: np.ndarray, accepted: np.ndarray | None, reference: Reference | None = None
) -> dict[str, Any]:
    """theta ``(C, T, d)`` draws, accepted ``(C, T)`` → the ``diagnostics.json`` fields.

    ``accepted`` is None for samplers without an accept step (SG-MCMC) and for independent
    draws (the one-shot baselines): the acceptance fields are then null.

    ``error`` (with a reference): ``mean_abs`` |mean − ref mean| per dimension,
    ``mean_in_sd`` the same in reference sds, ``sd_ratio`` posterior sd / reference sd.
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
