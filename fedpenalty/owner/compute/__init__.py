"""Per-kind computation of an owner host's answers (docs/design.md §4): one module a query
kind — ``log_ratio`` (clipped log-likelihood-ratio sums), ``suff_stats`` (sufficient-statistic
copies), ``gradient`` (clipped, Poisson-subsampled gradient sums). Each exposes one object of
the same shape, ``Compute``: its noise-stream ``kind`` and ``fresh(noise, keys, query)``, the
request's fresh noisy answers (``Fresh``), computed only when the answer pipeline
(``pipeline.py``) asks for them."""

from __future__ import annotations

from typing import Protocol, TypeVar

import numpy as np

from ..mechanism import HostNoise, Keys

Q = TypeVar("Q", contravariant=True)


class Fresh(Protocol):
    """A request's fresh noisy answers, computed only when the pipeline asks for them (after
    the charge's checks): ``one(k, new)`` owner k's answers ``(Σ new, w')`` to the keys
    selected by ``new`` ``(M,)`` bool; ``every()`` every owner's to every key ``(K, M, w')``
    (w' the stored width, ``Mechanism.width``)."""

    def one(self, k: int, new: np.ndarray) -> np.ndarray: ...

    def every(self) -> np.ndarray: ...


class Compute(Protocol[Q]):
    """One query kind's computation: ``kind`` labels its noise streams; ``fresh`` gives the
    answers to ``keys`` of a validated ``query`` (the kind's own value object)."""

    kind: str

    def fresh(self, noise: HostNoise, keys: Keys, query: Q) -> Fresh: ...
