from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CacheMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CACHE_MODE_UNSPECIFIED: _ClassVar[CacheMode]
    CACHE_MODE_OFF: _ClassVar[CacheMode]
    CACHE_MODE_ON: _ClassVar[CacheMode]

class ResultView(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESULT_VIEW_UNSPECIFIED: _ClassVar[ResultView]
    RESULT_VIEW_FULL: _ClassVar[ResultView]
    RESULT_VIEW_SCORES: _ClassVar[ResultView]
    RESULT_VIEW_COLUMNS: _ClassVar[ResultView]

class GraderMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GRADER_MODE_UNSPECIFIED: _ClassVar[GraderMode]
    GRADER_MODE_POINTWISE: _ClassVar[GraderMode]
    GRADER_MODE_LISTWISE: _ClassVar[GraderMode]
CACHE_MODE_UNSPECIFIED: CacheMode
CACHE_MODE_OFF: CacheMode
CACHE_MODE_ON: CacheMode
RESULT_VIEW_UNSPECIFIED: ResultView
RESULT_VIEW_FULL: ResultView
RESULT_VIEW_SCORES: ResultView
RESULT_VIEW_COLUMNS: ResultView
GRADER_MODE_UNSPECIFIED: GraderMode
GRADER_MODE_POINTWISE: GraderMode
GRADER_MODE_LISTWISE: GraderMode

class Sample(_message.Message):
    __slots__ = ("id", "query", "response", "reference", "context", "responses", "extra", "messages", "tool_calls", "tool_definitions")
    ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_DEFINITIONS_FIELD_NUMBER: _ClassVar[int]
    id: str
    query: str
    response: str
    reference: str
    context: str
    responses: _containers.RepeatedScalarFieldContainer[str]
    extra: _struct_pb2.Struct
    messages: _struct_pb2.ListValue
    tool_calls: _struct_pb2.ListValue
    tool_definitions: _struct_pb2.ListValue
    def __init__(self, id: _Optional[str] = ..., query: _Optional[str] = ..., response: _Optional[str] = ..., reference: _Optional[str] = ..., context: _Optional[str] = ..., responses: _Optional[_Iterable[str]] = ..., extra: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., messages: _Optional[_Union[_struct_pb2.ListValue, _Mapping]] = ..., tool_calls: _Optional[_Union[_struct_pb2.ListValue, _Mapping]] = ..., tool_definitions: _Optional[_Union[_struct_pb2.ListValue, _Mapping]] = ...) -> None: ...

class GraderSpec(_message.Message):
    __slots__ = ("name", "params", "key", "weight", "gate")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    GATE_FIELD_NUMBER: _ClassVar[int]
    name: str
    params: _struct_pb2.Struct
    key: str
    weight: float
    gate: bool
    def __init__(self, name: _Optional[str] = ..., params: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., key: _Optional[str] = ..., weight: _Optional[float] = ..., gate: bool = ...) -> None: ...

class EvaluateRequest(_message.Message):
    __slots__ = ("graders", "sample", "reward", "grader_timeout_seconds", "view", "cache")
    GRADERS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    GRADER_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    graders: _containers.RepeatedCompositeFieldContainer[GraderSpec]
    sample: Sample
    reward: str
    grader_timeout_seconds: float
    view: ResultView
    cache: CacheMode
    def __init__(self, graders: _Optional[_Iterable[_Union[GraderSpec, _Mapping]]] = ..., sample: _Optional[_Union[Sample, _Mapping]] = ..., reward: _Optional[str] = ..., grader_timeout_seconds: _Optional[float] = ..., view: _Optional[_Union[ResultView, str]] = ..., cache: _Optional[_Union[CacheMode, str]] = ...) -> None: ...

class SampleColumns(_message.Message):
    __slots__ = ("id", "query", "response", "reference", "context", "extra")
    ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    id: _containers.RepeatedScalarFieldContainer[str]
    query: _containers.RepeatedScalarFieldContainer[str]
    response: _containers.RepeatedScalarFieldContainer[str]
    reference: _containers.RepeatedScalarFieldContainer[str]
    context: _containers.RepeatedScalarFieldContainer[str]
    extra: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    def __init__(self, id: _Optional[_Iterable[str]] = ..., query: _Optional[_Iterable[str]] = ..., response: _Optional[_Iterable[str]] = ..., reference: _Optional[_Iterable[str]] = ..., context: _Optional[_Iterable[str]] = ..., extra: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ...) -> None: ...

class GraderError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class GraderResult(_message.Message):
    __slots__ = ("key", "grader", "score", "reason", "metadata", "rank", "error", "cached")
    KEY_FIELD_NUMBER: _ClassVar[int]
    GRADER_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    key: str
    grader: str
    score: float
    reason: str
    metadata: _struct_pb2.Struct
    rank: _containers.RepeatedScalarFieldContainer[int]
    error: GraderError
    cached: bool
    def __init__(self, key: _Optional[str] = ..., grader: _Optional[str] = ..., score: _Optional[float] = ..., reason: _Optional[str] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., rank: _Optional[_Iterable[int]] = ..., error: _Optional[_Union[GraderError, _Mapping]] = ..., cached: bool = ...) -> None: ...

class EvaluateResponse(_message.Message):
    __slots__ = ("id", "results", "reward")
    ID_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    id: str
    results: _containers.RepeatedCompositeFieldContainer[GraderResult]
    reward: float
    def __init__(self, id: _Optional[str] = ..., results: _Optional[_Iterable[_Union[GraderResult, _Mapping]]] = ..., reward: _Optional[float] = ...) -> None: ...

class BatchEvaluateRequest(_message.Message):
    __slots__ = ("graders", "samples", "reward", "grader_timeout_seconds", "chunk_size", "view", "budget_seconds", "max_failure_ratio", "cache", "columns")
    GRADERS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    GRADER_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    BUDGET_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_FAILURE_RATIO_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    graders: _containers.RepeatedCompositeFieldContainer[GraderSpec]
    samples: _containers.RepeatedCompositeFieldContainer[Sample]
    reward: str
    grader_timeout_seconds: float
    chunk_size: int
    view: ResultView
    budget_seconds: float
    max_failure_ratio: float
    cache: CacheMode
    columns: SampleColumns
    def __init__(self, graders: _Optional[_Iterable[_Union[GraderSpec, _Mapping]]] = ..., samples: _Optional[_Iterable[_Union[Sample, _Mapping]]] = ..., reward: _Optional[str] = ..., grader_timeout_seconds: _Optional[float] = ..., chunk_size: _Optional[int] = ..., view: _Optional[_Union[ResultView, str]] = ..., budget_seconds: _Optional[float] = ..., max_failure_ratio: _Optional[float] = ..., cache: _Optional[_Union[CacheMode, str]] = ..., columns: _Optional[_Union[SampleColumns, _Mapping]] = ...) -> None: ...

class BatchItem(_message.Message):
    __slots__ = ("index", "result")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    index: int
    result: EvaluateResponse
    def __init__(self, index: _Optional[int] = ..., result: _Optional[_Union[EvaluateResponse, _Mapping]] = ...) -> None: ...

class ScoreColumn(_message.Message):
    __slots__ = ("key", "grader", "scores", "error_rows", "errors", "cached_rows")
    KEY_FIELD_NUMBER: _ClassVar[int]
    GRADER_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    ERROR_ROWS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    CACHED_ROWS_FIELD_NUMBER: _ClassVar[int]
    key: str
    grader: str
    scores: _containers.RepeatedScalarFieldContainer[float]
    error_rows: _containers.RepeatedScalarFieldContainer[int]
    errors: _containers.RepeatedCompositeFieldContainer[GraderError]
    cached_rows: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, key: _Optional[str] = ..., grader: _Optional[str] = ..., scores: _Optional[_Iterable[float]] = ..., error_rows: _Optional[_Iterable[int]] = ..., errors: _Optional[_Iterable[_Union[GraderError, _Mapping]]] = ..., cached_rows: _Optional[_Iterable[int]] = ...) -> None: ...

