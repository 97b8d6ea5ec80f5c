"""Dynamic batching: concurrent requests are grouped into one call of a batch function.

A batch starts when ``max_size`` items wait, or ``max_wait_s`` after the first one
arrived (0: at the end of the event-loop turn it arrived in, with whatever else was
submitted in that turn). At most ``lanes`` batches per batcher run at a time (one per
thread of the device lane, ``service.runtime.threads``; default 1): a batch that starts
takes every lane that is free, the waiting items split evenly over them (on a CPU,
forwards of one thread each on two cores: about twice as fast as one forward of them
all, with no barrier between the two). Items that arrive while every lane is busy wait
for one to finish and then go at once (they have already waited), so under load
batches fill up by themselves and a lone request pays at most ``max_wait_s``.
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
                 on_batch: Callable[[int], None] | None = None, lanes: int = 1) -> None:
        if max_size < 1:
            raise ValueError("max_size must be at least 1")
        if lanes < 1:
            raise ValueError("lanes must be at least 1")
        self._run = run
        self._executor = executor
        self.max_size = max_size
        self.max_wait_s = max_wait_s
        self._on_batch = on_batch
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._timer: asyncio.Handle | None = None
        self.lanes = lanes
        self._running = 0  # batches running now, at most ``lanes``
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
        this event-loop turn (with whatever else was submitted in it), or, while every
        lane runs a batch, right after one ends; larger than ``max_size``, it goes as
        several batches."""
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[R]] = [loop.create_future() for _ in items]
        self._pending.extend(zip(items, futures, strict=True))
        self._schedule(now=True)
        return list(await asyncio.gather(*futures))

    def _schedule(self, now: bool = False) -> None:
        if self._running >= self.lanes or not self._pending:
            return  # a running batch starts the next one when it finishes
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
        if self._running < self.lanes and self._pending:
            self._start()

    def _start(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        # the waiting items, split evenly over the free lanes (one batch each, at most
        # ``max_size``): a group of 15 on two idle lanes is two forwards of 8 and 7 at once
        free = self.lanes - self._running
        taken = self._pending[:self.max_size * free]
        self._pending = self._pending[len(taken):]
        parts = min(free, len(taken))
        for n in range(parts):
            batch = taken[len(taken) * n // parts:len(taken) * (n + 1) // parts]
            self._running += 1
            task = asyncio.get_running_loop().create_task(self._execute(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _execute(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        live = [(item, fut) for item, fut in batch if not fut.cancelled()]
        try:
            if live:
                await self._forward(live)
        finally:
            self._running -= 1
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
