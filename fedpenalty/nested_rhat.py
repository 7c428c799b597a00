"""Nested R-hat (Margossian, Hoffman, Sountsov, Riou-Durand, Vehtari & Gelman 2024, "Nested
R-hat: assessing the convergence of MCMC when running many short chains"; docs/design.md §5):
the convergence check of many short chains, grouped in superchains whose chains share an
initial point (``sampler.superchains``).

With S superchains of M chains of N draws each, chain means x̄_sm, superchain means x̄_s and
their mean x̄:

* between superchains   B = Σ_s (x̄_s − x̄)² / (S − 1);
* within superchain s   W_s = Σ_m (x̄_sm − x̄_s)² / (M − 1)  +  mean_m of the chain variances
  (divisor N − 1); either term is 0 when M = 1 or N = 1;
* nR̂ = √(1 + B / mean_s W_s).

Chains that forgot their common start agree across superchains as well as within them, so nR̂
→ 1; a superchain stuck where it started inflates B. Near stationarity nR̂ − 1 ≈ 1/(2 M N_eff)
(N_eff the effective draws per chain), so the limit ``NESTED_RHAT_LIMIT`` = 1.01 asks for about
50 effective draws per superchain.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Largest nested R-hat of a converged run (the classic R-hat limit of Vehtari et al. 2021;
#: ≈ 50 effective draws per superchain at stationarity, see the module docstring).
NESTED_RHAT_LIMIT = 1.01
#: Runs with at least this many chains get a nested R-hat in diagnostics.json.
MIN_CHAINS = 16
#: Chains per superchain when ``sampler.superchains`` is 0 (independent starts): consecutive
#: groups of this many chains.
DEFAULT_CHAINS_PER_SUPERCHAIN = 4


def nested_rhat(theta: np.ndarray, superchains: int) -> np.ndarray:
    """theta ``(C, N, d)``, chain c in superchain c // (C / ``superchains``) → nR̂ ``(d,)``.

    ``ValueError`` unless 2 ≤ superchains and it divides C."""
    chains, draws, dim = theta.shape
    if superchains < 2 or chains % superchains:
        raise ValueError(
            f"nested R-hat needs at least 2 superchains dividing the {chains} chains, "
            f"got {superchains}"
        )
    x = theta.reshape(superchains, chains // superchains, draws, dim)
    chain_mean = x.mean(axis=2)  # (S, M, d)
    super_mean = chain_mean.mean(axis=1)  # (S, d)
    between = super_mean.var(axis=0, ddof=1)
    zeros = np.zeros((superchains, dim))
    among_chains = chain_mean.var(axis=1, ddof=1) if x.shape[1] > 1 else zeros
    within_chains = x.var(axis=2, ddof=1).mean(axis=1) if draws > 1 else zeros
    within = (among_chains + within_chains).mean(axis=0)
    return np.sqrt(1.0 + between / within)


def nested_summary(theta: np.ndarray, superchains: int) -> dict[str, Any] | None:
    """The ``nested_rhat`` entry of diagnostics.json for theta ``(C, N, d)``, or None below
    MIN_CHAINS chains or when the default grouping does not divide C.

    ``superchains`` > 0: the run's superchains (chains sharing a start, ``shared_start``
    true); 0: consecutive groups of DEFAULT_CHAINS_PER_SUPERCHAIN independently started
    chains (``shared_start`` false: a weaker check, as the groups' starts already differ).
    ``mixed``: every parameter's nR̂ at most ``limit``."""
    chains = theta.shape[0]
    if chains < MIN_CHAINS:
        return None
    groups = superchains or chains // DEFAULT_CHAINS_PER_SUPERCHAIN
    if not superchains and chains % DEFAULT_CHAINS_PER_SUPERCHAIN:
        return None
    values = nested_rhat(theta, groups)
    return {
        "values": values.tolist(),
        "superchains": groups,
        "chains_per_superchain": chains // groups,
        "shared_start": bool(superchains),
        "limit": NESTED_RHAT_LIMIT,
        "mixed": bool(np.all(values <= NESTED_RHAT_LIMIT)),
    }
