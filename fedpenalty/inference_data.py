"""A run as ArviZ data (docs/design.md §5): one DataTree written to ``posterior.nc`` (NetCDF4
through h5netcdf), which ``arviz_base.convert_to_datatree`` and ``xarray.open_datatree`` open.

Groups:

* ``posterior`` — ``theta`` ``(chain, draw, param)``, ``param`` named by the model
  (``Model.param_names``), in the sampled parameterisation;
* ``sample_stats`` — per ``(chain, draw)`` what the algorithm has: ``accepted`` (MH),
  ``queried`` (owners asked), ``noise_variance`` (the owners' noise variance s² of that step;
  NaN where no owner was asked), ``step_size`` (MH: the proposal radius; SG-MCMC: η_t);
* ``privacy_spend`` — each owner's running spend in this session as its own ledger reported
  it, ``(owner, iteration)``: ``answers``, ``mu``, ``epsilon`` at ``delta``,
  ``epsilon_paper_bound`` (NaN where it does not apply) and ``budget_epsilon`` ``(owner,)``;
* ``reference`` — the reference posterior's ``mean`` and ``sd`` ``(param,)`` when known;
* ``privacy`` — privacy.json: each owner's entry over ``owner`` (``epsilon``, ``delta``,
  ``answers``, ``mu``, ``budget_left``, …; numbers as floats with NaN for null, text as
  strings), the run's own fields (``algorithm``, ``accounting``, ``unreported``, …) as
  attributes (text as it is, anything else as JSON);
* ``diagnostics`` — diagnostics.json: ``posterior_mean``, ``posterior_sd``, ``ess_bulk``,
  ``rhat``, ``mcse_mean`` and ``error_*`` over ``param``, ``acceptance_rate_per_chain`` over
  ``chain``, ``warnings`` over ``warning``, its numbers (``acceptance_rate``, ``kept_draws``,
  …) as scalars and the rest as attributes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from . import __version__
from .common import PrivacyReport
from .models import Reference

POSTERIOR_FILE = "posterior.nc"


@dataclass(frozen=True)
class SpendTrace:
    """Owners' running spend of one session at ``iterations`` ``(P,)`` (iterations done, warmup
    included): ``answers``, ``mu`` (NaN: gradient answers), ``epsilon`` and
    ``epsilon_paper_bound`` (NaN: not applicable) ``(K, P)``, each from the owner's report;
    ``owners``, ``delta`` and ``budget_epsilon`` ``(K,)``."""

    owners: tuple[str, ...]
    delta: np.ndarray
    budget_epsilon: np.ndarray
    iterations: np.ndarray
    answers: np.ndarray
    mu: np.ndarray
    epsilon: np.ndarray
    epsilon_paper_bound: np.ndarray

    @classmethod
    def empty(cls, reports: Sequence[PrivacyReport]) -> SpendTrace:
        k = len(reports)
        return cls(
            tuple(r.owner for r in reports),
            np.array([r.delta for r in reports], dtype=float),
            np.array([r.budget_epsilon for r in reports], dtype=float),
            np.zeros(0, dtype=np.int64),
            np.zeros((k, 0), dtype=np.int64),
            np.zeros((k, 0)),
            np.zeros((k, 0)),
            np.zeros((k, 0)),
        )

    def added(self, iteration: int, reports: Sequence[PrivacyReport], gradient: bool) -> SpendTrace:
        """This trace with one more point: the session spend of ``reports`` after ``iteration``
        iterations (``gradient``: μ does not describe the answers, NaN)."""
        spends = [r.session for r in reports if r.session is not None]
        assert len(spends) == len(reports)  # asked for this run's session

        def column(values: list[float], dtype: Any = float) -> np.ndarray:
            return np.array(values, dtype=dtype)[:, None]

        return SpendTrace(
            self.owners,
            self.delta,
            self.budget_epsilon,
            np.append(self.iterations, iteration),
            np.hstack([self.answers, column([s.answers for s in spends], np.int64)]),
            np.hstack([self.mu, column([np.nan if gradient else s.mu for s in spends])]),
            np.hstack([self.epsilon, column([s.epsilon for s in spends])]),
            np.hstack([self.epsilon_paper_bound, column([s.epsilon_paper_bound for s in spends])]),
        )

    def before(self, iteration: int) -> SpendTrace:
        """The points taken after fewer than ``iteration`` iterations (a resumed run keeps
        these and adds its own)."""
        keep = self.iterations < iteration
        return SpendTrace(
            self.owners,
            self.delta,
            self.budget_epsilon,
            self.iterations[keep],
            self.answers[:, keep],
            self.mu[:, keep],
            self.epsilon[:, keep],
            self.epsilon_paper_bound[:, keep],
        )

    def to_dataset(self) -> xr.Dataset:
        owner_iter = ("owner", "iteration")
        paper = np.where(np.isfinite(self.epsilon_paper_bound), self.epsilon_paper_bound, np.nan)
        return xr.Dataset(
            {
                "answers": (owner_iter, self.answers),
                "mu": (owner_iter, self.mu),
                "epsilon": (owner_iter, self.epsilon),
                "epsilon_paper_bound": (owner_iter, paper),
                "delta": ("owner", self.delta),
                "budget_epsilon": ("owner", self.budget_epsilon),
            },
            coords={"owner": list(self.owners), "iteration": self.iterations},
            attrs={
                "description": "each owner's spend in this session as its own ledger reported "
                "it, after the given number of iterations (warmup included)"
            },
        )

    @classmethod
    def from_dataset(cls, ds: xr.Dataset) -> SpendTrace:
        return cls(
            tuple(str(o) for o in ds["owner"].values),
            ds["delta"].values.astype(float),
            ds["budget_epsilon"].values.astype(float),
            ds["iteration"].values.astype(np.int64),
            ds["answers"].values.astype(np.int64),
            ds["mu"].values.astype(float),
            ds["epsilon"].values.astype(float),
            ds["epsilon_paper_bound"].values.astype(float),
        )


def posterior_tree(
    theta: np.ndarray,
    param_names: Sequence[str],
    sample_stats: Mapping[str, np.ndarray],
    spend: SpendTrace | None,
    reference: Reference | None,
    attrs: Mapping[str, Any],
    privacy: Mapping[str, Any] | None = None,
    diagnostics: Mapping[str, Any] | None = None,
) -> xr.DataTree:
    """The DataTree of a run: ``theta`` ``(chains, draws, d)``, ``sample_stats`` name →
    ``(chains, draws)`` array, the owners' ``spend``, the ``reference``, the run's
    ``privacy`` (privacy.json) and ``diagnostics`` (diagnostics.json) (each may be absent),
    ``attrs`` added to the posterior's (algorithm, model, ...)."""
    chains, draws, _ = theta.shape
    coords = {"chain": np.arange(chains), "draw": np.arange(draws), "param": list(param_names)}
    common = {"created_by": f"fedpenalty {__version__}", "inference_library": "fedpenalty"}
    groups: dict[str, xr.Dataset] = {
        "posterior": xr.Dataset(
            {"theta": (("chain", "draw", "param"), theta)},
            coords=coords,
            attrs={**common, **attrs},
        )
    }
    if sample_stats:
        groups["sample_stats"] = xr.Dataset(
            {name: (("chain", "draw"), value) for name, value in sample_stats.items()},
            coords={"chain": coords["chain"], "draw": coords["draw"]},
            attrs=common,
        )
    if spend is not None and spend.owners:
        groups["privacy_spend"] = spend.to_dataset()
    if reference is not None:
        groups["reference"] = xr.Dataset(
            {"mean": ("param", reference.mean), "sd": ("param", reference.sd)},
            coords={"param": list(param_names)},
            attrs={"source": reference.source},
        )
    if privacy:
        groups["privacy"] = privacy_dataset(privacy)
    if diagnostics:
        groups["diagnostics"] = diagnostics_dataset(diagnostics)
    return xr.DataTree.from_dict(groups)


