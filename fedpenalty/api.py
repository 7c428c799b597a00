"""The Python API, for notebooks: ``fedpenalty.sample`` runs a scenario as ``fedpenalty
simulate`` does (the same function, ``simulation.simulate``) and returns the run as ArviZ data,
as ``pymc.sample`` does."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import xarray as xr

from .cli import run_warnings
from .simulation import simulate


def sample(
    scenario: str | Path | Mapping[str, Any] | None = None,
    *,
    overrides: Mapping[str, Any] | Sequence[str] = (),
    out: str | Path | None = None,
    progress: bool | None = None,
) -> xr.DataTree:
    """Run a scenario like ``fedpenalty simulate`` and return the run as an ArviZ DataTree.

    ``scenario``: a scenario file's path, a mapping of its sections (``{"model": {"name":
    "bernoulli"}, "sampler": {"iterations": 2000}}``) or None for the embedded default;
    ``overrides``: ``{"sampler.iterations": 500}`` or ``--set`` strings
    (``["sampler.iterations=500"]``); ``out``: the run directory (default run.out, else
    runs/<algorithm>-<time>), which holds every file the command writes; ``progress``:
    show the progress bar (default run.progress).

    The tree is the run directory's posterior.nc (docs/design.md §5): groups ``posterior``
    (``theta`` ``(chain, draw, param)``), ``sample_stats``, ``privacy_spend`` (each owner's
    running spend), ``reference``, ``privacy`` (privacy.json: ε per owner at δ, from its own
    ledger) and ``diagnostics`` (diagnostics.json). Unmixed chains, excess SG-MCMC noise and a
    run an owner stopped early (kept, resumable with ``fedpenalty simulate --resume DIR``) are
    reported as ``RuntimeWarning`` warnings; a scenario that is refused raises the error
    ``fedpenalty simulate`` prints (a ``fedpenalty.errors.FedPenaltyError``).
    """
    result = simulate(scenario, overrides, out, progress)
    for line in run_warnings(result, resumable=True, command="simulate"):
        warnings.warn(line.removeprefix("warning: "), RuntimeWarning, stacklevel=2)
    assert result.tree is not None  # every simulation writes its tree
    return result.tree
