"""``penalty_hier``: penalty MH on a hierarchical model's z = (θ, b_1, …, b_K) by Metropolis
within Gibbs, one iteration in three sub-steps (docs/design.md §6, "Hierarchical models
(design)"):

1. θ_H: random-walk MH on the prior alone, log p(θ) + Σ_k log p(b_k | θ_H) — no owner is asked;
   then a random walk along the model's likelihood-invariant directions (for random_intercept
   μ + c, b_k − c: every φ_k stays put), again MH on the prior alone. It decouples θ from the
   blocks at no owner's cost (the centred parameterisation otherwise moves θ at the data's sd).
2. θ_L: a random walk of radius r_L; every owner answers its log ratio at φ_k → φ_k' (one θ row
   per owner, ``kinds.per_owner``), sub-step key 1; one penalty decision with the summed
   answers, the prior difference and −Σ_k σ_k²/2 (§2.1).
3. blocks: each b_k' = b_k + a random walk of radius r_b (reflected into the block box, a
   symmetric proposal while r_b < block_bound); owner k answers at φ_k → φ_k', sub-step key 2;
   given θ the blocks are independent, so each has its own decision with its owner's answer,
   the prior ratio of b_k and −σ_k²/2 — its acceptance does not fall as K grows.

Two answers per owner per chain per iteration (sub-step 2 is not asked for a chain whose θ_L'
leaves the box). In warmup the caller adapts each radius on its own acceptance (``adapted``;
the block radius on the mean over owners) and freezes them after, so the kept chain is an
exact kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..models.hierarchical import HierarchicalModel
from .mh import propose_in_ball
from .oracle import Oracle

#: answers per owner per chain per iteration (sub-steps 2 and 3)
ANSWERS_PER_ITERATION = 2
#: the owners' sub-step keys of sub-steps 2 (θ_L) and 3 (blocks)
THETA_SUBSTEP, BLOCK_SUBSTEP = 1, 2
#: the acceptance each radius is adapted towards in warmup
TARGET_ACCEPT = 0.3


@dataclass(frozen=True)
class Radii:
    """Proposal radii of the three sub-steps, units of the coordinates they move."""

    hyper: float
    shared: float
    block: float
    #: along the likelihood-invariant directions; 0 makes no such move
    shift: float = 0.0


@dataclass(frozen=True)
class HierState:
    z: np.ndarray  # (C, d + K·p), inside the model's box
    owners: int
    iteration: int = 0  # keys the owners' answers

    @property
    def position(self) -> np.ndarray:
        return self.z


@dataclass(frozen=True)
class HierInfo:
    """Per chain ``(C,)``: whether θ_H and θ_L moved, the fraction of blocks that moved, whether
    the owners were asked at sub-step 2, its summed noise variance Σ_k σ_k² (nats²), and
    whether the likelihood-invariant shift moved."""

    hyper_accepted: np.ndarray
    accepted: np.ndarray
    block_acceptance: np.ndarray
    queried: np.ndarray
    noise_var: np.ndarray
    shift_accepted: np.ndarray


def init(z: np.ndarray, model: HierarchicalModel, owners: int) -> HierState:
    """C chains at z ``(C, d + K·p)``, which must lie inside the box."""
    z = np.array(z, dtype=float, ndmin=2)
    if z.shape[1] != model.full_dim(owners) or not model.in_theta_space(z, owners).all():
        raise ValueError(f"initial points must be (C, {model.full_dim(owners)}) inside the box")
    return HierState(z, owners)


def _moved(z: np.ndarray, index: list[int], move: np.ndarray) -> np.ndarray:
    out = z.copy()
    out[:, index] = move
    return out


def hyper_step(
    rng: np.random.Generator, z: np.ndarray, model: HierarchicalModel, owners: int, radius: float
) -> tuple[np.ndarray, np.ndarray]:
    """Sub-step 1: θ_H by random-walk MH on the prior (asks no owner). → (z, accepted (C,))."""
    hyper = [j for j in range(model.shared_dim) if j not in model.lik_index]
    prop = _moved(z, hyper, propose_in_ball(rng, z[:, hyper], radius))
    return _prior_mh(rng, z, prop, model, owners)


def shift_step(
    rng: np.random.Generator, z: np.ndarray, model: HierarchicalModel, owners: int, radius: float
) -> tuple[np.ndarray, np.ndarray]:
    """Sub-step 1, second move: z + c·V for c uniform in the ball of ``radius`` over the rows of
    ``model.invariant_directions`` V ``(m, d + K·p)``; every φ_k is unchanged, so the
    likelihood ratio is exactly 1 and MH on the prior alone is exact (asks no owner). A radius
    of 0, or a model without such directions, makes no move. → (z, accepted (C,))."""
    directions = model.invariant_directions(owners)
    if radius <= 0 or not len(directions):
        return z, np.zeros(len(z), dtype=bool)
    shift = propose_in_ball(rng, np.zeros((len(z), len(directions))), radius)
    return _prior_mh(rng, z, z + shift @ directions, model, owners)


def _prior_mh(
    rng: np.random.Generator, z: np.ndarray, prop: np.ndarray, model: HierarchicalModel, owners: int
) -> tuple[np.ndarray, np.ndarray]:
    """MH from z to the symmetric proposal ``prop`` on the prior alone (a move the likelihood
    does not see). → (z, accepted (C,))."""
    log_u = np.log(rng.random(len(z)))
    inside = model.in_theta_space(prop, owners)
    log_alpha = np.full(len(z), -np.inf)
    log_alpha[inside] = model.log_prior(prop[inside], owners) - model.log_prior(z[inside], owners)
    acc = log_u < log_alpha
    return np.where(acc[:, None], prop, z), acc


def shared_step(
    rng: np.random.Generator,
    state: HierState,
    z: np.ndarray,
    model: HierarchicalModel,
    oracle: Oracle,
    radius: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Sub-step 2: θ_L by penalty MH on every owner's answer at its own φ_k.
    → (z, accepted, queried, Σ_k σ_k²), each ``(C,)``."""
    k, lik = state.owners, list(model.lik_index)
    prop = _moved(z, lik, propose_in_ball(rng, z[:, lik], radius))
    log_u = np.log(rng.random(len(z)))
    queried = model.in_theta_space(prop, k)
    idx = np.flatnonzero(queried)
    accepted, noise_var = np.zeros(len(z), dtype=bool), np.zeros(len(z))
    if idx.size:
        answers = oracle.query(
            "log_ratio",
            state.iteration,
            idx,
            substep=THETA_SUBSTEP,
            theta=model.local_params(z[idx], k),
            theta_prop=model.local_params(prop[idx], k),
        )
        lam, s2 = answers.total()
        prior = model.log_prior(prop[idx], k) - model.log_prior(z[idx], k)
        accepted[idx] = log_u[idx] < prior + lam - 0.5 * s2
        noise_var[idx] = s2
    return np.where(accepted[:, None], prop, z), accepted, queried, noise_var


