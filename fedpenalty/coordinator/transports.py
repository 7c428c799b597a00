"""The transport registry: what ``run.transport`` selects (docs/design.md §6). A transport is
one module defining a ``Transport`` (``transport_base.py``) plus one line here; every
transport's oracle passes the same contract tests (tests/test_oracle_contract.py). A transport
with ``[run]`` keys of its own carries their settings model (``transport_settings.py``).
"""

from __future__ import annotations

from dataclasses import replace

from .grpc_oracle import GRPC
from .inprocess import INPROCESS
from .ray_oracle import RAY
from .transport_base import Transport
from .transport_settings import GrpcSettings, RaySettings

TRANSPORTS: dict[str, Transport] = {
    t.name: t
    for t in (
        INPROCESS,
        replace(GRPC, options=GrpcSettings),
        replace(RAY, options=RaySettings),
    )
}
