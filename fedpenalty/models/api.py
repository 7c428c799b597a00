"""The public API for writing a model (docs/design.md §6, "Writing a model"): the base classes
and capabilities a model implements, and the helpers the built-in models use — ``[model]`` key
declaration and resolution (``Param``, ``Configured``), array validation and clipping, and the
1-D numerics of closed-form posteriors (log-concave moments, truncated inverse-CDF draws).

A new model imports what it needs from here::

    from fedpenalty.models.api import Configured, ExpFamModel, Param, as_theta, validate_raw

A user's own model (``examples/user_model/laplace_location.py``) subclasses ``Configured`` and
``Model`` in the user's own module and writes: ``PARAMS`` (its ``[model]`` keys) and ``_setup``
(setting ``dim`` and ``theta_bound``), ``column_names``, ``prepare_records`` (records
``(n, p)``: ``validate_raw``, then clip into the data domain), ``log_lik`` (records ``(n, p)``,
θ ``(C, d)`` → ``(C, n)`` nats), ``grad_log_lik`` (→ ``(C, n, d)``), ``log_prior`` (``(C, d)``
→ ``(C,)``) and ``grad_log_prior`` (→ ``(C, d)``). It may leave out ``name`` (the name it is
selected by), ``lipschitz`` (None: runs on the clipped kinds, ``sampler.ratio_clip``),
``simulate_records`` (then only on the owners' files), ``log_lik_diff``, ``param_names``,
``in_theta_space``, ``reference_posterior``, and ``gradient_norm_bound`` and
``log_lik_diff_bound`` (certified bounds over the data domain that let owners skip a clip that
cannot bind). It is selected as ``[model] name =
"package.module:Class"`` or by a ``fedpenalty.models`` entry point (``registry.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
from scipy import integrate, optimize

from ..errors import ConfigError, DataError
from .base import (
    NEIGHBOURS,
    ExpFamModel,
    Model,
    Neighbour,
    Reference,
    check_neighbour,
    require_lipschitz,
)
from .capabilities import BoundedLogLikelihood, ConjugateUpdate

__all__ = [
    "NEIGHBOURS",
    "BoundedLogLikelihood",
    "Configured",
    "ConjugateUpdate",
    "ExpFamModel",
    "Model",
    "Neighbour",
    "Param",
    "ParamKind",
    "Reference",
    "as_point",
    "as_prepared",
    "as_theta",
    "check_binary",
    "check_neighbour",
    "log_concave_moments",
    "project_to_ball",
    "require_lipschitz",
    "resolve_params",
    "truncated_ppf",
    "uniform_ball",
    "validate_raw",
]

ParamKind = Literal["dim", "count", "positive", "real"]

_KIND_TEXT: dict[str, str] = {
    "dim": "an integer >= 1",
    "count": "an integer >= 1",
    "positive": "a finite number > 0",
    "real": "a finite number",
}


@dataclass(frozen=True)
class Param:
    """One ``[model]`` key: its default, what values are allowed, and what it means."""

    default: Any
    kind: ParamKind
    doc: str = ""


def _check_value(model: str, key: str, value: Any, kind: ParamKind) -> int | float:
    """Validate one ``[model]`` value and return it as a plain ``int``/``float``."""
    allowed = _KIND_TEXT[kind]
    bad = ConfigError(f"[model] {model}: {key!r} must be {allowed}, got {value!r}")
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (int, float, np.integer, np.floating)
    ):
        raise bad
    if kind in ("dim", "count"):
        integral = not isinstance(value, (float, np.floating)) or (
            math.isfinite(value) and float(value).is_integer()
        )
        if not integral:
            raise bad
        ivalue = int(value)
        if ivalue < 1:
            raise bad
        return ivalue
    fvalue = float(value)
    if not math.isfinite(fvalue):
        raise bad
    if kind == "positive" and fvalue <= 0.0:
        raise bad
    return fvalue


def resolve_params(
    model: str, specs: Mapping[str, Param], given: Mapping[str, Any]
) -> dict[str, Any]:
    """Defaults overlaid with ``given``, every value validated; ``ConfigError`` on an unknown key
    or a bad value."""
    allowed = ", ".join(["name", *specs])
    for key in given:
        if key not in specs:
            raise ConfigError(f"[model] {model}: unknown key {key!r}; allowed keys: {allowed}")
    out: dict[str, Any] = {}
    for key, spec in specs.items():
        out[key] = _check_value(model, key, given.get(key, spec.default), spec.kind)
    return out


class Configured:
    """Mixin giving a model its ``[model]`` keys: ``PARAMS`` declares them, ``__init__`` resolves
    and validates them and then calls ``_setup``."""

    name: ClassVar[str]
    PARAMS: ClassVar[dict[str, Param]]

    def __init__(self, **params: Any) -> None:
        self._params = resolve_params(self.name, self.PARAMS, params)
        self._setup()
        lip = self.lipschitz  # type: ignore[attr-defined]
        if lip is not None and not (math.isfinite(lip) and lip > 0):
            raise ConfigError(
                f"[model] {self.name}: the Lipschitz bound overflows for {self._params}; "
                "use a smaller theta_bound / data_bound"
            )

    def _setup(self) -> None:  # pragma: no cover - every model overrides
        raise NotImplementedError

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Default value of every ``[model]`` key (``name`` excluded)."""
        return {k: p.default for k, p in cls.PARAMS.items()}

    def params(self) -> dict[str, Any]:
        """The resolved ``[model]`` keys (``name`` excluded)."""
        return dict(self._params)


