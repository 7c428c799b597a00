"""The owner protocol's messages ↔ fedpenalty's Python objects, for both ends of the wire.

Arrays travel as packed row-major float64 with an explicit shape (a secure session's masked
sums as packed uint64, docs/design.md §2.6); owner refusals travel as a
gRPC status (unary calls) or an in-band ``Refusal`` (the Query stream) naming the error class,
so the coordinator re-raises exactly the ``fedpenalty.errors`` class the owner raised.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import errors
from ..common import OwnerDescription, OwnNoise, Policy, PrivacyReport, SecureTerms, SpendReport
from ..kinds import KINDS, KindTerms, kind_names, query_kind
from ..models.base import check_neighbour
from ..models.compat import ModelIdentity
from ..proto import owner_pb2 as pb
from .aggregation import PeerKey, Reply, SecureOpen
from .session_request import SessionRequest

#: trailing-metadata keys of a refused unary call
ERROR_KEY, OWNER_KEY, EPSILON_LEFT_KEY = (
    "fedpenalty-error",
    "fedpenalty-owner",
    "fedpenalty-epsilon-left",
)

_ERRORS: dict[str, type[errors.OwnerError]] = {
    cls.__name__: cls
    for cls in (
        errors.InvalidRequest,
        errors.UnknownSession,
        errors.ReplayConflict,
        errors.BudgetExhausted,
        errors.NotPermitted,
        errors.OwnerUnavailable,
        errors.StorageUnavailable,
        errors.AggregationFailed,
    )
}


# --- arrays -------------------------------------------------------------------------------
def rows(values, count: int, what: str) -> np.ndarray:
    """Packed doubles → ``(count, len/count)``; a length that does not split into ``count``
    rows is an ``InvalidRequest`` (the owner then checks the row width itself)."""
    arr = np.asarray(values, dtype=float)
    if count == 0 and arr.size == 0:
        return arr.reshape(0, 0)  # the owner refuses the empty chain list itself
    if count < 1 or arr.size % count:
        raise errors.InvalidRequest(
            f"{what} has {arr.size} values, which is not {count} rows of equal length"
        )
    return arr.reshape(count, arr.size // count)


def answers_message(reply: Reply) -> pb.Answers:
    """A host's ``Reply`` → ``Answers`` (plain values, or a secure session's masked sum)."""
    msg = pb.Answers(shape=reply.values.shape, noise_sd=np.asarray(reply.noise_sd, dtype=float))
    if reply.lattice_step is None:
        msg.values[:] = np.ascontiguousarray(reply.values, dtype=float).ravel()
        return msg
    assert reply.check is not None  # a secure reply carries its check words
    msg.masked[:] = np.ascontiguousarray(reply.values, dtype=np.uint64).ravel()
    msg.check[:] = np.ascontiguousarray(reply.check, dtype=np.uint64).ravel()
    msg.lattice_step = reply.lattice_step
    return msg


def answers_reply(msg: pb.Answers) -> Reply:
    """``Answers`` → the host's ``Reply``; ``OwnerError`` when the sizes do not fit the shape."""
    shape = tuple(msg.shape)
    noise_sd = np.asarray(msg.noise_sd, dtype=float)
    if msg.lattice_step:
        values = np.asarray(msg.masked, dtype=np.uint64)
        check = np.asarray(msg.check, dtype=np.uint64)
        if math.prod(shape) != values.size or not shape or shape[0] != 1 or not check.size:
            raise errors.OwnerError(
                f"malformed masked answers: {values.size} words for shape {shape}, "
                f"{check.size} check words"
            )
        return Reply(values.reshape(shape), noise_sd, msg.lattice_step, check[None])
    values = np.asarray(msg.values, dtype=float)
    if math.prod(shape) != values.size or not shape or shape[0] != len(noise_sd):
        raise errors.OwnerError(
            f"malformed answers: {values.size} values for shape {shape} and "
            f"{len(noise_sd)} noise sds"
        )
    return Reply(values.reshape(shape), noise_sd)


