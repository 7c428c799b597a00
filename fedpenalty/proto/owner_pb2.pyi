from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Policy(_message.Message):
    __slots__ = ("sigma", "max_step", "budget_epsilon", "delta", "neighbour", "max_answers_per_request", "max_sampling_rate", "max_clip", "min_step", "min_clip", "max_record_evaluations", "total_noise_sd", "colluders", "min_peers", "min_charged_step", "noise")
    class NoiseEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SIGMA_FIELD_NUMBER: _ClassVar[int]
    MAX_STEP_FIELD_NUMBER: _ClassVar[int]
    BUDGET_EPSILON_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    NEIGHBOUR_FIELD_NUMBER: _ClassVar[int]
    MAX_ANSWERS_PER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    MAX_SAMPLING_RATE_FIELD_NUMBER: _ClassVar[int]
    MAX_CLIP_FIELD_NUMBER: _ClassVar[int]
    MIN_STEP_FIELD_NUMBER: _ClassVar[int]
    MIN_CLIP_FIELD_NUMBER: _ClassVar[int]
    MAX_RECORD_EVALUATIONS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_NOISE_SD_FIELD_NUMBER: _ClassVar[int]
    COLLUDERS_FIELD_NUMBER: _ClassVar[int]
    MIN_PEERS_FIELD_NUMBER: _ClassVar[int]
    MIN_CHARGED_STEP_FIELD_NUMBER: _ClassVar[int]
    NOISE_FIELD_NUMBER: _ClassVar[int]
    sigma: float
    max_step: float
    budget_epsilon: float
    delta: float
    neighbour: str
    max_answers_per_request: int
    max_sampling_rate: float
    max_clip: float
    min_step: float
    min_clip: float
    max_record_evaluations: int
    total_noise_sd: float
    colluders: int
    min_peers: int
    min_charged_step: float
    noise: _containers.ScalarMap[str, float]
    def __init__(self, sigma: _Optional[float] = ..., max_step: _Optional[float] = ..., budget_epsilon: _Optional[float] = ..., delta: _Optional[float] = ..., neighbour: _Optional[str] = ..., max_answers_per_request: _Optional[int] = ..., max_sampling_rate: _Optional[float] = ..., max_clip: _Optional[float] = ..., min_step: _Optional[float] = ..., min_clip: _Optional[float] = ..., max_record_evaluations: _Optional[int] = ..., total_noise_sd: _Optional[float] = ..., colluders: _Optional[int] = ..., min_peers: _Optional[int] = ..., min_charged_step: _Optional[float] = ..., noise: _Optional[_Mapping[str, float]] = ...) -> None: ...

class OwnerInfo(_message.Message):
    __slots__ = ("name", "model", "model_params_json", "dim", "n", "policy", "model_digest")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    MODEL_DIGEST_FIELD_NUMBER: _ClassVar[int]
    name: str
    model: str
    model_params_json: str
    dim: int
    n: int
    policy: Policy
    model_digest: str
    def __init__(self, name: _Optional[str] = ..., model: _Optional[str] = ..., model_params_json: _Optional[str] = ..., dim: _Optional[int] = ..., n: _Optional[int] = ..., policy: _Optional[_Union[Policy, _Mapping]] = ..., model_digest: _Optional[str] = ...) -> None: ...