# --- arrays ----------------------------------------------------------------------------------


def as_theta(theta: np.ndarray, dim: int) -> np.ndarray:
    """``theta`` as a float ``(C, dim)`` array; ``ValueError`` for any other shape."""
    arr = np.asarray(theta, dtype=float)
    if arr.ndim != 2 or arr.shape[1] != dim:
        raise ValueError(f"theta must have shape (C, {dim}), got {arr.shape}")
    return arr


def as_point(theta: np.ndarray, dim: int) -> np.ndarray:
    """A single parameter ``(dim,)`` (``(1, dim)`` accepted); ``ValueError`` otherwise."""
    arr = np.asarray(theta, dtype=float)
    if arr.shape == (1, dim):
        arr = arr[0]
    if arr.shape != (dim,):
        raise ValueError(f"theta must have shape ({dim},), got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("theta must be finite")
    return arr


def as_prepared(records: np.ndarray, width: int) -> np.ndarray:
    """Already-prepared records as a float ``(n, width)`` array (cheap shape check only)."""
    arr = np.asarray(records, dtype=float)
    if arr.ndim == 1 and width == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape[1] != width:
        raise ValueError(f"records must have shape (n, {width}), got {arr.shape}")
    return arr


def validate_raw(raw: np.ndarray, columns: list[str], model: str) -> np.ndarray:
    """A fresh float64 ``(n, p)`` copy of ``raw`` (1-D accepted when p == 1); ``DataError`` for
    a non-numeric array, a wrong shape or a non-finite value."""
    p = len(columns)
    try:
        arr = np.array(raw, dtype=np.float64, copy=True)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{model}: records must be a numeric array ({exc})") from None
    if arr.ndim == 1 and p == 1:
        arr = arr.reshape(-1, 1)
    if arr.ndim != 2 or arr.shape[1] != p:
        raise DataError(
            f"{model}: records must have shape (n, {p}) with columns {columns}, "
            f"got shape {arr.shape}"
        )
    bad = ~np.isfinite(arr)
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise DataError(
            f"{model}: {int(bad.sum())} non-finite value(s); first at record {i}, "
            f"column {columns[j]!r}: {arr[i, j]!r}"
        )
    return arr


def check_binary(col: np.ndarray, column: str, model: str) -> None:
    """``DataError`` naming the first value of ``col`` that is not exactly 0 or 1."""
    bad = (col != 0.0) & (col != 1.0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DataError(
            f"{model}: column {column!r} must be exactly 0 or 1; {int(bad.sum())} bad "
            f"value(s), first at record {i}: {col[i]!r}"
        )


def project_to_ball(x: np.ndarray, radius: float) -> np.ndarray:
    """Rows of ``x`` ``(n, d)`` longer than ``radius`` (L2) rescaled onto the sphere; a new array.
    Norms are computed overflow-safely (rows are pre-scaled by their largest entry)."""
    x = np.array(x, dtype=float, copy=True)
    if x.size == 0:
        return x
    m = np.max(np.abs(x), axis=1)
    if float(m.max()) * math.sqrt(x.shape[1]) * (1.0 + 1e-9) < radius:
        return x  # every row well inside (‖x‖ ≤ √d·max|x_i|): what the full check gives, cheaply
    safe = np.where(m > 0, m, 1.0)
    norms = m * np.linalg.norm(x / safe[:, None], axis=1)
    over = norms > radius
    if over.any():
        x[over] = (x[over] / safe[over, None]) * (radius / (norms[over] / safe[over]))[:, None]
    return x


def uniform_ball(rng: np.random.Generator, n: int, dim: int, radius: float) -> np.ndarray:
    """``n`` points uniform in the L2 ball of ``radius`` in R^dim: ``(n, dim)``."""
    g = rng.standard_normal((n, dim))
    norms = np.linalg.norm(g, axis=1)
    norms = np.where(norms > 0, norms, 1.0)
    r = radius * rng.random(n) ** (1.0 / dim)
    return g / norms[:, None] * r[:, None]


# --- 1-D quadrature ----------------------------------------------------------------------------


def log_concave_moments(
    logf, mode: float, lo: float, hi: float, cut: float = 60.0
) -> tuple[float, float]:
    """Mean and sd of the density ∝ exp(logf) on [lo, hi], where ``logf`` (scalar → scalar) is
    concave with maximiser ``mode`` in [lo, hi].

    The density is normalised by exp(logf(mode)) (no overflow however large n is); the range is
    first shrunk to where logf is within ``cut`` of its maximum (by concavity the mass outside is
    below e^-cut relative), so quad sees the peak however narrow it is.
    """
    f0 = float(logf(mode))

    def g(t: float) -> float:
        return float(logf(t)) - f0 + cut

    a = lo if (mode <= lo or g(lo) >= 0) else optimize.brentq(g, lo, mode, xtol=1e-15, rtol=1e-15)
    b = hi if (mode >= hi or g(hi) >= 0) else optimize.brentq(g, mode, hi, xtol=1e-15, rtol=1e-15)
    points = [mode] if a < mode < b else None

    def w(t: float) -> float:
        return math.exp(float(logf(t)) - f0)

    opts = dict(points=points, epsabs=0.0, epsrel=1e-12, limit=400)
    z = integrate.quad(w, a, b, **opts)[0]
    mean = integrate.quad(lambda t: t * w(t), a, b, **opts)[0] / z
    var = integrate.quad(lambda t: (t - mean) ** 2 * w(t), a, b, **opts)[0] / z
    return mean, math.sqrt(max(var, 0.0))


def truncated_ppf(dist: Any, lo: float, hi: float, u: np.ndarray) -> np.ndarray:
    """Inverse-CDF draws of a frozen continuous scipy distribution ``dist`` truncated to
    [lo, hi] at uniforms ``u`` ``(m,)`` → ``(m,)``, using the lower tail (cdf/ppf) when the
    interval lies in it and the upper tail (sf/isf) otherwise, so that a posterior piled
    against either end keeps full precision."""
    f_lo, f_hi = dist.cdf(lo), dist.cdf(hi)
    if f_lo < 0.5:
        return np.clip(dist.ppf(f_lo + u * (f_hi - f_lo)), lo, hi)
    s_lo, s_hi = dist.sf(lo), dist.sf(hi)
    return np.clip(dist.isf(s_hi + u * (s_lo - s_hi)), lo, hi)