class ResultColumns(_message.Message):
    __slots__ = ("indices", "scores", "rewards", "reward_absent_rows")
    INDICES_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    REWARD_ABSENT_ROWS_FIELD_NUMBER: _ClassVar[int]
    indices: _containers.RepeatedScalarFieldContainer[int]
    scores: _containers.RepeatedCompositeFieldContainer[ScoreColumn]
    rewards: _containers.RepeatedScalarFieldContainer[float]
    reward_absent_rows: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, indices: _Optional[_Iterable[int]] = ..., scores: _Optional[_Iterable[_Union[ScoreColumn, _Mapping]]] = ..., rewards: _Optional[_Iterable[float]] = ..., reward_absent_rows: _Optional[_Iterable[int]] = ...) -> None: ...

class BatchEvaluateResponse(_message.Message):
    __slots__ = ("items", "columns")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[BatchItem]
    columns: ResultColumns
    def __init__(self, items: _Optional[_Iterable[_Union[BatchItem, _Mapping]]] = ..., columns: _Optional[_Union[ResultColumns, _Mapping]] = ...) -> None: ...

class BatchEvaluateUnaryRequest(_message.Message):
    __slots__ = ("batch",)
    BATCH_FIELD_NUMBER: _ClassVar[int]
    batch: BatchEvaluateRequest
    def __init__(self, batch: _Optional[_Union[BatchEvaluateRequest, _Mapping]] = ...) -> None: ...

