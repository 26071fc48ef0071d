#!/usr/bin/env python3
"""An example trainer loop over the rollout-fleet HTTP API, in Python with only the standard library.

What it does, in the order a trainer would:

1. Upload every task folder under --tasks (each sub-folder with a task.yaml) to ``POST /v1/tasks`` as a
   plain tar of the folder's contents; the API answers with the task's digest.
2. Create a batch from those digests, --samples episodes per task, with ``POST /v1/batches``. The
   batch id is derived from its content: running the trainer again names the same batch (nothing is
   enqueued twice) and reads its results from the start again.
3. Follow ``GET /v1/batches/{id}/results`` as Server-Sent Events. A ``result`` event arrives as each
   episode ends, in completion order; a ``group`` event right after the last result of a task, with the
   rewards of all its samples (floats: a verifier's reward file can give partial credit) and their
   reward-file metrics: that is where a GRPO-style trainer computes advantages and takes a step, without
   waiting for the whole batch. Here it prints the group's mean reward, each sample's advantage (its
   reward minus the group's mean, over the group's standard deviation) and the mean of each metric.
4. On any connection error, read timeout or early close, reconnect with ``Last-Event-ID`` set to the
   last event's id: the server resumes right after it, with no event lost and none repeated.
5. Stop at ``event: end`` (every episode has a result) and print the batch summary.

Run a fleet (Redis, workers, ``FLEET_API_TOKEN=... rollout-fleet api``), then::

    FLEET_API_TOKEN=... python3 examples/trainer/trainer.py --api http://127.0.0.1:3100

By default the oracle agent (each task's own solution) plays; ``--agent-command 'sh my_agent.sh'``
runs a command agent instead; ``--pass-threshold 0.5`` sets the batch's pass threshold (a reward at or
above it passes; 1 unless set). ``--report FILE`` writes what was received as JSON, and ``--drop-at``
closes the connection on purpose after chosen events: both are for the tests.
"""
from __future__ import annotations

import argparse
import http.client
import io
import json
import os
import sys
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple


class ApiError(Exception):
    """An HTTP error answer of the API: its status and the `{"error": {"field", "message"}}` body."""

    def __init__(self, method: str, path: str, status: int, body: bytes) -> None:
        self.status = status
        try:
            error = json.loads(body)["error"]
            self.message, self.field = str(error["message"]), error.get("field")
        except (ValueError, KeyError, TypeError):
            self.message, self.field = body[:200].decode("utf-8", "replace") or "(no body)", None
        where = f" (field: {self.field})" if self.field else ""
        super().__init__(f"{method} {path}: HTTP {status}: {self.message}{where}")


