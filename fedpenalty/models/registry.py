"""Where a ``[model] name`` leads (docs/design.md §6, "Writing a model"): a built-in model's
registry name, an entry point of the group ``fedpenalty.models`` (a package that ships models
declares ``[project.entry-points."fedpenalty.models"] NAME = "pkg.mod:Class"``), or a
``"package.module:Class"`` path imported with importlib. Only the name a scenario or an
OWNER.toml gives is ever resolved here; nothing a remote owner describes is (``compat.py``).

A module path that does not import as it stands is tried once more with the folders of
``search_folders`` (the scenario file's folder, set by ``config.load_scenario``) and the
working directory on ``sys.path``, so a model module next to its scenario file runs from that
folder. The loaded class's ``name`` is the name it was selected by (set here when the class
does not declare one), so a resolved scenario names it the same way.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import importlib
import importlib.metadata
import inspect
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from ..errors import ConfigError
from .base import Model

#: The entry-point group a package registers its models in.
ENTRY_POINT_GROUP = "fedpenalty.models"

_FOLDERS: contextvars.ContextVar[tuple[Path, ...]] = contextvars.ContextVar(
    "fedpenalty_model_folders", default=()
)


@contextlib.contextmanager
def search_folders(*folders: Path) -> Iterator[None]:
    """Within the block, a ``module:Class`` name that does not import as it stands is also
    looked up in ``folders`` (then the working directory)."""
    token = _FOLDERS.set(tuple(Path(f).resolve() for f in folders) + _FOLDERS.get())
    try:
        yield
    finally:
        _FOLDERS.reset(token)


def entry_point_names() -> list[str]:
    """The names of the installed ``fedpenalty.models`` entry points, sorted."""
    return sorted(ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def known_names(builtin: Mapping[str, type[Model]]) -> str:
    """The names a ``[model]`` table may give, for error messages."""
    names = [*sorted(builtin), *entry_point_names(), "'package.module:Class'"]
    return ", ".join(names)


def model_class(name: object, builtin: Mapping[str, type[Model]]) -> type[Model]:
    """The model class ``name`` selects: a key of ``builtin``, an entry point of
    ``ENTRY_POINT_GROUP``, or ``"package.module:Class"``. ``ConfigError`` naming
    ``model.name`` when it selects nothing or something that is not a ``Model`` subclass."""
    if isinstance(name, str) and name in builtin:
        return builtin[name]
    if not isinstance(name, str) or not name:
        raise ConfigError(
            f"[model] name must be a non-empty string, got {name!r}; "
            f"known models: {known_names(builtin)}"
        )
    if ":" in name:
        return _named(name, _import_path(name))
    found = [
        ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == name
    ]
    if not found:
        raise ConfigError(
            f"[model] unknown model name {name!r} (model.name); known models: "
            f"{known_names(builtin)}"
        )
    try:
        loaded = found[0].load()
    except Exception as exc:  # a broken third-party module: say which entry point
        raise ConfigError(
            f"[model] the {ENTRY_POINT_GROUP} entry point {name!r} = {found[0].value!r} "
            f"cannot be loaded: {type(exc).__name__}: {exc}"
        ) from exc
    return _named(name, _check_class(name, loaded))


def _import_path(name: str) -> type[Model]:
    """The class of a ``"package.module:Class"`` name (``Class`` may be dotted)."""
    module_name, _, attr = name.partition(":")
    if not module_name or not attr:
        raise ConfigError(
            f"[model] name {name!r} must be 'package.module:Class' (model.name), with both parts"
        )
    module = _import_module(module_name, name)
    obj: object = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(
                n for n, v in vars(module).items() if inspect.isclass(v) and not n.startswith("_")
            )
            raise ConfigError(
                f"[model] module {module_name!r} has no attribute {attr!r} (model.name = "
                f"{name!r}); its classes: {', '.join(public) or 'none'}"
            )
        obj = getattr(obj, part)
    return _check_class(name, obj)


def _import_module(module_name: str, name: str):
    """``module_name`` imported, trying the scenario's folder and the working directory when
    it is not importable as it stands."""
    top = module_name.split(".")[0]
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != top:  # the module exists but imports something missing
            raise _import_error(name, exc) from exc
    except Exception as exc:
        raise _import_error(name, exc) from exc
    folders = [str(f) for f in (*_FOLDERS.get(), Path.cwd())]
    saved = list(sys.path)
    sys.path[:0] = folders
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != top:
            raise _import_error(name, exc) from exc
        raise ConfigError(
            f"[model] no module named {module_name!r} (model.name = {name!r}); looked on "
            f"sys.path and in {', '.join(folders)}"
        ) from exc
    except Exception as exc:
        raise _import_error(name, exc) from exc
    finally:
        sys.path[:] = saved


def _import_error(name: str, exc: BaseException) -> ConfigError:
    return ConfigError(
        f"[model] importing {name!r} (model.name) failed: {type(exc).__name__}: {exc}"
    )


def _check_class(name: str, obj: object) -> type[Model]:
    """``obj`` when it is a concrete ``Model`` subclass; ``ConfigError`` otherwise."""
    if not (inspect.isclass(obj) and issubclass(obj, Model)):
        raise ConfigError(
            f"[model] {name!r} (model.name) is {obj!r}, not a subclass of "
            "fedpenalty.models.api.Model"
        )
    if inspect.isabstract(obj):
        missing = ", ".join(sorted(getattr(obj, "__abstractmethods__", ())))
        raise ConfigError(
            f"[model] {name!r} (model.name) does not implement: {missing} "
            "(docs/design.md §6, 'Writing a model')"
        )
    return obj


def _named(name: str, cls: type[Model]) -> type[Model]:
    """``cls`` with ``name`` as its model name (set when it declares none; a declared name
    must be the one it is selected by)."""
    declared = cls.__dict__.get("name")
    if declared is None:
        cls.name = name
    elif declared != name:
        raise ConfigError(
            f"[model] {name!r} (model.name) selects class {cls.__qualname__}, which declares "
            f"name = {declared!r}; select it as {declared!r} or drop its 'name'"
        )
    return cls


def model_digest(model: Model | type[Model]) -> str:
    """sha256 (hex) of the code of ``model``'s class: the module name and source bytes of each
    module of its package or of fedpenalty that defines a class in its method resolution order
    (for a built-in model: its module, ``api.py`` and ``base.py``). Equal digests: the same
    model code. ``ConfigError`` when a module's source file cannot be read."""
    return _class_digest(model if isinstance(model, type) else type(model))


@functools.lru_cache(maxsize=256)
def _class_digest(cls: type[Model]) -> str:
    """``model_digest`` of a class, taken once: the code as it was when first asked (a module
    edited later is new code only once it is imported again, as a new class)."""
    packages = {cls.__module__.split(".")[0], "fedpenalty"}
    modules = sorted({c.__module__ for c in cls.__mro__ if c.__module__.split(".")[0] in packages})
    h = hashlib.sha256()
    for module_name in modules:
        module = sys.modules.get(module_name)
        try:
            path = inspect.getsourcefile(module) if module is not None else None
            source = Path(path).read_bytes() if path else None
        except (OSError, TypeError):
            source = None
        if source is None:
            raise ConfigError(
                f"[model] {cls.name!r}: no source file for module {module_name!r}, so its "
                "code version (digest) cannot be taken; define the model in a .py file"
            )
        h.update(module_name.encode() + b"\0" + hashlib.sha256(source).digest())
    return h.hexdigest()
