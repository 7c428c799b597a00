"""The ``[run]`` keys of each transport that has its own (docs/design.md §6): the settings
models the registry (``transports.py``) attaches to its entries. ``config.py`` assembles the
scenario's flat ``[run]`` section from the generic keys and these; a launch reads its values
from ``OwnerSetup.run`` as before.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, PlainValidator
from pydantic_core import PydanticCustomError

from ..cluster.ray_hosts import check_address
from ..schema import NonNegativeInt, PositiveFloat, Section


def _ray_address(value: Any) -> str:
    if not isinstance(value, str):
        raise PydanticCustomError("refused", "must be {allowed}", {"allowed": "a string"})
    try:
        return check_address(value)
    except ValueError as exc:
        allowed = str(exc).removeprefix("must be ")
        raise PydanticCustomError("refused", "must be {allowed}", {"allowed": allowed}) from None


#: ``run.ray_address``: '' (a local Ray), 'auto', 'host:port' or 'ray://host[:port]'.
RayAddress = Annotated[str, PlainValidator(_ray_address)]


class GrpcSettings(Section):
    """The ``[run]`` keys of the ``grpc`` transport."""

    owner_hosts: NonNegativeInt = Field(
        default=0,
        description="grpc simulate: owner host processes (0: one per CPU core but the "
        "coordinator's)",
    )
    retry_seconds: PositiveFloat = Field(
        default=20.0,
        description="grpc: how long an unreachable owner is retried before the run stops",
    )


class RaySettings(Section):
    """The ``[run]`` keys of the ``ray`` transport."""

    ray_address: RayAddress = Field(
        default="",
        description="ray: '' starts a local Ray sized to the machine (stopped at the end); "
        "'auto', 'host:port' or 'ray://host[:port]' connect to an existing Ray cluster",
    )
    ray_actors: NonNegativeInt = Field(
        default=0, description="ray: owner-host actors (0: one per free CPU of the cluster)"
    )
    ray_actor_cpus: PositiveFloat = Field(
        default=1.0, description="ray: CPUs each owner-host actor reserves (may be fractional)"
    )
