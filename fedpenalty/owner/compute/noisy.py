"""Fresh answers that are an exact value per owner and key plus the session's noise (log
ratios, sufficient statistics): the ``pipeline.Fresh`` of those kinds."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..mechanism import HostNoise, Keys


class NoisyExact:
    """Noisy answers to ``keys`` from ``exact()`` ``(K, M, w)`` — every owner's exact values,
    computed once, and only when the first answer is asked for (after the charge's checks), noised
    at sd σ_k·``scale`` (``scale``: the answer unit, a clipped kind's clip)."""

    def __init__(
        self,
        noise: HostNoise,
        keys: Keys,
        kind: str,
        exact: Callable[[], np.ndarray],
        scale: float = 1.0,
    ) -> None:
        self._noise, self._keys, self._kind, self._scale = noise, keys, kind, scale
        self._exact = exact
        self._values: np.ndarray | None = None

    def values(self) -> np.ndarray:
        """The exact values ``(K, M, w)``; never released as they are."""
        if self._values is None:
            self._values = self._exact()
        return self._values

    def one(self, k: int, new: np.ndarray) -> np.ndarray:
        """Owner k's noisy answers ``(Σ new, w')`` to the keys selected by ``new``."""
        one = self.values()[k : k + 1, new]
        return self._noise.noisy(self._keys, self._kind, k, one, new, self._scale)[0]

    def every(self) -> np.ndarray:
        """Every owner's noisy answers ``(K, M, w')`` to every key."""
        return self._noise.noisy(self._keys, self._kind, None, self.values(), None, self._scale)
