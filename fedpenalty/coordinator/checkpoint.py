"""Checkpoints of a running chain: state, chain RNG state and the draws so far, in one file.

The file is replaced atomically (write a temporary file beside it, fsync, rename), so a crash
at any moment leaves either the previous checkpoint or the new one, never a torn file.
Resuming from it with the same owners gives exactly the chain of an uninterrupted run: the
RNG restarts where it was, so the re-run iterations ask the same questions, and the owners
replay their stored answers for them (DESIGN §3 invariant 2, §4).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

from . import expfam, mh, sgmcmc
from .driver import Progress, State

_SG_KINDS = {sgmcmc.SGLDState: "sgld", sgmcmc.SGHMCState: "sghmc", sgmcmc.SGNHTState: "sgnht"}

FORMAT = "fedpenalty-checkpoint-1"


def save(path: Path, progress: Progress) -> None:
    """Write ``progress`` to ``path`` atomically."""
    state = progress.state
    chain = state.mh if isinstance(state, expfam.ExpFamState) else state
    sg_kind = _SG_KINDS.get(type(state))
    meta = {"format": FORMAT, "done": progress.done, "warmup": progress.warmup, "rng_state": progress.rng_state,
            "noise_sum": progress.noise_sum, "noise_count": progress.noise_count, "iteration": chain.iteration,
            "excess_max": progress.excess_max, "excess_steps": progress.excess_steps, "sgmcmc": sg_kind,
            "expfam": None if chain is state else {"stats_start": state.stats_start, "stats_var": state.stats_var}}
    arrays = {"theta": progress.theta, "queried": progress.queried, "state_theta": chain.theta}
    if progress.accepted is not None:
        arrays["accepted"] = progress.accepted
    if sg_kind is None:
        arrays["state_log_prior"] = chain.log_prior
    for extra in ("momentum", "thermostat"):
        if hasattr(state, extra):
            arrays[f"state_{extra}"] = getattr(state, extra)
    if chain is not state:
        arrays["stats"] = state.stats
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, meta=np.array(json.dumps(meta)), **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load(path: Path) -> Progress:
    """The ``Progress`` saved at ``path``; ``ValueError`` for a file that is not a checkpoint."""
    try:
        with np.load(path, allow_pickle=False) as f:
            meta = json.loads(str(f["meta"]))
            arrays = {k: f[k] for k in f.files if k != "meta"}
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"{path} is not a readable checkpoint ({exc})") from exc
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path} is not a {FORMAT} file")
    theta, iteration = arrays["state_theta"], meta["iteration"]
    kind = meta.get("sgmcmc")
    state: State
    if kind == "sgld":
        state = sgmcmc.SGLDState(theta, iteration)
    elif kind == "sghmc":
        state = sgmcmc.SGHMCState(theta, arrays["state_momentum"], iteration)
    elif kind == "sgnht":
        state = sgmcmc.SGNHTState(theta, arrays["state_momentum"], arrays["state_thermostat"], iteration)
    else:
        state = mh.MHState(theta, arrays["state_log_prior"], iteration)
        if meta["expfam"] is not None:
            state = expfam.ExpFamState(state, arrays["stats"], meta["expfam"]["stats_start"],
                                       meta["expfam"]["stats_var"])
    accepted = arrays["accepted"].copy() if "accepted" in arrays else None
    return Progress(meta["done"], meta["warmup"], state, meta["rng_state"], arrays["theta"].copy(), accepted,
                    arrays["queried"].copy(), meta["noise_sum"], meta["noise_count"], meta.get("excess_max", 0.0),
                    meta.get("excess_steps", 0))
