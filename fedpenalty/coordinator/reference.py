"""Reference posteriors for measuring a run's error.

Closed form where the model has one; otherwise a long exact (non-private) MH run on the pooled
records, computed once and cached on disk keyed by a hash of the model and the records.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from ..models import Model, Reference
from . import exact, mh
from .adapt import StepAdaptation
from .driver import sample

#: Exact-MH reference: chains × kept draws, after as many warmup draws.
REFERENCE_CHAINS = 8
REFERENCE_DRAWS = 10_000


def cache_dir() -> Path:
    """``$FEDPENALTY_CACHE`` or ``$XDG_CACHE_HOME/fedpenalty`` (default ``~/.cache/fedpenalty``)."""
    if "FEDPENALTY_CACHE" in os.environ:
        return Path(os.environ["FEDPENALTY_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fedpenalty"


def reference_posterior(
    model: Model, records: np.ndarray, seed: int = 20_161_122, progress: bool = False
) -> Reference:
    """Posterior moments given all ``records`` pooled (trusted-curator view)."""
    closed = model.reference_posterior(records)
    if closed is not None:
        return closed
    key = hashlib.sha256(
        json.dumps({"model": model.name, **model.params()}, sort_keys=True).encode()
    )
    key.update(np.ascontiguousarray(records, dtype="<f8").tobytes())
    key.update(f"{seed}-{REFERENCE_CHAINS}-{REFERENCE_DRAWS}".encode())
    path = cache_dir() / f"reference-{key.hexdigest()[:24]}.npz"
    if path.is_file():
        with np.load(path) as cached:
            return Reference(cached["mean"], cached["sd"], "exact_mh")
    draws = exact_mh_draws(
        model, records, np.random.default_rng(seed), REFERENCE_CHAINS, REFERENCE_DRAWS, progress
    )
    ref = Reference(draws.mean(axis=(0, 1)), draws.std(axis=(0, 1), ddof=1), "exact_mh")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, mean=ref.mean, sd=ref.sd)
    tmp.replace(path)
    return ref


def exact_mh_draws(
    model: Model,
    records: np.ndarray,
    rng: np.random.Generator,
    chains: int,
    draws: int,
    progress: bool = False,
) -> np.ndarray:
    """Exact MH draws ``(chains, draws, d)``: the ball radius is tuned in a pilot phase to an
    acceptance near 0.3, then frozen (so the kept chain is a fixed, exact kernel)."""
    ratio = exact.exact_ratio(model, records)
    state, radius = mh.tune_radius(
        rng, mh.init(np.zeros((chains, model.dim)), model), model, ratio, 30
    )
    result = sample(
        mh.kernel(model, ratio, StepAdaptation.start(radius)),
        rng,
        state.theta,
        iterations=draws,
        warmup=draws // 4,
        progress=progress,
        description="reference (exact MH)",
    )
    return result.theta
