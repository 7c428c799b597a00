"""Request validation of one owner host: what every query's arguments must satisfy before
anything is computed or charged (docs/design.md §3). Every refusal is an ``InvalidRequest``
naming the owner whose limit it passes (or the host, for a malformed request)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import InvalidRequest
from .node import OwnerNode
from .noise.sources import MAX_CHAIN


class StepLimits:
    """The steps ‖θ' − θ‖ one session's owners admit: each owner's [min_step, max_step], the
    max_step lowered to what the session declared ``declared`` ``(K,)``."""

    def __init__(
        self, names: list[str], min_step: np.ndarray, max_step: np.ndarray, declared: np.ndarray
    ):
        self.names = names
        self.min_step = min_step
        self.limit = np.minimum(max_step, declared)
        self.declared = declared < max_step
        self.shortest, self.longest = float(self.min_step.max()), float(self.limit.min())

    def check(self, theta: np.ndarray, theta_prop: np.ndarray) -> np.ndarray:
        """‖θ' − θ‖ per chain ``(C,)``; ``InvalidRequest`` unless every step lies within each
        owner's [min_step, max_step] and the session's declared step (a step below min_step —
        θ' = θ included — carries almost no information and is refused rather than answered
        for free). Two comparisons whatever the number of owners; the owner is found only for
        the error."""
        diff = theta_prop - theta
        step = np.sqrt(np.add.reduce(diff * diff, axis=1))  # as np.linalg.norm(axis=1)
        steps = step.tolist()  # a few chains: Python's max and min are cheaper than numpy's
        longest, shortest = max(steps), min(steps)
        if longest > self.longest * (1 + 1e-12):
            k = int(np.argmax(longest > self.limit * (1 + 1e-12)))
            whose = (
                "the session's declared max_step" if self.declared[k] else "this owner's max_step"
            )
            raise InvalidRequest(
                f"step ‖θ'−θ‖ = {longest:.6g} exceeds {whose} {self.limit[k]:g}", self.names[k]
            )
        if shortest < self.shortest:
            k = int(np.argmax(shortest < self.min_step))
            raise InvalidRequest(
                f"step ‖θ'−θ‖ = {shortest:.6g} is below this owner's min_step {self.min_step[k]:g}",
                self.names[k],
            )
        return step


class RequestChecks:
    """The checks of one host's requests, from its owners' policies (``label`` names the host
    in errors that concern no single owner)."""

    def __init__(self, nodes: Sequence[OwnerNode], label: str):
        self.nodes = list(nodes)
        self.label = label
        self.model = nodes[0].model
        self.names = [n.name for n in nodes]
        self._max_step = np.array([n.policy.max_step for n in nodes])
        self._min_step = np.array([n.policy.min_step for n in nodes])
        # per-record terms one chain costs each owner, and the most it computes per request
        self._records = np.array([len(n.records) for n in nodes])
        self._max_work = np.array([n.policy.max_record_evaluations for n in nodes])
        self._max_answers = min(n.policy.max_answers_per_request for n in nodes)

    def step_limits(self, declared: np.ndarray) -> StepLimits:
        """What steps a session whose owners declared ``declared`` ``(K,)`` admits."""
        return StepLimits(self.names, self._min_step, self._max_step, declared)

    def work(self, chains: int) -> None:
        """``InvalidRequest`` before any work when chains × records would pass an owner's
        ``max_record_evaluations`` (per-record log-ratios and gradients)."""
        over = chains * self._records > self._max_work
        if over.any():
            k = int(np.argmax(over))
            raise InvalidRequest(
                f"request asks for {chains} chains × {self._records[k]} records = "
                f"{chains * self._records[k]} per-record evaluations; this owner computes at most "
                f"{self._max_work[k]} per request (max_record_evaluations)",
                self.names[k],
            )

    def clip(self, clip: Any) -> float:
        """``clip`` as a float; ``InvalidRequest`` unless positive, finite and within every
        owner's ``max_clip``."""
        number = isinstance(clip, (int, float, np.floating)) and not isinstance(clip, bool)
        if not number or not 0 < clip < np.inf:
            raise InvalidRequest(f"clip must be a positive finite number, got {clip!r}", self.label)
        for node in self.nodes:
            low, high = node.policy.min_clip, node.policy.max_clip
            if not low <= clip <= high:
                if clip > high:
                    which = f"exceeds this owner's max_clip {high:g}"
                else:
                    which = f"is below this owner's min_clip {low:g}"
                raise InvalidRequest(f"clip {clip:g} {which}", node.name)
        return float(clip)

    def sampling_rate(self, opened: list) -> float:
        """The one Poisson rate q the owners' open gradient sessions ``opened`` share;
        ``InvalidRequest`` when they differ."""
        rates = {o.sampling_rate for o in opened}
        if len(rates) != 1:
            raise InvalidRequest(
                f"the owners of one host must share a session's sampling rate, got {sorted(rates)}",
                self.label,
            )
        return rates.pop()

    def index(self, what: str, value: Any) -> int:
        """``value`` as an int in [0, 2⁶²) (an iteration, a start, a block)."""
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, np.integer))
            or not 0 <= value < 2**62
        ):
            raise InvalidRequest(
                f"{what} must be a non-negative integer, got {value!r}", self.label
            )
        return int(value)

    def chains(self, chains: Any, per_chain: int = 1) -> np.ndarray:
        """Distinct chain ids ``(C,)`` int64 below 2²⁹, at most the owners' answers per request
        counting ``per_chain`` answers each."""
        arr = np.asarray(chains)
        if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu":
            raise InvalidRequest("chains must be a non-empty 1-D array of integers", self.label)
        lowest, highest, distinct = _spread(arr)
        if lowest < 0 or not distinct:
            raise InvalidRequest("chains must be distinct non-negative integers", self.label)
        if highest >= MAX_CHAIN:  # the noise streams' chain address space
            raise InvalidRequest(
                f"chain ids must be below 2^29 = {MAX_CHAIN}, got {highest}", self.label
            )
        if arr.size * per_chain > self._max_answers:
            raise InvalidRequest(
                f"request asks for {arr.size * per_chain} answers; this owner answers at most "
                f"{self._max_answers} per request",
                self.label,
            )
        return arr.astype(np.int64)

    def moves(
        self, arrays: Mapping[str, Any], chains: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``arrays``' ``theta`` and ``theta_prop`` as ``theta`` checks them, and their rows side
        by side ``(chains, 2d)`` (what a move's digest hashes, ``row_digests``): one Θ check of
        both in the usual case; ``theta``'s own checks find the error otherwise."""
        theta = _floats(arrays["theta"])
        theta_prop = _floats(arrays["theta_prop"])
        shape = (chains, self.model.dim)
        usual = theta is not None and theta_prop is not None
        if usual and theta.shape == shape and theta_prop.shape == shape:  # type: ignore[union-attr]
            pairs = np.concatenate([theta, theta_prop], axis=1)
            inside = self.model.in_theta_space(pairs.reshape(2 * chains, -1))
            if np.count_nonzero(inside) == inside.size:  # .all(), without its reduction's cost
                return theta, theta_prop, pairs  # type: ignore[return-value]
        theta = self.theta("theta", arrays["theta"], chains)
        theta_prop = self.theta("theta_prop", arrays["theta_prop"], chains)
        return theta, theta_prop, np.concatenate([theta, theta_prop], axis=1)

    def theta(self, what: str, theta: Any, chains: int) -> np.ndarray:
        """``theta`` as floats ``(chains, d)`` inside Θ (finite)."""
        arr = _floats(theta)
        if arr is None or arr.shape != (chains, self.model.dim):
            raise InvalidRequest(
                f"{what} must have shape ({chains}, {self.model.dim}), got "
                f"{None if arr is None else arr.shape}",
                self.label,
            )
        if not self.model.in_theta_space(arr).all():  # NaN and inf are outside Θ too
            if not np.isfinite(arr).all():
                raise InvalidRequest(f"{what} contains NaN or inf", self.label)
            raise InvalidRequest(
                f"{what} lies outside Θ = [-{self.model.theta_bound:g}, "
                f"{self.model.theta_bound:g}]^"
                f"{self.model.dim}",
                self.label,
            )
        return arr


def _floats(values: Any) -> np.ndarray | None:
    """``values`` as a float array (None: not numbers)."""
    try:
        return np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        return None


def row_digests(tag: bytes, rows: np.ndarray) -> list[bytes]:
    """SHA-256 of ``tag`` and each row of ``rows`` ``(M, w)`` as little-endian float64: one
    query digest per key (docs/design.md §3, invariant 2). Each row's hash continues a copy
    of the tag's (kept per tag): the same digest as hashing tag + row."""
    prefix = _TAG_HASHES.get(tag)
    if prefix is None:
        if len(_TAG_HASHES) >= 64:  # a tag may carry a request's clip: keep a few
            _TAG_HASHES.clear()
        prefix = _TAG_HASHES[tag] = hashlib.sha256(tag)
    raw = np.ascontiguousarray(rows, dtype="<f8").tobytes()
    width = len(raw) // len(rows)
    digests = []
    for i in range(0, len(raw), width):
        row = prefix.copy()
        row.update(raw[i : i + width])
        digests.append(row.digest())
    return digests


#: SHA-256 of the digest tags asked lately (a kind's, with a clip for some kinds; 64 at most)
_TAG_HASHES: dict[bytes, Any] = {}


def _spread(ids: np.ndarray) -> tuple[int, int, bool]:
    """The lowest and highest of a non-empty 1-D int array and whether its values are
    distinct: in Python ints for the usual few chains (a few µs cheaper than numpy's sort),
    by numpy's sort for many (np.unique hashes: ~10x slower for a few)."""
    if ids.size <= 16:
        values = ids.tolist()
        return min(values), max(values), len(set(values)) == len(values)
    ordered = np.sort(ids)
    return int(ordered[0]), int(ordered[-1]), not bool((ordered[1:] == ordered[:-1]).any())
