"""What a query kind is (docs/design.md §6, "A query kind"): everything an owner must know
about one kind of answer — how a session request for it is checked, the named arrays a query
carries, the tag its query digests start with, the width of one answer, the sensitivity of one
answer (the ONE function that admission, refusal advice and charging call), the accounting
event its answers make, the words and keys that reports and refusals use for it, and its
answer path at a host (``answer_path``: checks, digests, charge and compute).

Every kind has two names: its protocol-v2 name (``name``: ``log_ratio``, ``suff_stats``,
``gradient``), by which ``OwnerHost.answer`` and the oracles' ``query`` ask it, and its
ledger name (``ledger_name``: ``penalty``, ``penalty_expfam``, ``sgmcmc``), the
string stored on disk and fed to the seeded noise streams, which never changes.

This module sits just above the leaves (errors, models, privacy): ``common`` imports it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from ..errors import InvalidRequest
from ..models import Model
from ..privacy import GaussianSpend
from ..privacy.events import SelfComposed
from ..privacy.subsampled import SubsampledGaussian

if TYPE_CHECKING:  # common and the owner package import this one; their types are only types
    from ..common import Policy, SecureTerms
    from ..owner.node import OwnerNode
    from ..owner.pipeline import KindPath

#: What one kind's planned answers add to an owner's spend: Gaussian answers (μ-accounted),
#: Poisson-subsampled Gaussian answers (dp-accounting) or pure-ε releases (SelfComposed).
Event = GaussianSpend | SubsampledGaussian | SelfComposed


class OwnerCosts(Protocol):
    """What an owner knows of its own answers' cost (``OwnerNode``): the worst-case μ of a
    Gaussian answer and the noise multiplier gradient answers are accounted at."""

    def worst_case_mu(
        self, algorithm: str, max_step: float | None = None, secure: SecureTerms | None = None
    ) -> float: ...

    def gradient_multiplier(self, secure: SecureTerms | None = None) -> float: ...

    @property
    def model(self) -> Model: ...

    @property
    def policy(self) -> Policy: ...


@dataclass(frozen=True)
class KindTerms:
    """One kind's terms in a session request: ``kind`` (its v2 or ledger name), the most
    answers each owner gives (``planned_answers``), the Poisson ``sampling_rate`` q (gradient
    answers only) and the largest step ‖θ′ − θ‖₂ the session asks (``max_step``, log ratios
    only; None: the owner's policy's). Checked by the kind's ``check_terms``."""

    kind: str
    planned_answers: int
    sampling_rate: float | None = None
    max_step: float | None = None


