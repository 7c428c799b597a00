"""The coordinator's side of secure aggregation (docs/design.md §2.6): relay the owners'
session keys (and, for a sparse masking graph, their commitments and revealed shares), and turn
the owner hosts' replies into ``Answers`` — plain answers stacked, masked sums added mod 2⁶⁴
and decoded. Every transport calls these; none decodes on its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..common import PEERS_AUTHENTICATED, PEERS_OWN_NOISE, PEERS_SIMULATED, PrivacyReport
from ..errors import AggregationFailed, OwnerError
from ..kinds import query_kind
from ..owner.aggregation import PeerKey, Reply, SecureOpen
from ..owner.mask_graph import COMPLETE_UP_TO, FAILURE_BITS
from ..owner.noise.lattice import FLOAT_EXACT_LIMIT, from_lattice
from ..owner.reveal import sparse
from .oracle import Answers, SecureAggregation


def secure_open(
    keys: Sequence[PeerKey],
    secure: SecureAggregation,
    reveal: Callable[[tuple[PeerKey, ...]], Sequence[PeerKey]] | None = None,
) -> SecureOpen:
    """The open request every owner receives: all owners' ``keys`` and the asked s and t. With a
    sparse masking graph, after the reveal round: ``reveal`` relays every key and commitment to
    every host and returns the hosts' keys with their revealed shares (any order), which join
    the keys (docs/design.md §2.6, "Commit, then reveal"). ``OwnerError`` for shares of other
    owners than the keys'."""
    peers = tuple(keys)
    if reveal is not None and sparse(len(peers), int(secure.colluders)):
        shares = {k.owner: k.share for k in reveal(peers)}
        if sorted(shares) != sorted(k.owner for k in peers):
            raise OwnerError("the owner hosts revealed graph shares of other owners than sent keys")
        peers = tuple(replace(k, share=shares[k.owner]) for k in peers)
    return SecureOpen(peers, float(secure.total_noise_sd), int(secure.colluders))


def owner_noise_sd(secure: SecureAggregation | None, sigma: np.ndarray, owners: int) -> np.ndarray:
    """The noise sd ``(K,)`` each of ``owners`` owners adds to an answer unit: its σ_k, or with
    secure aggregation s/√(K − t) (what an owner that follows its policy declares)."""
    if secure is None:
        return np.asarray(sigma, dtype=float)
    sd = secure.total_noise_sd / math.sqrt(owners - secure.colluders)
    return np.full(owners, sd)


def combine(replies: Sequence[Reply]) -> Answers:
    """Every host's reply to one query as ``Answers``: plain answers stacked in host order;
    masked sums added mod 2⁶⁴ and decoded (``decode``). ``OwnerError`` for a mix of both."""
    if len(replies) == 1 and replies[0].lattice_step is None:  # one host's plain answers
        return Answers(replies[0].values, replies[0].noise_sd)
    kinds = {r.lattice_step is None for r in replies}
    if len(kinds) != 1:
        raise OwnerError("some owner hosts answered with secure aggregation and some without")
    if kinds.pop():
        return Answers(
            np.concatenate([r.values for r in replies]),
            np.concatenate([r.noise_sd for r in replies]),
        )
    return decode(replies)


def decode(replies: Sequence[Reply]) -> Answers:
    """Σ_k λ̂_k from the hosts' masked sums: added mod 2⁶⁴, the check words must sum to 0 (every
    owner answered under one transcript), and the total, read as a signed integer below 2⁵³ in
    size, times the lattice step. One row, with noise sd √(Σ_k sd_k²).
    ``AggregationFailed`` — nothing decoded — otherwise."""
    steps = {r.lattice_step for r in replies}
    shapes = {(r.values.shape, None if r.check is None else r.check.shape) for r in replies}
    if len(steps) != 1 or len(shapes) != 1:
        raise AggregationFailed(
            f"owner hosts answered on different lattices or shapes ({sorted(map(str, steps))}): "
            "the owners disagree on the session's terms; nothing was decoded"
        )
    total = np.zeros(replies[0].values.shape, dtype=np.uint64)
    check = np.zeros_like(replies[0].check, dtype=np.uint64)
    for r in replies:
        assert r.check is not None  # masked replies carry their check words
        total += r.values
        check += r.check
    if np.any(check != 0):
        raise AggregationFailed(
            "the masked answers do not add up to a decodable sum (their check words do not "
            "cancel): an owner did not answer, or the owners were shown different peers or "
            "terms; nothing was decoded"
        )
    signed = total.view(np.int64)
    if np.any((signed >= FLOAT_EXACT_LIMIT) | (signed <= -FLOAT_EXACT_LIMIT)):
        raise AggregationFailed("the decoded sum lies past 2^53 lattice steps; nothing was decoded")
    step = steps.pop()
    assert step is not None  # masked replies carry their lattice step
    # one sum over every owner's sd, in owner order: the same float however owners are hosted
    sd = math.sqrt(float(np.sum(np.concatenate([r.noise_sd for r in replies]) ** 2)))
    return Answers(from_lattice(signed, step), np.array([sd]))


# --------------------------------------------------------------------------- scenario and report


def requested(privacy: Mapping[str, Any]) -> SecureAggregation | None:
    """The secure aggregation a scenario's ``[privacy]`` asks for (None: ``aggregation`` none)."""
    if privacy["aggregation"] != "secure":
        return None
    return SecureAggregation(float(privacy["total_noise_sd"]), int(privacy["colluders"]))


