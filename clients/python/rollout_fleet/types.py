"""The API's bodies as dataclasses, one per schema of its OpenAPI document (GET /openapi.json).

Attributes are the JSON properties in snake_case (``episodeId`` is ``episode_id``); a property the
schema does not require is ``Optional`` with a default of None. Every object keeps the JSON it was
read from in ``raw``, so a field a newer fleet adds is there before this package names it. The
package's tests compare each class's fields with its schema's properties, types included.
"""
from __future__ import annotations

import dataclasses
import re
import sys
import typing
from typing import Any, Dict, List, Literal, Optional, Type, TypeVar, Union

T = TypeVar("T")

#: Episode statuses, failure kinds and phases, as the API names them.
EpisodeStatus = Literal["passed", "failed", "timeout", "cancelled", "error"]
FailureKind = Literal["infra", "model", "agent", "verifier", "invalid"]

#: The schema each class is checked against, by class name: ``components.schemas[SCHEMAS[cls]]``.
SCHEMAS: Dict[str, str] = {}


def _raw() -> Any:
    return dataclasses.field(default_factory=dict, repr=False, compare=False, metadata={"json": False})


def json_name(attribute: str) -> str:
    """The JSON property of an attribute: ``episode_id`` is ``episodeId``."""
    return re.sub(r"_([a-z0-9])", lambda m: m.group(1).upper(), attribute)


def schema(name: str) -> Any:
    """Name the OpenAPI schema a dataclass stands for (its fields are checked against it)."""

    def mark(cls: Type[T]) -> Type[T]:
        SCHEMAS[cls.__name__] = name
        return cls

    return mark


@dataclasses.dataclass
class FailureInfo:
    """Why an episode ended in error: its kind, a stable code, and a message."""

    kind: FailureKind
    code: str
    message: str
    raw: Dict[str, Any] = _raw()


@dataclasses.dataclass
class Timings:
    total_ms: float
    setup_ms: Optional[float] = None
    agent_ms: Optional[float] = None
    verify_ms: Optional[float] = None
    close_ms: Optional[float] = None
    raw: Dict[str, Any] = _raw()


@dataclasses.dataclass
class Usage:
    prompt_tokens: float
    completion_tokens: float
    total_tokens: float
    raw: Dict[str, Any] = _raw()


@schema("EpisodeResult")
@dataclasses.dataclass
class EpisodeResult:
    """One episode's result: its status, reward (a float; None when not graded), attempts and timings."""

    episode_id: str
    batch_id: str
    task_id: str
    sample: int
    status: EpisodeStatus
    reward: Optional[float]
    attempts: int
    worker_id: str
    timings: Timings
    provenance: Dict[str, Any]
    started_at: str
    ended_at: str
    error: Optional[FailureInfo] = None
    metrics: Optional[Dict[str, float]] = None
    network: Optional[Dict[str, Any]] = None
    grading: Optional[Dict[str, Any]] = None
    agent: Optional[Dict[str, Any]] = None
    verifier: Optional[Dict[str, Any]] = None
    runtime: Optional[Dict[str, Any]] = None
    sandbox: Optional[Dict[str, Any]] = None
    resumed_from: Optional[int] = None
    usage: Optional[Usage] = None
    oom_killed: Optional[bool] = None
    model: Optional[Dict[str, Any]] = None
    policy_versions: Optional[Dict[str, Any]] = None
    stale_restarts: Optional[int] = None
    raw: Dict[str, Any] = _raw()


@schema("StoredTask")
@dataclasses.dataclass
class StoredTask:
    """A task the fleet keeps: batches name it by its digest."""

    digest: str
    task_id: str
    bytes: int
    raw: Dict[str, Any] = _raw()


@schema("BatchCreated")
@dataclasses.dataclass
class BatchCreated:
    """A batch enqueued (``added``), or named again (the same batch: nothing added)."""

    batch_id: str
    episodes: int
    added: bool
    episode_ids: List[str]
    raw: Dict[str, Any] = _raw()


@dataclasses.dataclass
class MetricMean:
    mean: float
    n: int
    raw: Dict[str, Any] = _raw()


@dataclasses.dataclass
class PhaseTimes:
    p50: float
    p95: float
    n: int
    raw: Dict[str, Any] = _raw()


@dataclasses.dataclass
class Tokens:
    prompt: float
    completion: float
    total: float
    raw: Dict[str, Any] = _raw()


@schema("BatchSummary")
@dataclasses.dataclass
class BatchSummary:
    """A batch's progress and outcome: counts by status and failure kind, mean reward, pass@k, phases."""

    batch_id: str
    total: int
    done: int
    finished: bool
    by_status: Dict[str, int]
    by_kind: Dict[str, int]
    mean_reward: Optional[float]
    pass_threshold: float
    metrics: Dict[str, MetricMean]
    pass_at: Dict[str, float]
    phases: Dict[str, PhaseTimes]
    tokens: Tokens
    model: Dict[str, Any]
    stale_restarts: Dict[str, Any]
    raw: Dict[str, Any] = _raw()


