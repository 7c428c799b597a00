"""fedpenalty: differentially private Bayesian inference across data owners who do not pool data.

``fedpenalty.sample(...)`` runs a scenario from Python and returns the run as ArviZ data
(``fedpenalty.api``); it is imported on first use, so that the command line starts fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["__version__", "sample"]

if TYPE_CHECKING:
    from .api import sample


def __getattr__(name: str) -> Any:
    if name == "sample":
        from .api import sample

        return sample
    raise AttributeError(f"module 'fedpenalty' has no attribute {name!r}")