def privacy_dataset(privacy: Mapping[str, Any]) -> xr.Dataset:
    """privacy.json as a Dataset: each owner's entry over ``owner`` (``_column``), the run's
    other fields as attributes (``_attribute``)."""
    owners = privacy.get("owners", [])
    keys = dict.fromkeys(k for o in owners for k in o if k != "owner")
    return xr.Dataset(
        {k: ("owner", _column([o.get(k) for o in owners])) for k in keys},
        coords={"owner": [str(o["owner"]) for o in owners]},
        attrs={k: _attribute(v) for k, v in privacy.items() if k != "owners"},
    )


#: diagnostics.json's arrays and the dimension each runs over (the rest: scalars, attributes).
DIAGNOSTIC_DIMS = {
    **dict.fromkeys(("posterior_mean", "posterior_sd", "ess_bulk", "rhat", "mcse_mean"), "param"),
    **dict.fromkeys(("error_mean_abs", "error_mean_in_sd", "error_sd_ratio"), "param"),
    "acceptance_rate_per_chain": "chain",
    "warnings": "warning",
}


def diagnostics_dataset(diagnostics: Mapping[str, Any]) -> xr.Dataset:
    """diagnostics.json as a Dataset: the arrays of ``DIAGNOSTIC_DIMS`` (``error`` flattened to
    ``error_*``) over their dimension, numbers as scalars, the rest as attributes
    (``_attribute``); ``param`` named by ``param_names``."""
    flat = {k: v for k, v in diagnostics.items() if k not in ("error", "param_names")}
    flat.update({f"error_{k}": v for k, v in diagnostics.get("error", {}).items()})
    data: dict[str, Any] = {}
    attrs: dict[str, Any] = {}
    for key, value in flat.items():
        if key in DIAGNOSTIC_DIMS and value is not None:
            data[key] = (DIAGNOSTIC_DIMS[key], _column(list(value)))
        elif _number(value):
            data[key] = ((), value)
        else:
            attrs[key] = _attribute(value)
    coords = {"param": list(diagnostics["param_names"])}
    if "acceptance_rate_per_chain" in data:
        coords["chain"] = list(range(len(diagnostics["acceptance_rate_per_chain"])))
    return xr.Dataset(data, coords=coords, attrs=attrs)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _column(values: Sequence[Any]) -> np.ndarray:
    """One variable from JSON values: integers as int64, numbers (null: NaN) as float64, text
    (null: "") as strings, booleans as bool, anything else as JSON text."""
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in values):
        return np.array(values, dtype=bool)
    if all(_number(v) for v in present):
        whole = bool(values) and all(isinstance(v, (int, np.integer)) for v in values)
        return np.array([np.nan if v is None else v for v in values], dtype=int if whole else float)
    if all(isinstance(v, str) for v in present):
        return np.array(["" if v is None else v for v in values], dtype=str)
    return np.array([json.dumps(v) for v in values], dtype=str)


