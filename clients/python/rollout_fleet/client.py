"""The synchronous client (http.client, standard library only)."""
from __future__ import annotations

import http.client
import json
import ssl
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence

from ._tasks import PathArg, tar_task, task_folders
from ._wire import NDJSON, SSE, Endpoint, StreamParser, TaskRef, batch_request, quote, results_path
from .errors import FleetApiError, StreamError
from .types import (
    BatchCreated, BatchEvent, BatchList, BatchListing, BatchSummary, EndEvent, EpisodeResult, FailureKind,
    GroupEvent, PolicyVersion, ResultEvent, RetryReport, StoredTask, decode,
)

#: Statuses a stream (re)connection is tried again after; any other 4xx is raised.
RETRIED_STATUSES = (408, 425, 429, 500, 502, 503, 504)


def backoff(failures: int) -> float:
    """Seconds to wait before the next try after ``failures`` tries in a row that brought nothing."""
    return 0.0 if failures == 0 else min(5.0, 0.1 * 2.0 ** failures)


class FleetClient:
    """The rollout-fleet HTTP API from Python.

    ``base_url`` is where ``rollout-fleet api`` listens (``http://127.0.0.1:3100``); ``token`` its
    bearer token (default: the FLEET_API_TOKEN environment variable). ``timeout`` bounds each request
    and, on the result stream, the silence before it is reopened (the server sends a keep-alive every
    15 s).
    """

    def __init__(self, base_url: str, token: Optional[str] = None, timeout: float = 60.0, ssl_context: Optional[ssl.SSLContext] = None) -> None:
        self._endpoint = Endpoint(base_url, token)
        self.timeout = timeout
        self._ssl = ssl_context

    @property
    def base_url(self) -> str:
        return self._endpoint.base_url

    # -- plumbing -------------------------------------------------------------------------------------

    def _connection(self, timeout: Optional[float] = None) -> http.client.HTTPConnection:
        e = self._endpoint
        if e.scheme == "https":
            return http.client.HTTPSConnection(e.host, e.port, timeout=timeout or self.timeout, context=self._ssl)
        return http.client.HTTPConnection(e.host, e.port, timeout=timeout or self.timeout)

    def _call(self, method: str, path: str, body: Any = None, raw: Optional[bytes] = None, content_type: str = "application/json") -> Any:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        headers = self._endpoint.headers({"Accept": "application/json", "Connection": "close"})
        if data is not None:
            headers["Content-Type"] = content_type
        conn = self._connection()
        try:
            conn.request(method, self._endpoint.prefix + path, body=data, headers=headers)
            response = conn.getresponse()
            payload = response.read()
        finally:
            conn.close()
        if response.status >= 400:
            raise FleetApiError(method, path, response.status, payload, sent=body)
        return json.loads(payload) if payload else None

    # -- tasks and batches ----------------------------------------------------------------------------

    def upload_task(self, folder: PathArg) -> StoredTask:
        """Upload one task folder (task.yaml, workspace/, tests/, solution/): the fleet keeps it by digest."""
        return decode(StoredTask, self._call("POST", "/v1/tasks", raw=tar_task(folder), content_type="application/x-tar"))

    def upload_tasks(self, root: PathArg) -> List[StoredTask]:
        """Upload every task folder under ``root`` (or ``root`` itself when it is one), in name order."""
        return [self.upload_task(folder) for folder in task_folders(root)]

    def create_batch(
        self,
        name: str,
        tasks: Sequence[TaskRef],
        samples: Optional[int] = None,
        agent: Optional[Dict[str, Any]] = None,
        pass_threshold: Optional[float] = None,
        **extra: Any,
    ) -> BatchCreated:
        """Create a batch: ``samples`` episodes of each task (a digest, a StoredTask, or ``{"digest": ...}``).

        ``agent`` is the API's agent object (default ``{"kind": "oracle"}``); any other field of the
        API's batch request (``model``, ``defaults``...) goes in ``extra`` under its API name. The same
        batch again names the same batch and adds nothing (``added`` False).
        """
        body = batch_request(name, tasks, samples, agent, pass_threshold, extra)
        return decode(BatchCreated, self._call("POST", "/v1/batches", body))

    def status(self, batch_id: str) -> BatchSummary:
        """The batch's summary so far."""
        return decode(BatchSummary, self._call("GET", "/v1/batches/%s" % quote(batch_id)))

    def list_batches(self, limit: Optional[int] = None, after: Optional[str] = None) -> BatchList:
        """One page of the batches, newest first; pass its ``next`` as ``after`` for the next page."""
        query = []
        if limit is not None:
            query.append("limit=%d" % limit)
        if after is not None:
            query.append("after=%s" % quote(after))
        return decode(BatchList, self._call("GET", "/v1/batches" + ("?" + "&".join(query) if query else "")))

    def iter_batches(self, page_size: int = 100) -> Iterator[BatchListing]:
        """Every batch, newest first, a page at a time."""
        after: Optional[str] = None
        while True:
            page = self.list_batches(limit=page_size, after=after)
            yield from page.batches
            if page.next is None:
                return
            after = page.next

    def result(self, batch_id: str, episode_id: str) -> EpisodeResult:
        return decode(EpisodeResult, self._call("GET", "/v1/batches/%s/episodes/%s" % (quote(batch_id), quote(episode_id))))

    def trajectory(self, batch_id: str, episode_id: str) -> Dict[str, Any]:
        """The episode's trajectory document (conversation with token ids and logprobs when captured)."""
        doc: Dict[str, Any] = self._call("GET", "/v1/batches/%s/episodes/%s/trajectory" % (quote(batch_id), quote(episode_id)))
        return doc

    def cancel(self, batch_id: str, episode_ids: Optional[Sequence[str]] = None) -> Dict[str, str]:
        """Cancel the batch, or the episodes named: the outcome per episode."""
        body = {} if episode_ids is None else {"episodeIds": list(episode_ids)}
        outcomes: Dict[str, str] = self._call("POST", "/v1/batches/%s/cancel" % quote(batch_id), body)["outcomes"]
        return outcomes

    def retry(self, batch_id: str, kind: FailureKind) -> RetryReport:
        """Run again the batch's episodes that failed with ``kind`` (infra, model, agent, verifier, invalid)."""
        return decode(RetryReport, self._call("POST", "/v1/batches/%s/retry" % quote(batch_id), {"kind": kind}))

    # -- policy versions ------------------------------------------------------------------------------

    def set_policy_version(self, endpoint: str, version: int) -> PolicyVersion:
        """Tell the fleet the policy behind ``endpoint`` is now at ``version`` (never lower: 409)."""
        body = {"version": version}
        return decode(PolicyVersion, self._call("PUT", "/v1/endpoints/%s/policy-version" % quote(endpoint), body))

    def get_policy_version(self, endpoint: str) -> Optional[PolicyVersion]:
        """The endpoint's current policy version; None when none was ever set."""
        try:
            return decode(PolicyVersion, self._call("GET", "/v1/endpoints/%s/policy-version" % quote(endpoint)))
        except FleetApiError as err:
            if err.status == 404 and err.message != "no such route":
                return None
            raise

    # -- results --------------------------------------------------------------------------------------

    def results(self, batch_id: str, after: str = "0", media: str = SSE, max_failures: int = 10) -> "ResultStream":
        """The batch's results as they finish, and a group event once every sample of a task ended.

        Iterate it: it yields ResultEvent and GroupEvent, each once, in completion order, and stops at
        the stream's end (every episode has a result), then ``summary`` holds the batch summary. A
        connection that breaks (an error, ``timeout`` of silence, a close before the end) is reopened
        from the last cursor received. ``media`` is SSE (default) or NDJSON.
        """
        return ResultStream(self, batch_id, after, media, max_failures)


