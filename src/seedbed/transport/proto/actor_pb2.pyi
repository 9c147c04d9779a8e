from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Array(_message.Message):
    __slots__ = ("dtype", "shape", "data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("protocol", "actor_name")
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    ACTOR_NAME_FIELD_NUMBER: _ClassVar[int]
    protocol: int
    actor_name: str
    def __init__(self, protocol: _Optional[int] = ..., actor_name: _Optional[str] = ...) -> None: ...

class Step(_message.Message):
    __slots__ = ("obs", "reward", "done", "truncated", "acted")
    class ActedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Array
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Array, _Mapping]] = ...) -> None: ...
    OBS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    ACTED_FIELD_NUMBER: _ClassVar[int]
    obs: Array
    reward: Array
    done: Array
    truncated: Array
    acted: _containers.MessageMap[str, Array]
    def __init__(self, obs: _Optional[_Union[Array, _Mapping]] = ..., reward: _Optional[_Union[Array, _Mapping]] = ..., done: _Optional[_Union[Array, _Mapping]] = ..., truncated: _Optional[_Union[Array, _Mapping]] = ..., acted: _Optional[_Mapping[str, Array]] = ...) -> None: ...

class ActorMessage(_message.Message):
    __slots__ = ("hello", "step")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    step: Step
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., step: _Optional[_Union[Step, _Mapping]] = ...) -> None: ...

class Assignment(_message.Message):
    __slots__ = ("env_id", "num_envs", "seed", "settings_json", "slot", "obs_dtype", "obs_shape", "action_dtype", "action_shape", "local_json", "plugins")
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_ENVS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_JSON_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    OBS_DTYPE_FIELD_NUMBER: _ClassVar[int]
    OBS_SHAPE_FIELD_NUMBER: _ClassVar[int]
    ACTION_DTYPE_FIELD_NUMBER: _ClassVar[int]
    ACTION_SHAPE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_JSON_FIELD_NUMBER: _ClassVar[int]
    PLUGINS_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    num_envs: int
    seed: int
    settings_json: str
    slot: int
    obs_dtype: str
    obs_shape: _containers.RepeatedScalarFieldContainer[int]
    action_dtype: str
    action_shape: _containers.RepeatedScalarFieldContainer[int]
    local_json: str
    plugins: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, env_id: _Optional[str] = ..., num_envs: _Optional[int] = ..., seed: _Optional[int] = ..., settings_json: _Optional[str] = ..., slot: _Optional[int] = ..., obs_dtype: _Optional[str] = ..., obs_shape: _Optional[_Iterable[int]] = ..., action_dtype: _Optional[str] = ..., action_shape: _Optional[_Iterable[int]] = ..., local_json: _Optional[str] = ..., plugins: _Optional[_Iterable[str]] = ...) -> None: ...

class Policy(_message.Message):
    __slots__ = ("version", "payload")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    version: int
    payload: bytes
    def __init__(self, version: _Optional[int] = ..., payload: _Optional[bytes] = ...) -> None: ...

class Stop(_message.Message):
    __slots__ = ("reason", "status")
    REASON_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    reason: str
    status: int
    def __init__(self, reason: _Optional[str] = ..., status: _Optional[int] = ...) -> None: ...

class Redirect(_message.Message):
    __slots__ = ("address",)
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    address: str
    def __init__(self, address: _Optional[str] = ...) -> None: ...

class LearnerMessage(_message.Message):
    __slots__ = ("assignment", "actions", "stop", "policy", "redirect")
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    assignment: Assignment
    actions: Array
    stop: Stop
    policy: Policy
    redirect: Redirect
    def __init__(self, assignment: _Optional[_Union[Assignment, _Mapping]] = ..., actions: _Optional[_Union[Array, _Mapping]] = ..., stop: _Optional[_Union[Stop, _Mapping]] = ..., policy: _Optional[_Union[Policy, _Mapping]] = ..., redirect: _Optional[_Union[Redirect, _Mapping]] = ...) -> None: ...
