"""Hot swap: promotions and rollbacks (through the API or written to the registry by
another process) swap the serving version under load with no error; every response
names one version and matches that version's results; in-flight requests finish on
the version they started with; a slow load never blocks queries."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import ADMIN
from fastapi.testclient import TestClient

from service.state.registry import Registry
from training.data import generate_items
from training.versions import load_encoder

ITEMS = generate_items(12, seed=9, languages=("en",))
QUERIES = [it.captions["en"][1] for it in ITEMS[:6]]


def add_items(client: TestClient) -> None:
    items = [{"id": it.id, "text": it.captions["en"][0]} for it in ITEMS]
    r = client.post("/v1/galleries/shapes/items", headers=ADMIN, json={"items": items})
    assert r.status_code == 200, r.text


def ask(client: TestClient, text: str, top_k: int = 3) -> dict:
    r = client.post("/v1/galleries/shapes/search",
                    json={"text": text, "kind": "text", "top_k": top_k})
    assert r.status_code == 200, r.text
    return r.json()


def activate(client: TestClient, version: str) -> None:
    action = "promote" if version == "v2" else "rollback"
    r = client.post(f"/v1/models/{version}/{action}", headers=ADMIN, json={"gallery": "shapes"})
    assert r.status_code == 200 and r.json()["serving"]["version"] == version, r.text


def score_tables(client: TestClient) -> dict[str, dict[str, dict[str, float]]]:
    """version -> query -> item id -> score, over the whole gallery."""
    tables = {}
    for version in ("v2", "v1"):
        activate(client, version)
        tables[version] = {q: {h["id"]: h["score"] for h in ask(client, q, len(ITEMS))["hits"]}
                           for q in QUERIES}
    return tables


def check_answer(answer: dict, query: str, tables: dict) -> None:
    """The hits are exactly the named version's top hits for this query."""
    table = tables[answer["version"]][query]
    for hit in answer["hits"]:
        assert hit["score"] == pytest.approx(table[hit["id"]], abs=1e-4)
    kth = answer["hits"][-1]["score"]
    better = [i for i, s in table.items() if s > kth + 1e-4]
    assert set(better) <= {h["id"] for h in answer["hits"]}


def wait_for(predicate, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_queries_under_load_through_repeated_swaps(gateway_factory, tmp_path) -> None:
    with gateway_factory(batch_max_size=8, batch_max_wait_ms=5) as client:
        add_items(client)
        tables = score_tables(client)
        registry = Registry(tmp_path / "data" / "registry")  # as another process would
        stop = threading.Event()
        answers: list[tuple[str, dict]] = []

        def load(worker: int) -> None:
            n = worker
            while not stop.is_set():
                query = QUERIES[n % len(QUERIES)]
                r = client.post("/v1/galleries/shapes/search",
                                json={"text": query, "kind": "text", "top_k": 3})
                answers.append((query, {"status": r.status_code, **r.json()}))
                n += 1

        with ThreadPoolExecutor(max_workers=6) as pool:
            for w in range(6):
                pool.submit(load, w)
            for k in range(8):
                done = len(answers)
                wait_for(lambda done=done: len(answers) >= done + 5)  # queries between swaps
                version = "v2" if k % 2 == 0 else "v1"
                if k % 4 < 2:
                    activate(client, version)  # through the API
                else:  # through the registry; the gateway's watcher notices
                    (registry.promote if version == "v2" else registry.rollback)(
                        "shapes", version, by="worker")
                    wait_for(lambda v=version: client.get(
                        "/v1/galleries/shapes", headers=ADMIN).json()["serving"]["version"] == v)
            done = len(answers)
            wait_for(lambda: len(answers) >= done + 5)
            stop.set()
        assert len(answers) > 40
        assert [a for _, a in answers if a["status"] != 200] == []
        assert {a["version"] for _, a in answers} == {"v1", "v2"}
        for query, answer in answers:
            assert answer["space"] == "v1" and answer["route"] == "native"
            check_answer(answer, query, tables)
        swaps = [line for line in client.get("/metrics", headers=ADMIN).text.splitlines()
                 if line.startswith('nobackfill_swaps_total{gallery="shapes"}')]
        assert float(swaps[0].split()[-1]) >= 8 + 2  # 8 here, 2 while building the tables


def test_an_in_flight_request_finishes_on_the_version_it_started_with(gateway_factory) -> None:
    release, entered = threading.Event(), threading.Event()
    release.set()

    def load(artifact, space):
        encoder = load_encoder(artifact, space, "cpu")
        if artifact.version_id == "v1":
            plain = encoder.encode_texts

            def held(texts, *args, **kwargs):
                if any("hold" in t for t in texts):
                    entered.set()
                    assert release.wait(60)
                return plain(texts, *args, **kwargs)
            encoder.encode_texts = held
        return encoder

    with gateway_factory(load=load) as client:
        add_items(client)
        on_v1 = ask(client, "hold: a red circle")
        release.clear()
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending = pool.submit(ask, client, "hold: a red circle")
            assert entered.wait(60)  # the v1 forward is running
            activate(client, "v2")  # v2 loads and the reference swaps meanwhile
            release.set()
            finished = pending.result(timeout=60)
        assert finished == on_v1  # started on v1, finished on v1
        assert ask(client, "hold: a red circle")["version"] == "v2"


def test_a_slow_load_never_blocks_queries(gateway_factory) -> None:
    loading, loaded = threading.Event(), threading.Event()

    def load(artifact, space):
        if artifact.version_id == "v2":
            loading.set()
            assert loaded.wait(60)  # a big model takes a while to load
        return load_encoder(artifact, space, "cpu")

    with gateway_factory(load=load) as client:
        add_items(client)
        with ThreadPoolExecutor(max_workers=1) as pool:
            promoting = pool.submit(activate, client, "v2")
            assert loading.wait(60)
            during = [ask(client, q) for q in QUERIES]  # answered while v2 loads
            assert not promoting.done()
            loaded.set()
            promoting.result(timeout=60)
        assert {a["version"] for a in during} == {"v1"}
        assert ask(client, QUERIES[0])["version"] == "v2"


def test_a_rollback_to_a_warm_version_loads_nothing(gateway_factory) -> None:
    loads: list[str] = []

    def load(artifact, space):
        loads.append(artifact.version_id)
        return load_encoder(artifact, space, "cpu")

    with gateway_factory(load=load, keep_warm_versions=1) as client:
        activate(client, "v2")
        activate(client, "v1")  # v1 stayed loaded after the promotion
        activate(client, "v2")
        assert loads == ["v1", "v2"]


def test_a_model_loads_in_a_thread_of_its_own_that_ends_with_the_load() -> None:
    """``in_own_thread`` (how the gateway loads a model: only the device lane keeps torch's
    OpenMP threads, ``service.runtime.threads``): the result or the error reaches the
    awaiting caller, from a thread that is neither the caller's nor alive afterwards."""
    import asyncio
    import threading

    from service.runtime.threads import in_own_thread

    ran: list[threading.Thread] = []

    def load(x: int) -> int:
        ran.append(threading.current_thread())
        if x < 0:
            raise ValueError("no such model")
        return 2 * x

    async def main() -> tuple[int, str]:
        got = await in_own_thread(load, 21)
        try:
            await in_own_thread(load, -1)
        except ValueError as exc:
            return got, str(exc)
        return got, ""

    assert asyncio.run(main()) == (42, "no such model")
    assert len(ran) == 2 and ran[0] is not ran[1]
    assert all(t is not threading.main_thread() for t in ran)
    for t in ran:
        t.join(timeout=10)
        assert not t.is_alive()