# --- queries ------------------------------------------------------------------------------
@dataclass(frozen=True)
class QueryCodec:
    """One v1 query message on the wire (the ``QueryRequest`` oneof field named as the kind;
    clients of this release send a ``KindQuery`` instead): ``message`` its class; ``fields``
    the message's fields besides session and chains from (iteration, arrays); ``arrays``
    (iteration, arrays) back from a message of C chains (``InvalidRequest`` for a malformed
    one); ``keys`` the answers it asks per chain."""

    message: type
    fields: Callable[[int, Mapping[str, Any]], dict[str, Any]]
    arrays: Callable[[Any, int], tuple[int, dict[str, Any]]]
    keys: Callable[[Any], int] = lambda msg: 1


#: Query kind (v2 name) → its v1 message's codec: the kinds of the first release only (a kind
#: registered since travels as a ``KindQuery`` alone).
QUERY_CODECS: dict[str, QueryCodec] = {
    "log_ratio": QueryCodec(
        pb.LogRatioRequest,
        lambda it, a: {
            "iteration": int(it),
            "theta": np.ravel(a["theta"]).tolist(),
            "theta_prop": np.ravel(a["theta_prop"]).tolist(),
        },
        lambda m, c: (
            m.iteration,
            {"theta": rows(m.theta, c, "theta"), "theta_prop": rows(m.theta_prop, c, "theta_prop")},
        ),
    ),
    "suff_stats": QueryCodec(
        pb.SuffStatsRequest,
        lambda it, a: {"start": int(it), "block": int(a["block"])},
        lambda m, c: (m.start, {"block": m.block}),
        lambda m: m.block,
    ),
    "gradient": QueryCodec(
        pb.GradientRequest,
        lambda it, a: {
            "iteration": int(it),
            "theta": np.ravel(a["theta"]).tolist(),
            "clip": a["clip"],
        },
        lambda m, c: (m.iteration, {"theta": rows(m.theta, c, "theta"), "clip": m.clip}),
    ),
}


def query_codec(kind: str) -> QueryCodec:
    """The v1 codec of ``kind`` (v2 name); ``InvalidRequest`` naming the kinds it has."""
    codec = QUERY_CODECS.get(kind)
    if codec is None:
        raise errors.InvalidRequest(
            f"no query kind {kind!r} on the wire; it carries {', '.join(QUERY_CODECS)}"
        )
    return codec


def kind_query(
    kind: str, session: str, iteration: int, chains, arrays, substep: int = 0
) -> pb.KindQuery:
    """A query of ``kind`` (v2 name) at ``substep`` as the generic ``KindQuery``: ``arrays`` by
    name, integer ones (Python or numpy ints) as integers, everything else as float64. Sub-step
    0 is not written (proto3's default): such a query is the bytes of one before sub-steps."""
    return pb.KindQuery(
        kind=kind,
        session=session,
        iteration=int(iteration),
        chains=np.asarray(chains).tolist(),
        arrays=[_named_array(name, value) for name, value in arrays.items()],
        substep=int(substep),
    )


def _named_array(name: str, value: Any) -> pb.NamedArray:
    arr = np.asarray(value)
    msg = pb.NamedArray(name=name, shape=arr.shape)
    if arr.dtype.kind in "iu":
        msg.integers[:] = arr.ravel().tolist()
    else:
        msg.values[:] = np.ravel(arr.astype(float)).tolist()
    return msg


def kind_query_arrays(msg: pb.KindQuery) -> dict[str, Any]:
    """A ``KindQuery``'s named arrays: scalars as Python ints or floats, the others as arrays
    of their shape; ``InvalidRequest`` for a name given twice, or values that do not fill
    their shape of at most 32 axes (whether the names, shapes and values are the kind's is
    the kind's to check)."""
    arrays: dict[str, Any] = {}
    for named in msg.arrays:
        if named.name in arrays:
            raise errors.InvalidRequest(f"the query names the array {named.name!r} twice")
        if named.integers and named.values:
            raise errors.InvalidRequest(f"array {named.name!r} has both values and integers")
        shape = tuple(named.shape)
        if named.integers:
            flat = np.asarray(named.integers, dtype=np.int64)
        else:
            flat = np.asarray(named.values, dtype=float)
        if len(shape) > 32 or any(n < 0 for n in shape) or math.prod(shape) != flat.size:
            raise errors.InvalidRequest(
                f"array {named.name!r} has {flat.size} values, not the {shape} it declares"
            )
        arrays[named.name] = flat[0].item() if not shape else flat.reshape(shape)
    return arrays


