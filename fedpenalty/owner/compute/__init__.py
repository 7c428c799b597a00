"""Per-kind computation of an owner host's answers (docs/design.md §4): one module a query
kind — ``log_ratio`` (clipped log-likelihood-ratio sums), ``suff_stats`` (sufficient-statistic
copies), ``gradient`` (clipped, Poisson-subsampled gradient sums). Each exposes one object of
the same shape, ``Compute``: its noise-stream ``kind`` and ``fresh(noise, keys, query)``, the
request's fresh noisy answers (``pipeline.Fresh``), computed only when the pipeline asks."""

from __future__ import annotations

from typing import Protocol, TypeVar

from ..mechanism import HostNoise, Keys
from ..pipeline import Fresh

Q = TypeVar("Q", contravariant=True)


class Compute(Protocol[Q]):
    """One query kind's computation: ``kind`` labels its noise streams; ``fresh`` gives the
    answers to ``keys`` of a validated ``query`` (the kind's own value object)."""

    kind: str

    def fresh(self, noise: HostNoise, keys: Keys, query: Q) -> Fresh: ...
