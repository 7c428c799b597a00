"""The answer path of every owner: one or many owners served by one process.

A request (session, iteration, every chain's (θ, θ')) is answered for all hosted owners at once:
validate → replay check → compute → charge → reply. Each owner keeps its own data, noise
source, policy and ledger rows; owners that share a ledger file are charged in one
transaction, so a host of hundreds of owners pays one commit per request instead of one per
owner. A refusal by any owner (validation, budget, replay conflict) fails the whole request
and, within one ledger, charges nobody. A lone ``OwnerNode`` answers through a host of one
(``OwnerHost([node])``).

Sessions with secure aggregation (docs/design.md §2.6) answer through the same path: their
noise, lattice step and charge come from the session's ``_Mechanism``, each owner's answer is
masked (``aggregation.SecureSession``) and stored masked, and the host releases only the sum
of its owners' masked answers (an ``aggregation.Reply``). Transports turn any answer into a
``Reply`` with ``OwnerHost.reply``.
"""

from __future__ import annotations

import functools
import hashlib
import math
import secrets
from collections import defaultdict
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..common import (
    LOG_RATIO,
    SGMCMC,
    SUFF_STATS,
    OwnerDescription,
    PrivacyReport,
)
from ..errors import InvalidRequest, ReplayConflict, UnknownSession
from ..models import ExpFamModel
from .aggregation import PeerKey, Reply, SecureOpen, SecureSession, agree, scaled_step
from .gradient import clipped_gradient_sum
from .ledger import Charge, SampledCharge
from .ledger_rows import AffineMus, span
from .node import SESSION_EVENTS, OwnerNode, close_sessions, open_sessions, privacy_reports
from .noise.exact import SCALE_MAX, poisson_sample
from .noise.lattice import (
    LATTICE_BITS,
    lattice_sensitivity,
    noisy_lattice_answers,
    noisy_lattice_multiples,
)
from .noise.seeded import SeededNormals, seed_material
from .noise.sources import MAX_CHAIN, word_source

#: Exact values are clipped to ±2⁵² γ before rounding (data independent; 1-Lipschitz).
LATTICE_LIMIT = 2.0**52

_STATS_DIGEST = hashlib.sha256(SUFF_STATS.encode()).digest()
_LOG_RATIO_TAG = LOG_RATIO.encode()


class _LedgerPart:
    """The hosted owners that share one ledger file, with what every charge needs as arrays:
    positions ``idx`` in the host, names, ledger ids, limits (docs/design.md §4)."""

    def __init__(self, nodes: list[OwnerNode], idx: list[int]):
        self.nodes = [nodes[k] for k in idx]
        self.idx = np.array(idx, dtype=np.int64)
        #: how to take this part's rows of a host array: a view when it is every owner
        self.rows: slice | np.ndarray = slice(None) if idx == list(range(len(nodes))) else self.idx
        self.ledger = self.nodes[0].ledger
        self.names = [n.name for n in self.nodes]
        self.owner_ids = self.ledger.ids(self.names)
        self.budget_epsilon = np.array([n.policy.budget_epsilon for n in self.nodes])
        self.delta = np.array([n.policy.delta for n in self.nodes])
        self.renyi = any(n.renyi_accounting for n in self.nodes)
        self.refresh_caps()

    def refresh_caps(self) -> None:
        """Re-read the owners' μ² caps (opening a session may lower them)."""
        self.max_mu_squared = np.array([n.max_mu_squared for n in self.nodes])


@dataclass(frozen=True)
class _Mechanism:
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


class _StepLimits:
    """The steps ‖θ' − θ‖ one session's owners admit: each owner's [min_step, max_step], the
    max_step lowered to what the session declared ``declared`` ``(K,)``."""

    def __init__(self, host: OwnerHost, declared: np.ndarray):
        self.names = host.names
        self.min_step = host._min_step
        self.limit = np.minimum(host._max_step, declared)
        self.declared = declared < host._max_step
        self.shortest, self.longest = float(self.min_step.max()), float(self.limit.min())

    def check(self, theta: np.ndarray, theta_prop: np.ndarray) -> np.ndarray:
        """‖θ' − θ‖ per chain ``(C,)``; ``InvalidRequest`` unless every step lies within each
        owner's [min_step, max_step] and the session's declared step (a step below min_step —
        θ' = θ included — carries almost no information and is refused rather than answered
        for free). Two comparisons whatever the number of owners; the owner is found only for
        the error."""
        diff = theta_prop - theta
        step = np.sqrt(np.add.reduce(diff * diff, axis=1))  # as np.linalg.norm(axis=1)
        steps = step.tolist()  # a few chains: Python's max and min are cheaper than numpy's
        longest, shortest = max(steps), min(steps)
        if longest > self.longest * (1 + 1e-12):
            k = int(np.argmax(longest > self.limit * (1 + 1e-12)))
            whose = (
                "the session's declared max_step" if self.declared[k] else "this owner's max_step"
            )
            raise InvalidRequest(
                f"step ‖θ'−θ‖ = {longest:.6g} exceeds {whose} {self.limit[k]:g}", self.names[k]
            )
        if shortest < self.shortest:
            k = int(np.argmax(shortest < self.min_step))
            raise InvalidRequest(
                f"step ‖θ'−θ‖ = {shortest:.6g} is below this owner's min_step {self.min_step[k]:g}",
                self.names[k],
            )
        return step