# --- secure aggregation -------------------------------------------------------------------
def peer_key_message(key: PeerKey) -> pb.PeerKey:
    return pb.PeerKey(
        owner=key.owner,
        public_key=key.public_key,
        signature=key.signature,
        certificate=key.certificate,
        commitment=key.commitment,
        share=key.share,
    )


def peer_key(msg: pb.PeerKey) -> PeerKey:
    return PeerKey(
        msg.owner,
        bytes(msg.public_key),
        bytes(msg.signature),
        bytes(msg.certificate),
        bytes(msg.commitment),
        bytes(msg.share),
    )


def secure_message(secure: SecureOpen) -> pb.SecureAggregation:
    return pb.SecureAggregation(
        peers=[peer_key_message(k) for k in secure.peers],
        total_noise_sd=secure.total_noise_sd,
        colluders=secure.colluders,
    )


def secure_open(msg: pb.SecureAggregation) -> SecureOpen:
    return SecureOpen(tuple(peer_key(k) for k in msg.peers), msg.total_noise_sd, int(msg.colluders))


# --- sessions -----------------------------------------------------------------------------
def open_message(request: SessionRequest) -> pb.OpenSessionRequest:
    """A session request on the wire. One kind: in the single-kind fields, by the v2 name
    (``kind``) and, for owners that speak only v1, by its ledger name (``algorithm``) — the
    message of the release before sessions of several kinds. Several kinds: in ``kinds`` alone
    (an owner that knows no ``kinds`` then refuses the session: it names no kind)."""
    msg = pb.OpenSessionRequest(session=request.session)
    asked = request.kinds()
    if len(asked) == 1:
        terms = asked[0]
        kind = query_kind(terms.kind)
        msg.kind, msg.algorithm = kind.name, kind.ledger_name
        msg.planned_answers = terms.planned_answers
        if terms.sampling_rate is not None:
            msg.sampling_rate = terms.sampling_rate
        if terms.max_step is not None:
            msg.max_step = terms.max_step
    else:
        msg.kinds.extend(_terms_message(t) for t in asked)
    if request.secure is not None:
        msg.secure.CopyFrom(secure_message(request.secure))
    if request.model is not None:
        m = request.model
        msg.model.CopyFrom(
            pb.ModelIdentity(name=m.name, params_json=json.dumps(m.params), digest=m.digest)
        )
    return msg


def model_identity(msg: pb.OpenSessionRequest) -> ModelIdentity | None:
    """The coordinator's model a session request names; None when it names none (an older
    client). ``InvalidRequest`` for parameters that are not a JSON object."""
    if not msg.HasField("model"):
        return None
    try:
        params = json.loads(msg.model.params_json)
    except ValueError:
        params = None
    if not isinstance(params, dict):
        raise errors.InvalidRequest(
            f"the session's model parameters are not a JSON object: {msg.model.params_json!r}"
        )
    return ModelIdentity(msg.model.name, params, msg.model.digest)


def _terms_message(terms: KindTerms) -> pb.KindTerms:
    msg = pb.KindTerms(kind=query_kind(terms.kind).name, planned_answers=terms.planned_answers)
    if terms.sampling_rate is not None:
        msg.sampling_rate = terms.sampling_rate
    if terms.max_step is not None:
        msg.max_step = terms.max_step
    return msg


def _kind_terms(msg: pb.KindTerms | pb.OpenSessionRequest, kind: str) -> KindTerms:
    """``kind``'s terms from a message's plan, rate and step (``KindTerms`` or the
    single-kind fields of ``OpenSessionRequest``)."""
    return KindTerms(
        kind,
        msg.planned_answers,
        msg.sampling_rate if msg.HasField("sampling_rate") else None,
        msg.max_step if msg.HasField("max_step") else None,
    )


