"""Dynamic batching: grouping, limits, errors and cancellation, work off the event loop,
and through the API: concurrent queries share forwards and get the same answers as
queries sent one at a time."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from itertools import chain

import numpy as np
import pytest
from conftest import ADMIN

from service.runtime.batching import MicroBatcher
from service.state.gallery.store import Search


class Recorder:
    """A batch function that doubles its inputs and remembers each batch."""

    def __init__(self, delay_s: float = 0.0, fail_on: int | None = None) -> None:
        self.batches: list[list[int]] = []
        self.threads: set[str] = set()
        self.delay_s = delay_s
        self.fail_on = fail_on

    def __call__(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        self.threads.add(threading.current_thread().name)
        time.sleep(self.delay_s)
        if self.fail_on is not None and self.fail_on in items:
            raise ValueError(f"cannot encode {self.fail_on}")
        return [2 * i for i in items]


@pytest.fixture
def lane():
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="lane") as pool:
        yield pool


def run(coro):
    return asyncio.run(coro)


def test_concurrent_items_share_batches_up_to_max_size(lane) -> None:
    fn = Recorder()

    async def main() -> list[int]:
        batcher = MicroBatcher(fn, lane, max_size=4, max_wait_s=0.05)
        return await asyncio.gather(*(batcher.submit(i) for i in range(10)))
    assert run(main()) == [2 * i for i in range(10)]  # each caller gets its own result
    assert [len(b) for b in fn.batches] == [4, 4, 2]
    assert sorted(chain.from_iterable(fn.batches)) == list(range(10))
    assert fn.threads == {"lane_0"}  # the blocking work ran on the lane, not the loop


def test_a_lone_item_waits_at_most_max_wait(lane) -> None:
    fn = Recorder()

    async def main() -> float:
        batcher = MicroBatcher(fn, lane, max_size=8, max_wait_s=0.05)
        t0 = time.perf_counter()
        await batcher.submit(1)
        return time.perf_counter() - t0
    elapsed = run(main())
    assert 0.045 <= elapsed < 1.0 and fn.batches == [[1]]


def test_a_whole_group_waits_for_no_company(lane) -> None:
    """A group (a rerank's candidates) starts at the end of its turn even when lone items
    would wait long for company; a lone item already waiting goes with it; a group over
    ``max_size`` goes as several batches, each caller's results in its order."""
    fn = Recorder()

    async def main() -> tuple[float, list[int], list[int], list[int]]:
        batcher = MicroBatcher(fn, lane, max_size=4, max_wait_s=30.0)
        t0 = time.perf_counter()
        lone = asyncio.ensure_future(batcher.submit(9))
        await asyncio.sleep(0)  # the lone item is waiting for company now
        group = await batcher.submit_group([1, 2, 3])
        elapsed = time.perf_counter() - t0
        big = await batcher.submit_group([5, 6, 7, 8, 10, 11])
        return elapsed, group, [await lone], big
    elapsed, group, lone, big = run(main())
    assert elapsed < 10.0  # not the 30 s a lone item waits
    assert group == [2, 4, 6] and lone == [18] and big == [10, 12, 14, 16, 20, 22]
    assert fn.batches == [[9, 1, 2, 3], [5, 6, 7, 8], [10, 11]]


def test_items_arriving_during_a_forward_go_together_next(lane) -> None:
    fn = Recorder(delay_s=0.2)

    async def main() -> None:
        batcher = MicroBatcher(fn, lane, max_size=32, max_wait_s=0.0)
        first = asyncio.ensure_future(batcher.submit(0))
        await asyncio.sleep(0.05)  # the first forward is running now
        await asyncio.gather(first, *(batcher.submit(i) for i in range(1, 6)))
    run(main())
    assert fn.batches == [[0], [1, 2, 3, 4, 5]]


def test_no_wait_still_groups_what_one_event_loop_turn_submits(lane) -> None:
    """max_wait 0: items submitted in the same turn (callers woken by one forward's
    results) go together; one submitted later to an idle batcher goes at once, alone."""
    fn = Recorder()

    async def main() -> float:
        batcher = MicroBatcher(fn, lane, max_size=32, max_wait_s=0.0)
        await asyncio.gather(*(batcher.submit(i) for i in range(5)))
        t0 = time.perf_counter()
        await batcher.submit(5)
        return time.perf_counter() - t0
    assert run(main()) < 1.0
    assert fn.batches == [[0, 1, 2, 3, 4], [5]]


def test_max_size_one_turns_batching_off(lane) -> None:
    fn = Recorder()

    async def main() -> None:
        batcher = MicroBatcher(fn, lane, max_size=1, max_wait_s=0.05)
        await asyncio.gather(*(batcher.submit(i) for i in range(5)))
    run(main())
    assert [len(b) for b in fn.batches] == [1] * 5


def test_a_failed_batch_fails_its_callers_only(lane) -> None:
    fn = Recorder(fail_on=3)

    async def main() -> tuple[list, int]:
        batcher = MicroBatcher(fn, lane, max_size=4, max_wait_s=0.01)
        results = await asyncio.gather(*(batcher.submit(i) for i in range(4)),
                                       return_exceptions=True)
        return results, await batcher.submit(7)
    results, later = run(main())
    assert all(isinstance(r, ValueError) and "cannot encode 3" in str(r) for r in results)
    assert later == 14  # the batcher keeps working


def test_a_cancelled_caller_does_not_disturb_the_others(lane) -> None:
    fn = Recorder(delay_s=0.05)

    async def main() -> list[int]:
        batcher = MicroBatcher(fn, lane, max_size=8, max_wait_s=0.02)
        doomed = asyncio.ensure_future(batcher.submit(100))
        others = [asyncio.ensure_future(batcher.submit(i)) for i in range(3)]
        await asyncio.sleep(0)
        doomed.cancel()
        return await asyncio.gather(*others)
    assert run(main()) == [0, 2, 4]
    assert 100 not in chain.from_iterable(fn.batches)


def test_the_event_loop_stays_responsive_during_a_forward(lane) -> None:
    fn = Recorder(delay_s=0.5)

    async def main() -> int:
        batcher = MicroBatcher(fn, lane, max_size=2, max_wait_s=0.0)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1
        tick = asyncio.ensure_future(ticker())
        await batcher.submit(1)
        tick.cancel()
        return ticks
    assert run(main()) >= 5


# ---------------------------------------------------------------- through the gateway
def metric(text: str, name: str, labels: str) -> float:
    found = re.search(rf"^{re.escape(name)}{{{re.escape(labels)}}} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_concurrent_queries_are_batched_and_match_single_queries(gateway_factory) -> None:
    texts = [f"a {c} {s} on a grey background" for c in ("red", "blue", "green", "white")
             for s in ("circle", "square", "star", "heart")]
    with gateway_factory(batch_max_size=16, batch_max_wait_ms=150) as client:
        items = [{"id": f"t{i}", "text": t} for i, t in enumerate(texts)]
        assert client.post("/v1/galleries/shapes/items", headers=ADMIN,
                           json={"items": items}).status_code == 200

        def ask(text: str) -> dict:
            r = client.post("/v1/galleries/shapes/search",
                            json={"text": text, "kind": "text", "top_k": 5})
            assert r.status_code == 200, r.text
            return r.json()
        alone = [ask(t) for t in texts]  # reference: one query per forward
        before = client.get("/metrics").text
        with ThreadPoolExecutor(max_workers=len(texts)) as pool:
            together = list(pool.map(ask, texts))
        after = client.get("/metrics").text
    forwards = (metric(after, "nobackfill_batch_size_count", 'modality="text"')
                - metric(before, "nobackfill_batch_size_count", 'modality="text"'))
    queries = (metric(after, "nobackfill_batch_size_sum", 'modality="text"')
               - metric(before, "nobackfill_batch_size_sum", 'modality="text"'))
    assert queries == len(texts) and forwards < len(texts) / 2  # shared forwards
    for one, many, text in zip(alone, together, texts, strict=True):
        assert [h["id"] for h in many["hits"]] == [h["id"] for h in one["hits"]], text
        np.testing.assert_allclose([h["score"] for h in many["hits"]],
                                   [h["score"] for h in one["hits"]], atol=1e-4)
        assert many["hits"][0]["id"] == f"t{texts.index(text)}"  # its own caption first


def blas_threads() -> set[int]:
    from threadpoolctl import threadpool_info

    return {int(i["num_threads"]) for i in threadpool_info() if i["user_api"] == "blas"}


@pytest.mark.parametrize(("setting", "expected"), [(1, {1}), (0, {2})])
def test_gateway_caps_numpy_blas_threads(gateway_factory, setting, expected) -> None:
    """OpenBLAS's spinning idle threads slow the forward on the same cores: the gateway
    caps them at ``blas_threads`` (default 1) when it starts; 0 leaves them alone."""
    from threadpoolctl import threadpool_limits

    if not blas_threads():
        pytest.skip("numpy has no BLAS that threadpoolctl can see")
    with threadpool_limits(limits=2, user_api="blas"):  # this process's value, restored after
        assert blas_threads() == {2}
        with gateway_factory(blas_threads=setting):
            assert blas_threads() == expected


@pytest.fixture
def gallery_store():
    from qdrant_client import QdrantClient

    from service.state.gallery import GalleryStore, Item

    store = GalleryStore(QdrantClient(":memory:"), serialise=True)
    store.create("g", 4)
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((20, 4)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    store.upsert("g", [Item(f"i{n}", {"image": v}, {"n": n}) for n, v in enumerate(vectors)],
                 version="v1", space="v1")
    yield store, vectors
    store.close()


def test_concurrent_searches_share_one_qdrant_call(gallery_store, lane) -> None:
    """Searches submitted together (as one forward's callers do) go in one Qdrant call, and
    each caller gets exactly what a search of its own returns."""
    from service.runtime.search_batcher import SearchBatcher

    store, vectors = gallery_store
    calls: list[int] = []
    many = store.search_many
    store.search_many = lambda gallery, searches: calls.append(len(searches)) or many(
        gallery, searches)

    async def main() -> list:
        batcher = SearchBatcher(store, lane, max_size=32)
        return await asyncio.gather(*(batcher.search("g", v, "image", 3) for v in vectors[:10]))
    together = run(main())
    assert calls == [10]  # submitted in the same event-loop turn: one call
    for v, hits in zip(vectors[:10], together, strict=True):
        assert [h.id for h in hits] == [h.id for h in many("g", [Search(v, "image", 3)])[0]]
    assert [hits[0].id for hits in together] == [f"i{n}" for n in range(10)]  # itself first


def test_a_failing_search_fails_only_its_caller(gallery_store, lane) -> None:
    """A bad search grouped with good ones (same gallery, or an unknown gallery) gets its
    error; the others in its group still get their results."""
    from service.runtime.search_batcher import SearchBatcher
    from service.state.errors import Unavailable

    store, vectors = gallery_store

    async def main() -> list:
        batcher = SearchBatcher(store, lane, max_size=32)
        first = asyncio.ensure_future(batcher.search("g", vectors[0], "image", 1))
        await asyncio.sleep(0)  # the first call runs; the rest queue up behind it
        return await asyncio.gather(
            first, batcher.search("g", vectors[1], "image", 1),
            batcher.search("g", vectors[2], "no-such-vector", 1),
            batcher.search("nope", vectors[3], "image", 1),
            batcher.search("g", vectors[4], "image", 1), return_exceptions=True)
    results = run(main())
    assert [r[0].id for r in (results[0], results[1], results[4])] == ["i0", "i1", "i4"]
    assert isinstance(results[2], Exception) and "no-such-vector" in str(results[2])
    assert isinstance(results[3], Unavailable) and "nope" in str(results[3])


@pytest.mark.parametrize(("setting", "expected"), [(1, 1), (3, 3), (0, 2)])
def test_the_device_lane_runs_torch_on_torch_threads(gateway_factory, setting,
                                                     expected) -> None:
    """A forward on several threads waits at every barrier for a preempted one when another
    process takes a core: the gateway's device lane runs ``torch_threads`` (default 1;
    these tests' own gateways get 0 from conftest, to leave the test process alone), and 0
    leaves torch's own count (here 2)."""
    import torch

    from service.state.config import Settings

    assert Settings.model_fields["torch_threads"].default == 1
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with gateway_factory(torch_threads=setting) as c:
            lane = c.app.state.gateway.lane  # type: ignore[attr-defined]
            assert lane.submit(torch.get_num_threads).result() == expected
            r = c.post("/v1/galleries/shapes/search", json={"text": "a red circle"})
            assert r.status_code == 200, r.text  # the forwards ran on it
    finally:
        torch.set_num_threads(before)
