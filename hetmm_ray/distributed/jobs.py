"""Long-running admin work (create a product, add normals) as jobs with live progress.

A job is an asyncio task inside the registry actor; its record is plain JSON so
``GET /v1/jobs/{id}`` can show it from any ingress replica. Records of finished
jobs are kept (bounded) so a client that polls late still sees the outcome.

A failed job's ``error`` is ``{"type", "message", "status", "code"}``: the exception's class
name and last line, and its HTTP status and stable code from the one error table
(``errors.describe``; 500 ``internal`` for an unexpected exception), which an admin request
that waited for the job answers with (serve/ingress.py ``job_answer``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, cast

from ..errors import describe
from ..messages import JobError, JobRecord

__all__ = ["JobBoard", "JobProgress"]

KEEP_FINISHED = 200


def _job_error(exc: BaseException) -> JobError:
    """A failed job's error record (see the module docstring)."""
    status, code, _ = describe(exc) or (500, "internal", "")
    message = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:2000]
    return {"type": type(exc).__name__, "message": message, "status": status, "code": code}


class JobProgress:
    """What a running job reports: a stage name and done/total units of it."""

    def __init__(self, record: JobRecord) -> None:
        self._record = record

    @property
    def job_id(self) -> str:
        return self._record["id"]

    def stage(self, name: str, total: int = 0) -> None:
        self._record["progress"] = {"stage": name, "done": 0, "total": total}

    def note(self, **fields: Any) -> None:
        """Facts the job's record reports besides progress (e.g. ``skipped_duplicates``)."""
        self._record.update(cast(JobRecord, fields))  # keys of JobRecord, read by the routes

    def __call__(self, done: int, total: int) -> None:
        progress = self._record["progress"]
        progress["done"], progress["total"] = done, total


class JobBoard:
    def __init__(self) -> None:
        self.records: OrderedDict[str, JobRecord] = OrderedDict()
        self.tasks: dict[str, asyncio.Task[Any]] = {}

    def start(
        self, kind: str, product: str, work: Callable[[JobProgress], Awaitable[int]], *, done: str = "published"
    ) -> JobRecord:
        """Run ``work`` (returns the published version) in the background; returns the job record.
        ``done``: the stage a succeeded job reports (a preview publishes nothing)."""
        job_id = uuid.uuid4().hex[:16]
        record: JobRecord = {
            "id": job_id,
            "kind": kind,
            "product": product,
            "state": "running",
            "progress": {"stage": "queued", "done": 0, "total": 0},
            "version": None,
            "error": None,
            "created": time.time(),
            "finished": None,
        }
        self.records[job_id] = record
        self.tasks[job_id] = asyncio.get_running_loop().create_task(self._run(record, work, done))
        self._trim()
        return JobRecord(**record)

    async def _run(self, record: JobRecord, work: Callable[[JobProgress], Awaitable[int]], done: str) -> None:
        try:
            record["version"] = await work(JobProgress(record))
            record["state"] = "succeeded"
            record["progress"]["stage"] = done
        except Exception as exc:  # noqa: BLE001 - any failure is the job's outcome, reported to the client
            record["state"] = "failed"
            record["error"] = _job_error(exc)
        finally:
            record["finished"] = time.time()
            self.tasks.pop(record["id"], None)

    def progress_of(self, job_id: str) -> JobProgress | None:
        """The progress of a running job (work reporting from elsewhere, e.g. a task); None once it ended."""
        record = self.records.get(job_id)
        return None if record is None or record["state"] != "running" else JobProgress(record)

    def get(self, job_id: str) -> JobRecord | None:
        record = self.records.get(job_id)
        if record is None:
            return None
        copied: JobRecord = {**record, "progress": {**record["progress"]}}
        return copied

    async def wait(self, job_id: str, timeout: float) -> JobRecord | None:
        task = self.tasks.get(job_id)
        if task is not None:
            await asyncio.wait([task], timeout=timeout)
        return self.get(job_id)

    def _trim(self) -> None:
        finished = [k for k, r in self.records.items() if r["state"] != "running"]
        for k in finished[: max(0, len(finished) - KEEP_FINISHED)]:
            del self.records[k]