def _attribute(value: Any) -> str | int | float:
    """A NetCDF attribute from a JSON value: text and numbers as they are, else JSON text."""
    return value if isinstance(value, str) or _number(value) else json.dumps(value)


def write_posterior(path: Path, tree: xr.DataTree) -> None:
    """Write ``tree`` to ``path`` (NetCDF4 through h5netcdf), replacing it atomically; numbers
    and text zlib-compressed (per-owner groups of many owners repeat one value and names:
    10⁵ owners' 32 MB, docs/design.md §5), read back unchanged."""
    tmp = path.with_name(path.name + ".tmp")
    encoding = {
        node.path: {
            name: {"zlib": True, "complevel": 4, **_chars(variable.dtype)}
            for name, variable in node.dataset.variables.items()
            if variable.dtype.kind in "biufU" and variable.ndim > 0
        }
        for node in tree.subtree
    }
    tree.to_netcdf(tmp, engine="h5netcdf", encoding=encoding)
    tmp.replace(path)


def _chars(dtype: np.dtype) -> dict[str, str]:
    """Text as fixed-width characters (compressible; read back as text): owner names."""
    return {"dtype": "S1"} if dtype.kind == "U" else {}


def read_spend(path: Path) -> SpendTrace | None:
    """The ``privacy_spend`` group of a run's posterior.nc (None when it has none)."""
    if not path.is_file():
        return None
    with xr.open_datatree(path, engine="h5netcdf") as tree:
        if "privacy_spend" not in tree.children:
            return None
        return SpendTrace.from_dataset(tree["privacy_spend"].to_dataset().load())
