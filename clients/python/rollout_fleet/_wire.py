"""What the sync and the asyncio clients share: requests as the API takes them, and the result stream's
parsing (Server-Sent Events or NDJSON) into events, with the cursor to resume from."""
from __future__ import annotations

import json
import os
import urllib.parse
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from .errors import FleetError
from .types import (
    BatchSummary, EndEvent, GroupEvent, KeepAliveEvent, ResultEvent, StoredTask, decode,
)

#: The media types of the result stream.
SSE = "text/event-stream"
NDJSON = "application/x-ndjson"

Event = Union[ResultEvent, GroupEvent, EndEvent, KeepAliveEvent]
TaskRef = Union[str, StoredTask, Dict[str, Any]]


class Endpoint:
    """The API's base URL split into what a connection needs, and the bearer token."""

    def __init__(self, base_url: str, token: Optional[str]) -> None:
        parsed = urllib.parse.urlsplit(base_url.rstrip("/"))
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError("base_url: expected http://host:port or https://host:port (got %r)" % base_url)
        self.scheme = parsed.scheme
        self.host = parsed.hostname
        self.port = parsed.port or (443 if parsed.scheme == "https" else 80)
        self.prefix = parsed.path
        self.base_url = base_url.rstrip("/")
        if token is None:
            token = os.environ.get("FLEET_API_TOKEN") or None
        self.token = token

    def headers(self, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        headers = {"Host": "%s:%d" % (self.host, self.port), "User-Agent": "rollout-fleet-python/0.1"}
        if self.token:
            headers["Authorization"] = "Bearer %s" % self.token
        headers.update(extra or {})
        return headers


def quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


def batch_request(
    name: str,
    tasks: Sequence[TaskRef],
    samples: Optional[int],
    agent: Optional[Dict[str, Any]],
    pass_threshold: Optional[float],
    extra: Dict[str, Any],
) -> Dict[str, Any]:
    """The JSON of POST /v1/batches: tasks by digest (or {digest, ...}), the rest as the API names it."""
    refs: List[Any] = []
    for t in tasks:
        refs.append(t.digest if isinstance(t, StoredTask) else t)
    body: Dict[str, Any] = {"name": name, "tasks": refs, "agent": agent if agent is not None else {"kind": "oracle"}}
    if samples is not None:
        body["samples"] = samples
    if pass_threshold is not None:
        body["passThreshold"] = pass_threshold
    body.update(extra)
    return body


def results_path(batch_id: str, media: str, after: str) -> Tuple[str, Dict[str, str]]:
    """The path and headers of a (re)connection to the result stream after ``after``.

    SSE sends the cursor as Last-Event-ID, NDJSON as ?after=: one of the two, never both.
    """
    path = "/v1/batches/%s/results" % quote(batch_id)
    headers = {"Accept": media}
    if after != "0":
        if media == SSE:
            headers["Last-Event-ID"] = after
        else:
            path += "?after=" + urllib.parse.quote(after, safe="")
    return path, headers


def event_of(data: Dict[str, Any], where: str) -> Optional[Event]:
    """An event from its JSON; None for a kind this client does not know (a newer fleet's)."""
    kind = data.get("kind")
    if kind == "result":
        return decode(ResultEvent, data, where)
    if kind == "group":
        return decode(GroupEvent, data, where)
    if kind == "end":
        return decode(EndEvent, data, where)
    if kind == "keep-alive":
        return decode(KeepAliveEvent, data, where)
    return None


class StreamParser:
    """Complete lines in, events out. A line is only taken once its newline arrived: a connection cut
    mid-event leaves a partial line (or an SSE event with no blank line after it), which is dropped."""

    def __init__(self, media: str) -> None:
        self.media = media
        self._partial = b""
        self._data: List[str] = []
        self._name: Optional[str] = None
        self._id: Optional[str] = None

    def feed(self, chunk: bytes) -> List[Event]:
        self._partial += chunk
        events: List[Event] = []
        while True:
            at = self._partial.find(b"\n")
            if at < 0:
                return events
            line = self._partial[:at].decode("utf-8").rstrip("\r")
            self._partial = self._partial[at + 1:]
            event = self._line(line)
            if event is not None:
                events.append(event)

    def _line(self, line: str) -> Optional[Event]:
        if self.media == NDJSON:
            if line.strip() == "":
                return None
            return event_of(_json_object(line), "event")
        if line == "":
            if not self._data and self._name is None:
                return None
            data, name = "\n".join(self._data), self._name
            self._data, self._name, self._id = [], None, None
            if name not in ("result", "group", "end"):
                return None
            return event_of(_json_object(data), "event %s" % name)
        if line.startswith(":"):
            return KeepAliveEvent(kind="keep-alive")
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "data":
            self._data.append(value)
        elif field == "event":
            self._name = value
        elif field == "id":
            self._id = value
        return None


def _json_object(text: str) -> Dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as err:
        raise FleetError("the result stream sent a line that is not JSON (%s)" % err) from None
    if not isinstance(value, dict):
        raise FleetError("the result stream sent %s, not an event object" % type(value).__name__)
    return value


def summary_of(data: Any) -> BatchSummary:
    return decode(BatchSummary, data)
