"""The asyncio client: the same calls as FleetClient, as coroutines, over asyncio streams (HTTP/1.1,
standard library only). The result stream is an async iterator that reconnects from its cursor."""
from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any, AsyncIterator, Dict, List, Optional, Sequence, Tuple

from ._tasks import PathArg, tar_task, task_folders
from ._wire import NDJSON, SSE, Endpoint, StreamParser, TaskRef, batch_request, quote, results_path
from .client import RETRIED_STATUSES, backoff
from .errors import FleetApiError, FleetError, StreamError
from .types import (
    BatchCreated, BatchEvent, BatchList, BatchSummary, EndEvent, EpisodeResult, FailureKind, GroupEvent,
    PolicyVersion, ResultEvent, RetryReport, StoredTask, decode,
)

#: The most a response's status line and headers may take.
MAX_HEADER_BYTES = 64 * 1024


class _Response:
    """A response's status and headers, and its body as it comes (Content-Length, chunked, or to EOF)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout: float) -> None:
        self.reader = reader
        self.writer = writer
        self.timeout = timeout
        self.status = 0
        self.headers: Dict[str, str] = {}

    async def _line(self) -> bytes:
        return await asyncio.wait_for(self.reader.readuntil(b"\n"), self.timeout)

    async def start(self) -> None:
        status = await self._line()
        parts = status.decode("latin-1").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise FleetError("not an HTTP response: %r" % status[:80])
        self.status = int(parts[1])
        size = len(status)
        while True:
            line = await self._line()
            size += len(line)
            if size > MAX_HEADER_BYTES:
                raise FleetError("response headers over %d bytes" % MAX_HEADER_BYTES)
            text = line.decode("latin-1").rstrip("\r\n")
            if text == "":
                return
            name, _, value = text.partition(":")
            self.headers[name.strip().lower()] = value.strip()

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive; ends at the body's end. A body cut short raises IncompleteBody."""
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            while True:
                size_line = await self._line()
                try:
                    size = int(size_line.split(b";")[0].strip(), 16)
                except ValueError:
                    raise IncompleteBody("a bad chunk size %r" % size_line[:40]) from None
                if size == 0:
                    return
                data = await asyncio.wait_for(self.reader.readexactly(size + 2), self.timeout)
                yield data[:-2]
        elif "content-length" in self.headers:
            left = int(self.headers["content-length"])
            while left > 0:
                data = await asyncio.wait_for(self.reader.read(min(left, 65536)), self.timeout)
                if not data:
                    raise IncompleteBody("%d bytes short" % left)
                left -= len(data)
                yield data
        else:
            while True:
                data = await asyncio.wait_for(self.reader.read(65536), self.timeout)
                if not data:
                    return
                yield data

    async def body(self) -> bytes:
        parts = [c async for c in self.chunks()]
        return b"".join(parts)

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (OSError, asyncio.IncompleteReadError):
            pass


class IncompleteBody(FleetError):
    """A response body that ended before its end."""


