"""The algorithm registry: every ``sampler.algorithm`` name and what runs it
(docs/design.md §6). The driver, the scenario schema, the CLI and checkpoints read this table;
adding an algorithm is one module plus one line here.
"""

from __future__ import annotations

from .barker import BARKER
from .base import ChainAlgorithm, ReleaseAlgorithm
from .baseline_algorithms import HYBRID, NOISY_STATS, OPS
from .dp_hmc import DP_HMC
from .exact import EXACT_MH
from .expfam import PENALTY_EXPFAM
from .hier_algorithm import PENALTY_HIER
from .mh import PENALTY
from .objpert import OBJPERT
from .private_gibbs import PRIVATE_GIBBS
from .sgfs import SGFS
from .sghmc import SGHMC
from .sgld import SGLD
from .sgnht import SGNHT

Algorithm = ChainAlgorithm | ReleaseAlgorithm

ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        PENALTY,
        PENALTY_EXPFAM,
        EXACT_MH,
        SGLD,
        SGHMC,
        SGNHT,
        OPS,
        NOISY_STATS,
        HYBRID,
        DP_HMC,
        PENALTY_HIER,
        OBJPERT,
        PRIVATE_GIBBS,
        SGFS,
        BARKER,
    )
}