class Api:
    """The few calls the trainer makes; every one carries the bearer token."""

    def __init__(self, base: str, token: str, timeout: float) -> None:
        self.base = base.rstrip("/")
        self.token = token
        self.timeout = timeout

    def open(self, method: str, path: str, body: Optional[bytes] = None, headers: Optional[Dict[str, str]] = None):
        request = urllib.request.Request(self.base + path, data=body, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        try:
            return urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as err:
            raise ApiError(method, path, err.code, err.read()) from None

    def call(self, method: str, path: str, body: Any = None, raw: Optional[bytes] = None, content_type: str = "application/json") -> Tuple[int, Any]:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        headers = {"Content-Type": content_type} if data is not None else {}
        with self.open(method, path, data, headers) as response:
            return response.status, json.load(response)


def task_folders(root: Path) -> List[Path]:
    """The task folders under `root` (or `root` itself when it is one), in name order."""
    if (root / "task.yaml").is_file():
        return [root]
    folders = sorted(p for p in root.iterdir() if (p / "task.yaml").is_file())
    if not folders:
        sys.exit(f"trainer: no task folder (a folder with task.yaml) under {root}")
    return folders


def tar_task(folder: Path) -> bytes:
    """A plain tar of the folder's contents (task.yaml, workspace/, tests/, solution/ at the top)."""

    def no_links(info: tarfile.TarInfo) -> tarfile.TarInfo:
        if info.issym() or info.islnk():
            sys.exit(f"trainer: {folder / info.name}: a link; the API accepts plain files and folders only")
        return info

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(str(folder), arcname=".", filter=no_links)
    return buffer.getvalue()


def sse_events(response) -> Iterator[Dict[str, str]]:
    """Parse a text/event-stream: `field: value` lines, a blank line ends an event, `:` lines are comments."""
    event: Dict[str, str] = {}
    data: List[str] = []
    for raw in response:  # one line at a time, as it arrives
        line = raw.decode("utf-8").rstrip("\r\n")
        if line == "":
            if event or data:
                event["data"] = "\n".join(data)
                yield event
            event, data = {}, []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "data":
            data.append(value)
        elif field in ("id", "event"):
            event[field] = value
    # The server closed the connection before `event: end`: the caller reconnects.


class ResultStream:
    """The batch's result and group events, each once and in order, across as many connections as it takes.

    Every event's `id:` is its cursor in the fleet's completion stream. When a connection breaks (an
    error, a read timeout, the server closing it before `event: end`), the next request sends the last
    id received as `Last-Event-ID` and the server goes on right after it.
    """

    def __init__(self, api: Api, batch_id: str, drop_at: Set[int]) -> None:
        self.api = api
        self.path = f"/v1/batches/{batch_id}/results"
        self.drop_at = drop_at
        self.last_id: Optional[str] = None
        self.received = 0
        self.reconnects = 0

    def __iter__(self) -> Iterator[Tuple[str, Dict[str, Any]]]:
        failures = 0  # connections in a row that brought nothing
        while True:
            headers = {"Accept": "text/event-stream"}
            if self.last_id is not None:
                headers["Last-Event-ID"] = self.last_id
            got = 0
            try:
                with self.api.open("GET", self.path, headers=headers) as response:
                    for event in sse_events(response):
                        kind = event.get("event")
                        if kind == "end":
                            return  # every episode has a result, and all were delivered
                        if kind not in ("result", "group"):
                            continue  # an event type this trainer does not know
                        self.last_id = event.get("id", self.last_id)
                        self.received += 1
                        got += 1
                        yield kind, json.loads(event["data"])
                        if self.received in self.drop_at:
                            break  # the test hook: leaving the `with` closes the connection
            except ApiError as err:
                if err.status < 500:
                    raise  # a 4xx will not get better by asking again
                print(f"trainer: {err}; reconnecting", file=sys.stderr)
            except (OSError, http.client.HTTPException) as err:  # refused, reset, timed out, cut short
                print(f"trainer: stream interrupted ({err.__class__.__name__}: {err}); reconnecting", file=sys.stderr)
            failures = 0 if got else failures + 1
            if failures > 10:
                raise ConnectionError(f"{self.api.base} did not answer with an event after {failures} tries")
            self.reconnects += 1
            time.sleep(min(5.0, 0.1 * 2 ** failures) if failures else 0)  # back off only while it fails


def mean(values: List[Optional[float]]) -> Optional[float]:
    graded = [v for v in values if v is not None]  # null: the episode ended without a grade (an error)
    return sum(graded) / len(graded) if graded else None


def advantages(rewards: List[Optional[float]]) -> List[Optional[float]]:
    """GRPO's group-relative advantage of each sample: (reward - mean) / std over the group's graded rewards.

    An ungraded sample (null: an error) gets None and takes no part; a group whose graded rewards are all
    equal (std 0) gives 0 to each, so it teaches nothing rather than dividing by zero.
    """
    graded = [r for r in rewards if r is not None]
    if not graded:
        return [None for _ in rewards]
    m = sum(graded) / len(graded)
    std = (sum((r - m) ** 2 for r in graded) / len(graded)) ** 0.5
    return [None if r is None else (0.0 if std < 1e-12 else (r - m) / std) for r in rewards]


def metric_means(metrics: List[Optional[Dict[str, float]]]) -> Dict[str, float]:
    """The mean of each reward-file metric over the samples that reported it, by name."""
    sums: Dict[str, List[float]] = {}
    for sample in metrics:
        for key, value in (sample or {}).items():
            sums.setdefault(key, []).append(value)
    return {key: sum(values) / len(values) for key, values in sorted(sums.items())}


def fmt(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", default="http://127.0.0.1:3100", help="base URL of `rollout-fleet api` (default %(default)s)")
    parser.add_argument("--token-env", default="FLEET_API_TOKEN", help="environment variable holding the bearer token (default %(default)s)")
    parser.add_argument("--tasks", default=str(Path(__file__).resolve().parent.parent / "tasks"), help="a folder of task folders, or one task folder (default: examples/tasks)")
    parser.add_argument("--samples", type=int, default=4, help="episodes per task: the group size (default %(default)s)")
    parser.add_argument("--name", default="trainer-demo", help="batch name, lower case (default %(default)s)")
    parser.add_argument("--pass-threshold", type=float, help="the batch's passThreshold: the reward an episode needs to pass (default: the fleet's, 1)")
    parser.add_argument("--agent-command", help="run this shell command as the agent (default: the oracle agent, each task's solution)")
    parser.add_argument("--timeout", type=float, default=60, help="seconds without a byte before the stream is reopened (default %(default)s)")
    parser.add_argument("--report", help="write what was received to this JSON file")
    parser.add_argument("--drop-at", default="", help="test hook: close the connection after these events (1-based, counted over the whole run), e.g. 5,17,40")
    args = parser.parse_args(argv)

    token = os.environ.get(args.token_env, "")
    if not token:
        print(f"trainer: set the API token in the environment variable {args.token_env}", file=sys.stderr)
        return 2
    api = Api(args.api, token, args.timeout)

    try:
        # 1. Upload the tasks.
        digests: List[str] = []
        for folder in task_folders(Path(args.tasks)):
            _, stored = api.call("POST", "/v1/tasks", raw=tar_task(folder), content_type="application/x-tar")
            digests.append(stored["digest"])
            print(f"task {stored['taskId']}: {stored['digest'][:12]} ({stored['bytes']} bytes)")

        # 2. Create the batch: a group of --samples episodes per task.
        agent = {"kind": "command", "command": args.agent_command} if args.agent_command else {"kind": "oracle"}
        request: Dict[str, Any] = {"name": args.name, "tasks": digests, "samples": args.samples, "agent": agent}
        if args.pass_threshold is not None:
            request["passThreshold"] = args.pass_threshold
        status, batch = api.call("POST", "/v1/batches", request)
        batch_id, total = batch["batchId"], batch["episodes"]
        print(f"batch {batch_id}: {total} episodes" + ("" if status == 201 else " (created before: its results again, from the start)"), flush=True)

        # 3. and 4. Follow the results; the stream reconnects by itself.
        stream = ResultStream(api, batch_id, {int(k) for k in args.drop_at.split(",") if k.strip()})
        received: List[Dict[str, Any]] = []  # for the report: every event, in the order received
        results = 0
        first_group: Optional[Dict[str, Any]] = None
        for kind, event in stream:
            if kind == "result":
                results += 1
                r = event["result"]
                received.append({"kind": kind, "cursor": event["cursor"], "episodeId": r["episodeId"], "taskId": r["taskId"], "sample": r["sample"], "status": r["status"], "reward": r["reward"]})
                continue
            # A whole group: this is where a trainer computes advantages from the rewards and steps.
            rewards = event["rewards"]
            advantage = advantages(rewards)
            metrics = metric_means(event.get("metrics") or [])
            received.append({"kind": kind, "cursor": event["cursor"], "taskId": event["taskId"], "rewards": rewards, "advantages": advantage, "metrics": metrics, "resultsBefore": results})
            print(f"group {event['taskId']}: mean reward {fmt(mean(rewards))} over {len(rewards)} samples ({results}/{total} episodes done)", flush=True)
            print(f"  advantages {' '.join(fmt(a) for a in advantage)}" + (f"; metrics {', '.join(f'{k} {v:.2f}' for k, v in metrics.items())}" if metrics else ""), flush=True)
            if first_group is None:
                # How far the whole batch was when the first group arrived: results the fleet has recorded.
                _, summary = api.call("GET", f"/v1/batches/{batch_id}")
                first_group = {"resultsBefore": results, "batchDone": summary["done"], "total": total}

        # 5. The summary, from the API.
        _, summary = api.call("GET", f"/v1/batches/{batch_id}")
    except ApiError as err:
        print(f"trainer: {err}", file=sys.stderr)
        return 1
    except (OSError, http.client.HTTPException) as err:
        print(f"trainer: cannot talk to {args.api}: {getattr(err, 'reason', err)}", file=sys.stderr)
        return 1

    pass_at = ", ".join(f"pass@{k} {v:.3f}" for k, v in sorted(summary["passAt"].items(), key=lambda kv: int(kv[0])))
    groups = sum(1 for e in received if e["kind"] == "group")
    threshold = summary.get("passThreshold", 1)
    passed_by = "" if threshold == 1 else f" (passed: reward >= {threshold:g})"
    print(f"batch {batch_id}: {results}/{total} episodes, {groups} groups, mean reward {fmt(summary['meanReward'])}, {pass_at}{passed_by}; {stream.reconnects} reconnects")
    if summary.get("metrics"):
        print("  metrics: " + ", ".join(f"{k} {m['mean']:.3f}" for k, m in sorted(summary["metrics"].items())))
    if args.report:
        report = {"batchId": batch_id, "total": total, "events": received, "reconnects": stream.reconnects, "firstGroup": first_group, "summary": summary}
        Path(args.report).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
