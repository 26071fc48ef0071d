"""rollout-fleet's Python client: the fleet's HTTP API from a trainer, standard library only.

    from rollout_fleet import FleetClient
    fleet = FleetClient("http://127.0.0.1:3100")          # token from FLEET_API_TOKEN
    tasks = fleet.upload_tasks("examples/tasks")
    batch = fleet.create_batch("demo", tasks, samples=4)
    for event in fleet.results(batch.batch_id):            # reconnects from its cursor
        if event.kind == "group":
            print(event.task_id, event.rewards)

``rollout_fleet.aio.AsyncFleetClient`` is the same for asyncio.
"""
from ._tasks import TaskFolderError, tar_task, task_folders
from ._wire import NDJSON, SSE
from .aio import AsyncFleetClient, AsyncResultStream
from .client import FleetClient, ResultStream
from .errors import FleetApiError, FleetError, StreamError
from .types import (
    BatchCreated, BatchEvent, BatchList, BatchListing, BatchSummary, DecodeError, EndEvent, EpisodeResult,
    FailureInfo, GroupEvent, KeepAliveEvent, PolicyVersion, ResultEvent, RetryReport, StoredTask,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncFleetClient", "AsyncResultStream", "BatchCreated", "BatchEvent", "BatchList", "BatchListing",
    "BatchSummary", "DecodeError", "EndEvent", "EpisodeResult", "FailureInfo", "FleetApiError", "FleetClient",
    "FleetError", "GroupEvent", "KeepAliveEvent", "NDJSON", "PolicyVersion", "ResultEvent", "ResultStream",
    "RetryReport", "SSE", "StoredTask", "StreamError", "TaskFolderError", "tar_task", "task_folders",
]