def session_request(
    msg: pb.OpenSessionRequest, client: str | None, secure: SecureOpen | None
) -> SessionRequest:
    """``OpenSession`` → the request the host opens, for ``client`` with ``secure`` (decoded
    by the server, which alone may mark its peers authenticated). The kinds are ``kinds`` (v2,
    at most one per registered kind) or else the one kind of the single-kind fields: ``kind``
    (v2) or ``algorithm`` (v1), which must name one kind when both are set. A message with
    both single-kind fields and ``kinds`` must carry one kind with the same terms in each."""
    if len(msg.kinds) > len(KINDS):
        raise errors.InvalidRequest(
            f"the session asks {len(msg.kinds)} query kinds; each kind is asked once and "
            f"there are {len(KINDS)}: {kind_names()}"
        )
    kinds = [_kind_terms(t, t.kind) for t in msg.kinds]
    model = model_identity(msg)
    if not kinds:
        return SessionRequest(msg.session, (_single_terms(msg),), client, secure, model)
    if _names_a_single_kind(msg):
        single = _single_terms(msg)
        if len(kinds) != 1 or not _same_terms(single, kinds[0]):
            raise errors.InvalidRequest(
                f"the session's single-kind fields ask {single} but its kinds ask "
                f"{', '.join(map(str, kinds))}; send the kinds alone"
            )
    return SessionRequest.several(msg.session, kinds, client, secure, model)


def _names_a_single_kind(msg: pb.OpenSessionRequest) -> bool:
    """The message sets any of the single-kind (v1) fields."""
    optional = msg.HasField("sampling_rate") or msg.HasField("max_step")
    return bool(msg.kind or msg.algorithm or msg.planned_answers or optional)


def _single_terms(msg: pb.OpenSessionRequest) -> KindTerms:
    """The terms of the single-kind fields: the kind is ``kind`` (v2) or else ``algorithm``
    (v1); a message naming both must name one kind."""
    if msg.kind and msg.algorithm and query_kind(msg.kind) is not query_kind(msg.algorithm):
        raise errors.InvalidRequest(
            f"the session names two query kinds: kind {msg.kind!r} and algorithm "
            f"{msg.algorithm!r}; name one (kind)"
        )
    return _kind_terms(msg, msg.kind or msg.algorithm)


def _same_terms(a: KindTerms, b: KindTerms) -> bool:
    """One kind (by either of its names; ``a`` may name none) with the same plan, rate and
    step."""
    if not a.kind or query_kind(a.kind) is not query_kind(b.kind):
        return False
    return (a.planned_answers, a.sampling_rate, a.max_step) == (
        b.planned_answers,
        b.sampling_rate,
        b.max_step,
    )


# --- descriptions and reports -------------------------------------------------------------
def owner_info(d: OwnerDescription) -> pb.OwnerInfo:
    p = d.policy
    return pb.OwnerInfo(
        name=d.name,
        model=d.model,
        model_params_json=json.dumps(d.model_params),
        model_digest=d.model_digest,
        dim=d.dim,
        n=-1 if d.n is None else d.n,
        policy=pb.Policy(
            sigma=p.sigma,
            max_step=p.max_step,
            budget_epsilon=p.budget_epsilon,
            delta=p.delta,
            neighbour=p.neighbour,
            max_answers_per_request=p.max_answers_per_request,
            min_step=p.min_step,
            min_clip=p.min_clip,
            max_record_evaluations=p.max_record_evaluations,
            max_sampling_rate=p.max_sampling_rate,
            max_clip=p.max_clip,
            total_noise_sd=p.total_noise_sd,
            colluders=p.colluders,
            min_peers=p.min_peers,
            min_charged_step=p.min_charged_step,
            noise=p.noise,
        ),
    )


def owner_description(msg: pb.OwnerInfo) -> OwnerDescription:
    p = msg.policy
    policy = Policy(
        sigma=p.sigma,
        max_step=p.max_step,
        budget_epsilon=p.budget_epsilon,
        delta=p.delta,
        neighbour=check_neighbour(p.neighbour),
        max_answers_per_request=int(p.max_answers_per_request),
        max_sampling_rate=p.max_sampling_rate,
        max_clip=p.max_clip,
        min_step=p.min_step,
        min_clip=p.min_clip,
        max_record_evaluations=int(p.max_record_evaluations),
        total_noise_sd=p.total_noise_sd if p.HasField("total_noise_sd") else None,
        colluders=int(p.colluders),
        min_peers=int(p.min_peers),
        min_charged_step=p.min_charged_step if p.HasField("min_charged_step") else None,
        noise=dict(p.noise),
    )
    params = json.loads(msg.model_params_json)
    count = _count(msg.n)
    return OwnerDescription(msg.name, msg.model, params, msg.dim, count, policy, msg.model_digest)


def _spend(s: SpendReport) -> pb.Spend:
    return pb.Spend(
        answers=s.answers,
        mu=s.mu,
        epsilon=s.epsilon,
        epsilon_paper_bound=s.epsilon_paper_bound,
        accountant=s.accountant,
    )