class ModelIdentity(_message.Message):
    __slots__ = ("name", "params_json", "digest")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    name: str
    params_json: str
    digest: str
    def __init__(self, name: _Optional[str] = ..., params_json: _Optional[str] = ..., digest: _Optional[str] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeReply(_message.Message):
    __slots__ = ("owners",)
    OWNERS_FIELD_NUMBER: _ClassVar[int]
    owners: _containers.RepeatedCompositeFieldContainer[OwnerInfo]
    def __init__(self, owners: _Optional[_Iterable[_Union[OwnerInfo, _Mapping]]] = ...) -> None: ...

class OpenSessionRequest(_message.Message):
    __slots__ = ("session", "algorithm", "planned_answers", "sampling_rate", "max_step", "secure", "kind", "kinds", "model")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    PLANNED_ANSWERS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_RATE_FIELD_NUMBER: _ClassVar[int]
    MAX_STEP_FIELD_NUMBER: _ClassVar[int]
    SECURE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    session: str
    algorithm: str
    planned_answers: int
    sampling_rate: float
    max_step: float
    secure: SecureAggregation
    kind: str
    kinds: _containers.RepeatedCompositeFieldContainer[KindTerms]
    model: ModelIdentity
    def __init__(self, session: _Optional[str] = ..., algorithm: _Optional[str] = ..., planned_answers: _Optional[int] = ..., sampling_rate: _Optional[float] = ..., max_step: _Optional[float] = ..., secure: _Optional[_Union[SecureAggregation, _Mapping]] = ..., kind: _Optional[str] = ..., kinds: _Optional[_Iterable[_Union[KindTerms, _Mapping]]] = ..., model: _Optional[_Union[ModelIdentity, _Mapping]] = ...) -> None: ...

class KindTerms(_message.Message):
    __slots__ = ("kind", "planned_answers", "sampling_rate", "max_step")
    KIND_FIELD_NUMBER: _ClassVar[int]
    PLANNED_ANSWERS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_RATE_FIELD_NUMBER: _ClassVar[int]
    MAX_STEP_FIELD_NUMBER: _ClassVar[int]
    kind: str
    planned_answers: int
    sampling_rate: float
    max_step: float
    def __init__(self, kind: _Optional[str] = ..., planned_answers: _Optional[int] = ..., sampling_rate: _Optional[float] = ..., max_step: _Optional[float] = ...) -> None: ...

class OpenSessionReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PeerKey(_message.Message):
    __slots__ = ("owner", "public_key", "signature", "certificate", "commitment", "share")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    COMMITMENT_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    owner: str
    public_key: bytes
    signature: bytes
    certificate: bytes
    commitment: bytes
    share: bytes
    def __init__(self, owner: _Optional[str] = ..., public_key: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., certificate: _Optional[bytes] = ..., commitment: _Optional[bytes] = ..., share: _Optional[bytes] = ...) -> None: ...

class SessionKeysRequest(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: str
    def __init__(self, session: _Optional[str] = ...) -> None: ...

class SessionKeysReply(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[PeerKey]
    def __init__(self, keys: _Optional[_Iterable[_Union[PeerKey, _Mapping]]] = ...) -> None: ...

class RevealSharesRequest(_message.Message):
    __slots__ = ("session", "peers")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    session: str
    peers: _containers.RepeatedCompositeFieldContainer[PeerKey]
    def __init__(self, session: _Optional[str] = ..., peers: _Optional[_Iterable[_Union[PeerKey, _Mapping]]] = ...) -> None: ...

class RevealSharesReply(_message.Message):
    __slots__ = ("shares",)
    SHARES_FIELD_NUMBER: _ClassVar[int]
    shares: _containers.RepeatedCompositeFieldContainer[PeerKey]
    def __init__(self, shares: _Optional[_Iterable[_Union[PeerKey, _Mapping]]] = ...) -> None: ...

class SecureAggregation(_message.Message):
    __slots__ = ("peers", "total_noise_sd", "colluders")
    PEERS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_NOISE_SD_FIELD_NUMBER: _ClassVar[int]
    COLLUDERS_FIELD_NUMBER: _ClassVar[int]
    peers: _containers.RepeatedCompositeFieldContainer[PeerKey]
    total_noise_sd: float
    colluders: int
    def __init__(self, peers: _Optional[_Iterable[_Union[PeerKey, _Mapping]]] = ..., total_noise_sd: _Optional[float] = ..., colluders: _Optional[int] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: str
    def __init__(self, session: _Optional[str] = ...) -> None: ...

class CloseSessionReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LogRatioRequest(_message.Message):
    __slots__ = ("session", "iteration", "chains", "theta", "theta_prop")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    CHAINS_FIELD_NUMBER: _ClassVar[int]
    THETA_FIELD_NUMBER: _ClassVar[int]
    THETA_PROP_FIELD_NUMBER: _ClassVar[int]
    session: str
    iteration: int
    chains: _containers.RepeatedScalarFieldContainer[int]
    theta: _containers.RepeatedScalarFieldContainer[float]
    theta_prop: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, session: _Optional[str] = ..., iteration: _Optional[int] = ..., chains: _Optional[_Iterable[int]] = ..., theta: _Optional[_Iterable[float]] = ..., theta_prop: _Optional[_Iterable[float]] = ...) -> None: ...

class SuffStatsRequest(_message.Message):
    __slots__ = ("session", "chains", "start", "block")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    CHAINS_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    session: str
    chains: _containers.RepeatedScalarFieldContainer[int]
    start: int
    block: int
    def __init__(self, session: _Optional[str] = ..., chains: _Optional[_Iterable[int]] = ..., start: _Optional[int] = ..., block: _Optional[int] = ...) -> None: ...

class GradientRequest(_message.Message):
    __slots__ = ("session", "iteration", "chains", "theta", "clip")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    CHAINS_FIELD_NUMBER: _ClassVar[int]
    THETA_FIELD_NUMBER: _ClassVar[int]
    CLIP_FIELD_NUMBER: _ClassVar[int]
    session: str
    iteration: int
    chains: _containers.RepeatedScalarFieldContainer[int]
    theta: _containers.RepeatedScalarFieldContainer[float]
    clip: float
    def __init__(self, session: _Optional[str] = ..., iteration: _Optional[int] = ..., chains: _Optional[_Iterable[int]] = ..., theta: _Optional[_Iterable[float]] = ..., clip: _Optional[float] = ...) -> None: ...

class KindQuery(_message.Message):
    __slots__ = ("kind", "session", "iteration", "chains", "arrays", "substep")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    CHAINS_FIELD_NUMBER: _ClassVar[int]
    ARRAYS_FIELD_NUMBER: _ClassVar[int]
    SUBSTEP_FIELD_NUMBER: _ClassVar[int]
    kind: str
    session: str
    iteration: int
    chains: _containers.RepeatedScalarFieldContainer[int]
    arrays: _containers.RepeatedCompositeFieldContainer[NamedArray]
    substep: int
    def __init__(self, kind: _Optional[str] = ..., session: _Optional[str] = ..., iteration: _Optional[int] = ..., chains: _Optional[_Iterable[int]] = ..., arrays: _Optional[_Iterable[_Union[NamedArray, _Mapping]]] = ..., substep: _Optional[int] = ...) -> None: ...

class NamedArray(_message.Message):
    __slots__ = ("name", "shape", "values", "integers")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    INTEGERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    integers: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., values: _Optional[_Iterable[float]] = ..., integers: _Optional[_Iterable[int]] = ...) -> None: ...

class Answers(_message.Message):
    __slots__ = ("values", "shape", "noise_sd", "masked", "check", "lattice_step")
    VALUES_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    NOISE_SD_FIELD_NUMBER: _ClassVar[int]
    MASKED_FIELD_NUMBER: _ClassVar[int]
    CHECK_FIELD_NUMBER: _ClassVar[int]
    LATTICE_STEP_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    shape: _containers.RepeatedScalarFieldContainer[int]
    noise_sd: _containers.RepeatedScalarFieldContainer[float]
    masked: _containers.RepeatedScalarFieldContainer[int]
    check: _containers.RepeatedScalarFieldContainer[int]
    lattice_step: float
    def __init__(self, values: _Optional[_Iterable[float]] = ..., shape: _Optional[_Iterable[int]] = ..., noise_sd: _Optional[_Iterable[float]] = ..., masked: _Optional[_Iterable[int]] = ..., check: _Optional[_Iterable[int]] = ..., lattice_step: _Optional[float] = ...) -> None: ...

class Refusal(_message.Message):
    __slots__ = ("code", "error", "message", "owner", "epsilon_left")
    CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    EPSILON_LEFT_FIELD_NUMBER: _ClassVar[int]
    code: str
    error: str
    message: str
    owner: str
    epsilon_left: float
    def __init__(self, code: _Optional[str] = ..., error: _Optional[str] = ..., message: _Optional[str] = ..., owner: _Optional[str] = ..., epsilon_left: _Optional[float] = ...) -> None: ...

class QueryRequest(_message.Message):
    __slots__ = ("id", "log_ratio", "suff_stats", "gradient", "kind_query")
    ID_FIELD_NUMBER: _ClassVar[int]
    LOG_RATIO_FIELD_NUMBER: _ClassVar[int]
    SUFF_STATS_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_FIELD_NUMBER: _ClassVar[int]
    KIND_QUERY_FIELD_NUMBER: _ClassVar[int]
    id: int
    log_ratio: LogRatioRequest
    suff_stats: SuffStatsRequest
    gradient: GradientRequest
    kind_query: KindQuery
    def __init__(self, id: _Optional[int] = ..., log_ratio: _Optional[_Union[LogRatioRequest, _Mapping]] = ..., suff_stats: _Optional[_Union[SuffStatsRequest, _Mapping]] = ..., gradient: _Optional[_Union[GradientRequest, _Mapping]] = ..., kind_query: _Optional[_Union[KindQuery, _Mapping]] = ...) -> None: ...

class QueryReply(_message.Message):
    __slots__ = ("id", "answers", "refusal")
    ID_FIELD_NUMBER: _ClassVar[int]
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    id: int
    answers: Answers
    refusal: Refusal
    def __init__(self, id: _Optional[int] = ..., answers: _Optional[_Union[Answers, _Mapping]] = ..., refusal: _Optional[_Union[Refusal, _Mapping]] = ...) -> None: ...

class PrivacyReportRequest(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: str
    def __init__(self, session: _Optional[str] = ...) -> None: ...

class Spend(_message.Message):
    __slots__ = ("answers", "mu", "epsilon", "epsilon_paper_bound", "accountant")
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    MU_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    EPSILON_PAPER_BOUND_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTANT_FIELD_NUMBER: _ClassVar[int]
    answers: int
    mu: float
    epsilon: float
    epsilon_paper_bound: float
    accountant: str
    def __init__(self, answers: _Optional[int] = ..., mu: _Optional[float] = ..., epsilon: _Optional[float] = ..., epsilon_paper_bound: _Optional[float] = ..., accountant: _Optional[str] = ...) -> None: ...

class SecureTerms(_message.Message):
    __slots__ = ("owners", "colluders", "total_noise_sd")
    OWNERS_FIELD_NUMBER: _ClassVar[int]
    COLLUDERS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_NOISE_SD_FIELD_NUMBER: _ClassVar[int]
    owners: int
    colluders: int
    total_noise_sd: float
    def __init__(self, owners: _Optional[int] = ..., colluders: _Optional[int] = ..., total_noise_sd: _Optional[float] = ...) -> None: ...

class OwnNoise(_message.Message):
    __slots__ = ("total", "session", "terms", "peers")
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    TERMS_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    total: Spend
    session: Spend
    terms: SecureTerms
    peers: str
    def __init__(self, total: _Optional[_Union[Spend, _Mapping]] = ..., session: _Optional[_Union[Spend, _Mapping]] = ..., terms: _Optional[_Union[SecureTerms, _Mapping]] = ..., peers: _Optional[str] = ...) -> None: ...

class OwnerPrivacy(_message.Message):
    __slots__ = ("owner", "n", "delta", "budget_epsilon", "neighbour", "total", "session", "own_noise")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    BUDGET_EPSILON_FIELD_NUMBER: _ClassVar[int]
    NEIGHBOUR_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    OWN_NOISE_FIELD_NUMBER: _ClassVar[int]
    owner: str
    n: int
    delta: float
    budget_epsilon: float
    neighbour: str
    total: Spend
    session: Spend
    own_noise: OwnNoise
    def __init__(self, owner: _Optional[str] = ..., n: _Optional[int] = ..., delta: _Optional[float] = ..., budget_epsilon: _Optional[float] = ..., neighbour: _Optional[str] = ..., total: _Optional[_Union[Spend, _Mapping]] = ..., session: _Optional[_Union[Spend, _Mapping]] = ..., own_noise: _Optional[_Union[OwnNoise, _Mapping]] = ...) -> None: ...

class PrivacyReportReply(_message.Message):
    __slots__ = ("owners",)
    OWNERS_FIELD_NUMBER: _ClassVar[int]
    owners: _containers.RepeatedCompositeFieldContainer[OwnerPrivacy]
    def __init__(self, owners: _Optional[_Iterable[_Union[OwnerPrivacy, _Mapping]]] = ...) -> None: ...
