"""The non-private baseline: Metropolis–Hastings with a trusted curator's exact log-likelihood
ratio over every owner's records pooled (docs/design.md §2.4). The kernel is ``mh``'s, with
ratio variance 0; it runs in simulation only.
"""

from __future__ import annotations

import numpy as np

from ..models import Model
from . import mh
from .base import ChainAlgorithm, ChainData, SamplingAlgorithm
from .mh import RatioFn


def exact_ratio(model: Model, records: np.ndarray) -> RatioFn:
    """The trusted curator's exact log-likelihood ratio over pooled ``records`` (non-private)."""

    def ratio(iteration: int, chains: np.ndarray, theta: np.ndarray, theta_prop: np.ndarray):
        return model.log_lik_diff(records, theta, theta_prop).sum(axis=1), np.zeros(len(chains))

    return ratio


def build(model: Model, data: ChainData, *, step: float) -> SamplingAlgorithm:
    """Exact MH over ``data.records`` (pooled); ``step`` is the ball radius."""
    return mh.kernel(model, step, exact_ratio(model, data.require_records("exact_mh")))


EXACT_MH = ChainAlgorithm(
    "exact_mh",
    "non-private exact MH on the pooled records (trusted curator)",
    build,
    ("step",),
    mh.MHState,
    None,
    check=mh.check_step,
)
