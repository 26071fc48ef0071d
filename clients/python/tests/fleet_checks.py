"""Drive a real fleet's API with the installed rollout_fleet package (test/integration/python-client.test.ts
runs this with a fresh venv's python).

    fleet_checks.py stream  --api URL --batch ID --mode sync|async --media sse|ndjson --report FILE
    fleet_checks.py surface --api URL --tasks DIR --batch ID --report FILE
    fleet_checks.py policy  --api URL --endpoint NAME --report FILE

``stream`` reads the batch's results to the end and writes every event received, in order, with the
number of reconnects and the summary the end event carried. ``surface`` exercises the other calls
(upload, create, status, listing, cancel, retry, errors naming the field) and writes what they
answered. ``policy`` sets and reads an endpoint's policy version (PUT/GET
/v1/endpoints/{endpoint}/policy-version), sync and asyncio: what it read before any was set, after
setting 3 and 5, after trying 4 (lower: 409), and a negative version (400 naming the field).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import tempfile
from typing import Any, Dict, List

import rollout_fleet
from rollout_fleet import AsyncFleetClient, FleetApiError, FleetClient, GroupEvent, NDJSON, SSE, ResultEvent


def entry(event: Any) -> Dict[str, Any]:
    if isinstance(event, ResultEvent):
        r = event.result
        return {"kind": "result", "cursor": event.cursor, "episodeId": r.episode_id, "taskId": r.task_id,
                "sample": r.sample, "status": r.status, "reward": r.reward, "type": type(event).__name__}
    assert isinstance(event, GroupEvent)
    return {"kind": "group", "cursor": event.cursor, "taskId": event.task_id, "episodeIds": event.episode_ids,
            "rewards": event.rewards, "type": type(event).__name__}


def stream(args: argparse.Namespace) -> Dict[str, Any]:
    media = SSE if args.media == "sse" else NDJSON
    events: List[Dict[str, Any]] = []
    if args.mode == "sync":
        s = FleetClient(args.api, timeout=args.timeout).results(args.batch, media=media)
        for event in s:
            events.append(entry(event))
        return {"events": events, "reconnects": s.reconnects, "ended": s.ended, "cursor": s.cursor,
                "summary": None if s.summary is None else s.summary.raw, "summaryType": type(s.summary).__name__}

    async def run() -> Dict[str, Any]:
        a = AsyncFleetClient(args.api, timeout=args.timeout).results(args.batch, media=media)
        async for event in a:
            events.append(entry(event))
        return {"events": events, "reconnects": a.reconnects, "ended": a.ended, "cursor": a.cursor,
                "summary": None if a.summary is None else a.summary.raw, "summaryType": type(a.summary).__name__}

    return asyncio.run(run())


def error_of(call: Any) -> Dict[str, Any]:
    try:
        call()
    except FleetApiError as err:
        return {"status": err.status, "field": err.field, "value": err.value, "message": err.message, "text": str(err)}
    return {"status": None}


def surface(args: argparse.Namespace) -> Dict[str, Any]:
    fleet = FleetClient(args.api, timeout=args.timeout)
    out: Dict[str, Any] = {"version": rollout_fleet.__version__, "module": rollout_fleet.__file__}
    stored = fleet.upload_tasks(args.tasks)
    out["uploaded"] = [dataclasses.asdict(s) for s in stored]
    summary = fleet.status(args.batch)
    out["status"] = {"type": type(summary).__name__, "total": summary.total, "done": summary.done,
                     "finished": summary.finished, "meanReward": summary.mean_reward, "passAt": summary.pass_at}
    # The same batch again: named again, nothing added.
    again = fleet.create_batch(args.name, stored, samples=args.samples, agent={"kind": "command", "command": args.command})
    out["again"] = {"batchId": again.batch_id, "added": again.added, "episodes": again.episodes}
    # A second batch (one episode), cancelled at once: the listing has two, a page at a time.
    extra = fleet.create_batch(args.name + "-extra", stored[:1], samples=1, agent={"kind": "command", "command": "sleep 30"})
    out["extra"] = {"batchId": extra.batch_id, "cancel": fleet.cancel(extra.batch_id)}
    pages = fleet.list_batches(limit=1)
    out["firstPage"] = {"ids": [b.batch_id for b in pages.batches], "next": pages.next}
    out["allBatches"] = [b.batch_id for b in fleet.iter_batches(page_size=1)]
    out["cancel"] = fleet.cancel(args.batch)
    retry = fleet.retry(args.batch, "agent")
    out["retry"] = {"requeued": retry.requeued, "missing": retry.missing, "pending": retry.pending}
    one = next(iter(fleet.results(args.batch)))
    assert isinstance(one, ResultEvent)
    out["result"] = dataclasses.asdict(fleet.result(args.batch, one.result.episode_id))["episode_id"]
    # Errors name the field, and the value sent in it.
    out["badSamples"] = error_of(lambda: fleet.create_batch(args.name, stored, samples=0))
    out["badTask"] = error_of(lambda: fleet.create_batch(args.name, ["0" * 64]))
    out["badKind"] = error_of(lambda: fleet.retry(args.batch, "cosmic"))  # type: ignore[arg-type]
    out["noBatch"] = error_of(lambda: fleet.status("no-such-batch"))
    out["badCursor"] = error_of(lambda: list(fleet.results(args.batch, after="9999999999999-0")))
    out["wrongToken"] = error_of(lambda: FleetClient(args.api, token="wrong-token-4411").status(args.batch))
    with tempfile.TemporaryDirectory() as empty:
        os.makedirs(os.path.join(empty, "workspace"))
        with open(os.path.join(empty, "workspace", "a.txt"), "w") as f:
            f.write("x\n")
        out["noTaskYaml"] = error_of(lambda: fleet.upload_task(empty))

    async def aio() -> Dict[str, Any]:
        a = AsyncFleetClient(args.api, timeout=args.timeout)
        s = await a.status(args.batch)
        try:
            await a.create_batch(args.name, stored, samples=0)
            err: Dict[str, Any] = {"status": None}
        except FleetApiError as e:
            err = {"status": e.status, "field": e.field, "value": e.value}
        page = await a.list_batches(limit=5)
        return {"total": s.total, "badSamples": err, "listed": len(page.batches)}

    out["async"] = asyncio.run(aio())
    return out


def policy(args: argparse.Namespace) -> Dict[str, Any]:
    fleet = FleetClient(args.api, timeout=args.timeout)
    before = fleet.get_policy_version(args.endpoint)
    out: Dict[str, Any] = {"before": None if before is None else before.version}
    three = fleet.set_policy_version(args.endpoint, 3)
    out["set3"] = {"type": type(three).__name__, "endpoint": three.endpoint, "version": three.version, "setAt": three.set_at}
    got = fleet.get_policy_version(args.endpoint)
    out["get3"] = None if got is None else {"version": got.version, "setAt": got.set_at}
    out["lower"] = error_of(lambda: fleet.set_policy_version(args.endpoint, 2))
    out["negative"] = error_of(lambda: fleet.set_policy_version(args.endpoint, -1))

    async def aio() -> Dict[str, Any]:
        a = AsyncFleetClient(args.api, timeout=args.timeout)
        five = await a.set_policy_version(args.endpoint, 5)
        now = await a.get_policy_version(args.endpoint)
        try:
            await a.set_policy_version(args.endpoint, 4)
            lower: Dict[str, Any] = {"status": None}
        except FleetApiError as e:
            lower = {"status": e.status, "field": e.field}
        return {"set5": five.version, "get5": None if now is None else now.version, "lower": lower}

    out["async"] = asyncio.run(aio())
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["stream", "surface", "policy"])
    parser.add_argument("--api", required=True)
    parser.add_argument("--batch")
    parser.add_argument("--endpoint", default="default")
    parser.add_argument("--mode", choices=["sync", "async"], default="sync")
    parser.add_argument("--media", choices=["sse", "ndjson"], default="sse")
    parser.add_argument("--tasks")
    parser.add_argument("--name")
    parser.add_argument("--samples", type=int, default=1)
    parser.add_argument("--command")
    parser.add_argument("--timeout", type=float, default=30)
    parser.add_argument("--report", required=True)
    args = parser.parse_args()
    out = {"stream": stream, "surface": surface, "policy": policy}[args.what](args)
    with open(args.report, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
