"""The in-process transport: owners living in the coordinator's process, served by one
``OwnerHost`` (no serialisation; tests and the fastest simulations). With secure aggregation
the host computes every owner's masked answer and the oracle decodes their sum
(``secure_sum``), exactly as over a network."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import privacy_rows
from ..common import OwnerDescription, PrivacyReport
from ..kinds import KindTerms, query_kind
from ..models import Model
from ..models.compat import ModelIdentity
from ..owner import Ledger, OwnerHost, OwnerNode
from ..owner.host import gc_paused
from ..owner.session_request import SessionRequest
from .oracle import Answers, Oracle, SecureAggregation, Unreported
from .secure_sum import combine, secure_open
from .transport_base import Launched, OwnerSetup, Transport


class InProcessOracle(Oracle):
    """Owners living in this process, served by one ``OwnerHost`` (no serialisation).
    ``model``: the scenario's model, named in every session request (each owner refuses a
    session for a model other than its own); None names none."""

    def __init__(self, nodes: Sequence[OwnerNode], model: Model | None = None):
        self.host = OwnerHost(nodes)
        self.session: str | None = None
        self._model = None if model is None else ModelIdentity.of(model)

    def describe(self) -> list[OwnerDescription]:
        return self.host.describe()

    def open_kinds(
        self,
        terms: Sequence[KindTerms],
        session: str | None = None,
        secure: SecureAggregation | None = None,
    ) -> str:
        """Open (or resume) a session of the kinds ``terms`` (each with its plan, rate and
        step) at every owner; returns its id."""
        session = session or uuid.uuid4().hex
        request = None
        if secure is not None:
            keys = self.host.session_keys(session)
            request = secure_open(keys, secure, lambda k: self.host.reveal_shares(session, k))
        self.host.open(SessionRequest.several(session, terms, secure=request, model=self._model))
        self.session = session
        return session

    def _require_session(self) -> str:
        if self.session is None:
            raise RuntimeError("open_session must be called first")
        return self.session

    def query(
        self, kind: str, iteration: int, chains: np.ndarray, substep: int = 0, **arrays: Any
    ) -> Answers:
        session = self._require_session()
        asked = query_kind(kind)
        # the host checks the kind's arrays (``QueryKind.ask`` would check them twice)
        return combine(
            [self.host.answer_reply(asked, session, iteration, chains, substep, **arrays)]
        )

    def privacy_reports(self) -> list[PrivacyReport]:
        return self.host.privacy_reports(self.session)

    def reachable_reports(self) -> list[PrivacyReport | Unreported]:
        """The owners live in this process: every one of them reports."""
        return list(self.privacy_reports())

    def close(self) -> None:
        if self.session is not None:
            self.host.close_session(self.session)
            self.session = None

    def disconnect(self) -> None:
        """Nothing to release: the owners live in this process (the session stays open)."""

    def persist(self) -> None:
        """Commit the charges the owners' batched ledgers hold (``Ledger.flush``)."""
        for ledger in {id(node.ledger): node.ledger for node in self.host.nodes}.values():
            ledger.flush()

    def simulation_diagnostics(self) -> dict[str, Any] | None:
        nodes = self.host.nodes
        if any(node.diagnostics is None for node in nodes):
            return None
        counters = [node.simulation_diagnostics() for node in nodes]
        return simulation_only(
            [not node.per_record for node in nodes],
            [c.clip_binds for c in counters],
            [c.log_ratio_terms for c in counters],
            [c.by_kind for c in counters],
        )


#: diagnostics.json's ``simulation_only`` note.
SIMULATION_NOTE = (
    "data-dependent counters kept by simulated owners only; deployed owners never release them. "
    "Owners answering from sufficient statistics evaluate no per-record terms: for records "
    "inside the data domain the per-record clip cannot bind there"
)


def simulation_only(
    sufficient: list[bool],
    binds: list[int],
    terms: list[int],
    by_kind: list[dict[str, list[int]]],
) -> dict[str, Any]:
    """diagnostics.json's ``simulation_only`` block from each owner's counters: whether it
    answered from sufficient statistics, its clip binds and log-ratio terms, and its clip hits
    and evaluations per kind (``clip_hits``). Past ``privacy_rows.MAX_JSON_OWNERS`` owners,
    totals over the owners instead of per-owner lists (``per_owner`` false), so the file does
    not grow with them (docs/design.md §5)."""
    hits = clip_hits(by_kind)
    if len(sufficient) <= privacy_rows.MAX_JSON_OWNERS:
        return {
            "note": SIMULATION_NOTE,
            "answered_from_sufficient_statistics": sufficient,
            "clip_binds": binds,
            "log_ratio_terms": terms,
            "clip_hits": hits,
        }
    return {
        "note": SIMULATION_NOTE,
        "per_owner": False,
        "owners": len(sufficient),
        "answered_from_sufficient_statistics": sum(sufficient),
        "clip_binds": sum(binds),
        "log_ratio_terms": sum(terms),
        "clip_hits": {
            kind: {**counts, "hits": sum(counts["hits"]), "evaluations": sum(counts["evaluations"])}
            for kind, counts in hits.items()
        },
    }


def clip_hits(by_owner: list[dict[str, list[int]]]) -> dict[str, dict[str, Any]]:
    """Per query kind (ledger name) the owners counted: each owner's records whose clip bound
    was hit (``hits``) and record evaluations (``evaluations``), and the fraction of all
    evaluations that hit it (``fraction``; None before any)."""
    kinds = sorted({kind for counts in by_owner for kind in counts})
    out: dict[str, dict[str, Any]] = {}
    for kind in kinds:
        hits = [counts.get(kind, [0, 0])[0] for counts in by_owner]
        evaluations = [counts.get(kind, [0, 0])[1] for counts in by_owner]
        total = sum(evaluations)
        fraction = sum(hits) / total if total else None
        out[kind] = {"hits": hits, "evaluations": evaluations, "fraction": fraction}
    return out


def launch(setup: OwnerSetup) -> Launched:
    """The simulation's owners in this process, on one ledger in the run directory."""
    ledger = Ledger.simulation(setup.folder / "ledger.sqlite", batched=True)
    with gc_paused():
        answered = ledger.answered_on_lattice_of(setup.names)  # once: docs/design.md §4
        nodes = [
            OwnerNode.simulated(name, setup.model, records, policy, ledger, seed, True, lattice)
            for name, records, policy, seed, lattice in zip(
                setup.names, setup.records, setup.policies, setup.seeds, answered
            )
        ]
        oracle = InProcessOracle(nodes, setup.model)
    return Launched(oracle, ledger.close)


INPROCESS = Transport("inprocess", "owners in the coordinator's process (fastest)", launch)