def _spend_report(s: pb.Spend) -> SpendReport:
    return SpendReport(s.answers, s.mu, s.epsilon, s.epsilon_paper_bound, s.accountant)


def owner_privacy(r: PrivacyReport) -> pb.OwnerPrivacy:
    msg = pb.OwnerPrivacy(
        owner=r.owner,
        n=-1 if r.n is None else r.n,
        delta=r.delta,
        budget_epsilon=r.budget_epsilon,
        neighbour=r.neighbour,
        total=_spend(r.total),
    )
    if r.session is not None:
        msg.session.CopyFrom(_spend(r.session))
    if r.own_noise is not None:
        own = r.own_noise
        msg.own_noise.total.CopyFrom(_spend(own.total))
        if own.session is not None:
            msg.own_noise.session.CopyFrom(_spend(own.session))
        msg.own_noise.peers = own.peers
        if own.terms is not None:
            t = own.terms
            msg.own_noise.terms.CopyFrom(
                pb.SecureTerms(
                    owners=t.owners, colluders=t.colluders, total_noise_sd=t.total_noise_sd
                )
            )
    return msg


def privacy_report(msg: pb.OwnerPrivacy) -> PrivacyReport:
    session = _spend_report(msg.session) if msg.HasField("session") else None
    own = None
    if msg.HasField("own_noise"):
        m = msg.own_noise
        terms = m.terms
        own = OwnNoise(
            _spend_report(m.total),
            _spend_report(m.session) if m.HasField("session") else None,
            SecureTerms(int(terms.owners), int(terms.colluders), terms.total_noise_sd)
            if m.HasField("terms")
            else None,
            m.peers,
        )
    return PrivacyReport(
        msg.owner,
        _count(msg.n),
        msg.delta,
        msg.budget_epsilon,
        check_neighbour(msg.neighbour),
        _spend_report(msg.total),
        session,
        own,
    )


# --- refusals -----------------------------------------------------------------------------
def refusal(exc: errors.OwnerError) -> pb.Refusal:
    """An owner's refusal as an in-band message (its text already names the owner)."""
    return pb.Refusal(
        code=exc.grpc_code,
        error=type(exc).__name__,
        message=str(exc),
        owner=exc.owner or "",
        epsilon_left=getattr(exc, "epsilon_left", 0.0),
    )


def refusal_metadata(exc: errors.OwnerError) -> tuple[tuple[str, str], ...]:
    meta = [(ERROR_KEY, type(exc).__name__), (OWNER_KEY, exc.owner or "")]
    if isinstance(exc, errors.BudgetExhausted):
        meta.append((EPSILON_LEFT_KEY, repr(exc.epsilon_left)))
    return tuple(meta)


def error_from_refusal(r: pb.Refusal, where: str) -> errors.OwnerError:
    """The ``fedpenalty.errors`` exception an owner raised; ``where`` names the host."""
    return make_error(r.error, r.code, f"{r.message} [{where}]", r.owner or None, r.epsilon_left)


def make_error(
    error: str, code: str, message: str, owner: str | None, epsilon_left: float = 0.0
) -> errors.OwnerError:
    """Rebuild an owner error from its class name, or from the status code when the refusal
    came from gRPC itself (e.g. RESOURCE_EXHAUSTED for a message over the size limit)."""
    cls = _ERRORS.get(error) or _BY_CODE.get(code, errors.OwnerError)
    exc = cls(message, None, epsilon_left) if cls is errors.BudgetExhausted else cls(message)
    exc.owner = owner  # the message already names the owner
    return exc


_BY_CODE: dict[str, type[errors.OwnerError]] = {
    "INVALID_ARGUMENT": errors.InvalidRequest,
    "NOT_FOUND": errors.UnknownSession,
    "FAILED_PRECONDITION": errors.ReplayConflict,
    "RESOURCE_EXHAUSTED": errors.InvalidRequest,
    "PERMISSION_DENIED": errors.NotPermitted,
    "UNAVAILABLE": errors.OwnerUnavailable,
    "DEADLINE_EXCEEDED": errors.OwnerUnavailable,
}


def _count(n: int) -> int | None:
    """A record count from the wire: −1 means the owner does not disclose it (add_remove)."""
    return None if n < 0 else n