class BatchEvaluateUnaryResponse(_message.Message):
    __slots__ = ("answer",)
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    answer: BatchEvaluateResponse
    def __init__(self, answer: _Optional[_Union[BatchEvaluateResponse, _Mapping]] = ...) -> None: ...

class ListGradersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ParamInfo(_message.Message):
    __slots__ = ("name", "type", "default", "required")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    default: _struct_pb2.Value
    required: bool
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., default: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., required: bool = ...) -> None: ...

class GraderInfo(_message.Message):
    __slots__ = ("name", "aliases", "mode", "description", "plugin", "distribution", "version", "params")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ALIASES_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PLUGIN_FIELD_NUMBER: _ClassVar[int]
    DISTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    name: str
    aliases: _containers.RepeatedScalarFieldContainer[str]
    mode: GraderMode
    description: str
    plugin: str
    distribution: str
    version: str
    params: _containers.RepeatedCompositeFieldContainer[ParamInfo]
    def __init__(self, name: _Optional[str] = ..., aliases: _Optional[_Iterable[str]] = ..., mode: _Optional[_Union[GraderMode, str]] = ..., description: _Optional[str] = ..., plugin: _Optional[str] = ..., distribution: _Optional[str] = ..., version: _Optional[str] = ..., params: _Optional[_Iterable[_Union[ParamInfo, _Mapping]]] = ...) -> None: ...

class PluginInfo(_message.Message):
    __slots__ = ("name", "distribution", "version", "status", "error", "graders")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DISTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    GRADERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    distribution: str
    version: str
    status: str
    error: str
    graders: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., distribution: _Optional[str] = ..., version: _Optional[str] = ..., status: _Optional[str] = ..., error: _Optional[str] = ..., graders: _Optional[_Iterable[str]] = ...) -> None: ...

class RewardInfo(_message.Message):
    __slots__ = ("name", "description", "graders")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    GRADERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    graders: _containers.RepeatedCompositeFieldContainer[GraderSpec]
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., graders: _Optional[_Iterable[_Union[GraderSpec, _Mapping]]] = ...) -> None: ...

class ListGradersResponse(_message.Message):
    __slots__ = ("graders", "plugins", "rewards")
    GRADERS_FIELD_NUMBER: _ClassVar[int]
    PLUGINS_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    graders: _containers.RepeatedCompositeFieldContainer[GraderInfo]
    plugins: _containers.RepeatedCompositeFieldContainer[PluginInfo]
    rewards: _containers.RepeatedCompositeFieldContainer[RewardInfo]
    def __init__(self, graders: _Optional[_Iterable[_Union[GraderInfo, _Mapping]]] = ..., plugins: _Optional[_Iterable[_Union[PluginInfo, _Mapping]]] = ..., rewards: _Optional[_Iterable[_Union[RewardInfo, _Mapping]]] = ...) -> None: ...