@schema("BatchListing")
@dataclasses.dataclass
class BatchListing:
    batch_id: str
    name: str
    created_at: str
    total: int
    done: int
    finished: bool
    raw: Dict[str, Any] = _raw()


@schema("BatchList")
@dataclasses.dataclass
class BatchList:
    """A page of batches, newest first; ``next`` is the page token for the next page (None: the last)."""

    batches: List[BatchListing]
    next: Optional[str] = None
    raw: Dict[str, Any] = _raw()


@schema("ResultEvent")
@dataclasses.dataclass
class ResultEvent:
    """An episode ended: its result, and the cursor to resume after it."""

    kind: Literal["result"]
    cursor: str
    result: EpisodeResult
    raw: Dict[str, Any] = _raw()


@schema("GroupEvent")
@dataclasses.dataclass
class GroupEvent:
    """Every sample of a task has ended: their rewards and metrics in sample order (None: not graded)."""

    kind: Literal["group"]
    cursor: str
    task_id: str
    episode_ids: List[str]
    rewards: List[Optional[float]]
    metrics: List[Optional[Dict[str, float]]]
    policy_versions: Optional[Dict[str, Any]] = None
    raw: Dict[str, Any] = _raw()


@schema("EndEvent")
@dataclasses.dataclass
class EndEvent:
    """The stream's last event: every episode has a result and all were delivered."""

    kind: Literal["end"]
    summary: Optional[BatchSummary]
    raw: Dict[str, Any] = _raw()


@schema("KeepAliveEvent")
@dataclasses.dataclass
class KeepAliveEvent:
    kind: Literal["keep-alive"]
    raw: Dict[str, Any] = _raw()


@schema("RetryReport")
@dataclasses.dataclass
class RetryReport:
    """What a retry by kind did: episodes requeued, past retention (missing), or still pending."""

    requeued: List[str]
    missing: List[str]
    pending: List[str]
    raw: Dict[str, Any] = _raw()


@dataclasses.dataclass
class PolicyVersion:
    """An endpoint's current policy version, as the fleet keeps it."""

    endpoint: str
    version: int
    set_at: str
    raw: Dict[str, Any] = _raw()


#: What a result stream yields.
BatchEvent = Union[ResultEvent, GroupEvent]


class DecodeError(ValueError):
    """A body that does not have the shape of its schema (the path names where)."""


def _hints(cls: type) -> Dict[str, Any]:
    return typing.get_type_hints(cls, globalns=vars(sys.modules[__name__]))


def decode(cls: Type[T], data: Any, where: str = "body") -> T:
    """A dataclass from the JSON the API sent, checked against its declared types."""
    return typing.cast(T, _decode(cls, data, where))


def _decode(tp: Any, value: Any, where: str) -> Any:
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Union:
        if value is None and type(None) in args:
            return None
        others = [a for a in args if a is not type(None)]
        errors = []
        for option in others:
            try:
                return _decode(option, value, where)
            except DecodeError as err:
                errors.append(str(err))
        raise DecodeError("; ".join(errors))
    if origin is Literal:
        if value not in args:
            raise DecodeError("%s: expected one of %s (got %r)" % (where, ", ".join(repr(a) for a in args), value))
        return value
    if origin in (list, List):
        if not isinstance(value, list):
            raise DecodeError("%s: expected a list (got %s)" % (where, type(value).__name__))
        return [_decode(args[0], v, "%s[%d]" % (where, i)) for i, v in enumerate(value)]
    if origin in (dict, Dict):
        if not isinstance(value, dict):
            raise DecodeError("%s: expected an object (got %s)" % (where, type(value).__name__))
        return {str(k): _decode(args[1], v, "%s.%s" % (where, k)) for k, v in value.items()}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, dict):
            raise DecodeError("%s: expected an object (got %s)" % (where, type(value).__name__))
        hints = _hints(tp)
        kwargs: Dict[str, Any] = {}
        for f in dataclasses.fields(tp):
            if f.metadata.get("json") is False:
                continue
            key = json_name(f.name)
            if key in value:
                kwargs[f.name] = _decode(hints[f.name], value[key], "%s.%s" % (where, key))
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise DecodeError("%s: missing %s" % (where, key))
        return tp(raw=value, **kwargs)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise DecodeError("%s: expected a number (got %r)" % (where, value))
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise DecodeError("%s: expected a whole number (got %r)" % (where, value))
        return value
    if tp in (str, bool):
        if not isinstance(value, tp):
            raise DecodeError("%s: expected %s (got %r)" % (where, tp.__name__, value))
        return value
    raise DecodeError("%s: no decoder for %r" % (where, tp))


def type_hints(cls: type) -> Dict[str, Any]:
    """The resolved annotations of one of these classes (the schema check reads them)."""
    return _hints(cls)