def reflect(x: np.ndarray, bound: float) -> np.ndarray:
    """x reflected once into [−bound, bound] (|x| < 3·bound)."""
    return np.where(x > bound, 2 * bound - x, np.where(x < -bound, -2 * bound - x, x))


def block_step(
    rng: np.random.Generator,
    state: HierState,
    z: np.ndarray,
    model: HierarchicalModel,
    oracle: Oracle,
    radius: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Sub-step 3: every block by its own penalty decision on its owner's answer.
    → (z, accepted ``(K, C)``)."""
    k, d, p = state.owners, model.shared_dim, model.block_dim
    blocks = model.blocks(z, k)  # (K, C, p)
    moves = propose_in_ball(rng, blocks.reshape(-1, p), radius).reshape(blocks.shape)
    moves = reflect(moves, model.block_bound)
    prop = z.copy()
    prop[:, d:] = np.transpose(moves, (1, 0, 2)).reshape(len(z), k * p)
    chains = np.arange(len(z))
    answers = oracle.query(
        "log_ratio",
        state.iteration,
        chains,
        substep=BLOCK_SUBSTEP,
        theta=model.local_params(z, k),
        theta_prop=model.local_params(prop, k),
    )
    if answers.values.shape[0] != k:
        raise ValueError("penalty_hier needs each owner's own answer (no secure aggregation)")
    log_u = np.log(rng.random((k, len(z))))
    prior = _block_prior_ratio(model, z, prop, k)
    log_alpha = prior + answers.values - 0.5 * (answers.noise_sd**2)[:, None]
    acc = log_u < log_alpha  # (K, C)
    new_blocks = np.where(acc[:, :, None], moves, blocks)
    out = z.copy()
    out[:, d:] = np.transpose(new_blocks, (1, 0, 2)).reshape(len(z), k * p)
    return out, acc


def _block_prior_ratio(
    model: HierarchicalModel, z: np.ndarray, prop: np.ndarray, owners: int
) -> np.ndarray:
    """log p(b_k' | θ_H) − log p(b_k | θ_H) per block ``(K, C)``: the full prior moved one block
    at a time (the prior factorises over blocks given θ)."""
    base = model.log_prior(z, owners)
    d, p = model.shared_dim, model.block_dim
    out = np.empty((owners, len(z)))
    for k in range(owners):
        one = z.copy()
        one[:, d + k * p : d + (k + 1) * p] = prop[:, d + k * p : d + (k + 1) * p]
        out[k] = model.log_prior(one, owners) - base
    return out


def step(
    rng: np.random.Generator,
    state: HierState,
    model: HierarchicalModel,
    oracle: Oracle,
    radii: Radii,
) -> tuple[HierState, HierInfo]:
    """One iteration of the three sub-steps for all chains. ``ValueError`` unless the block
    radius is below the block box's half-width (the reflected proposal is symmetric then)."""
    if not radii.block < model.block_bound:
        raise ValueError(f"block radius {radii.block} must be < block_bound {model.block_bound}")
    z, hyper = hyper_step(rng, state.z, model, state.owners, radii.hyper)
    z, shifted = shift_step(rng, z, model, state.owners, radii.shift)
    z, accepted, queried, noise_var = shared_step(rng, state, z, model, oracle, radii.shared)
    z, blocks = block_step(rng, state, z, model, oracle, radii.block)
    info = HierInfo(hyper, accepted, blocks.mean(axis=0), queried, noise_var, shifted)
    return HierState(z, state.owners, state.iteration + 1), info


def adapted(radii: Radii, info: HierInfo, iteration: int, cap: float) -> Radii:
    """The radii after warmup iteration ``iteration`` (0-based): each log radius moves by
    (its mean acceptance over chains − ``TARGET_ACCEPT``)·(iteration + 1)^−0.6 (Robbins–Monro,
    a vanishing gain); the θ_L and block radii are capped at ``cap`` (the owners' max_step,
    which bounds every local step). A shift radius of 0 (no shift move) stays 0."""
    gain = (iteration + 1.0) ** -0.6

    def move(radius: float, accepted: np.ndarray, limit: float) -> float:
        return min(radius * float(np.exp(gain * (np.mean(accepted) - TARGET_ACCEPT))), limit)

    return Radii(
        hyper=move(radii.hyper, info.hyper_accepted, np.inf),
        shared=move(radii.shared, info.accepted, cap),
        block=move(radii.block, info.block_acceptance, cap),
        shift=move(radii.shift, info.shift_accepted, np.inf),
    )
