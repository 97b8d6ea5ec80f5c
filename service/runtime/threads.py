"""The gateway's threads outside Python: numpy's BLAS threads and torch's OpenMP teams.

numpy's BLAS: the gateway's own numpy work is small (the embedded Qdrant's brute-force
search, one [D] x [N, D] product per query), but OpenBLAS keeps its idle threads spinning
for a while after every call, on the same cores as the next model forward. On a 2-core
host that roughly halved a ViT-B-32 text query's encode time when set to one thread
(53 -> 25 ms, ``nobackfill bench serve``): ``limit_blas_threads``.

torch's OpenMP teams: every thread that runs a parallel torch operation gets a team of
OpenMP worker threads of its own, kept while that thread lives. Once the process holds
more such threads than it has cores, GNU OpenMP stops letting idle workers spin and puts
them to sleep between operations, so each of a forward's many small operations waits for
its workers to wake. Measured on this project's 2-core machine (bench base's NEW, in the
device lane's thread): 20 images 6.5 ms and one text 0.9 ms when only the lane had ever
run torch; 10.0 and 2.0 ms once a model had been loaded in another thread that stays
alive (a thread pool's). So in the gateway only the device lane runs torch for good:
images are preprocessed in numpy (``training.encoders.pixels_many``), and a model is
loaded in a thread of its own that ends once it is loaded (``in_own_thread``), its team
with it.

And the lane's own team: a forward on two threads is a string of fork-join barriers,
each waiting for both threads. When another process takes a core (a worker on the same
host loading a model or backfilling), one of them is preempted and every barrier waits
for its next time slice: plain searches took 200-230 ms instead of 6 (``bench rerank``,
while the worker loaded its model). On one thread there is no barrier: one text 0.9 ms
(the same), 20 images 11.0 ms instead of 6.5. So the lane runs ``torch_threads`` (default
1: ``lane_torch_threads``); a host with cores to spare for the forward sets more.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from threadpoolctl import threadpool_limits

T = TypeVar("T")


def limit_blas_threads(threads: int) -> None:
    """Cap every BLAS library loaded in this process at ``threads``; 0 leaves them alone.
    Applies from now on, for the whole process."""
    if threads > 0:
        threadpool_limits(limits=threads, user_api="blas")


def lane_torch_threads(threads: int) -> None:
    """The device lane's initializer: torch's threads for its forwards (0: torch's
    default)."""
    if threads > 0:
        import torch

        torch.set_num_threads(threads)


async def in_own_thread(fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` in a new thread that ends when it returns (its OpenMP team is freed
    with it), awaited without blocking the event loop."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="load")
    try:
        return await asyncio.get_running_loop().run_in_executor(pool, functools.partial(
            fn, *args))
    finally:
        pool.shutdown(wait=False)  # its one thread exits once ``fn`` has returned
