"""Dynamic batching: concurrent requests are grouped into one call of a batch function.

A batch starts when ``max_size`` items wait, or ``max_wait_s`` after the first one
arrived (0: at the end of the event-loop turn it arrived in, with whatever else was
submitted in that turn). At most one batch per batcher runs at a time; items that
arrive meanwhile wait for it to finish and then go at once (they have already waited),
so under load batches fill up by themselves and a lone request pays at most
``max_wait_s``.
The batch function is blocking (a model forward) and runs on ``executor``, never on
the event loop. ``max_size=1`` turns batching off.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class MicroBatcher(Generic[T, R]):
    def __init__(self, run: Callable[[list[T]], Sequence[R]], executor: Executor,
                 max_size: int, max_wait_s: float,
                 on_batch: Callable[[int], None] | None = None) -> None:
        if max_size < 1:
            raise ValueError("max_size must be at least 1")
        self._run = run
        self._executor = executor
        self.max_size = max_size
        self.max_wait_s = max_wait_s
        self._on_batch = on_batch
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._timer: asyncio.Handle | None = None
        self._running = False
        self._tasks: set[asyncio.Task[None]] = set()  # strong refs: tasks must not be GC'd

    async def submit(self, item: T) -> R:
        """The batch function's result for ``item``, computed together with its neighbours."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        self._schedule()
        return await future

    async def submit_group(self, items: Sequence[T]) -> list[R]:
        """The batch function's result for each of ``items``: a group that is whole
        already (one caller's batch), so it waits for no company. It starts at the end of
        this event-loop turn (with whatever else was submitted in it), or, while a batch
        runs, right after it; larger than ``max_size``, it goes as several batches."""
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[R]] = [loop.create_future() for _ in items]
        self._pending.extend(zip(items, futures, strict=True))
        self._schedule(now=True)
        return list(await asyncio.gather(*futures))

    def _schedule(self, now: bool = False) -> None:
        if self._running or not self._pending:
            return  # the running batch starts the next one when it finishes
        if len(self._pending) >= self.max_size:
            self._start()
            return
        if now and self._timer is not None:  # a whole group waits: no company to wait for
            self._timer.cancel()
            self._timer = None
        if self._timer is None:
            loop = asyncio.get_running_loop()
            # No wait still waits for the end of this event-loop turn: callers woken
            # together (e.g. by one forward's results) then submit together.
            self._timer = (loop.call_soon(self._on_timer) if now or self.max_wait_s <= 0
                           else loop.call_later(self.max_wait_s, self._on_timer))

    def _on_timer(self) -> None:
        self._timer = None
        if not self._running and self._pending:
            self._start()

    def _start(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch = self._pending[:self.max_size]
        self._pending = self._pending[self.max_size:]
        self._running = True
        task = asyncio.get_running_loop().create_task(self._execute(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _execute(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        live = [(item, fut) for item, fut in batch if not fut.cancelled()]
        try:
            if live:
                await self._forward(live)
        finally:
            self._running = False
            if self._pending:
                self._start()

    async def _forward(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        if self._on_batch is not None:
            self._on_batch(len(batch))
        loop = asyncio.get_running_loop()
        try:
            results = await loop.run_in_executor(self._executor, self._run,
                                                 [item for item, _ in batch])
        except Exception as exc:  # noqa: BLE001 - not swallowed: each caller gets it re-raised
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        for (_, fut), result in zip(batch, results, strict=True):
            if not fut.done():  # a caller may have gone away (cancelled) meanwhile
                fut.set_result(result)