#: privacy.json's ``noise`` line of a simulation with secure aggregation (docs/design.md §2.7).
SIMULATED_SECURE_NOISE = (
    "simulated owners with secure aggregation: exact discrete-Gaussian noise on the lattice from "
    "a Philox stream keyed from run.seed, X25519 session keys derived from run.seed, and masks "
    "from a SplitMix64 mixer keyed by the pairwise secrets (deployed owners: ChaCha20 under "
    "keys from OS entropy); whoever knows the seed knows the noise and the masks"
)


#: What each owner's ε rests on, by ``OwnNoise.peers`` (docs/design.md §2.6), in words.
_BASIS = {
    PEERS_AUTHENTICATED: (
        "authenticated peers: its server checked that every other owner's key is signed under a "
        "certificate from its server.peer_ca naming that owner, one of its server.allowed_peers, "
        "so K counts distinct authenticated owners; each answer is charged mu = (Delta + "
        "gamma*sqrt(w))/s, which holds if at most t = {t} of them collude with the coordinator "
        "(revealing their noise and masks) and every other owner follows the protocol"
    ),
    PEERS_SIMULATED: (
        "simulated peers: the simulation's owners are its own, so K is real; each answer is "
        "charged mu = (Delta + gamma*sqrt(w))/s, which holds if at most t = {t} owners collude "
        "with the coordinator and every other owner follows the protocol"
    ),
    PEERS_OWN_NOISE: (
        "peers not authenticated (privacy.unauthenticated_peers = 'charge_own_noise'): each "
        "answer is charged at the owner's own noise sd s/sqrt(K - t) alone, so its epsilon "
        "holds whoever its peers are, invented ones included (it equals epsilon_own_noise_only)"
    ),
}


def assumption(
    secure: SecureAggregation,
    reports: Sequence[PrivacyReport] = (),
    clips: Mapping[str, float] | None = None,
) -> str:
    """privacy.json's ``assumption``: what ``epsilon`` of a secure run rests on, in words, from
    what the owners' reports say their ε rests on (``OwnNoise.peers``); ``clips``: the
    per-record clip of each clipped kind the run asks (by kind name), whose s is a noise
    multiplier (docs/design.md §2.6, "The noise level of a clipped kind")."""
    s, t = secure.total_noise_sd, secure.colluders
    counts: dict[str, list[str]] = {}
    for r in reports:
        if r.own_noise is not None and r.own_noise.peers:
            counts.setdefault(r.own_noise.peers, []).append(r.owner)
    if counts:
        bases = "; ".join(
            f"{len(owners)} owner(s) on {_BASIS.get(basis, basis).format(t=t)}"
            for basis, owners in counts.items()
        )
    else:
        bases = "no owner reported what its epsilon rests on"
    return (
        f"secure aggregation (docs/design.md §2.6): the coordinator sees only the sum of the "
        f"owners' masked answers. Each of the K owners (K counted by each owner from the peer "
        f"keys it received) adds noise of variance s²/(K − t) with s = {s:g}, t = {t}; the sum "
        f"carries variance K·s²/(K − t), which the sampler accounts for.{_clipped(clips)} "
        f"'epsilon' rests on, "
        f"by the owners' own reports: {bases}. 'epsilon_own_noise_only' is what an owner's own "
        f"noise alone gives (every other owner colluding or invented). Above "
        f"{COMPLETE_UP_TO} owners each owner masks only with its neighbours in a graph derived "
        f"from the session's keys and terms (SecAgg+), whose honest owners stay connected "
        f"except with probability at most 2^-{FAILURE_BITS} a session; each owner's delta "
        f"includes that (its epsilon is its accountant's at delta less it). An owner that drops "
        f"out stops the run (the sum cannot be decoded); recovery by secret sharing is not "
        f"implemented"
    )


def _clipped(clips: Mapping[str, float] | None) -> str:
    """The assumption's words on the clipped kinds ``clips`` (kind → clip; none: nothing)."""
    if not clips:
        return ""
    each = ", ".join(f"{query_kind(kind).name} at clip {c:g}" for kind, c in clips.items())
    return (
        f" For the kinds clipped per record ({each}) s is a noise multiplier: an answer's noise "
        f"sd is s·clip/√(K − t), the sum's s·clip·√(K/(K − t)); each answer is charged "
        f"mu = (Delta + gamma*sqrt(w))/s per unit clip, whatever the kind."
    )


def aggregation_fields(
    secure: SecureAggregation | None,
    reports: Sequence[PrivacyReport] = (),
    clips: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """privacy.json's run-level fields: the aggregation and, when secure, s, t and the
    assumption ``epsilon`` rests on (from the owners' ``reports``; ``clips``: the run's
    clipped kinds, ``assumption``)."""
    if secure is None:
        return {"aggregation": "none"}
    return {
        "aggregation": "secure",
        "total_noise_sd": secure.total_noise_sd,
        "colluders": secure.colluders,
        "assumption": assumption(secure, reports, clips),
    }


def owner_fields(report: PrivacyReport) -> dict[str, Any]:
    """An owner's privacy.json fields of a secure session: the K it counted, t, s, its own
    noise sd and ε from its own noise alone (empty when the session was not secure)."""
    own = report.own_noise
    if own is None or own.session is None or own.terms is None:
        return {}
    return {
        "peers": own.peers,
        "owners_counted": own.terms.owners,
        "colluders": own.terms.colluders,
        "total_noise_sd": own.terms.total_noise_sd,
        "owner_noise_sd": own.terms.owner_noise_sd,
        "epsilon_own_noise_only": own.session.epsilon,
    }
