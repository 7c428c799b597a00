"""The optional per-owner axis of a query's θ arrays (docs/design.md §6, "Hierarchical
models (design)", "Requests carry each owner's block").

A kind's θ arrays (``theta``, ``theta_prop``) have shape ``(C, d)`` — one θ for every owner, a
flat model's request, unchanged — or ``(K, C, d)``: row k is owner k's local parameter φ_k
(owners in ``describe()`` order) and goes to owner k only. Transports split such a request
per host (``take_owners``), and a host per owner (``owner_rows``), so each owner validates,
digests and answers its own rows alone. Every other array is shared by all owners.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import InvalidRequest

#: the arrays that may carry a per-owner axis, in any kind that has them
THETA_ARRAYS = ("theta", "theta_prop")


def has_owner_axis(arrays: Mapping[str, Any], owners: int, label: str | None = None) -> bool:
    """Whether ``arrays`` carry one θ row per owner (every θ array 3-D with a leading axis of
    ``owners``); ``InvalidRequest`` when some θ arrays have it and others not, or the axis has
    another length."""
    if all(name not in arrays or _ndim(arrays[name]) != 3 for name in THETA_ARRAYS):
        return False  # the usual request: no θ array carries the axis
    dims = {name: _ndim(arrays[name]) for name in THETA_ARRAYS if name in arrays}
    per_owner = [name for name, ndim in dims.items() if ndim == 3]
    if len(per_owner) != len(dims):
        raise InvalidRequest(
            f"{', '.join(dims)} must all carry the per-owner axis (K, C, d) or none", label
        )
    for name in per_owner:
        rows = np.shape(arrays[name])[0]
        if rows != owners:
            raise InvalidRequest(
                f"{name} carries {rows} owner rows (K, C, d) for {owners} owners", label
            )
    return True


def _ndim(value: Any) -> int:
    """``np.ndim`` of ``value``, an array's without np.ndim's dispatch (every query asks)."""
    return value.ndim if isinstance(value, np.ndarray) else np.ndim(value)


def take_owners(arrays: Mapping[str, Any], index: Sequence[int]) -> dict[str, Any]:
    """The request for the owners ``index`` (in order): their rows of each θ array, every
    other array as it is. Use after ``has_owner_axis`` has said the axis is there."""
    return {
        name: np.asarray(value)[list(index)] if name in THETA_ARRAYS else value
        for name, value in arrays.items()
    }


def owner_rows(arrays: Mapping[str, Any], owners: int) -> list[dict[str, Any]]:
    """One flat request per owner: owner k's θ arrays ``(C, d)`` (row k), the rest shared."""
    return [
        {
            name: np.asarray(value)[k] if name in THETA_ARRAYS else value
            for name, value in arrays.items()
        }
        for k in range(owners)
    ]


def split_by_host(
    arrays: Mapping[str, Any], sizes: Sequence[int], label: str | None = None
) -> list[Mapping[str, Any]]:
    """The arrays each host receives, hosts holding ``sizes`` owners in ``describe()`` order:
    ``arrays`` itself for every host when no θ array carries the per-owner axis (a flat
    request, sent as it is), else each host's own owners' rows (``take_owners``)."""
    if not has_owner_axis(arrays, sum(sizes), label):
        return [arrays] * len(sizes)
    starts = np.cumsum([0, *sizes])
    return [take_owners(arrays, range(a, b)) for a, b in zip(starts[:-1], starts[1:])]
