"""The coordinator's check that a remote owner serves the scenario's model (docs/design.md §6,
"Writing a model"): pure, and it never imports or looks up anything the owner names.

An owner describes its model as a name and a parameter table (``OwnerDescription.model`` and
``.model_params``, from JSON on the wire). The coordinator already holds the model it wants;
the owner's name is only compared with that model's name, and the owner's parameters are only
resolved by the coordinator's own model class. So a description naming ``"os:system"`` or any
other module path is refused as a different model, with no import and no registry lookup.
The owner's code digest is compared with the digest of the coordinator's own model code.

The owner's side of the same check is ``check_session_model``: a session request names the
coordinator's model (``ModelIdentity``), and the owner refuses a different one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import ConfigError, InvalidRequest
from .base import Model
from .registry import model_digest


class DescribedModel(Protocol):
    """What an owner says about its model (``common.OwnerDescription`` has these fields)."""

    @property
    def name(self) -> str: ...  # the owner's name

    @property
    def model(self) -> str: ...  # the model's registry name, as the owner sent it

    @property
    def model_params(self) -> Any: ...  # the model's [model] keys, decoded from JSON

    @property
    def model_digest(self) -> str: ...  # its code digest ("": an older owner sent none)


@dataclass(frozen=True)
class ModelIdentity:
    """A model as a session request names it: ``name``, ``params`` (its ``params()`` as JSON
    gives them back) and ``digest`` (``model_digest``, sha256 hex of its code)."""

    name: str
    params: dict[str, Any]
    digest: str

    @classmethod
    def of(cls, model: Model) -> ModelIdentity:
        return cls(model.name, json.loads(json.dumps(model.params())), model_digest(model))

    def __str__(self) -> str:
        return f"{self.name!r} with {self.params} (code digest {self.digest[:12]})"


def check_session_model(asked: ModelIdentity | None, model: Model, owner: str) -> None:
    """``InvalidRequest`` naming both models unless the session's ``asked`` model is the
    owner's ``model`` (name, parameters and code digest). ``None`` (an older client that names
    none) is accepted: the owner answers with its own model code and parameters and charges
    by its own sensitivity whatever the coordinator believes, so the check only saves a run
    whose answers would mean something else to the coordinator."""
    if asked is None:
        return
    own = ModelIdentity.of(model)
    if asked != own:
        raise InvalidRequest(
            f"this owner runs model {own}; the session asks for model {asked}: the "
            "coordinator's [model] (name, parameters and model code) must be the owner's",
            owner,
        )


def check_owner_model(owner: DescribedModel, model: Model) -> None:
    """``ConfigError`` unless ``owner`` describes exactly ``model``: the same name,
    parameters that ``model``'s own class resolves to ``model.params()``, and the same code
    digest (an owner that sends none, an older one, is not compared)."""
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
    digest = owner.model_digest
    if digest and digest != model_digest(model):
        raise ConfigError(
            f"owner {owner.name!r} runs {model.name} code with digest {digest[:12]}, this "
            f"coordinator's has {model_digest(model)[:12]}: the two run different versions of "
            "the model's code (install the same version on both sides)"
        )
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
