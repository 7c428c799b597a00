"""The model interface shared by owners (who evaluate likelihoods) and the coordinator (prior).

Conventions, used everywhere in fedpenalty:

* ``theta`` has shape ``(C, d)``: one row per chain, in the *sampled* parameterisation
  (e.g. the logit for ``bernoulli``). Single points are passed as ``(1, d)``.
* ``records`` has shape ``(n, p)``: one row per record, columns ``column_names``.
* Θ is the box ``[-theta_bound, theta_bound]^d``; the target is the posterior restricted to Θ.
* ``lipschitz`` is L with ``|ℓ(x, θ') - ℓ(x, θ)| <= L ‖θ' - θ‖₂`` for every record x in the
  bounded data domain and every θ, θ' in Θ. Owners clip each record's log-likelihood
  difference to ``±L‖θ'-θ‖``; for a correct L that clip never binds. A model may leave L
  undeclared (``None``, the default): the kinds needing L (``log_ratio``) then refuse it, and
  it runs on the clipped kinds, whose sensitivity is the user-set clip (``sampler.ratio_clip``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from ..errors import ConfigError

Neighbour = Literal["replace_one", "add_remove"]
NEIGHBOURS: tuple[str, ...] = ("replace_one", "add_remove")


def check_neighbour(neighbour: object) -> Neighbour:
    """``neighbour`` itself; ``ValueError`` unless it is one of ``NEIGHBOURS``."""
    if neighbour not in NEIGHBOURS:
        raise ValueError(f"neighbour must be one of {NEIGHBOURS}, got {neighbour!r}")
    return neighbour  # type: ignore[return-value]  # checked against NEIGHBOURS above


@dataclass(frozen=True)
class Reference:
    """Moments of the reference posterior over Θ, in the sampled parameterisation.

    ``mean`` and ``sd`` have shape ``(d,)``; ``source`` says how they were obtained
    ("closed_form", "importance_sampling" or "exact_mh"). "closed_form" means deterministic to
    numerical precision: an analytic formula (e.g. a truncated normal) or an adaptive 1-D
    quadrature (relative error ~1e-10), never a Monte Carlo estimate; the other two are Monte
    Carlo estimates (``coordinator/reference.py``).
    """

    mean: np.ndarray
    sd: np.ndarray
    source: str


class Model(ABC):
    """A likelihood with a bounded data domain, a box parameter space Θ and a prior on Θ."""

    name: ClassVar[str]

    dim: int
    theta_bound: float

    # --- identity ------------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        """Models are equal when they are the same class with equal ``params()``."""
        if not isinstance(other, Model):
            return NotImplemented
        return type(self) is type(other) and self.params() == other.params()

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(sorted(self.params().items()))))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"

    # --- configuration -------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def defaults(cls) -> dict[str, Any]:
        """Default value of every ``[model]`` key this model accepts (``name`` excluded)."""

    @abstractmethod
    def params(self) -> dict[str, Any]:
        """The resolved ``[model]`` keys (``name`` excluded); equal params mean equal models."""

    @property
    @abstractmethod
    def column_names(self) -> list[str]:
        """Names of the record columns, in order (``x`` or ``x0..``; ``y`` last for labels)."""

    @property
    def param_names(self) -> list[str]:
        """Names of the d coordinates of θ in the sampled parameterisation (run outputs label
        them: the ``param`` coordinate of posterior.nc, the plots and the console tables)."""
        return [f"theta[{j}]" for j in range(self.dim)]

    # --- data ----------------------------------------------------------------------------
    @abstractmethod
    def prepare_records(self, raw: np.ndarray) -> np.ndarray:
        """Validate raw records ``(n, p)`` and clip them into the data domain.

        Raises ``DataError`` for a wrong shape, non-finite values, or values outside the
        model's support that clipping cannot fix (e.g. a Bernoulli outcome of 0.5).
        Returns a new float64 array; never modifies ``raw``.
        """

    def simulate_records(self, rng: np.random.Generator, theta: np.ndarray, n: int) -> np.ndarray:
        """``n`` synthetic records ``(n, p)`` drawn at parameter ``theta`` ``(d,)``, already
        inside the data domain. Optional: a model whose users bring their own data
        (``data.source = "files"``) need not simulate; synthetic data then refuse it."""
        raise ConfigError(
            f"[model] {self.name} cannot simulate records (it defines no simulate_records); "
            "set data.source = 'files' and data.paths"
        )

    # --- likelihood ----------------------------------------------------------------------
    @property
    def lipschitz(self) -> float | None:
        """L: bound on ‖∇_θ ℓ(x, θ)‖₂ over the data domain × Θ (units of log-likelihood per
        unit of θ), or ``None``: not declared (the default; see the module docstring)."""
        return None

    @abstractmethod
    def log_lik(self, records: np.ndarray, theta: np.ndarray) -> np.ndarray:
        """Per-record log-likelihood ℓ(x, θ): records ``(n, p)``, theta ``(C, d)`` → ``(C, n)``."""

    def log_lik_diff(
        self, records: np.ndarray, theta: np.ndarray, theta_prop: np.ndarray
    ) -> np.ndarray:
        """ℓ(x, θ') − ℓ(x, θ) per record: ``(C, n)``. Models override this when the difference
        has a cheaper or more accurate form than two evaluations."""
        return self.log_lik(records, theta_prop) - self.log_lik(records, theta)

    @abstractmethod
    def grad_log_lik(self, records: np.ndarray, theta: np.ndarray) -> np.ndarray:
        """Per-record gradient ∇_θ ℓ(x, θ): ``(C, n, d)``."""

    # --- clip certification (optional) ----------------------------------------------------
    def gradient_norm_bound(self, theta: np.ndarray) -> np.ndarray | None:
        """An upper bound per chain ``(C,)`` on ‖∇_θ ℓ(x, θ_c)‖₂ over every record x of the data
        domain (nats per unit of θ), or ``None``: not certified (the default). Where it is no
        more than a gradient clip, that clip cannot bind on any record (docs/design.md §2.9,
        "Answers without the per-record pass")."""
        return None

    def log_lik_diff_bound(self, theta: np.ndarray, theta_prop: np.ndarray) -> np.ndarray | None:
        """An upper bound per chain ``(C,)`` on |ℓ(x, θ'_c) − ℓ(x, θ_c)| over every record x of
        the data domain (nats), or ``None``: not certified (the default); likewise for a ratio
        clip."""
        return None

    @property
    def prior_only_coordinates(self) -> tuple[int, ...]:
        """The coordinates i of θ with ∂ℓ(x, θ)/∂θ_i = 0 for every record x of the domain and
        every θ (a hyperparameter, say a random effect's mean or scale): DP-HMC drops the
        owners' gradient noise there and redraws them from their prior conditional after every
        iteration, exact only if this is true (DP-HMC spot-checks it on simulated records;
        docs/design.md §2.9, "Prior-only coordinates"). Default: none."""
        return ()

    # --- prior ---------------------------------------------------------------------------
    @abstractmethod
    def log_prior(self, theta: np.ndarray) -> np.ndarray:
        """Log prior density of the sampled parameter (Jacobian included), up to a constant:
        ``(C, d)`` → ``(C,)``. Only meaningful inside Θ."""

    @abstractmethod
    def grad_log_prior(self, theta: np.ndarray) -> np.ndarray:
        """∇_θ log prior: ``(C, d)`` → ``(C, d)``."""

    # --- parameter space -----------------------------------------------------------------
    def in_theta_space(self, theta: np.ndarray) -> np.ndarray:
        """``(C, d)`` → ``(C,)`` bool: finite and inside the box Θ (NaN and ±inf never compare
        ≤ the finite bound)."""
        return (np.abs(np.asarray(theta, dtype=float)) <= self.theta_bound).all(axis=-1)

    # --- reference -----------------------------------------------------------------------
    def reference_posterior(self, records: np.ndarray) -> Reference | None:
        """Closed-form moments of the posterior given all ``records`` pooled, restricted to Θ,
        or ``None`` when the model has no closed form (the coordinator then samples it:
        ``coordinator/reference.py``)."""
        return None

    # --- sensitivity ---------------------------------------------------------------------
    def log_ratio_sensitivity(
        self, step_norm: np.ndarray | float, neighbour: Neighbour
    ) -> np.ndarray:
        """L2 sensitivity of one owner's clipped log-likelihood-ratio sum for a move of length
        ``step_norm``: ``2 L ‖θ'-θ‖`` for replace-one, ``L ‖θ'-θ‖`` for add/remove.
        ``ConfigError`` when the model declares no L (``require_lipschitz``)."""
        factor = 2.0 if neighbour == "replace_one" else 1.0
        return factor * require_lipschitz(self) * np.asarray(step_norm, dtype=float)


def require_lipschitz(model: Model, needed_by: str = "the log_ratio query kind") -> float:
    """``model.lipschitz``; ``ConfigError`` naming ``sampler.ratio_clip`` and ``lipschitz``
    when the model declares none."""
    lip = model.lipschitz
    if lip is None:
        raise ConfigError(
            f"[model] {model.name} declares no Lipschitz bound, which {needed_by} needs: set "
            "sampler.ratio_clip > 0 (penalty MH on per-record clipped ratios) or declare the "
            "model's lipschitz property"
        )
    return float(lip)


class ExpFamModel(Model):
    """ℓ(x, θ) = η(θ)ᵀ S(x) − A(θ) + log h(x).

    ``log_lik`` and ``log_lik_diff`` are implemented here from ``natural_param``,
    ``suff_stat``, ``log_partition`` and ``log_base_measure``, so the identity holds exactly;
    ``reference_posterior`` pools Σ S(x) and calls ``reference_from_stats``.
    """

    @abstractmethod
    def log_base_measure(self, records: np.ndarray) -> np.ndarray:
        """log h(x) per record: ``(n, p)`` → ``(n,)``."""

    def log_lik(self, records: np.ndarray, theta: np.ndarray) -> np.ndarray:
        """η(θ)ᵀS(x) − A(θ) + log h(x): records ``(n, p)``, theta ``(C, d)`` → ``(C, n)``."""
        stats = self.suff_stat(records)
        eta = self.natural_param(theta)
        return (
            eta @ stats.T
            - self.log_partition(theta)[:, None]
            + self.log_base_measure(records)[None, :]
        )

    def log_lik_diff(
        self, records: np.ndarray, theta: np.ndarray, theta_prop: np.ndarray
    ) -> np.ndarray:
        """(η(θ')−η(θ))ᵀS(x) − (A(θ')−A(θ)) per record: ``(C, n)`` (log h cancels exactly)."""
        stats = self.suff_stat(records)
        d_eta = self.natural_param(theta_prop) - self.natural_param(theta)
        d_a = self.log_partition(theta_prop) - self.log_partition(theta)
        return d_eta @ stats.T - d_a[:, None]

    def reference_from_stats(self, n: int, stat_sum: np.ndarray) -> Reference | None:
        """Posterior moments over Θ given ``n`` records whose statistics sum to ``stat_sum``
        ``(s,)`` (a noisy sum must first be projected to the set of attainable sums).
        ``None`` when the model has no closed form."""
        return None

    def reference_posterior(self, records: np.ndarray) -> Reference | None:
        """Moments of the posterior given all ``records`` (prepared first) pooled, over Θ."""
        prepared = self.prepare_records(records)
        return self.reference_from_stats(prepared.shape[0], self.suff_stat(prepared).sum(axis=0))

    def log_lik_diff_from_stats(
        self,
        n: float | np.ndarray,
        stat_sum: np.ndarray,
        theta: np.ndarray,
        theta_prop: np.ndarray,
    ) -> np.ndarray:
        """Σ_x ℓ(x, θ'_c) − ℓ(x, θ_c) = Δηᵀ Σ S(x) − n ΔA over ``n`` records whose statistics
        sum to ``stat_sum`` ``(s,)``: ``(C,)`` nats, O(s) per chain; for K owners at once,
        ``n`` ``(K,)`` and ``stat_sum`` ``(K, s)`` give ``(K, C)``."""
        d_eta = self.natural_param(theta_prop) - self.natural_param(theta)
        d_a = self.log_partition(theta_prop) - self.log_partition(theta)
        # n ⊗ ΔA by broadcasting: np.multiply.outer's products, without its wrapper's cost
        return np.asarray(stat_sum, dtype=float) @ d_eta.T - np.asarray(n)[..., None] * d_a

    def grad_log_lik_from_stats(
        self, n: int, stat_sum: np.ndarray, theta: np.ndarray
    ) -> np.ndarray | None:
        """Σ_x ∇_θ ℓ(x, θ_c) = J_η(θ)ᵀ Σ S(x) − n ∇A(θ) over ``n`` records whose statistics sum
        to ``stat_sum`` ``(s,)``: ``(C, d)``; ``None`` when the model does not give it (the
        default: its owners then sum record by record)."""
        return None

    @property
    @abstractmethod
    def stat_dim(self) -> int:
        """s: the length of S(x)."""

    @abstractmethod
    def suff_stat(self, records: np.ndarray) -> np.ndarray:
        """S(x) per record: ``(n, p)`` → ``(n, s)``."""

    @abstractmethod
    def natural_param(self, theta: np.ndarray) -> np.ndarray:
        """η(θ): ``(C, d)`` → ``(C, s)``."""

    @abstractmethod
    def log_partition(self, theta: np.ndarray) -> np.ndarray:
        """A(θ): ``(C, d)`` → ``(C,)``."""

    @abstractmethod
    def stat_sensitivity(self, neighbour: Neighbour) -> float:
        """L2 sensitivity of Σ S(x) over the data domain: sup‖S(x) − S(x')‖₂ for replace-one,
        sup‖S(x)‖₂ for add/remove."""

    @abstractmethod
    def stat_l1_sensitivity(self, neighbour: Neighbour) -> float:
        """L1 sensitivity of Σ S(x) (for the Laplace noisy-statistics baseline)."""