class ResultStream:
    """A batch's events across as many connections as it takes (see FleetClient.results)."""

    def __init__(self, client: FleetClient, batch_id: str, after: str, media: str, max_failures: int) -> None:
        if media not in (SSE, NDJSON):
            raise ValueError("media: expected %r or %r (got %r)" % (SSE, NDJSON, media))
        self._client = client
        self.batch_id = batch_id
        #: The cursor of the last event received: resume here (``client.results(id, after=cursor)``).
        self.cursor = after
        self.media = media
        self.max_failures = max_failures
        #: The batch summary the end event carried; None until the stream ended.
        self.summary: Optional[BatchSummary] = None
        self.ended = False
        #: Connections opened again after one broke.
        self.reconnects = 0
        self._connections = 0

    def __iter__(self) -> Iterator[BatchEvent]:
        failures = 0
        while not self.ended:
            if self._connections > 0:
                self.reconnects += 1
            self._connections += 1
            time.sleep(backoff(failures))
            got = 0
            try:
                for event in self._connection():
                    got += 1
                    yield event
            except FleetApiError as err:
                if err.status not in RETRIED_STATUSES:
                    raise
            except (OSError, http.client.HTTPException):
                pass  # refused, reset, timed out, cut short: reopened from the cursor
            failures = 0 if got else failures + 1
            if not self.ended and failures > self.max_failures:
                raise StreamError("%s: no event after %d tries in a row (cursor %s)" % (self._client.base_url, failures, self.cursor))

    def _connection(self) -> Iterator[BatchEvent]:
        path, extra = results_path(self.batch_id, self.media, self.cursor)
        e = self._client._endpoint
        conn = self._client._connection()
        try:
            conn.request("GET", e.prefix + path, headers=e.headers(extra))
            response = conn.getresponse()
            if response.status >= 400:
                raise FleetApiError("GET", path, response.status, response.read(), sent={"after": self.cursor, "Last-Event-ID": self.cursor})
            parser = StreamParser(self.media)
            while True:
                chunk = response.read1(65536)
                if not chunk:
                    return  # closed before the end event: the caller reconnects
                for event in parser.feed(chunk):
                    if isinstance(event, EndEvent):
                        self.summary = event.summary
                        self.ended = True
                        return
                    if isinstance(event, (ResultEvent, GroupEvent)):
                        self.cursor = event.cursor
                        yield event
        finally:
            conn.close()

    def __repr__(self) -> str:
        return "ResultStream(batch_id=%r, cursor=%r, ended=%r, reconnects=%d)" % (self.batch_id, self.cursor, self.ended, self.reconnects)
