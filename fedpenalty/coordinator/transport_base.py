"""What a transport is: how ``fedpenalty simulate`` starts its owners (``OwnerSetup``) and the
oracle that reaches them (``Launched``). The registry is ``transports.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..common import Policy
from ..extras import require
from ..models import Model
from ..schema import Section
from .base import NoSettings
from .oracle import Oracle


@dataclass(frozen=True)
class OwnerSetup:
    """A simulation's owners: ``names``, prepared ``records`` ``(n_k, p)``, ``policies`` and
    noise ``seeds`` in owner order, their ``model``, the run directory ``folder`` for ledgers
    and host files, and the ``[run]`` section."""

    folder: Path
    model: Model
    names: Sequence[str]
    records: Sequence[np.ndarray]
    policies: Sequence[Policy]
    seeds: Sequence[np.random.SeedSequence]
    run: Mapping[str, Any]


@dataclass(frozen=True)
class Launched:
    """Started owners: the ``oracle`` that reaches them and ``stop()``, which ends them."""

    oracle: Oracle
    stop: Callable[[], None]


@dataclass(frozen=True)
class Transport:
    """A registry entry: ``launch(setup)`` starts the owners and returns how to reach them;
    ``needs``: the optional module it imports (``extras.EXTRAS``; None: the core install);
    ``options``: its settings model (the ``[run]`` keys of its own, which ``launch`` reads from
    ``setup.run``)."""

    name: str
    summary: str
    launch: Callable[[OwnerSetup], Launched]
    needs: str | None = None
    options: type[Section] = NoSettings

    def check_installed(self) -> None:
        """A one-line ``ConfigError`` naming the extra to install when ``needs`` is missing."""
        if self.needs is not None:
            require(self.needs, f"run.transport = {self.name!r}", "choose another run.transport")
