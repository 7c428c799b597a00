"""The network a run's owners sit on (docs/design.md §5, "Protocol cost"): the ``[network]``
scenario section and the model that prices one query on it.

One query is one round trip to every owner at once; the iteration waits for the slowest
owner. Owner k's time for query q is

    t_kq = c_kq + 2·L_k + s_kq + b_down,kq/B_down + b_up,kq/B_up

with c_kq its compute (seconds), L_k its one-way latency, s_kq the straggler delay (the extra
delay with probability p, else 0), b the bytes it receives and sends and B its downlink and
uplink bandwidth (bytes/s; unset: unlimited). The query costs max_k t_kq.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from pydantic import Field, field_validator

from ..errors import ConfigError
from ..schema import NonNegativeFloat, PositiveFloat, Section, refusal

#: z of the normal's 95th percentile: a log-normal latency with median m and p95 P has
#: log-sd ln(P/m)/Z95.
Z95 = 1.6448536269514722
UnitInterval = Annotated[float, Field(strict=True, ge=0, le=1), refusal("a number in [0, 1]")]


class NetworkSection(Section):
    """``[network]``: unset ``latency_ms`` (the default) models no network."""

    latency_ms: float | list[float] | dict[str, float] | None = Field(
        default=None,
        description="one-way latency per owner in ms: a number, one per owner, or "
        "{median, p95} (log-normal, drawn once per owner from run.seed); unset: no network",
    )
    bandwidth_up_mbps: PositiveFloat | None = Field(
        default=None, description="each owner's uplink in Mbit/s (unset: unlimited)"
    )
    bandwidth_down_mbps: PositiveFloat | None = Field(
        default=None, description="each owner's downlink in Mbit/s (unset: unlimited)"
    )
    straggler_probability: UnitInterval = Field(
        default=0.0, description="chance that an owner's reply to one request is delayed"
    )
    straggler_delay_ms: NonNegativeFloat = Field(
        default=0.0, description="extra delay of a straggler, ms"
    )

    @field_validator("latency_ms")
    @classmethod
    def _latency(cls, value: Any) -> Any:
        """Non-negative finite numbers; a distribution names exactly median ≤ p95."""
        if isinstance(value, dict):
            if set(value) != {"median", "p95"}:
                raise ValueError(f"a latency distribution is {{median, p95}}, not {sorted(value)}")
            if not 0 < value["median"] <= value["p95"]:
                raise ValueError("a latency distribution needs 0 < median ≤ p95")
        values = value.values() if isinstance(value, dict) else np.atleast_1d(value or 0.0)
        if not all(np.isfinite(v) and v >= 0 for v in values):
            raise ValueError("latencies must be finite and ≥ 0 ms")
        return value


@dataclass(frozen=True)
class Network:
    """A network of K owners: one-way ``latency`` ``(K,)`` s, ``up``/``down`` bandwidth in
    bytes/s (inf: unlimited), straggler ``probability`` and ``delay`` s."""

    latency: np.ndarray
    up: float = np.inf
    down: float = np.inf
    probability: float = 0.0
    delay: float = 0.0

    @classmethod
    def uniform(cls, latency_ms: float, owners: int) -> Network:
        """Every owner at ``latency_ms`` one way, unlimited bandwidth, no stragglers."""
        return cls(np.full(owners, latency_ms / 1e3))

    def owner_seconds(
        self,
        compute: np.ndarray,
        received: np.ndarray,
        sent: np.ndarray,
        rng: np.random.Generator,
    ) -> np.ndarray:
        """Each owner's time for one query: ``compute`` s, bytes ``received`` and ``sent``,
        all ``(K,)`` (or broadcastable); straggling drawn from ``rng``."""
        late = rng.random(self.latency.shape) < self.probability if self.probability else 0.0
        transfer = received / self.down + sent / self.up
        return compute + 2 * self.latency + transfer + late * self.delay

    def query_seconds(self, *args: Any) -> float:
        """The time of one query: its slowest owner's (``owner_seconds``)."""
        return float(np.max(self.owner_seconds(*args)))


def network_of(section: Mapping[str, Any], owners: int, seed: int | None) -> Network | None:
    """The ``[network]`` section as a ``Network`` of ``owners`` owners (None: no latency set);
    ``ConfigError`` naming the key when a per-owner list has another length."""
    latency = section["latency_ms"]
    if latency is None:
        return None
    if isinstance(latency, dict):
        sd = np.log(latency["p95"] / latency["median"]) / Z95
        rng = np.random.default_rng(np.random.SeedSequence([seed or 0, 0x4E455457]))
        ms = latency["median"] * np.exp(sd * rng.standard_normal(owners))
    elif isinstance(latency, list):
        if len(latency) != owners:
            raise ConfigError(
                f"network.latency_ms lists {len(latency)} latencies for {owners} owners: give "
                "one per owner, one number, or {median, p95}"
            )
        ms = np.asarray(latency, dtype=float)
    else:
        ms = np.full(owners, float(latency))

    def rate(mbps: float | None) -> float:
        return np.inf if mbps is None else mbps * 1e6 / 8

    return Network(
        ms / 1e3,
        rate(section["bandwidth_up_mbps"]),
        rate(section["bandwidth_down_mbps"]),
        section["straggler_probability"],
        section["straggler_delay_ms"] / 1e3,
    )