class OwnerHost:
    """Owner nodes answering batched requests; values are stacked in node order ``(K, ...)``.

    All hosted owners share one model (the coordinator runs one model anyway).
    """

    def __init__(self, nodes: Sequence[OwnerNode]):
        if not nodes:
            raise ValueError("a host needs at least one owner")
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"owner names must be unique within a host: {names}")
        self.nodes = list(nodes)
        self.model = nodes[0].model
        if any(n.model != self.model for n in nodes):
            raise ValueError("all owners of a host must use the same model")
        self.names = names
        self.label = names[0] if len(names) == 1 else f"host of {len(names)} owners"
        sigma = self._sigma = np.array([n.policy.sigma for n in nodes])
        self._checked: dict[str, tuple[str, int, list, _StepLimits]] = {}
        self._max_step = np.array([n.policy.max_step for n in nodes])
        self._min_step = np.array([n.policy.min_step for n in nodes])
        self._charged_step = max(n.policy.charged_step for n in nodes)  # see log_ratio
        # per-record terms one chain costs each owner, and the most it computes per request
        self._records = np.array([len(n.records) for n in nodes])
        self._max_work = np.array([n.policy.max_record_evaluations for n in nodes])
        self._max_answers = min(n.policy.max_answers_per_request for n in nodes)
        # sensitivity per unit step of a log-ratio answer: (2 or 1)·L
        self._delta_per_step = np.array(
            [float(self.model.log_ratio_sensitivity(1.0, n.policy.neighbour)) for n in nodes]
        )
        by_ledger: dict[int, list[int]] = defaultdict(list)
        for i, node in enumerate(nodes):
            by_ledger[id(node.ledger)].append(i)
        self._ledgers = [_LedgerPart(self.nodes, idx) for idx in by_ledger.values()]
        if isinstance(self.model, ExpFamModel):
            sums = [n.stat_sum for n in nodes]  # set for every exponential-family owner
            self._stat_sum = np.stack(sums)  # type: ignore[arg-type]
            self._stat_delta = np.array(
                [self.model.stat_sensitivity(n.policy.neighbour) for n in nodes]
            )
        self._n = np.array([len(n.records) for n in nodes], dtype=float)
        self._fast = not any(n.per_record for n in nodes)
        self._lattice = self._lattice_noise(nodes, sigma)
        self._fresh = self._lattice and any(n.fresh_attempts for n in nodes)
        if not self._lattice:
            self._seeded = SeededNormals([seed_material(n.rng) for n in nodes])
        self._plain = _Mechanism(
            sigma,
            sigma,
            self._gamma if self._lattice else None,
            LATTICE_LIMIT,
            np.array([n.gradient_noise_multiplier for n in nodes]),
        )
        self._secure: dict[str, _Mechanism] = {}

    def _lattice_noise(self, nodes: Sequence[OwnerNode], sigma: np.ndarray) -> bool:
        """Set up exact lattice noise when the owners use it (all of them or none): their
        ChaCha20 keys (seeded Philox for simulated owners) and one lattice step γ, a power of
        two 2²⁰ to 2²¹ times below the smallest σ (docs/design.md §2.7)."""
        modes = {n.lattice for n in nodes}
        if len(modes) != 1:
            raise ValueError("the owners of one host must all use lattice noise, or all not")
        if not modes.pop():
            return False
        self._simulated = all(n.seeded_streams for n in nodes)
        keys = [n.noise_key for n in nodes if n.noise_key is not None]
        self._source = word_source(keys, simulation=self._simulated)
        self._gamma = 2.0 ** (math.floor(math.log2(float(sigma.min()))) - LATTICE_BITS)
        if sigma.max() / self._gamma > SCALE_MAX / 2:  # /2: room for a gradient's clip scale
            raise ValueError("the owners' σ of one host must lie within a factor 2¹⁸ of each other")
        return True

    def _noisy(
        self,
        session: str,
        label: str,
        kind: str,
        owner: int | None,
        exact: np.ndarray,
        chains: np.ndarray,
        iterations: np.ndarray,
    ) -> np.ndarray:
        """Noisy answers ``(K', M, w)`` to keys (chains[j], iterations[j]) from the exact values
        ``exact`` ``(K', M, w)`` of one ``owner`` (K' = 1) or of every owner (None, K' = K):
        lattice answers (``_lattice_answers``, noise drawn under ``label``, see
        ``_noise_label``), or seeded float normals × σ_k addressed by the same keys (simulated
        owners, ``SeededNormals``)."""
        owners = np.arange(len(self.nodes)) if owner is None else np.array([owner])
        mechanism = self._mechanism(session)
        if mechanism.gamma is not None:
            return self._lattice_answers(mechanism, label, kind, owners, exact, chains, iterations)
        asked = None if owner is None else owners
        normals = self._seeded.normals(session, kind, asked, chains, iterations, exact.shape[2])
        normals *= self._sigma[:, None, None] if owner is None else self._sigma[owner]
        normals += exact
        return normals

    def _noise_label(self, session: str) -> str:
        """The label one request's noise and Poisson samples are drawn under. Simulated owners
        and owners given a key: the session (their noise is a function of the seed or key and
        the address, so that runs repeat). Deployed owners (``OwnerNode.fresh_attempts``): the
        session and 128 fresh bits from OS entropy, so every
        attempt draws fresh randomness — the noise of a key is drawn once, when it is released
        (a retry replays the stored answer), and the noise of a key never released cannot be
        recomputed on a client's demand, nor timed over many refused requests
        (docs/design.md §3, invariant 11)."""
        if not self._fresh:
            return session
        return f"{session}\x00attempt {secrets.token_hex(16)}"

    def _lattice_answers(
        self,
        mechanism: _Mechanism,
        label: str,
        kind: str,
        owners: np.ndarray,
        exact: np.ndarray,
        chains: np.ndarray,
        iterations: np.ndarray,
        scale: float = 1.0,
    ) -> np.ndarray:
        """Released answers ``(K', M, w)``: ``exact`` ``(K', M, w)`` of ``owners`` rounded to γℤ
        plus exact discrete-Gaussian noise of scale sd_k·``scale``/γ, keyed (``label``, kind,
        owner, chain, iteration, component) — every entry an exact multiple of γ; in a secure
        session the masked lattice words ``(K', M, w + 1)`` instead. ``scale``: the answer unit
        (gradients: the clip); γ is the session's step times a power of two no larger than
        ``scale``, so sd_k·scale/γ stays 2²⁰ to 2²¹ times sd_k/sd_min."""
        assert mechanism.gamma is not None  # lattice owners only
        gamma = mechanism.gamma * scaled_step(scale)
        # a data-independent bound that keeps every released value (and a secure session's
        # decoded sum) an exact float: |n| < 2^53
        bound = mechanism.limit * gamma
        clipped = np.clip(exact, -bound, bound)
        sigma = mechanism.sd[owners] * scale
        args = (self._source, label, kind, iterations, clipped, sigma, gamma)
        if mechanism.secure is None:
            return noisy_lattice_answers(*args, owners=owners, chains=chains)
        multiples = noisy_lattice_multiples(*args, owners=owners, chains=chains)
        return mechanism.secure.mask(multiples, owners, chains, iterations)

    def _mus(
        self, mechanism: _Mechanism, delta: np.ndarray, steps: np.ndarray, width: int
    ) -> AffineMus:
        """Each owner's μ of answers of sensitivity ``delta``·step (``delta`` ``(K,)``, the
        keys' ``steps`` ``(M,)``) and ``width`` components: (Δ + γ√w)/sd (γ√w: what rounding to
        γℤ adds; 0 without lattice noise)."""
        rounding = 0.0
        if mechanism.gamma is not None:
            rounding = lattice_sensitivity(0.0, mechanism.gamma, width)
        sd = mechanism.accounting_sd
        return AffineMus(delta / sd, np.full(len(sd), rounding) / sd, steps)

    def _mechanism(self, session: str) -> _Mechanism:
        """How ``session``'s answers are noised and charged (after ``_require_session``)."""
        return self._secure.get(session, self._plain)

    def _release(
        self, mechanism: _Mechanism, out: np.ndarray, shape: tuple[int, ...], scale: float = 1.0
    ) -> np.ndarray | Reply:
        """What the host releases from its owners' answers ``(K, M, w')``: them, shaped
        ``(K, *shape)``; in a secure session only their masked sum (``SecureSession.reply``)."""
        if mechanism.secure is None:
            return out.reshape(len(self.nodes), *shape)
        return mechanism.secure.reply(out, shape, scale)

    def reply(self, session: str, answers: np.ndarray | Reply, scale: float = 1.0) -> Reply:
        """Any answer of this host as a transport carries it: plain answers ``(K, ...)`` with
        each owner's noise sd σ_k·``scale`` (a secure session's reply is already one)."""
        if isinstance(answers, Reply):
            return answers
        sd = self._mechanism(session).sd
        return Reply(answers, sd if scale == 1.0 else sd * scale)

    # --- sessions and reports ---------------------------------------------------------------
    def describe(self) -> list[OwnerDescription]:
        return [node.describe() for node in self.nodes]

    def open_session(
        self,
        session: str,
        algorithm: str,
        planned_answers: int,
        sampling_rate: float | None = None,
        client: str | None = None,
        max_step: float | None = None,
        secure: SecureOpen | None = None,
    ) -> None:
        """Open (or resume) ``session`` at every hosted owner (``node.open_sessions``):
        ``client`` opens it; a penalty session may declare its largest step ``max_step``;
        ``secure``: with secure aggregation among ``secure.peers`` (docs/design.md §2.6)."""
        mechanism = None
        if secure is not None:
            mechanism = self._secure_mechanism(session, algorithm, secure)
        open_sessions(
            self.nodes,
            session,
            algorithm,
            planned_answers,
            sampling_rate,
            client,
            max_step,
            secure,
        )
        if mechanism is not None:
            self._secure[session] = mechanism
        for part in self._ledgers:
            part.refresh_caps()

    def _secure_mechanism(self, session: str, algorithm: str, secure: SecureOpen) -> _Mechanism:
        """A secure session's noise, charges and masks, once every hosted owner accepts its
        terms (``aggregation.agree``; all must share them) and every peer key is usable."""
        agreements = {
            agree(n.name, n.policy, n.session_key(session).public_key, secure, n.simulated_peers)
            for n in self.nodes
        }
        if len(agreements) != 1:
            raise InvalidRequest(
                "the owners of one host must share privacy.total_noise_sd, privacy.colluders "
                "and privacy.unauthenticated_peers to join a secure session",
                self.label,
            )
        agreed = agreements.pop()
        # noise and masks from the terms counted; μ from what is charged (docs/design.md §2.6:
        # with unauthenticated peers, the owner's own noise sd)
        terms, charged = agreed.terms, agreed.charged
        if not self._lattice:
            raise InvalidRequest(
                "secure aggregation needs lattice answers; these owners give float answers",
                self.label,
            )
        hosted = [(n.name, n.session_private_key(session)) for n in self.nodes]
        masks = SecureSession(session, algorithm, terms, secure.peers, hosted, self._simulated)
        count = len(self.nodes)
        return _Mechanism(
            np.full(count, terms.owner_noise_sd),
            np.full(count, charged.total_noise_sd),
            masks.gamma,
            LATTICE_LIMIT / terms.owners,
            np.array([n.gradient_multiplier(charged) for n in self.nodes]),
            masks,
        )

    def session_keys(self, session: str) -> list[PeerKey]:
        """Every hosted owner's public X25519 key for ``session`` (secure aggregation: the
        coordinator relays them to every participant before it opens the session)."""
        return [n.session_key(session) for n in self.nodes]

    def close_session(self, session: str) -> None:
        close_sessions(self.nodes, session)
        self._secure.pop(session, None)

    def _require_session(self, session: str, algorithm: str) -> list:
        """Every owner's open ``session`` for ``algorithm``: validated in full, then kept until
        any owner anywhere opens or closes a session (``SESSION_EVENTS``)."""
        checked = self._checked.get(session) if isinstance(session, str) else None
        if checked is not None and checked[0] == algorithm and checked[1] == SESSION_EVENTS[0]:
            return checked[2]
        opened = [node.require_session(session, algorithm) for node in self.nodes]
        if any(o.secure is not None for o in opened) != (session in self._secure):
            raise UnknownSession(
                f"session {session!r} uses secure aggregation, but this host holds no keys for "
                "it: re-open it",
                self.label,
            )
        steps = np.array([np.inf if o.max_step is None else o.max_step for o in opened])
        self._checked[session] = (algorithm, SESSION_EVENTS[0], opened, _StepLimits(self, steps))
        return opened

    def _step_limits(self, session: str) -> _StepLimits:
        """What steps ``session`` admits (after ``_require_session``)."""
        return self._checked[session][3]

    def privacy_reports(self, session: str | None = None) -> list[PrivacyReport]:
        return privacy_reports(self.nodes, session)

    def session_opener(self, session: str) -> str | None:
        """The client recorded in the ledgers as the opener of ``session`` (None: not recorded,
        or opened without a client identity) — what binds a session to its client across
        restarts (``Ledger.session_opener``)."""
        for part in self._ledgers:
            opener = part.ledger.session_opener(part.names, session)
            if opener is not None:
                return opener
        return None

    @property
    def stat_width(self) -> int:
        """Components of one sufficient-statistic answer (1 for a model without them, whose
        statistic sessions are refused anyway)."""
        return self.model.stat_dim if isinstance(self.model, ExpFamModel) else 1

    def reply_values(self, session: str, answers: int, width: int) -> int:
        """How many numbers the reply to ``answers`` keys of ``width`` carries: every owner's
        answers, or a secure session's one masked sum with its check words — so that a server
        bounds a reply before anything is computed (docs/design.md §3, invariant 9)."""
        if self._mechanism(session).secure is not None:
            return answers * (width + 1)
        return len(self.nodes) * answers * width

    def node(self, name: str) -> OwnerNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise InvalidRequest(f"this host serves no owner named {name!r}")

    # --- queries ------------------------------------------------------------------------------
    def log_ratio(
        self,
        session: str,
        iteration: int,
        chains: np.ndarray,
        theta: np.ndarray,
        theta_prop: np.ndarray,
    ) -> np.ndarray | Reply:
        """Noisy clipped log-likelihood ratios ``(K, C)`` (a secure session: their masked sum,
        a ``Reply``).

        chains ``(C,)`` distinct non-negative ints; theta, theta_prop ``(C, d)`` inside Θ with
        ‖θ' − θ‖ ≤ each owner's ``max_step``. Owner k's answer for chain c is
        Σ_x clip(ℓ(x,θ'_c) − ℓ(x,θ_c), ±L‖θ'_c − θ_c‖) + N(0, σ_k²), keyed (session, c, iteration)
        and charged μ = Δ/σ_k with Δ = 2L‖θ'_c − θ_c‖ (replace-one) or L‖θ'_c − θ_c‖ (add/remove);
        in a secure session the noise variance is s²/(K − t) and μ = (Δ + γ)/s.
        """
        self._require_session(session, LOG_RATIO)
        iteration = self._check_index("iteration", iteration)
        chains = self._check_chains(chains)
        theta = self._check_theta("theta", theta, len(chains))
        theta_prop = self._check_theta("theta_prop", theta_prop, len(chains))
        step = self._step_limits(session).check(theta, theta_prop)
        if not self._fast:
            self._check_work(len(chains))
        pairs = np.concatenate([theta, theta_prop], axis=1).astype("<f8", copy=False)
        digests = [hashlib.sha256(_LOG_RATIO_TAG + row.tobytes()).digest() for row in pairs]

        iterations = np.full(len(chains), iteration)
        label = self._noise_label(session)
        # computed once, and only after the charge's checks
        exact = functools.cache(lambda: self._clipped_log_ratio_sums(theta, theta_prop, step))

        def fresh(k: int, new: np.ndarray) -> np.ndarray:
            one = exact()[k : k + 1, new, None]
            return self._noisy(session, label, LOG_RATIO, k, one, chains[new], iterations[new])[0]

        def fresh_all() -> np.ndarray:
            values = exact()[:, :, None]
            return self._noisy(session, label, LOG_RATIO, None, values, chains, iterations)

        mechanism = self._mechanism(session)
        # a minimum charge (invariant 14): the owners' largest charged_step, one floor for the
        # host's one AffineMus (charging an owner more is never less private)
        charged = np.maximum(step, self._charged_step)
        mus = self._mus(mechanism, self._delta_per_step, charged, 1)
        out = self._answer(
            session,
            chains,
            iterations,
            digests,
            mechanism.width(1),
            fresh,
            mus,
            fresh_all=fresh_all,
            dtype=mechanism.dtype,
        )
        return self._release(mechanism, out, (len(chains),))

    def suff_stats(
        self, session: str, chains: np.ndarray, start: int, block: int
    ) -> np.ndarray | Reply:
        """``block`` fresh noisy copies of each owner's Σ S(x) per chain: ``(K, C, block, s)``
        (a secure session: their masked sum, a ``Reply``).

        Copy j of chain c is keyed (session, c, start + j); each copy is N(Σ S(x), σ_k² I),
        charged μ = Δ_S/σ_k (secure: variance s²/(K − t), μ = (Δ_S + γ√s)/s).
        """
        self._require_session(session, SUFF_STATS)
        start = self._check_index("start", start)
        block = self._check_index("block", block)
        if block < 1:
            raise InvalidRequest("block must be at least 1", self.label)
        chains = self._check_chains(chains, per_chain=block)
        s = self._stat_sum.shape[1]
        key_chains = np.repeat(chains, block)
        key_iterations = np.tile(start + np.arange(block), len(chains))

        label = self._noise_label(session)

        def fresh(k: int, new: np.ndarray) -> np.ndarray:
            exact = np.broadcast_to(self._stat_sum[k], (1, int(new.sum()), s))
            keys = key_chains[new], key_iterations[new]
            return self._noisy(session, label, SUFF_STATS, k, exact, *keys)[0]

        def fresh_all() -> np.ndarray:
            exact = np.broadcast_to(
                self._stat_sum[:, None, :], (len(self.nodes), len(key_chains), s)
            )
            return self._noisy(session, label, SUFF_STATS, None, exact, key_chains, key_iterations)

        mechanism = self._mechanism(session)
        out = self._answer(
            session,
            key_chains,
            key_iterations,
            [_STATS_DIGEST] * len(key_chains),
            mechanism.width(s),
            fresh,
            self._mus(mechanism, self._stat_delta, np.ones(len(key_chains)), s),
            fresh_all=fresh_all,
            dtype=mechanism.dtype,
        )
        return self._release(mechanism, out, (len(chains), block, s))

    # --- the shared answer path ---------------------------------------------------------------
    def _clipped_log_ratio_sums(
        self, theta: np.ndarray, theta_prop: np.ndarray, step: np.ndarray
    ) -> np.ndarray:
        """``(K, C)`` exact clipped sums; all owners at once when they use sufficient statistics."""
        if not self._fast:
            return np.stack(
                [node.clipped_log_ratio_sum(theta, theta_prop, step) for node in self.nodes]
            )
        m = self.model
        assert isinstance(m, ExpFamModel)  # _fast: every owner answers from sufficient statistics
        d_eta = m.natural_param(theta_prop) - m.natural_param(theta)
        d_a = m.log_partition(theta_prop) - m.log_partition(theta)
        total = self._stat_sum @ d_eta.T - self._n[:, None] * d_a[None, :]
        bound = self._n[:, None] * (m.lipschitz * step)[None, :]
        np.maximum(total, -bound, out=total)  # np.clip, without its wrapper's cost
        return np.minimum(total, bound, out=total)

    def gradient(
        self, session: str, iteration: int, chains: np.ndarray, theta: np.ndarray, clip: float
    ) -> np.ndarray | Reply:
        """Noisy clipped gradient sums ``(K, C, d)`` (federated SG-MCMC, docs/design.md §2.3;
        a secure session: their masked sum, a ``Reply``, with noise sd s·clip/√(K − t)).

        Owner k's answer for chain c: each record sampled with the session's Poisson rate q,
        its ∇_θ ℓ(x, θ_c) clipped to L2 norm ``clip`` (≤ the owner's ``max_clip``), summed, plus
        noise of sd σ_k·clip — for a lattice owner the sample and the exact discrete-Gaussian
        noise come from its keyed stream and the sum is rounded to the lattice first. Keyed
        (session, c, iteration); each is one subsampled-Gaussian release at (q, the owner's
        ``gradient_noise_multiplier``), counted against the session's plan.
        """
        opened = self._require_session(session, SGMCMC)
        rates = {o.sampling_rate for o in opened}
        if len(rates) != 1:
            raise InvalidRequest(
                f"the owners of one host must share a session's sampling rate, got {sorted(rates)}",
                self.label,
            )
        q = rates.pop()
        iteration = self._check_index("iteration", iteration)
        chains = self._check_chains(chains)
        theta = self._check_theta("theta", theta, len(chains))
        clip = self._check_clip(clip)
        self._check_work(len(chains))
        tag = SGMCMC.encode() + np.float64(clip).tobytes()
        digests = [
            hashlib.sha256(tag + theta[c].astype("<f8").tobytes()).digest()
            for c in range(len(chains))
        ]

        label = self._noise_label(session)

        def fresh(k: int, new: np.ndarray) -> np.ndarray:
            if not self._lattice:
                return self._seeded_gradient(
                    session, k, q, chains[new], iteration, theta[new], clip
                )
            keys = chains[new], iteration, theta[new], clip
            return self._lattice_gradient(session, label, k, q, *keys)

        mechanism = self._mechanism(session)
        iterations = np.full(len(chains), iteration)
        sampled = SampledCharge(
            q, mechanism.gradient_multiplier, [n.policy.neighbour for n in self.nodes]
        )
        out = self._answer(
            session,
            chains,
            iterations,
            digests,
            mechanism.width(self.model.dim),
            fresh,
            None,
            sampled,
            dtype=mechanism.dtype,
        )
        return self._release(mechanism, out, (len(chains), self.model.dim), clip)

    def _seeded_gradient(
        self,
        session: str,
        k: int,
        q: float,
        chains: np.ndarray,
        iteration: int,
        theta: np.ndarray,
        clip: float,
    ) -> np.ndarray:
        """A simulated owner k's gradient answers ``(M, d)``: Poisson sample (O(q·n) work,
        ``SeededNormals.sample``) and float noise of sd σ_k·clip, both addressed by (session,
        owner, chain, iteration)."""
        records = self.nodes[k].records
        samples = [
            self._seeded.sample(session, SGMCMC, k, c, iteration, len(records), q)
            for c in chains.tolist()
        ]
        every = np.sort(np.concatenate(samples))
        used = every[np.r_[True, every[1:] != every[:-1]]] if every.size else every
        mask = np.zeros((len(chains), len(used)), dtype=bool)
        for row, sample in enumerate(samples):
            mask[row, np.searchsorted(used, sample)] = True
        sums = clipped_gradient_sum(self.model, records[used], theta, mask, clip)
        iterations = np.full(len(chains), iteration)
        normals = self._seeded.normals(
            session, SGMCMC, np.array([k]), chains, iterations, self.model.dim
        )[0]
        return sums + self._sigma[k] * clip * normals

    def _lattice_gradient(
        self,
        session: str,
        label: str,
        k: int,
        q: float,
        chains: np.ndarray,
        iteration: int,
        theta: np.ndarray,
        clip: float,
    ) -> np.ndarray:
        """Owner k's lattice gradient answers ``(M, d)`` for ``chains`` ``(M,)`` at ``theta``
        ``(M, d)``: Poisson sample and exact discrete-Gaussian noise of sd σ_k·clip, both keyed
        under ``label`` (``_noise_label``); clipped sum, rounded (docs/design.md §2.7)."""
        records = self.nodes[k].records
        mask = poisson_sample(
            self._source,
            label,
            SGMCMC,
            q,
            len(records),
            owner=k,
            chain=chains,
            iteration=iteration,
        )
        sums = clipped_gradient_sum(self.model, records, theta, mask, clip)
        iterations = np.full(len(chains), iteration)
        mechanism = self._mechanism(session)
        answers = self._lattice_answers(
            mechanism, label, SGMCMC, np.array([k]), sums[None], chains, iterations, clip
        )
        return answers[0]

    def _answer(
        self,
        session: str,
        chains: np.ndarray,
        iterations: np.ndarray,
        digests: list[bytes],
        width: int,
        fresh: Callable[[int, np.ndarray], np.ndarray],
        mus: AffineMus | None,
        sampled: SampledCharge | None = None,
        fresh_all: Callable[[], np.ndarray] | None = None,
        dtype: type = np.float64,
    ) -> np.ndarray:
        """The reply ``(K, M, width)`` of ``dtype`` (float64; masked uint64 words in a secure
        session) to keys (chains[j], iterations[j]) with query ``digests[j]``.

        A key an owner answered before gets its stored answer (nothing drawn, nothing charged).
        For the others, every ledger's charging transaction first decides every refusal that
        does not need the answers — budget, plan, caps, replay — and only then does
        ``fresh(k, new)`` compute owner k's noisy answers ``(Σ new, width)`` (``fresh_all()``:
        every owner and key at once, for the usual request where nothing was answered
        before); they are stored and committed before anything is returned (docs/design.md
        §3, invariants 1 and 11). A refused request draws no noise.
        """
        new = np.ones((len(self.nodes), len(chains)), dtype=bool)
        first, last = span(iterations)
        out: np.ndarray | None = None
        for part in self._ledgers:
            stored = part.ledger.stored_ids(part.owner_ids, session, first, last)
            if stored:
                if out is None:
                    out = np.empty((len(self.nodes), len(chains), width), dtype=dtype)
                self._replay(stored, part, chains, iterations, digests, out, new)
        charges = [
            (part, self._charge(part, session, chains, iterations, digests, mus, sampled, new))
            for part in self._ledgers
            if new[part.rows].any()
        ]
        with ExitStack() as transactions:
            stores = [
                (part, transactions.enter_context(part.ledger.charging(charge)))
                for part, charge in charges
            ]
            # every refusal that does not need the answers has been decided: draw them now
            if out is None and fresh_all is not None:
                out = fresh_all()
            else:
                if out is None:
                    out = np.empty((len(self.nodes), len(chains), width), dtype=dtype)
                for k in range(len(self.nodes)):
                    if new[k].any():
                        out[k, new[k]] = fresh(k, new[k])
            for part, store in stores:
                store(out[part.rows])
        return out

    def _charge(
        self,
        part: _LedgerPart,
        session: str,
        chains: np.ndarray,
        iterations: np.ndarray,
        digests: list[bytes],
        mus: AffineMus | None,
        sampled: SampledCharge | None,
        new: np.ndarray,
    ) -> Charge:
        """The charge of ``part``'s owners' ``new`` answers, without the answers themselves."""
        rows = part.rows
        sub = None
        if sampled is not None:
            sub = SampledCharge(
                sampled.q,
                sampled.noise_multiplier[rows],
                [sampled.neighbour[k] for k in part.idx.tolist()],
            )
        return Charge(
            session,
            part.names,
            chains,
            iterations,
            digests,
            None,
            mus[rows] if mus is not None else None,
            new[rows],
            part.max_mu_squared,
            part.budget_epsilon,
            part.delta,
            sub,
            part.renyi,
            part.owner_ids,
        )

    def _replay(
        self,
        stored: dict,
        part: _LedgerPart,
        chains: np.ndarray,
        iterations: np.ndarray,
        digests: list[bytes],
        out: np.ndarray,
        new: np.ndarray,
    ) -> None:
        """Put the stored answers of ``part``'s owners into ``out`` (and clear ``new``); a key
        answered for a different query is a ``ReplayConflict``."""
        for k, owner_id in zip(part.idx.tolist(), part.owner_ids.tolist()):
            for j, key in enumerate(zip(chains.tolist(), iterations.tolist())):
                row = stored.get((owner_id, *key))
                if row is None:
                    continue
                if row[0] != digests[j]:
                    raise ReplayConflict(
                        f"(session, chain {key[0]}, iteration {key[1]}) was already answered for a "
                        f"different query; "
                        "an owner never gives two independent noisy answers to one query",
                        self.names[k],
                    )
                out[k, j] = np.frombuffer(row[1], dtype=out.dtype.newbyteorder("<"))
                new[k, j] = False

    def _check_work(self, chains: int) -> None:
        """``InvalidRequest`` before any work when chains × records would pass an owner's
        ``max_record_evaluations`` (per-record log-ratios and gradients)."""
        over = chains * self._records > self._max_work
        if over.any():
            k = int(np.argmax(over))
            raise InvalidRequest(
                f"request asks for {chains} chains × {self._records[k]} records = "
                f"{chains * self._records[k]} per-record evaluations; this owner computes at most "
                f"{self._max_work[k]} per request (max_record_evaluations)",
                self.names[k],
            )

    def _check_clip(self, clip: Any) -> float:
        """``clip`` as a float; ``InvalidRequest`` unless positive, finite and within every
        owner's ``max_clip``."""
        number = isinstance(clip, (int, float, np.floating)) and not isinstance(clip, bool)
        if not number or not 0 < clip < np.inf:
            raise InvalidRequest(f"clip must be a positive finite number, got {clip!r}", self.label)
        for node in self.nodes:
            low, high = node.policy.min_clip, node.policy.max_clip
            if not low <= clip <= high:
                if clip > high:
                    which = f"exceeds this owner's max_clip {high:g}"
                else:
                    which = f"is below this owner's min_clip {low:g}"
                raise InvalidRequest(f"clip {clip:g} {which}", node.name)
        return float(clip)

    # --- validation ---------------------------------------------------------------------------
    def _check_index(self, what: str, value: Any) -> int:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, np.integer))
            or not 0 <= value < 2**62
        ):
            raise InvalidRequest(
                f"{what} must be a non-negative integer, got {value!r}", self.label
            )
        return int(value)

    def _check_chains(self, chains: Any, per_chain: int = 1) -> np.ndarray:
        arr = np.asarray(chains)
        if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu":
            raise InvalidRequest("chains must be a non-empty 1-D array of integers", self.label)
        ordered = np.sort(arr)  # (np.unique hashes: ~10x slower for a few chains)
        if ordered[0] < 0 or bool((ordered[1:] == ordered[:-1]).any()):
            raise InvalidRequest("chains must be distinct non-negative integers", self.label)
        if ordered[-1] >= MAX_CHAIN:  # the noise streams' chain address space
            raise InvalidRequest(
                f"chain ids must be below 2^29 = {MAX_CHAIN}, got {int(ordered[-1])}", self.label
            )
        if arr.size * per_chain > self._max_answers:
            raise InvalidRequest(
                f"request asks for {arr.size * per_chain} answers; this owner answers at most "
                f"{self._max_answers} per request",
                self.label,
            )
        return arr.astype(np.int64)

    def _check_theta(self, what: str, theta: Any, chains: int) -> np.ndarray:
        try:
            arr = np.asarray(theta, dtype=float)
        except (TypeError, ValueError):
            arr = None
        if arr is None or arr.shape != (chains, self.model.dim):
            raise InvalidRequest(
                f"{what} must have shape ({chains}, {self.model.dim}), got "
                f"{None if arr is None else arr.shape}",
                self.label,
            )
        if not self.model.in_theta_space(arr).all():  # NaN and inf are outside Θ too
            if not np.isfinite(arr).all():
                raise InvalidRequest(f"{what} contains NaN or inf", self.label)
            raise InvalidRequest(
                f"{what} lies outside Θ = [-{self.model.theta_bound:g}, "
                f"{self.model.theta_bound:g}]^"
                f"{self.model.dim}",
                self.label,
            )
        return arr
