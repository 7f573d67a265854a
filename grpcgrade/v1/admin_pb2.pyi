from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListQuarantineRequest(_message.Message):
    __slots__ = ("grader",)
    GRADER_FIELD_NUMBER: _ClassVar[int]
    grader: str
    def __init__(self, grader: _Optional[str] = ...) -> None: ...

class QuarantineEntry(_message.Message):
    __slots__ = ("grader", "params", "code", "since_unix_seconds", "expires_unix_seconds", "hits", "preview", "key")
    GRADER_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    SINCE_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    PREVIEW_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    grader: str
    params: str
    code: str
    since_unix_seconds: float
    expires_unix_seconds: float
    hits: int
    preview: str
    key: str
    def __init__(self, grader: _Optional[str] = ..., params: _Optional[str] = ..., code: _Optional[str] = ..., since_unix_seconds: _Optional[float] = ..., expires_unix_seconds: _Optional[float] = ..., hits: _Optional[int] = ..., preview: _Optional[str] = ..., key: _Optional[str] = ...) -> None: ...

class ListQuarantineResponse(_message.Message):
    __slots__ = ("entries", "bytes", "max_bytes", "enabled")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[QuarantineEntry]
    bytes: int
    max_bytes: int
    enabled: bool
    def __init__(self, entries: _Optional[_Iterable[_Union[QuarantineEntry, _Mapping]]] = ..., bytes: _Optional[int] = ..., max_bytes: _Optional[int] = ..., enabled: bool = ...) -> None: ...

class ClearQuarantineRequest(_message.Message):
    __slots__ = ("grader",)
    GRADER_FIELD_NUMBER: _ClassVar[int]
    grader: str
    def __init__(self, grader: _Optional[str] = ...) -> None: ...

class ClearQuarantineResponse(_message.Message):
    __slots__ = ("cleared",)
    CLEARED_FIELD_NUMBER: _ClassVar[int]
    cleared: int
    def __init__(self, cleared: _Optional[int] = ...) -> None: ...

class ClearCacheRequest(_message.Message):
    __slots__ = ("grader",)
    GRADER_FIELD_NUMBER: _ClassVar[int]
    grader: str
    def __init__(self, grader: _Optional[str] = ...) -> None: ...

class ClearCacheResponse(_message.Message):
    __slots__ = ("cleared",)
    CLEARED_FIELD_NUMBER: _ClassVar[int]
    cleared: int
    def __init__(self, cleared: _Optional[int] = ...) -> None: ...
