#!/usr/bin/env python3
"""An example trainer loop on the rollout_fleet package (clients/python: `pip install ./clients/python`).

Uploads the task folders under --tasks, creates a batch of --samples episodes per task, and follows its
results as they finish. At each task's group event (all its samples ended) it computes GRPO's
group-relative advantages from the rewards, which is where a trainer would take a step; at the end it
prints the batch summary the stream's end carried. The stream reconnects by itself from its cursor.

    FLEET_API_TOKEN=... python3 examples/trainer/trainer.py --api http://127.0.0.1:3100
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List, Optional

try:
    import rollout_fleet
except ImportError:  # run from a clone without installing: the package next door
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))
    import rollout_fleet


def advantages(rewards: List[Optional[float]]) -> List[Optional[float]]:
    """(reward - mean) / std over the group's graded rewards; None for an ungraded sample, 0 when std is 0."""
    graded = [r for r in rewards if r is not None]
    if not graded:
        return [None for _ in rewards]
    m = sum(graded) / len(graded)
    std = (sum((r - m) ** 2 for r in graded) / len(graded)) ** 0.5
    return [None if r is None else (0.0 if std < 1e-12 else (r - m) / std) for r in rewards]


def metric_means(metrics: List[Optional[Dict[str, float]]]) -> Dict[str, float]:
    """The mean of each reward-file metric over the samples that reported it."""
    sums: Dict[str, List[float]] = {}
    for sample in metrics:
        for key, value in (sample or {}).items():
            sums.setdefault(key, []).append(value)
    return {key: sum(v) / len(v) for key, v in sorted(sums.items())}


def fmt(value: Optional[float]) -> str:
    return "-" if value is None else "%.2f" % value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", default="http://127.0.0.1:3100")
    parser.add_argument("--tasks", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tasks"))
    parser.add_argument("--samples", type=int, default=4, help="episodes per task: the group size")
    parser.add_argument("--name", default="trainer-demo")
    parser.add_argument("--agent-command", help="a command agent (default: the oracle, each task's solution)")
    args = parser.parse_args()

    fleet = rollout_fleet.FleetClient(args.api)  # the token from FLEET_API_TOKEN
    agent = {"kind": "command", "command": args.agent_command} if args.agent_command else {"kind": "oracle"}
    try:
        batch = fleet.create_batch(args.name, fleet.upload_tasks(args.tasks), samples=args.samples, agent=agent)
        print("batch %s: %d episodes%s" % (batch.batch_id, batch.episodes, "" if batch.added else " (created before: from the start)"), flush=True)
        done = 0
        stream = fleet.results(batch.batch_id)
        for event in stream:
            if isinstance(event, rollout_fleet.ResultEvent):
                done += 1
                continue
            # A whole group: a trainer computes advantages here and takes a step.
            metrics = metric_means(event.metrics)
            print("group %s: rewards %s, advantages %s%s (%d/%d done)" % (
                event.task_id, " ".join(fmt(r) for r in event.rewards), " ".join(fmt(a) for a in advantages(event.rewards)),
                "; " + ", ".join("%s %.2f" % kv for kv in metrics.items()) if metrics else "", done, batch.episodes), flush=True)
    except rollout_fleet.FleetError as err:
        print("trainer: %s" % err, file=sys.stderr)
        return 1
    except OSError as err:
        print("trainer: cannot talk to %s: %s" % (args.api, err), file=sys.stderr)
        return 1
    s = stream.summary
    if s is not None:
        pass_at = ", ".join("pass@%s %.3f" % (k, v) for k, v in sorted(s.pass_at.items(), key=lambda kv: int(kv[0])))
        print("batch %s: %d/%d episodes, mean reward %s, %s; %d reconnects" % (batch.batch_id, s.done, s.total, fmt(s.mean_reward), pass_at, stream.reconnects))
    return 0


if __name__ == "__main__":
    sys.exit(main())
