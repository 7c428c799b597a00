"""The non-private baseline: Metropolis–Hastings with a trusted curator's exact log-likelihood
ratio over every owner's records pooled (docs/design.md §2.4). The kernel is ``mh``'s, with
ratio variance 0; it runs in simulation only.

For exponential-family models the curator sums the sufficient statistics once, so each ratio
is O(1) in the records: Σ_x ℓ(x,θ') − ℓ(x,θ) = (η(θ') − η(θ))ᵀ Σ_x S(x) − n (A(θ') − A(θ))
(log h cancels). Other models (``logistic``) sum record by record.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..models import ExpFamModel, Model
from . import mh
from .adapt import StepAdaptation
from .base import ChainAlgorithm, ChainData, SamplingAlgorithm
from .mh import RatioFn

#: (theta (m, d), theta_prop (m, d)) -> Σ_x ℓ(x, θ') − ℓ(x, θ) over the pooled records (m,)
PooledRatio = Callable[[np.ndarray, np.ndarray], np.ndarray]


def pooled_log_ratio(model: Model, records: np.ndarray) -> PooledRatio:
    """The exact log-likelihood ratio over pooled, prepared ``records`` ``(n, p)``: from the
    summed sufficient statistics for exponential-family models (O(1) per chain), else record
    by record (O(n) per chain)."""
    if isinstance(model, ExpFamModel):
        stat_sum, n = model.suff_stat(records).sum(axis=0), len(records)

        def from_stats(theta: np.ndarray, theta_prop: np.ndarray) -> np.ndarray:
            d_eta = model.natural_param(theta_prop) - model.natural_param(theta)
            d_a = model.log_partition(theta_prop) - model.log_partition(theta)
            return d_eta @ stat_sum - n * d_a

        return from_stats
    return lambda theta, theta_prop: model.log_lik_diff(records, theta, theta_prop).sum(axis=1)


def exact_ratio(model: Model, records: np.ndarray) -> RatioFn:
    """The trusted curator's exact log-likelihood ratio over pooled ``records`` (non-private)."""
    pooled = pooled_log_ratio(model, records)

    def ratio(iteration: int, chains: np.ndarray, theta: np.ndarray, theta_prop: np.ndarray):
        return pooled(theta, theta_prop), np.zeros(len(chains))

    return ratio


def build(
    model: Model, data: ChainData, *, step: float, adapt_step: bool, target_accept: float
) -> SamplingAlgorithm:
    """Exact MH over ``data.records`` (pooled); ``step`` is the largest ball radius (adapted
    below it during warmup when ``adapt_step``, as the penalty kernels do)."""
    ratio = exact_ratio(model, data.require_records("exact_mh"))
    return mh.kernel(model, ratio, StepAdaptation.start(step, target_accept), adapt=adapt_step)


EXACT_MH = ChainAlgorithm(
    "exact_mh",
    "non-private exact MH on the pooled records (trusted curator)",
    build,
    mh.MHSettings,
    mh.MHState,
    None,
    check=mh.check_step,
)
