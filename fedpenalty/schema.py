"""Field types shared by scenario files (``config.py``), owner files (``owner/owner_config.py``)
and ``common.Policy``, the one formatter that turns pydantic's ``ValidationError`` into a
one-line ``ConfigError`` naming the dotted key and what it allows, and the one reader of those
TOML files (``read_toml``).

Numbers are strict: ``true`` is never a number, NaN and ±inf are refused, an integer key refuses
``2.0``; an integer given for a float key becomes a float.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Collection
from pathlib import Path
from typing import Annotated, Any, TypeVar, get_type_hints

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PlainValidator,
    Tag,
    TypeAdapter,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from pydantic_core import PydanticCustomError

from .errors import ConfigError
from .models import base

#: The error type of a value a shared field type refuses; its message is "must be <allowed>".
_REFUSED = "refused"
_UNKNOWN = ("extra_forbidden", "unexpected_keyword_argument")

Root = TypeVar("Root", bound=BaseModel)
_FIELD_ADAPTERS: dict[type, dict[str, TypeAdapter[Any]]] = {}


def refusal(phrase: str) -> WrapValidator:
    """Field metadata: every refusal of the annotated type reads "must be ``phrase``"."""

    def rephrase(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError(_REFUSED, "must be {allowed}", {"allowed": phrase}) from None

    return WrapValidator(rephrase)


def one_of(*names: str) -> PlainValidator:
    """Field metadata of ``Annotated[str, one_of(...)]``: exactly one of ``names``."""
    return entry_of(names)


def entry_of(registry: Collection[str]) -> PlainValidator:
    """Field metadata of ``Annotated[str, entry_of(REGISTRY)]``: a name in ``registry`` (a
    registry dict's keys) as it is when a value is validated, so that an entry added to the
    registry after this module is imported is accepted by the same one line."""

    def check(value: Any) -> str:
        if isinstance(value, str) and value in registry:
            return value
        phrase = f"one of {', '.join(map(repr, registry))}"
        raise PydanticCustomError(_REFUSED, "must be {allowed}", {"allowed": phrase})

    return PlainValidator(check)


_FINITE = Field(strict=True, allow_inf_nan=False)
_POSITIVE = Field(strict=True, allow_inf_nan=False, gt=0)
_POSITIVE_INT = Field(strict=True, gt=0)
_NON_EMPTY = Field(min_length=1)
_OR_LIST = " or a non-empty list of them"
_ONE_OR_LIST = Discriminator(lambda value: "list" if isinstance(value, list) else "one")

PositiveFloat = Annotated[float, _POSITIVE, refusal("a positive finite number")]
PositiveInt = Annotated[int, _POSITIVE_INT, refusal("a positive integer")]
NonNegativeInt = Annotated[int, Field(strict=True, ge=0), refusal("a non-negative integer")]
NonNegativeFloat = Annotated[
    float, Field(strict=True, allow_inf_nan=False, ge=0), refusal("a non-negative finite number")
]
Probability = Annotated[
    float, Field(strict=True, gt=0, lt=1), refusal("a number strictly between 0 and 1")
]
#: A Poisson sampling rate q ∈ (0, 1].
Rate = Annotated[float, Field(strict=True, gt=0, le=1), refusal("a number in (0, 1]")]
Bool = Annotated[bool, Field(strict=True), refusal("true or false")]
NonEmptyStr = Annotated[str, Field(strict=True, min_length=1), refusal("a non-empty string")]
Neighbour = Annotated[base.Neighbour, one_of(*base.NEIGHBOURS)]
#: A deployed owner's choice for secure sessions whose peers it cannot authenticate
#: (``Policy.unauthenticated_peers``).
PeerTrust = Annotated[str, one_of("refuse", "charge_own_noise")]
Paths = Annotated[
    list[Annotated[str, Field(strict=True, min_length=1)]],
    refusal("a list of file paths (CSV or NPZ, one per owner)"),
]
# One value, or a non-empty list of them (one per owner or per dimension); a bad list item is
# named by its index.
PositiveFloats = Annotated[
    Annotated[float, _POSITIVE, refusal(f"a positive finite number{_OR_LIST}"), Tag("one")]
    | Annotated[list[PositiveFloat], _NON_EMPTY, Tag("list")],
    _ONE_OR_LIST,
]
PositiveInts = Annotated[
    Annotated[int, _POSITIVE_INT, refusal(f"a positive integer{_OR_LIST}"), Tag("one")]
    | Annotated[list[PositiveInt], _NON_EMPTY, Tag("list")],
    _ONE_OR_LIST,
]
FiniteFloats = Annotated[
    Annotated[float, _FINITE, refusal(f"a finite number{_OR_LIST}"), Tag("one")]
    | Annotated[
        list[Annotated[float, _FINITE, refusal("a finite number")]], _NON_EMPTY, Tag("list")
    ],
    _ONE_OR_LIST,
]


class Section(BaseModel):
    """A TOML table whose keys are exactly its fields."""

    model_config = ConfigDict(extra="forbid")


#: the first bytes of every SQLite database (an owner's ledger given where a TOML file belongs)
_SQLITE_HEADER = b"SQLite format 3\x00"


def read_toml(path: str | Path, what: str, ledger_hint: str = "") -> dict[str, Any]:
    """The parsed TOML of the ``what`` file ``path`` (a scenario, an owner file); otherwise a
    ``ConfigError`` that says why not: unreadable, an SQLite database (``ledger_hint`` says
    where a ledger goes instead), not UTF-8 text, or not valid TOML."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from exc
    if data.startswith(_SQLITE_HEADER):
        raise ConfigError(
            f"{path} is an SQLite database (an owner's ledger?), not a TOML {what}{ledger_hint}"
        )
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not a text file (a {what} is TOML): {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc


def validate_file(root: type[Root], raw: Any) -> Root:
    """``raw`` (a parsed TOML file: section → key → value) as ``root``, whose fields are its
    sections; ``ConfigError`` with one line on the first problem."""
    try:
        return root.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_message(root, exc)) from None


def check_fields(obj: Any, section: str) -> None:
    """Validate each field of the frozen dataclass ``obj`` by its annotated type and store the
    canonical value (an int given for a float becomes a float); ``ConfigError`` naming
    ``section.field`` otherwise."""
    cls = type(obj)
    if cls not in _FIELD_ADAPTERS:
        hints = get_type_hints(cls, include_extras=True)
        _FIELD_ADAPTERS[cls] = {f.name: TypeAdapter(hints[f.name]) for f in dataclasses.fields(cls)}
    for key, adapter in _FIELD_ADAPTERS[cls].items():
        try:
            object.__setattr__(obj, key, adapter.validate_python(getattr(obj, key)))
        except ValidationError as exc:
            raise ConfigError(_describe(f"{section}.{key}", exc.errors()[0])) from None


def _keys(section_type: Any) -> list[str]:
    if dataclasses.is_dataclass(section_type):
        return [f.name for f in dataclasses.fields(section_type)]
    return list(section_type.model_fields)


def _message(root: type[BaseModel], exc: ValidationError) -> str:
    """Unknown sections first, then whole sections, then unknown keys, then values."""
    error = min(exc.errors(), key=lambda e: (len(e["loc"]) > 1, e["type"] not in _UNKNOWN))
    loc, kind = error["loc"], error["type"]
    if not loc:
        return _describe("the file", error)
    section = str(loc[0])
    if len(loc) == 1:
        if kind in _UNKNOWN:
            return f"unknown section [{section}]; allowed sections: {', '.join(root.model_fields)}"
        if kind == "missing":
            return f"needs a [{section}] table"
        return f"[{section}] must be a table of keys, got {error['input']!r}"
    section_type: Any = root.model_fields[section].annotation
    key = str(loc[1])
    if kind in _UNKNOWN:
        return (
            f"unknown key {section}.{key}; allowed keys in [{section}]: "
            f"{', '.join(_keys(section_type))}"
        )
    if kind == "missing":
        return f"[{section}] needs {key}: {section_type.model_fields[key].description}"
    return _describe(
        f"{section}.{key}" + "".join(f"[{i}]" for i in loc[2:] if isinstance(i, int)), error
    )


def _describe(name: str, error: Any) -> str:
    if error["type"] == _REFUSED:
        return f"{name} {error['msg']}, got {error['input']!r}"
    if error["type"] == "too_short":
        return f"{name} must not be an empty list"
    msg = error["msg"]
    return f"{name}: {msg[:1].lower()}{msg[1:]}, got {error['input']!r}"
