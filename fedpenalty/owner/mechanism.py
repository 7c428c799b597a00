"""How one owner host's answers are noised (docs/design.md §2.6, §2.7): float noise of
simulated owners (``seeded.SeededNormals``), exact lattice noise (``noise.lattice``) and a
secure session's lattice noise and masks (``aggregation.SecureSession``). Pure of ledgers: what
is charged for an answer is the pipeline's (``pipeline.py``), from ``Mechanism.mus``."""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidRequest
from ..kinds import KINDS
from .aggregation import SecureOpen, SecureSession, agree, scaled_step
from .ledger_records import PART_SEPARATOR, part_name
from .ledger_rows import AffineMus
from .node import OwnerNode
from .noise.exact import SCALE_MAX
from .noise.lattice import (
    LATTICE_BITS,
    lattice_sensitivity,
    noisy_lattice_answers,
    noisy_lattice_multiples,
)
from .noise.seeded import SeededNormals, seed_materials
from .noise.sources import WordSource, word_source

#: Exact values are clipped to ±2⁵² γ before rounding (data independent; 1-Lipschitz).
LATTICE_LIMIT = 2.0**52


def noise_address(session: str, substep: int) -> str:
    """Where the noise of ``session``'s keys at ``substep`` is drawn: the (ledger) session
    itself at sub-step 0 — so sessions of one sub-step draw what they drew before sub-steps
    existed — and the session with the sub-step folded in otherwise."""
    return session if substep == 0 else f"{session}{PART_SEPARATOR}sub-step {substep}"


