"""Which chains of a clipped query need no per-record pass (docs/design.md §2.9, "Answers
without the per-record pass"): where the model certifies from its data domain that no record's
term can reach the clip, the clipped sum is the plain sum, which an exponential-family model
gives from the owner's Σ S(x) in O(s) instead of O(n·d). Same mathematics; the answers differ
from the per-record path only by float summation order."""

from __future__ import annotations

import numpy as np

from ...models import ExpFamModel
from ..node import OwnerNode

#: A certified bound must sit this far (relative) below the clip: the per-record path's
#: rounding of a norm or difference exactly at the clip could still count it as bound.
MARGIN = 1e-9


def clip_free(node: OwnerNode, bound: np.ndarray | None, clip: np.ndarray) -> np.ndarray:
    """``(C,)`` bool: chains whose clip ``clip`` ``(C,)`` cannot bind on any of ``node``'s
    records by the model's certified ``bound`` ``(C,)`` (None: none certified), for an
    exponential-family owner that keeps Σ S(x) and asked for no per-record evaluation
    (``OwnerNode.per_record``)."""
    usable = isinstance(node.model, ExpFamModel) and node.stat_sum is not None
    if bound is None or not usable or node.per_record:
        return np.zeros(len(clip), dtype=bool)
    return np.asarray(bound, dtype=float) <= clip * (1.0 - MARGIN)
