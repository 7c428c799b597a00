"""Test-only owners: a lone owner answering without the owner axis, simulated gradient owners
without a ledger, CSV writing (``fedpenalty.data.save_csv``), and kernels built by name from
the algorithm registry."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedpenalty.coordinator.algorithms import ALGORITHMS
from fedpenalty.coordinator.base import ChainData, SamplingAlgorithm
from fedpenalty.coordinator.sgmcmc import GradFn
from fedpenalty.data import save_csv as save_csv  # the tests' CSV writer is the package's
from fedpenalty.models import Model
from fedpenalty.owner import OwnerHost, OwnerNode
from fedpenalty.owner.compute.gradient import clipped_gradient_sum

#: The ``[sampler]`` defaults of the kernels' settings (as in fedpenalty/config.py).
SAMPLER_DEFAULTS: dict[str, Any] = {
    "step": 0.05,
    "adapt_step": True,
    "target_accept": 0.5,
    "block": 1,
    "sampling_rate": 0.01,
    "clip": 1.0,
    "friction": 1.0,
    "step_schedule": "constant",
    "step_decay_b": 1.0,
    "step_decay_gamma": 0.55,
}


def kernel(
    name: str, model: Model, *, oracle=None, records=None, n_total=None, **sampler: Any
) -> SamplingAlgorithm:
    """The registry's algorithm ``name`` built on ``model``, ``sampler`` keys over the defaults."""
    return ALGORITHMS[name].kernel(
        model, ChainData(oracle, records, n_total), {**SAMPLER_DEFAULTS, **sampler}
    )


class SoloOwner:
    """One owner answering through its own host, its answers without the owner axis; every
    other attribute is the node's."""

    def __init__(self, node: OwnerNode):
        self.node, self.host = node, OwnerHost([node])

    def __getattr__(self, name: str) -> Any:
        return getattr(self.node, name)

    def open_session(self, *args: Any, **kwargs: Any) -> None:
        self.host.open_session(*args, **kwargs)

    def close_session(self, session: str) -> None:
        self.host.close_session(session)

    def log_ratio(self, *args: Any) -> np.ndarray:
        return self.host.log_ratio(*args)[0]

    def suff_stats(self, *args: Any) -> np.ndarray:
        return self.host.suff_stats(*args)[0]

    def gradient(self, *args: Any) -> np.ndarray:
        return self.host.gradient(*args)[0]


@dataclass(frozen=True)
class SimulatedOwner:
    """An owner simulated in process: its prepared ``records`` and its sampling rate q, clip C
    and noise multiplier σ."""

    records: np.ndarray
    sampling_rate: float
    clip: float
    noise_multiplier: float


def owner_noise_variance(owners: list[SimulatedOwner] | tuple[SimulatedOwner, ...]) -> float:
    """s² = Σ_k (σ_k C_k / q_k)²: the owner-noise variance on each coordinate of G."""
    return float(sum((o.noise_multiplier * o.clip / o.sampling_rate) ** 2 for o in owners))


def simulated_gradient(
    model: Model,
    owners: list[SimulatedOwner] | tuple[SimulatedOwner, ...],
    rng: np.random.Generator,
) -> GradFn:
    """The gradient function of in-process owners: G = Σ_k owner_gradient(...)/q_k, with
    s² = ``owner_noise_variance(owners)``. Every call draws fresh subsamples and noise from
    ``rng``; the iteration and chain indices are ignored (no replay cache in simulation)."""
    s2 = owner_noise_variance(owners)

    def grad(
        iteration: int, chains: np.ndarray, theta: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        total = np.zeros_like(theta, dtype=float)
        for o in owners:
            total += (
                owner_gradient(
                    model, o.records, theta, rng, o.sampling_rate, o.clip, o.noise_multiplier
                )
                / o.sampling_rate
            )
        return total, np.full(len(chains), s2)

    return grad


def owner_gradient(
    model: Model,
    records: np.ndarray,
    theta: np.ndarray,
    rng: np.random.Generator,
    q: float,
    clip: float,
    sigma: float,
) -> np.ndarray:
    """TEST ONLY: a simulated owner's noisy gradient answer for each chain: ``(C, d)``.

    For each row of ``theta`` ``(C, d)`` independently, include each record with probability
    ``q`` (Poisson sampling), clip and sum (``clipped_gradient_sum``), and add float
    N(0, (sigma·clip)² I). The only randomness is ``rng``. The caller divides by q. (A lattice
    owner samples and noises from its keyed stream instead, ``OwnerHost.gradient``.)
    """
    theta = np.array(theta, dtype=float, ndmin=2)
    if not 0.0 < q <= 1.0:
        raise ValueError(f"q must be in (0, 1], got {q!r}")
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma must be finite and >= 0, got {sigma!r}")
    c, d = theta.shape
    mask = rng.random((c, len(records))) < q
    total = clipped_gradient_sum(model, records, theta, mask, clip)
    return total + sigma * clip * rng.standard_normal((c, d))
