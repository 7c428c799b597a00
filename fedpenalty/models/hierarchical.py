"""Hierarchical models: a shared θ and one block b_k per owner (docs/design.md §6,
"Hierarchical models (design)").

The coordinator samples z = (θ, b_1, …, b_K), shape ``(C, d + K·p)``; owner k's likelihood reads
only its local parameter φ_k, a function of θ_L (the coordinates of θ the likelihood reads) and
b_k, and each owner serves a flat ``Model`` on φ_k (``local_model``), so the owner side — box,
step limit, sensitivity, replay, charging — is that of a flat model. The prior of z involves no
record and is evaluated by the coordinator alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .base import Model, Reference


class HierarchicalModel(ABC):
    """The coordinator's side of a model with one random-effect block per owner.

    Shapes: z ``(C, d + K·p)``, θ its first d coordinates, block k at ``d + k·p : d + (k+1)·p``;
    φ ``(K, C, d_local)`` with d_local = ``local_model().dim``.
    """

    name: str
    #: d: the shared coordinates (θ_L and θ_H)
    shared_dim: int
    #: p: the coordinates of one owner's block
    block_dim: int
    #: θ_L: the indices within θ that the likelihood reads
    lik_index: tuple[int, ...]
    #: every block lies in [−block_bound, block_bound]^p (units of b)
    block_bound: float

    @abstractmethod
    def params(self) -> dict[str, Any]:
        """The ``[model]`` keys besides name, defaults filled in."""

    def full_dim(self, owners: int) -> int:
        """d + K·p."""
        return self.shared_dim + owners * self.block_dim

    def blocks(self, z: np.ndarray, owners: int) -> np.ndarray:
        """The blocks of z: ``(C, d + K·p)`` → ``(K, C, p)``."""
        z = np.asarray(z, dtype=float)
        b = z[:, self.shared_dim :].reshape(len(z), owners, self.block_dim)
        return np.transpose(b, (1, 0, 2))

    @abstractmethod
    def local_model(self) -> Model:
        """The flat model every owner serves, on its local parameter φ_k."""

    @abstractmethod
    def local_params(self, z: np.ndarray, owners: int) -> np.ndarray:
        """φ_k for every owner: z ``(C, d + K·p)`` → ``(K, C, d_local)``, inside the local
        model's Θ whenever z is inside the model's box."""

    def invariant_directions(self, owners: int) -> np.ndarray:
        """Directions V ``(m, d + K·p)`` along which ``local_params`` is constant (z + c·V has
        every owner's φ_k of z), so a move along them needs no owner; none by default."""
        return np.empty((0, self.full_dim(owners)))

    @abstractmethod
    def log_prior(self, z: np.ndarray, owners: int) -> np.ndarray:
        """log p(θ) + Σ_k log p(b_k | θ_H), Jacobians included: ``(C, d + K·p)`` → ``(C,)``."""

    @abstractmethod
    def grad_log_prior(self, z: np.ndarray, owners: int) -> np.ndarray:
        """∇_z of ``log_prior``: ``(C, d + K·p)`` → ``(C, d + K·p)``."""

    @abstractmethod
    def in_theta_space(self, z: np.ndarray, owners: int) -> np.ndarray:
        """``(C, d + K·p)`` → ``(C,)`` bool: finite and inside the box of every coordinate."""

    @abstractmethod
    def param_names(self, owner_names: Sequence[str]) -> list[str]:
        """The d + K·p coordinate names of z in run outputs."""

    @abstractmethod
    def start_points(
        self, rng: np.random.Generator, chains: int, owners: int, scale: float
    ) -> np.ndarray:
        """Data-independent chain starts ``(chains, d + K·p)`` inside the box, spread by
        ``scale`` ∈ (0, 1] (sampler.init_scale)."""

    @abstractmethod
    def true_shared(self, true_theta: float) -> np.ndarray:
        """The shared θ ``(d,)`` synthetic records are drawn at, given ``data.true_theta``."""

    @abstractmethod
    def simulate_blocks(
        self, rng: np.random.Generator, theta: np.ndarray, owners: int
    ) -> np.ndarray:
        """z_true ``(d + K·p,)``: the shared ``theta`` ``(d,)`` and K blocks from p(b | θ_H)."""

    @abstractmethod
    def simulate_owner_records(
        self, rng: np.random.Generator, z: np.ndarray, owner: int, n: int
    ) -> np.ndarray:
        """``n`` records of owner ``owner`` at z ``(d + K·p,)``, inside the data domain."""

    @abstractmethod
    def reference_posterior(self, records: Sequence[np.ndarray]) -> Reference:
        """Moments ``(d + K·p,)`` of the posterior of z given each owner's records, in
        ``describe()`` order."""


@dataclass(frozen=True)
class BoundHierarchy:
    """A hierarchical ``model`` with its owners, by name in ``describe()`` order: what a run's
    outputs read (``name``, the d + K·p ``param_names``) and what ``penalty_hier`` samples."""

    model: HierarchicalModel
    owner_names: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def owners(self) -> int:
        return len(self.owner_names)

    @property
    def param_names(self) -> list[str]:
        return self.model.param_names(self.owner_names)