class AsyncFleetClient:
    """FleetClient for asyncio trainers: ``await client.create_batch(...)``, ``async for e in client.results(id)``."""

    def __init__(self, base_url: str, token: Optional[str] = None, timeout: float = 60.0, ssl_context: Optional[ssl.SSLContext] = None) -> None:
        self._endpoint = Endpoint(base_url, token)
        self.timeout = timeout
        self._ssl = ssl_context

    @property
    def base_url(self) -> str:
        return self._endpoint.base_url

    async def _open(self, method: str, path: str, data: Optional[bytes], headers: Dict[str, str]) -> _Response:
        e = self._endpoint
        context: Optional[ssl.SSLContext] = None
        if e.scheme == "https":
            context = self._ssl or ssl.create_default_context()
        reader, writer = await asyncio.wait_for(asyncio.open_connection(e.host, e.port, ssl=context), self.timeout)
        all_headers = e.headers(headers)
        all_headers["Connection"] = "close"
        if data is not None:
            all_headers["Content-Length"] = str(len(data))
        head = "%s %s HTTP/1.1\r\n%s\r\n" % (method, e.prefix + path, "".join("%s: %s\r\n" % kv for kv in all_headers.items()))
        response = _Response(reader, writer, self.timeout)
        try:
            writer.write(head.encode("latin-1"))
            if data:
                writer.write(data)
            await asyncio.wait_for(writer.drain(), self.timeout)
            await response.start()
        except BaseException:
            await response.close()
            raise
        return response

    async def _call(self, method: str, path: str, body: Any = None, raw: Optional[bytes] = None, content_type: str = "application/json") -> Any:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        response = await self._open(method, path, data, headers)
        try:
            payload = await response.body()
        finally:
            await response.close()
        if response.status >= 400:
            raise FleetApiError(method, path, response.status, payload, sent=body)
        return json.loads(payload) if payload else None

    async def upload_task(self, folder: PathArg) -> StoredTask:
        tar = await asyncio.get_running_loop().run_in_executor(None, tar_task, folder)
        return decode(StoredTask, await self._call("POST", "/v1/tasks", raw=tar, content_type="application/x-tar"))

    async def upload_tasks(self, root: PathArg) -> List[StoredTask]:
        return [await self.upload_task(folder) for folder in task_folders(root)]

    async def create_batch(
        self,
        name: str,
        tasks: Sequence[TaskRef],
        samples: Optional[int] = None,
        agent: Optional[Dict[str, Any]] = None,
        pass_threshold: Optional[float] = None,
        **extra: Any,
    ) -> BatchCreated:
        body = batch_request(name, tasks, samples, agent, pass_threshold, extra)
        return decode(BatchCreated, await self._call("POST", "/v1/batches", body))

    async def status(self, batch_id: str) -> BatchSummary:
        return decode(BatchSummary, await self._call("GET", "/v1/batches/%s" % quote(batch_id)))

    async def list_batches(self, limit: Optional[int] = None, after: Optional[str] = None) -> BatchList:
        query = []
        if limit is not None:
            query.append("limit=%d" % limit)
        if after is not None:
            query.append("after=%s" % quote(after))
        return decode(BatchList, await self._call("GET", "/v1/batches" + ("?" + "&".join(query) if query else "")))

    async def result(self, batch_id: str, episode_id: str) -> EpisodeResult:
        return decode(EpisodeResult, await self._call("GET", "/v1/batches/%s/episodes/%s" % (quote(batch_id), quote(episode_id))))

    async def cancel(self, batch_id: str, episode_ids: Optional[Sequence[str]] = None) -> Dict[str, str]:
        body = {} if episode_ids is None else {"episodeIds": list(episode_ids)}
        outcomes: Dict[str, str] = (await self._call("POST", "/v1/batches/%s/cancel" % quote(batch_id), body))["outcomes"]
        return outcomes

    async def retry(self, batch_id: str, kind: FailureKind) -> RetryReport:
        return decode(RetryReport, await self._call("POST", "/v1/batches/%s/retry" % quote(batch_id), {"kind": kind}))

    async def set_policy_version(self, endpoint: str, version: int) -> PolicyVersion:
        body = {"version": version}
        return decode(PolicyVersion, await self._call("PUT", "/v1/endpoints/%s/policy-version" % quote(endpoint), body))

    async def get_policy_version(self, endpoint: str) -> Optional[PolicyVersion]:
        try:
            return decode(PolicyVersion, await self._call("GET", "/v1/endpoints/%s/policy-version" % quote(endpoint)))
        except FleetApiError as err:
            if err.status == 404 and err.message != "no such route":
                return None
            raise

    def results(self, batch_id: str, after: str = "0", media: str = NDJSON, max_failures: int = 10) -> "AsyncResultStream":
        """As FleetClient.results, as an async iterator (NDJSON by default; SSE with ``media=SSE``)."""
        return AsyncResultStream(self, batch_id, after, media, max_failures)


class AsyncResultStream:
    """A batch's events across as many connections as it takes: ``async for event in stream``."""

    def __init__(self, client: AsyncFleetClient, batch_id: str, after: str, media: str, max_failures: int) -> None:
        if media not in (SSE, NDJSON):
            raise ValueError("media: expected %r or %r (got %r)" % (SSE, NDJSON, media))
        self._client = client
        self.batch_id = batch_id
        self.cursor = after
        self.media = media
        self.max_failures = max_failures
        self.summary: Optional[BatchSummary] = None
        self.ended = False
        self.reconnects = 0
        self._connections = 0

    def __aiter__(self) -> AsyncIterator[BatchEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[BatchEvent]:
        failures = 0
        while not self.ended:
            if self._connections > 0:
                self.reconnects += 1
            self._connections += 1
            await asyncio.sleep(backoff(failures))
            got = 0
            response: Optional[_Response] = None
            try:
                path, headers = results_path(self.batch_id, self.media, self.cursor)
                response = await self._client._open("GET", path, None, headers)
                if response.status >= 400:
                    raise FleetApiError("GET", path, response.status, await response.body(), sent={"after": self.cursor, "Last-Event-ID": self.cursor})
                parser = StreamParser(self.media)
                async for chunk in response.chunks():
                    for event in parser.feed(chunk):
                        if isinstance(event, EndEvent):
                            self.summary = event.summary
                            self.ended = True
                            break
                        if isinstance(event, (ResultEvent, GroupEvent)):
                            self.cursor = event.cursor
                            got += 1
                            yield event
                    if self.ended:
                        break
            except FleetApiError as err:
                if err.status not in RETRIED_STATUSES:
                    raise
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, IncompleteBody):
                pass  # refused, reset, timed out, cut short: reopened from the cursor
            finally:
                if response is not None:
                    await response.close()
            failures = 0 if got else failures + 1
            if not self.ended and failures > self.max_failures:
                raise StreamError("%s: no event after %d tries in a row (cursor %s)" % (self._client.base_url, failures, self.cursor))


__all__: Tuple[str, ...] = ("AsyncFleetClient", "AsyncResultStream", "IncompleteBody", "SSE", "NDJSON")
