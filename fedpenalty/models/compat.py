"""The coordinator's check that a remote owner serves the scenario's model (docs/design.md §6,
"Writing a model"): pure, and it never imports or looks up anything the owner names.

An owner describes its model as a name and a parameter table (``OwnerDescription.model`` and
``.model_params``, from JSON on the wire). The coordinator already holds the model it wants;
the owner's name is only compared with that model's name, and the owner's parameters are only
resolved by the coordinator's own model class. So a description naming ``"os:system"`` or any
other module path is refused as a different model, with no import and no registry lookup.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ..errors import ConfigError
from .base import Model


class DescribedModel(Protocol):
    """What an owner says about its model (``common.OwnerDescription`` has these fields)."""

    @property
    def name(self) -> str: ...  # the owner's name

    @property
    def model(self) -> str: ...  # the model's registry name, as the owner sent it

    @property
    def model_params(self) -> Any: ...  # the model's [model] keys, decoded from JSON


def check_owner_model(owner: DescribedModel, model: Model) -> None:
    """``ConfigError`` unless ``owner`` describes exactly ``model``: the same name, and
    parameters that ``model``'s own class resolves to ``model.params()``."""
    if not isinstance(owner.model, str) or owner.model != model.name:
        raise ConfigError(
            f"owner {owner.name!r} serves model {owner.model!r}, the scenario asks for "
            f"{model.name!r}"
        )
    params = owner.model_params
    if not isinstance(params, Mapping) or not all(isinstance(k, str) for k in params):
        raise ConfigError(
            f"owner {owner.name!r} describes {model.name} parameters that are not a table of "
            f"named keys: {params!r}"
        )
    try:
        theirs = type(model)(**params)
    except ConfigError as exc:
        raise ConfigError(
            f"owner {owner.name!r} describes a model this coordinator cannot build: {exc}"
        ) from exc
    if theirs != model:
        mine, other = model.params(), theirs.params()
        diff = [
            f"{k}: owner {other.get(k)!r} vs scenario {mine.get(k)!r}"
            for k in sorted(set(mine) | set(other))
            if mine.get(k) != other.get(k)
        ]
        raise ConfigError(
            f"owner {owner.name!r} has different {model.name} parameters: {'; '.join(diff)}"
        )


def check_owner_models(owners: Sequence[DescribedModel], model: Model) -> None:
    """``check_owner_model`` for each owner, in order (the first mismatch is raised)."""
    for owner in owners:
        check_owner_model(owner, model)