class QueryKind(ABC):
    """One kind of query an owner answers. Subclasses set the class attributes and implement
    ``sensitivity``, ``width`` and ``event``; the registry (``kinds.KINDS``) holds one
    instance per kind."""

    #: protocol-v2 name (the kinds of the first release: also their host and oracle wrappers')
    name: ClassVar[str]
    #: the name stored in ledgers and mixed into seeded noise streams (never changes)
    ledger_name: ClassVar[str]
    #: what this kind's noise level (``Policy.noise_for``) means (units)
    sigma_meaning: ClassVar[str]
    #: OWNER.toml's ``[privacy]`` key naming this kind's noise level (``owner_config``)
    noise_key: ClassVar[str]
    #: privacy.json's ``accounting`` words for runs of this kind
    report_basis: ClassVar[str]
    #: privacy.json's name of an owner's noise level (``report_noise``)
    report_sigma_key: ClassVar[str] = "sigma"
    #: scenario keys whose values set a plan's worst-case spend (``refusals.plan_causes``)
    spend_keys: ClassVar[tuple[str, ...]]
    #: the named arrays (and scalars) a query of this kind carries besides its keys
    arrays: ClassVar[tuple[str, ...]]
    #: one answer's sensitivity grows with the step (a smaller step is a remedy for a refusal)
    step_scaled: ClassVar[bool] = False
    #: a session of this kind declares a Poisson sampling rate (``KindTerms.sampling_rate``)
    takes_rate: ClassVar[bool] = False
    #: the noise level is a multiplier of the query's clip (noise sd σ·clip)
    clip_scaled: ClassVar[bool] = False
    #: the scenario key that sets a simulated owner's level of this kind (refusal advice)
    scenario_noise_key: ClassVar[str] = "privacy.sigma"
    #: how a simulated owner draws this kind's noise (privacy.json's ``noise`` line)
    simulated_noise: ClassVar[str] = "float Gaussian noise"

    # --- the request ------------------------------------------------------------------------
    def check_model(self, model: Model, public_n: int | None, owner: str) -> None:
        """``InvalidRequest`` naming ``owner`` when its model (or its undisclosed record
        count, ``public_n`` None) cannot answer this kind; every model answers by default."""
        return None

    def check_terms(self, terms: KindTerms, policy: Policy, owner: str) -> KindTerms:
        """``terms`` as this owner records them (``max_step``: the declared one or the
        policy's, for kinds that take one); ``InvalidRequest`` naming ``owner`` when they are
        malformed or outside ``policy``."""
        planned = terms.planned_answers
        planned_ok = isinstance(planned, (int, np.integer)) and planned >= 0
        if isinstance(planned, bool) or not planned_ok:
            raise InvalidRequest(
                f"planned_answers must be a non-negative integer, got {planned!r}", owner
            )
        return KindTerms(
            self.name,
            int(planned),
            self._check_rate(terms.sampling_rate, policy, owner),
            self._check_step(terms.max_step, policy, owner),
        )

    def _check_rate(self, rate: float | None, policy: Policy, owner: str) -> float | None:
        """Kinds without Poisson sampling refuse a sampling rate."""
        if rate is not None:
            raise InvalidRequest(
                f"only sgmcmc sessions take a sampling_rate, not {self.ledger_name!r}", owner
            )
        return None

    def _check_step(self, step: float | None, policy: Policy, owner: str) -> float | None:
        """Kinds without a step refuse a declared max_step."""
        if step is not None:
            raise InvalidRequest(
                f"only penalty sessions declare a max_step, not {self.ledger_name!r}", owner
            )
        return None

    # --- a query ----------------------------------------------------------------------------
    def check_arrays(self, arrays: Mapping[str, Any]) -> None:
        """``InvalidRequest`` unless ``arrays`` are named exactly the kind's ``arrays`` (their
        shapes and values are its ``answer_path``'s to check)."""
        if set(arrays) != set(self.arrays):
            raise InvalidRequest(
                f"a {self.name} query carries {', '.join(self.arrays)}, not "
                f"{', '.join(sorted(arrays)) or 'nothing'}"
            )

    def ask(
        self,
        host: Any,
        session: str,
        iteration: int,
        chains: np.ndarray,
        arrays: Mapping[str, Any],
        substep: int = 0,
    ) -> Any:
        """The owner host's answers to one query of this kind (``OwnerHost.answer``): keys
        (``session``, chain, ``iteration`` …) for ``chains`` ``(C,)`` at ``substep``, with the
        kind's ``arrays``; ``InvalidRequest`` when they are not exactly the kind's."""
        self.check_arrays(arrays)
        return host.answer(self.name, session, iteration, chains, substep, **arrays)

    @abstractmethod
    def answer_path(self, nodes: Sequence[OwnerNode]) -> KindPath:
        """This kind's answer path at a host of the owners ``nodes`` (``pipeline.KindPath``):
        its checks of a query's arrays, the digest of each answer, its charge and its compute.
        Kinds import their path when asked for it: the owner package imports this one."""

    def keys_per_chain(self, arrays: Mapping[str, Any]) -> int:
        """Answers (keys) one query asks per chain."""
        return 1

    def reply_scale(self, arrays: Mapping[str, Any]) -> float:
        """The unit of the answers' noise sd (σ_k × this): 1, or a gradient's clip."""
        return 1.0

    @property
    def digest_tag(self) -> bytes:
        """The bytes every query digest of this kind starts with (docs/design.md §3,
        invariant 2): the ledger name, as stored digests were made."""
        return self.ledger_name.encode()

    # --- what one answer is and costs -------------------------------------------------------
    @abstractmethod
    def width(self, model: Model) -> int:
        """Components of one answer (of one owner, one key)."""

    @abstractmethod
    def sensitivity(self, model: Model, neighbour: str, step: float) -> float:
        """L2 sensitivity of one answer for a move of length ``step`` (in the answer's units;
        gradient answers: per unit clip). The ONE definition: ``OwnerNode.worst_case_mu``
        (admission), ``refusals.plan_needs`` (advice) and the host's charges call it."""

    def worst_step(self, policy: Policy, max_step: float | None) -> float:
        """The step a plan's worst case is taken at: the session's ``max_step`` (default: the
        policy's, never above it), and never below ``policy.charged_step``, the least step any
        answer is charged at (docs/design.md §3, invariant 14)."""
        step = policy.max_step if max_step is None else min(policy.max_step, max_step)
        return max(step, policy.charged_step)

    def worst_sensitivity(self, model: Model, policy: Policy, max_step: float | None) -> float:
        """The sensitivity of the most expensive answer ``policy`` allows in a session whose
        largest step is ``max_step``."""
        return self.sensitivity(model, policy.neighbour, self.worst_step(policy, max_step))

    @abstractmethod
    def answer_unit(
        self, owner: OwnerCosts, max_step: float | None, secure: SecureTerms | None
    ) -> float:
        """What one answer costs ``owner`` in this kind's ``event``: the worst-case μ (Gaussian
        kinds, in a session whose largest step is ``max_step``) or the noise multiplier."""

    def session_multiplier(self, owner: OwnerCosts, secure: SecureTerms | None) -> float | None:
        """The noise multiplier the ledger records for a session of this kind (the one its
        reservation is held at); None for kinds not accounted by one."""
        return None

    @abstractmethod
    def event(self, answers: int, unit: float, sampling_rate: float | None) -> Event:
        """The accounting event of ``answers`` answers: each of μ = ``unit`` (Gaussian kinds)
        or of noise multiplier ``unit`` at Poisson rate ``sampling_rate`` (gradients)."""

    def budget_level(self, model: Model, neighbour: str, epsilon: float) -> float | None:
        """The noise level at which one answer costs ``epsilon`` (nats), for a kind whose
        simulated owners calibrate their level to the budget when the scenario names none;
        None (the default): the level is privacy.sigma's."""
        return None

    def report_noise(self, sigma: float, sampler: Mapping[str, Any]) -> dict[str, Any]:
        """An owner's noise fields in privacy.json: its noise level ``sigma`` under
        ``report_sigma_key``, and what else sets its answers' noise (from ``sampler``)."""
        return {self.report_sigma_key: sigma}

    def __repr__(self) -> str:
        return f"<query kind {self.name} ({self.ledger_name})>"
