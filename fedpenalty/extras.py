"""Optional dependencies: the packages of pyproject.toml's extras, imported only where they are
used. The core install (``pip install -e .``) runs ``simulate``, ``run``, ``owner serve`` and
``account``; Ray (``run.transport = "ray"``) and scikit-learn (``scenarios/wang_logistic.py``)
come with their extras, and asking for one that is not installed is a one-line error that
names the extra.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import ConfigError

#: Each optional top-level module: the package that provides it and the extra that installs it.
EXTRAS = {
    "ray": ("Ray", "ray"),
    "sklearn": ("scikit-learn", "scenarios"),
    "statsmodels": ("statsmodels", "scenarios"),
}


def require(module: str, purpose: str, otherwise: str = "") -> ModuleType:
    """``module`` imported, or a ``ConfigError`` saying that ``purpose`` (what asked for it,
    e.g. "run.transport = 'ray'") needs it, which extra installs it and, when given,
    ``otherwise``: what to change instead. A missing dependency of the module itself (a broken
    install) propagates as it is."""
    top = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != top:
            raise
        package, extra = EXTRAS[top]
        instead = f", or {otherwise}" if otherwise else ""
        raise ConfigError(
            f"{purpose} needs {package}, which is not installed: pip install "
            f"'fedpenalty[{extra}]' (in a clone: pip install -e '.[{extra}]'){instead}"
        ) from None
