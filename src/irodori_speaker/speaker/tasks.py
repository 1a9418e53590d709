"""One owner for the Speaker's background tasks (structured concurrency without a task group).

`asyncio.TaskGroup` needs Python 3.11 and an anyio task group must be entered and left in
one task, while a Speaker may be opened in one task and closed in another; so the Speaker
keeps its tasks in a `TaskScope`: every task is started through it, and `aclose` cancels
and awaits whatever is still running, so none outlives the Speaker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

log = logging.getLogger("irodori_speaker.speaker")

T = TypeVar("T")

__all__ = ["TaskScope"]


class TaskScope:
    """The tasks of one Speaker. A task's failure is logged (it has nobody else to tell)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    def spawn(self, coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        if self._closed:
            coro.close()
            raise RuntimeError(f"{self.name}: the task scope is closed")
        task = asyncio.get_running_loop().create_task(coro, name=f"{self.name}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._forget)
        return task

    def _forget(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s failed", task.get_name(), exc_info=task.exception())

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        return len(self._tasks)

    async def drain(self, grace_s: float) -> None:
        """Let what is running finish within `grace_s`, then `aclose`."""
        tasks = [t for t in self._tasks if not t.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=grace_s)
        await self.aclose()

    async def aclose(self, timeout: float = 1.0) -> None:
        """Cancel what is still running and wait (at most `timeout`) for it to end."""
        self._closed = True
        tasks = [t for t in self._tasks if not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
