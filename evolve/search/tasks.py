"""The run's tasks in flight (evaluations, tunings): one that fails stops the run instead of
dying unseen, and an interrupt abandons them all (their children stay pending for the resume)."""
from __future__ import annotations

import asyncio
from typing import Any, Coroutine


class Tasks:
    def __init__(self) -> None:
        self.in_flight: set[asyncio.Task] = set()
        self.failure: BaseException | None = None  # what stopped the run from inside a task
        self.stopping = False
        self.main: asyncio.Task | None = None  # cancelled when a task fails

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(coroutine)
        self.in_flight.add(task)
        task.add_done_callback(self._watch)

    def _watch(self, task: asyncio.Task) -> None:
        self.in_flight.discard(task)
        if self.stopping or task.cancelled():
            return
        if task.exception() is not None and self.failure is None:
            self.failure = task.exception()
            if self.main is not None:
                self.main.cancel()

    async def drain(self) -> None:
        while self.in_flight:
            await asyncio.gather(*list(self.in_flight))

    async def cancel(self, *others: asyncio.Task) -> None:
        """Abandon the tasks in flight and `others` (the loops: their calls are redone on resume)."""
        self.stopping = True
        tasks = [*self.in_flight, *others]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
