"""Checkpoints of a running chain: state, chain RNG state and the draws so far, in one file.

The file is replaced atomically (write a temporary file beside it, fsync, rename), so a crash
at any moment leaves either the previous checkpoint or the new one, never a torn file.
Resuming from it with the same owners gives exactly the chain of an uninterrupted run: the
RNG restarts where it was, so the re-run iterations ask the same questions, and the owners
replay their stored answers for them (docs/design.md §3 invariant 2, §4).
"""

from __future__ import annotations

import json
import os
import tempfile
import typing
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .algorithms import ALGORITHMS
from .base import ChainAlgorithm
from .driver import Progress

#: 3: MH states carry their step adaptation (``tuning``); a checkpoint of format 2 predates it.
#: A state field with a default that a checkpoint lacks (written before the field existed, e.g.
#: DP-HMC's ``metric``, the identity mass matrix runs had before it) takes its default.
#: The buffers of a kernel's further kept info fields (``Progress.stats``) are saved as arrays
#: ``stats.<name>``; a checkpoint without them reads as a kernel that has none.
FORMAT = "fedpenalty-checkpoint-3"
#: The array-name prefix of ``Progress.stats`` buffers.
STATS = "stats."


def state_classes() -> dict[str, type]:
    """Every registered chain state class by name (read from ``ALGORITHMS`` when asked, so a
    kernel registered later is included): a checkpoint names its state class, and only these
    load."""
    return {
        a.state.__qualname__: a.state for a in ALGORITHMS.values() if isinstance(a, ChainAlgorithm)
    }


def _flatten(
    state: Any, prefix: str, arrays: dict[str, np.ndarray], scalars: dict[str, Any]
) -> None:
    """Every field of a (nested) state dataclass: arrays into ``arrays``, numbers into
    ``scalars``, keyed ``prefix.field``."""
    for f in fields(state):
        value, key = getattr(state, f.name), f"{prefix}.{f.name}"
        if is_dataclass(value):
            _flatten(value, key, arrays, scalars)
        elif isinstance(value, np.ndarray):
            arrays[key] = value
        else:
            scalars[key] = value.item() if isinstance(value, np.generic) else value


def _unflatten(
    cls: type, prefix: str, arrays: dict[str, np.ndarray], scalars: dict[str, Any]
) -> Any:
    """The state dataclass ``cls`` from what ``_flatten`` wrote; a field with a default that
    was not written (a checkpoint older than the field) keeps its default."""
    hints = typing.get_type_hints(cls)
    values = {}
    for f in fields(cls):
        key, kind = f"{prefix}.{f.name}", hints[f.name]
        has_default = f.default is not MISSING or f.default_factory is not MISSING
        if has_default and not _written(key, arrays, scalars):
            continue
        values[f.name] = (
            _unflatten(kind, key, arrays, scalars)
            if isinstance(kind, type) and is_dataclass(kind)
            else arrays[key]
            if key in arrays
            else scalars[key]
        )
    return cls(**values)


def _written(key: str, arrays: dict[str, np.ndarray], scalars: dict[str, Any]) -> bool:
    """Whether ``_flatten`` wrote the field ``key`` (itself, or any field nested in it)."""
    nested = key + "."
    return any(k == key or k.startswith(nested) for k in (*arrays, *scalars))


def save(path: Path, progress: Progress) -> None:
    """Write ``progress`` to ``path`` atomically."""
    arrays: dict[str, np.ndarray] = {"theta": progress.theta, "queried": progress.queried}
    if progress.accepted is not None:
        arrays["accepted"] = progress.accepted
    if progress.noise_draws is not None:
        arrays["noise_draws"] = progress.noise_draws
    arrays.update({STATS + name: buffer for name, buffer in progress.stats.items()})
    scalars: dict[str, Any] = {}
    _flatten(progress.state, "state", arrays, scalars)
    meta = {
        "format": FORMAT,
        "done": progress.done,
        "warmup": progress.warmup,
        "rng_state": progress.rng_state,
        "noise_sum": progress.noise_sum,
        "noise_count": progress.noise_count,
        "excess_max": progress.excess_max,
        "excess_steps": progress.excess_steps,
        "state_class": type(progress.state).__qualname__,
        "state_scalars": scalars,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, meta=np.array(json.dumps(meta)), **arrays)  # type: ignore[arg-type]  # numpy's stub
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
    state_class = state_classes().get(meta.get("state_class", ""))
    if state_class is None:
        raise ValueError(f"{path} holds a chain state of unknown kind {meta.get('state_class')!r}")
    state = _unflatten(state_class, "state", arrays, meta["state_scalars"])
    accepted = arrays["accepted"].copy() if "accepted" in arrays else None
    return Progress(
        meta["done"],
        meta["warmup"],
        state,
        meta["rng_state"],
        arrays["theta"].copy(),
        accepted,
        arrays["queried"].copy(),
        meta["noise_sum"],
        meta["noise_count"],
        meta["excess_max"],
        meta["excess_steps"],
        arrays["noise_draws"].copy() if "noise_draws" in arrays else None,
        {k.removeprefix(STATS): v.copy() for k, v in arrays.items() if k.startswith(STATS)},
    )