# per-request record: plain, not frozen (built on every query, never changed; docs/design.md §4)
@dataclass
class Keys:
    """The addresses of one request's answers: key j is (``chains[j]``, ``iterations[j]``)
    ``(M,)`` of ``session`` (the ledger session of the asked kind) at ``substep``, its noise
    drawn under ``label`` (``HostNoise.label`` of ``address``)."""

    session: str
    label: str
    chains: np.ndarray
    iterations: np.ndarray
    substep: int = 0

    @property
    def address(self) -> str:
        """The session the seeded noise of these keys is addressed by (``noise_address``)."""
        return noise_address(self.session, self.substep)

    def subset(self, new: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """The (chains, iterations) of the keys selected by ``new`` ``(M,)`` bool (None: all)."""
        if new is None:
            return self.chains, self.iterations
        return self.chains[new], self.iterations[new]


@dataclass(frozen=True)
class Mechanism:
    """How one session's answers are noised and charged (docs/design.md §2.6, §2.7).

    ``sd`` ``(K,)``: each owner's noise sd per answer unit (σ_k; s/√(K − t) in a secure
    session); ``accounting_sd`` ``(K,)``: what its μ divides by (σ_k; s, or s/√(K − t) for an
    owner charged at its own noise because it cannot authenticate its peers); ``gamma``: the lattice
    step (None: float noise of simulated owners); ``limit``: the largest |exact value| in
    lattice steps; ``gradient_multiplier`` ``(K,)``: the noise multiplier gradient answers are
    accounted at; ``secure``: a secure session's masks (None: plain answers).
    """

    sd: np.ndarray
    accounting_sd: np.ndarray
    gamma: float | None
    limit: float
    gradient_multiplier: np.ndarray
    secure: SecureSession | None = None

    @property
    def dtype(self) -> type:
        """What an answer is made of: float64, or masked uint64 lattice words."""
        return np.float64 if self.secure is None else np.uint64

    def width(self, width: int) -> int:
        """Stored components of an answer of ``width``: a secure answer adds its check word."""
        return width if self.secure is None else width + 1

    def mus(self, delta: np.ndarray, steps: np.ndarray, width: int) -> AffineMus:
        """Each owner's μ of answers of sensitivity ``delta``·step (``delta`` ``(K,)``, the
        keys' ``steps`` ``(M,)``) and ``width`` components: (Δ + γ√w)/sd (γ√w: what rounding to
        γℤ adds; 0 without lattice noise)."""
        rounding = 0.0
        if self.gamma is not None:
            rounding = lattice_sensitivity(0.0, self.gamma, width)
        sd = self.accounting_sd
        return AffineMus(delta / sd, np.full(len(sd), rounding) / sd, steps)


class HostNoise:
    """The noise of one host's owners: float noise from seeded normals (simulated owners) or
    exact lattice noise from their keyed word sources, and each session's ``Mechanism`` —
    the host's plain one of the asked kind (each kind at its own noise level,
    ``Policy.noise_for``), or a secure session's (``open_secure``)."""

    def __init__(self, nodes: Sequence[OwnerNode], label: str):
        self.nodes = list(nodes)
        self.host_label = label
        #: each kind's noise level σ_k ``(K,)`` by ledger name (``Policy.noise_for``, asked
        #: once per distinct policy: owners alike share one; docs/design.md §4 "Many owners")
        names = [kind.ledger_name for kind in KINDS.values()]
        by_policy = {id(n.policy): n.policy for n in nodes}
        row = {key: k for k, key in enumerate(by_policy)}
        table = np.array(
            [[p.noise_for(name) for name in names] for p in by_policy.values()], dtype=float
        ).reshape(len(by_policy), len(names))
        at = np.array([row[id(n.policy)] for n in nodes], dtype=np.intp)
        self.levels = {name: table[at, j] for j, name in enumerate(names)}
        self.lattice = self._lattice_noise(np.concatenate(list(self.levels.values())))
        self.fresh = self.lattice and any(n.fresh_attempts for n in nodes)
        if not self.lattice:
            self.seeded = SeededNormals(seed_materials([n.rng for n in nodes]))
        #: the gradient multiplier, asked once per alike owners (policy, dimension, lattice)
        keys = [(id(n.policy), n.model.dim, n.lattice) for n in nodes]
        alike = {key: n.gradient_noise_multiplier for key, n in dict(zip(keys, nodes)).items()}
        multipliers = np.array([alike[key] for key in keys])
        gamma = self.gamma if self.lattice else None
        self.plain = {
            kind: Mechanism(sd, sd, gamma, LATTICE_LIMIT, multipliers)
            for kind, sd in self.levels.items()
        }
        #: each secure session's mechanism by ledger session: the session, or each part of a
        #: session of several kinds (``part_name``)
        self.secure: dict[str, Mechanism] = {}
        #: the ledger sessions of each secure session (``secure``'s keys)
        self.secure_parts: dict[str, list[str]] = {}

    def _lattice_noise(self, sigma: np.ndarray) -> bool:
        """Set up exact lattice noise when the owners use it (all of them or none): their
        ChaCha20 keys (seeded Philox for simulated owners) and one lattice step γ, a power of
        two 2²⁰ to 2²¹ times below the smallest σ of ``sigma`` (every owner's level of every
        kind; docs/design.md §2.7)."""
        modes = {n.lattice for n in self.nodes}
        if len(modes) != 1:
            raise ValueError("the owners of one host must all use lattice noise, or all not")
        if not modes.pop():
            return False
        self.simulated = all(n.seeded_streams for n in self.nodes)
        keys = [n.noise_key for n in self.nodes if n.noise_key is not None]
        self.source: WordSource = word_source(keys, simulation=self.simulated)
        self.gamma = 2.0 ** (math.floor(math.log2(float(sigma.min()))) - LATTICE_BITS)
        if sigma.max() / self.gamma > SCALE_MAX / 2:  # /2: room for a gradient's clip scale
            raise ValueError("the owners' σ of one host must lie within a factor 2¹⁸ of each other")
        return True

    def mechanism(self, session: str, kind: str | None) -> Mechanism:
        """How ``session``'s answers of ``kind`` (a ledger name; ``KeyError`` for an unknown
        one) are noised and charged (after ``OwnerHost._session``): a secure session's (of
        ``session``, a ledger session, or of ``kind``'s part of it), or the kind's plain one.
        ``kind`` None: the plain one of every kind, when the owners have one level for every
        kind (``ValueError`` otherwise)."""
        secure = self.secure.get(session)
        if secure is None and kind is not None and session in self.secure_parts:
            secure = self.secure[part_name(session, kind)]
        if secure is not None:
            return secure
        if kind is not None:
            return self.plain[kind]
        first, *others = self.plain.values()
        if any(not np.array_equal(m.sd, first.sd) for m in others):
            raise ValueError(
                f"{self.host_label}: its owners' noise levels differ by query kind; name the kind"
            )
        return first

    def label(self, session: str) -> str:
        """The label one request's noise and Poisson samples are drawn under. Simulated owners
        and owners given a key: the session (their noise is a function of the seed or key and
        the address, so that runs repeat). Deployed owners (``OwnerNode.fresh_attempts``): the
        session and 128 fresh bits from OS entropy, so every
        attempt draws fresh randomness — the noise of a key is drawn once, when it is released
        (a retry replays the stored answer), and the noise of a key never released cannot be
        recomputed on a client's demand, nor timed over many refused requests
        (docs/design.md §3, invariant 11)."""
        if not self.fresh:
            return session
        return f"{session}\x00attempt {secrets.token_hex(16)}"

    def noisy(
        self,
        keys: Keys,
        kind: str,
        owner: int | None,
        exact: np.ndarray,
        new: np.ndarray | None,
        scale: float = 1.0,
    ) -> np.ndarray:
        """Noisy answers ``(K', M', w)`` to the keys selected by ``new`` ``(M,)`` bool (None: all
        of them) from the
        exact values ``exact`` ``(K', M', w)`` of one ``owner`` (K' = 1) or of every owner
        (None, K' = K): lattice answers (``lattice_answers``, noise drawn under ``keys.label``),
        or seeded float normals × σ_k addressed by the same keys (simulated owners,
        ``SeededNormals``). ``scale``: the answer unit (a clipped kind's clip): noise sd
        σ_k·scale."""
        chains, iterations = keys.subset(new)
        if self.lattice:  # every mechanism of lattice owners has a step (float owners': none)
            mechanism = self.mechanism(keys.session, kind)
            assert mechanism.gamma is not None
            owners = np.arange(len(self.nodes)) if owner is None else np.array([owner])
            return self.lattice_answers(
                mechanism, keys.label, kind, owners, exact, chains, iterations, scale, keys.substep
            )
        asked = None if owner is None else np.array([owner])
        normals = self.seeded.normals(keys.address, kind, asked, chains, iterations, exact.shape[2])
        sigma = self.levels[kind] if scale == 1.0 else self.levels[kind] * scale
        noisy = np.multiply(normals, sigma[:, None, None] if owner is None else sigma[owner])
        noisy += exact
        return noisy

    def lattice_answers(
        self,
        mechanism: Mechanism,
        label: str,
        kind: str,
        owners: np.ndarray,
        exact: np.ndarray,
        chains: np.ndarray,
        iterations: np.ndarray,
        scale: float = 1.0,
        substep: int = 0,
    ) -> np.ndarray:
        """Released answers ``(K', M, w)``: ``exact`` ``(K', M, w)`` of ``owners`` rounded to γℤ
        plus exact discrete-Gaussian noise of scale sd_k·``scale``/γ, keyed (``label``, kind,
        owner, chain, iteration, component) — every entry an exact multiple of γ; in a secure
        session the masked lattice words ``(K', M, w + 1)`` instead. ``scale``: the answer unit
        (gradients: the clip); γ is the session's step times a power of two no larger than
        ``scale``, so sd_k·scale/γ stays 2²⁰ to 2²¹ times sd_k/sd_min. ``substep``: the keys'
        sub-step, which keys a secure session's masks (``SecureSession.mask``)."""
        assert mechanism.gamma is not None  # lattice owners only
        gamma = mechanism.gamma * scaled_step(scale)
        # a data-independent bound that keeps every released value (and a secure session's
        # decoded sum) an exact float: |n| < 2^53
        bound = mechanism.limit * gamma
        clipped = np.clip(exact, -bound, bound)
        sigma = mechanism.sd[owners] * scale
        args = (self.source, label, kind, iterations, clipped, sigma, gamma)
        if mechanism.secure is None:
            return noisy_lattice_answers(*args, owners=owners, chains=chains)
        multiples = noisy_lattice_multiples(*args, owners=owners, chains=chains)
        return mechanism.secure.mask(multiples, owners, chains, iterations, substep)

    def is_secure(self, session: str) -> bool:
        """``session`` is open here with secure aggregation."""
        return session in self.secure_parts

    def keep_secure(self, session: str, mechanisms: dict[str, Mechanism]) -> None:
        """Keep ``session``'s mechanisms (``secure_mechanisms``), once it opened."""
        self.secure.update(mechanisms)
        self.secure_parts[session] = list(mechanisms)

    def forget_secure(self, session: str) -> None:
        """Drop ``session``'s mechanisms (it closed); nothing for a plain session."""
        for name in self.secure_parts.pop(session, []):
            del self.secure[name]

    def secure_mechanisms(
        self, session: str, kinds: Sequence[str], secure: SecureOpen
    ) -> dict[str, Mechanism]:
        """A secure session's noise, charges and masks by ledger session — the session itself
        for one kind, else each of its ``kinds``' (ledger names) part (``part_name``) —, once
        every hosted owner accepts its terms (``aggregation.agree``; all must share them) and
        every peer key is usable. The kinds share the terms, the lattice step and the X25519
        exchanges; each kind's transcript binds its name, so its masks are its own
        (docs/design.md §2.6, "Sessions of several kinds")."""
        agreements = {
            agree(n.name, n.policy, n.session_key(session).public_key, secure, n.simulated_peers)
            for n in self.nodes
        }
        if len(agreements) != 1:
            raise InvalidRequest(
                "the owners of one host must share privacy.total_noise_sd, privacy.colluders "
                "and privacy.unauthenticated_peers to join a secure session",
                self.host_label,
            )
        agreed = agreements.pop()
        # noise and masks from the terms counted; μ from what is charged (docs/design.md §2.6:
        # with unauthenticated peers, the owner's own noise sd)
        terms, charged = agreed.terms, agreed.charged
        if not self.lattice:
            raise InvalidRequest(
                "secure aggregation needs lattice answers; these owners give float answers",
                self.host_label,
            )
        hosted = [(n.name, n.session_private_key(session)) for n in self.nodes]
        count = len(self.nodes)
        exchanged: dict[tuple[int, int], bytes] = {}
        multipliers = np.array([n.gradient_multiplier(charged) for n in self.nodes])
        out = {}
        for kind in kinds:
            masks = SecureSession(
                session, kind, terms, secure.peers, hosted, self.simulated, exchanged
            )
            out[part_name(session, kind) if len(kinds) > 1 else session] = Mechanism(
                np.full(count, terms.owner_noise_sd),
                np.full(count, charged.total_noise_sd),
                masks.gamma,
                LATTICE_LIMIT / terms.owners,
                multipliers,
                masks,
            )
        return out
