"""GalleryStore's contract on each embedded engine (qdrant-client's local mode, the
server's API; Qdrant Edge, the server's engine in-process), and what each engine keeps on
disk."""

from __future__ import annotations

import json
import threading

import numpy as np
from qdrant_client import QdrantClient

from service.state.gallery import GalleryStore
from service.state.gallery.store import Item


def unit(seed: int, dim: int = 8) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=dim).astype(np.float32)
    return v / np.linalg.norm(v)


def test_fingerprint_counts_per_version_and_changes_only_when_a_vector_does(
        embedded_store) -> None:
    store = embedded_store
    store.create("g", 8)
    store.upsert("g", [Item(f"a{i}", {"image": unit(i)}) for i in range(5)], "v1", "s")
    store.upsert("g", [Item("b0", {"image": unit(9)})], "v1.1", "s")
    first = store.fingerprint("g", page=2)  # several scroll pages
    assert {v: f["items"] for v, f in first.items()} == {"v1": 5, "v1.1": 1}
    assert store.fingerprint("g") == first  # same content, same digest, any page size
    store.upsert("g", [Item("a3", {"image": unit(3)})], "v1", "s")  # idempotent re-upsert
    assert store.fingerprint("g") == first
    store.upsert("g", [Item("a3", {"image": unit(33)})], "v1", "s")  # a re-embedded item
    changed = store.fingerprint("g")
    assert changed["v1"]["items"] == 5 and changed["v1"]["sha256"] != first["v1"]["sha256"]
    assert changed["v1.1"] == first["v1.1"]
    only = store.fingerprint("g", ids={"a0", "a1", "b0"})
    assert {v: f["items"] for v, f in only.items()} == {"v1": 2, "v1.1": 1}


def test_a_searchs_hits_carry_each_items_record_as_a_read_gives_it(embedded_store) -> None:
    """A rerank takes the candidates' etags, origins and kinds from its search's hits (no
    second read of the side): they must be what ``stored`` reads, on every engine."""
    store = embedded_store
    store.create("g", 8)
    store.upsert("g", [Item(f"a{i}", {"image": unit(i), "text": unit(50 + i)},
                            {"title": f"t{i}"}, {"image": f"/img/{i}.png"}, f"e{i}")
                       for i in range(6)], "v1", "s")
    store.upsert("g", [Item("a2", {"image": unit(2)}, {"title": "new"})], "v2", "s")
    hits = store.search("g", unit(2), "image", 6)
    assert hits[0].id == "a2" and len(hits) == 6
    read = store.stored("g", [h.id for h in hits])
    assert {h.id: h.stored for h in hits} == read
    assert hits[0].stored.kinds == ("image",) and hits[0].stored.version == "v2"
    assert {h.id: h.stored.etag for h in hits if h.id != "a2"} == {
        f"a{i}": f"e{i}" for i in (0, 1, 3, 4, 5)}
    assert all(h.payload == h.stored.payload for h in hits)
    both = store.stored_vectors("g", ["a0", "a2"])
    assert sorted(both["a0"][1]) == ["image", "text"] and sorted(both["a2"][1]) == ["image"]
    only = store.stored_vectors("g", ["a0", "a2"], ("image",))  # one kind read: the same
    assert {i: sorted(v) for i, (_, v) in only.items()} == {"a0": ["image"], "a2": ["image"]}
    assert np.array_equal(only["a0"][1]["image"], both["a0"][1]["image"])
    assert only["a0"][0] == both["a0"][0]
    texts = store.stored_vectors("g", ["a0", "a2"], ("text",))  # a2 has no text: none
    assert sorted(texts["a0"][1]) == ["text"] and texts["a2"][1] == {}


def _written_rewritten_deleted(store: GalleryStore) -> str:
    """300 items written to 'g', one rewritten, one deleted; a side with one item: its name."""
    store.create("g", 8)
    store.upsert("g", [Item(f"a{i}", {"image": unit(i)}) for i in range(300)], "v1", "s")
    store.upsert("g", [Item("a0", {"image": unit(999)})], "v2", "s")
    store.delete("g", ["a1"])
    side = store.create_side("g", 8)
    store.upsert(side, [Item("b0", {"text": unit(7)})], "v3", "t")
    return side


def test_an_embedded_store_on_disk_commits_in_wal_mode_and_keeps_every_write(tmp_path) -> None:
    """Writes to local mode on a path switch its SQLite file to write-ahead logging (no
    fsync per point); what was written, rewritten and deleted is all there after reopening,
    also for a side created later and written through its name."""
    import sqlite3

    store = GalleryStore(QdrantClient(path=str(tmp_path)), serialise=True)
    side = _written_rewritten_deleted(store)
    files = sorted(tmp_path.glob("collection/*/storage.sqlite"))
    assert len(files) == 2
    for file in files:
        with sqlite3.connect(file) as db:
            assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    store.close()
    reopened = GalleryStore(QdrantClient(path=str(tmp_path)), serialise=True)
    assert reopened.count("g") == 299
    stored = reopened.vectors("g", ["a0", "a2"])
    np.testing.assert_allclose(stored["a0"]["image"], unit(999), atol=1e-6)
    np.testing.assert_allclose(stored["a2"]["image"], unit(2), atol=1e-6)
    assert reopened.vectors(side, ["b0"])["b0"]["text"].shape == (8,)
    reopened.close()


def test_wal_tuning_is_a_no_op_in_memory() -> None:
    from service.state.gallery.client import tune_local_writes

    client = QdrantClient(":memory:")
    GalleryStore(client, serialise=True).create("g", 8)
    assert tune_local_writes(client, "g") is False
    assert tune_local_writes(client, "missing") is False


def test_an_edge_store_on_disk_keeps_every_write_side_and_alias_after_reopening(
        tmp_path) -> None:
    from service.state.gallery.edge import EdgeClient

    store = GalleryStore(EdgeClient(tmp_path), serialise=True)
    side = _written_rewritten_deleted(store)
    first = store.collection_of("g")
    store.point_alias("g", side)
    store.close()
    reopened = GalleryStore(EdgeClient(tmp_path), serialise=True)
    assert reopened.collection_of("g") == side  # the alias move was kept
    assert reopened.count(first) == 299 and reopened.count("g") == 1
    stored = reopened.vectors(first, ["a0", "a2"])
    np.testing.assert_allclose(stored["a0"]["image"], unit(999), atol=1e-6)
    np.testing.assert_allclose(stored["a2"]["image"], unit(2), atol=1e-6)
    assert reopened.vectors("g", ["b0"])["b0"]["text"].shape == (8,)
    assert reopened.drop_collection(first) and not reopened.drop_collection(first)
    reopened.close()
    assert sorted(p.name for p in (tmp_path / "collections").iterdir()) == [side]
    # Payloads mapped, not read at load; the store warms the files (edge.warm).
    config = json.loads((tmp_path / "collections" / side / "edge_config.json").read_text())
    assert config["payload_memory"] == "cold"


def test_an_edge_directory_is_open_in_one_process_and_a_second_gets_a_clear_error(
        tmp_path) -> None:
    import subprocess
    import sys

    from service.state.gallery.edge import EdgeClient

    store = GalleryStore(EdgeClient(tmp_path), serialise=True)
    store.create("g", 8)
    store.upsert("g", [Item("a", {"image": unit(1)})], "v1", "s")
    code = ("from service.state.gallery.edge import EdgeClient, EngineBusy\n"
            f"try:\n    EdgeClient({str(tmp_path)!r})\nexcept EngineBusy as e:\n"
            "    print('busy:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                         timeout=60)
    assert "busy:" in out.stdout and "another process" in out.stdout, out
    assert store.count("g") == 1  # the first opener is untouched
    store.close()


def test_the_edge_indexer_indexes_once_writes_are_quiet_and_search_stays_exact(
        tmp_path) -> None:
    """Unindexed points are searched exactly; once writes have been quiet the indexer
    builds the index off the request path, and the answers are the exact ones still."""
    import time

    from service.state.gallery.edge import EdgeClient

    client = EdgeClient(tmp_path, quiet_s=0.3, index_after=500, indexing_threshold_kb=10)
    store = GalleryStore(client, serialise=True)
    store.create("g", 16)
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(2000, 16)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    store.upsert("g", [Item(f"i{n}", {"image": v}) for n, v in enumerate(vectors)], "v", "s")
    queries = vectors[:20] + 0.1 * rng.normal(size=(20, 16)).astype(np.float32)
    exact = [[f"i{n}" for n in np.argsort(-(vectors @ q))[:5]] for q in queries]
    assert [[h.id for h in store.search("g", q, "image", 5)] for q in queries] == exact
    collection = store.collection_of("g")
    assert client.indexed(collection)["indexed_vectors"] == 0  # not yet: writes just ended
    deadline = time.monotonic() + 60
    while client.indexed(collection)["indexed_vectors"] < 2000 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert client.indexed(collection)["indexed_vectors"] >= 2000
    found = [[h.id for h in store.search("g", q, "image", 5)] for q in queries]
    assert np.mean([len(set(a) & set(b)) / 5 for a, b in zip(found, exact)]) >= 0.95
    store.close()


def test_an_edge_index_is_built_off_the_process_and_keeps_the_writes_made_meanwhile(
        tmp_path) -> None:
    """``optimize`` indexes a copy in a child process: while the child runs this process
    searches (exact answers) and writes; the writes made meanwhile are in the indexed shard
    that takes the live one's place, and stay there after a reopen."""
    import time

    from service.state.gallery.edge import EdgeClient

    client = EdgeClient(tmp_path, indexer=False, indexing_threshold_kb=10)
    store = GalleryStore(client, serialise=True)
    store.create("g", 64)
    rng = np.random.default_rng(1)
    vectors = rng.normal(size=(30_000, 64)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    for start in range(0, len(vectors), 5000):
        store.upsert("g", [Item(f"i{n}", {"image": vectors[n]})
                           for n in range(start, start + 5000)], "v", "s")
    collection = store.collection_of("g")
    built: list[bool] = []
    builder = threading.Thread(target=lambda: built.append(client.optimize(collection)))
    builder.start()
    deadline = time.monotonic() + 30
    while client._child is None and time.monotonic() < deadline:
        time.sleep(0.001)
    child = client._child
    assert child is not None, "no child process indexed the copy"
    q = vectors[7]
    assert store.search("g", q, "image", 1)[0].id == "i7"  # served while the child indexes
    extra = rng.normal(size=(100, 64)).astype(np.float32)
    extra /= np.linalg.norm(extra, axis=1, keepdims=True)
    store.upsert("g", [Item(f"x{n}", {"image": v}) for n, v in enumerate(extra)], "v", "s")
    store.delete("g", [f"i{n}" for n in range(10)])
    assert child.poll() is None, "the child ended before the writes: the test proves nothing"
    builder.join(120)
    assert built == [True]
    steps = client.last_build  # the build's steps, timed: the upsert and the delete replayed
    assert steps["writes_replayed"] == 2 and steps["child_s"] > 0 and steps["load_s"] > 0
    assert steps["swap_s"] <= steps["total_s"] and steps["close_s"] <= steps["swap_s"]
    info = client.indexed(collection)
    assert info["indexed_vectors"] >= 29_000 and info["points"] == 30_090
    assert store.search("g", extra[3], "image", 1)[0].id == "x3"  # a write made meanwhile
    assert store.vectors("g", ["i0", "i5"]) == {}  # deletes made meanwhile hold
    assert not (tmp_path / "building").exists() or not any((tmp_path / "building").iterdir())
    store.close()
    again = GalleryStore(EdgeClient(tmp_path, indexer=False), serialise=True)
    assert again.count("g") == 30_090 and again.search("g", extra[3], "image", 1)[0].id == "x3"
    again.close()


def test_edge_collections_index_the_keys_the_store_counts_on_also_when_made_before(
        tmp_path) -> None:
    """Every collection has keyword indexes on item_id, made.by and made.via (a count on an
    unindexed key scans every point holding the interpreter lock); a collection made
    without one gets it when the store opens."""
    import qdrant_edge as edge

    from service.state.gallery.edge import INDEXED, EdgeClient

    store = GalleryStore(EdgeClient(tmp_path, indexer=False), serialise=False)
    store.create("g", 8)
    collection = store.collection_of("g")
    assert set(INDEXED) <= set(store.client._collection(collection).shard.info().payload_schema)
    store.close()
    shard = edge.EdgeShard.load(str(tmp_path / "collections" / collection))
    shard.update(edge.UpdateOperation.delete_field_index("made.via"))
    assert "made.via" not in shard.info().payload_schema
    shard.close()
    again = GalleryStore(EdgeClient(tmp_path, indexer=False), serialise=False)
    assert set(INDEXED) <= set(again.client._collection(collection).shard.info().payload_schema)
    again.close()


def test_an_edge_store_opened_after_a_crash_mid_swap_has_every_write(tmp_path) -> None:
    """A crash between the two renames of an index swap leaves the live shard aside and
    its place empty: the next open puts it back, and removes an unfinished copy."""
    import os

    from service.state.gallery.edge import EdgeClient

    store = GalleryStore(EdgeClient(tmp_path, indexer=False), serialise=True)
    store.create("g", 8)
    store.upsert("g", [Item(f"i{n}", {"image": np.eye(8, dtype=np.float32)[n]})
                       for n in range(8)], "v", "s")
    collection = store.collection_of("g")
    store.close()
    (tmp_path / "retired").mkdir()
    os.rename(tmp_path / "collections" / collection, tmp_path / "retired" / collection)
    (tmp_path / "building" / collection).mkdir(parents=True)  # an unfinished copy
    again = GalleryStore(EdgeClient(tmp_path, indexer=False), serialise=True)
    assert again.count("g") == 8 and again.search(
        "g", np.eye(8, dtype=np.float32)[3], "image", 1)[0].id == "i3"
    assert not (tmp_path / "retired").exists() and not (tmp_path / "building").exists()
    again.close()


def test_an_edge_index_swap_names_its_generation_and_a_crash_either_side_keeps_every_write(
        tmp_path) -> None:
    """An index build moves its copy to ROOT/indexed/NAME/N, brings it up to date, rewrites
    the catalog to name it, then switches the handle (searches never wait for a load). A
    crash before the rewrite leaves the catalog naming the old shard (the unnamed new
    generation is removed at open); a crash after it leaves the old directory unnamed
    (removed at open). Either way every write is there."""
    import json
    import shutil

    from service.state.gallery.edge import EdgeClient

    eye = np.eye(16, dtype=np.float32)
    store = GalleryStore(EdgeClient(tmp_path, indexer=False), serialise=True)
    store.create("g", 16)
    store.upsert("g", [Item(f"i{n}", {"image": eye[n]}) for n in range(8)], "v", "s")
    collection = store.collection_of("g")
    assert store.client.shard_path(collection) == tmp_path / "collections" / collection
    store.client.optimize(collection)
    first = tmp_path / "indexed" / collection / "1"
    assert store.client.shard_path(collection) == first  # what serves now, by any name
    assert store.client.shard_path("g") == first
    catalog = json.loads((tmp_path / "catalog.json").read_text())
    assert catalog["paths"] == {collection: f"indexed/{collection}/1"} and first.is_dir()
    assert not (tmp_path / "collections" / collection).exists()  # the replaced shard
    store.upsert("g", [Item(f"i{n}", {"image": eye[n]}) for n in range(8, 12)], "v", "s")
    assert store.search("g", eye[10], "image", 1)[0].id == "i10"  # written to the new one
    store.close()

    # after the rewrite, before the old directory was removed
    shutil.copytree(first, tmp_path / "collections" / collection)
    # before the rewrite: a newer generation the catalog does not name, a copy in progress
    shutil.copytree(first, tmp_path / "indexed" / collection / "2")
    (tmp_path / "building" / collection).mkdir(parents=True)
    again = GalleryStore(EdgeClient(tmp_path, indexer=False), serialise=True)
    assert again.count("g") == 12 and again.search("g", eye[11], "image", 1)[0].id == "i11"
    assert sorted(p.name for p in (tmp_path / "indexed" / collection).iterdir()) == ["1"]
    assert not (tmp_path / "collections" / collection).exists()
    assert not (tmp_path / "building").exists()
    again.client.optimize(collection)  # the next generation replaces the first
    assert again.client.shard_path(collection) == tmp_path / "indexed" / collection / "2"
    assert sorted(p.name for p in (tmp_path / "indexed" / collection).iterdir()) == ["2"]
    again.delete("g", ["i0"])
    again.close()
    last = GalleryStore(EdgeClient(tmp_path, indexer=False), serialise=True)
    assert last.count("g") == 11 and last.search("g", eye[3], "image", 1)[0].id == "i3"
    assert last.drop("g")  # a dropped collection leaves no generation behind
    assert not (tmp_path / "indexed" / collection).exists()
    last.close()


def test_an_edge_shard_handle_is_shared_by_calls_and_replaced_only_when_none_uses_it(
        ) -> None:
    """Searches and the writer use a shard at once (Edge locks inside); closing or swapping
    it waits for the calls in flight and holds new ones off until it is done."""
    import time

    from service.state.gallery.edge import _HandleLock

    lock, events = _HandleLock(), []
    inside = threading.Barrier(3, timeout=10)

    def call(name: str) -> None:
        with lock.shared():
            inside.wait()  # both calls are inside together, or this times out
            time.sleep(0.05)
            events.append(f"{name} done")

    calls = [threading.Thread(target=call, args=(n,)) for n in ("search", "write")]
    for t in calls:
        t.start()
    inside.wait()

    def swap() -> None:
        with lock.exclusive():
            events.append("swap")
            time.sleep(0.05)
        events.append("swapped")

    swapper = threading.Thread(target=swap)
    swapper.start()
    time.sleep(0.01)
    late = threading.Thread(target=lambda: (lock.shared().__enter__(), events.append("late")))
    late.start()
    for t in (*calls, swapper, late):
        t.join(10)
    assert events[:3] in (["search done", "write done", "swap"], ["write done", "search done",
                                                                   "swap"])
    assert events.index("late") > events.index("swap")  # held off until the swap ended


def test_the_edge_default_refuses_a_local_mode_directory_until_it_is_moved(tmp_path) -> None:
    """With the default engine and local-mode data in DATA_DIR/qdrant, the gateway's store
    does not open empty: it names the move command; ``store move`` copies every point and
    alias, checked, leaves the local directory as it was, and the default then opens it."""
    import pytest

    from service.state.config import Settings
    from service.state.errors import Conflict, Unavailable
    from service.state.gallery.client import open_qdrant
    from service.state.gallery.move import move_local_to_edge

    data = tmp_path / "data"
    local = GalleryStore(QdrantClient(path=str(data / "qdrant")), serialise=True)
    local.create("g", 8)
    local.upsert("g", [Item(f"a{i}", {"image": unit(i), "text": unit(100 + i)},
                            payload={"n": i}) for i in range(1200)], "v1", "s")
    side = local.create_side("g", 8)
    local.upsert(side, [Item("a0", {"image": unit(5)})], "v2", "t")
    before = local.fingerprint("g")
    local.close()
    settings = Settings(data_dir=data)
    with pytest.raises(Unavailable, match="nobackfill store move"):
        open_qdrant(settings)
    (data / "qdrant-edge").mkdir()
    (data / "qdrant-edge" / "x").write_text("something")
    with pytest.raises(Conflict, match="not empty"):
        move_local_to_edge(data / "qdrant", data / "qdrant-edge")
    (data / "qdrant-edge" / "x").unlink()
    moved = move_local_to_edge(data / "qdrant", data / "qdrant-edge")
    assert sorted(moved.collections.values()) == [1, 1200] and list(moved.aliases) == ["g"]
    edge = GalleryStore(open_qdrant(settings), serialise=True)
    assert edge.fingerprint("g") == before and edge.count(side) == 1
    assert edge.stored("g", ["a7"])["a7"].payload == {"n": 7}
    edge.close()
    again = GalleryStore(QdrantClient(path=str(data / "qdrant")), serialise=True)
    assert again.fingerprint("g") == before  # the source is left as it was
    again.close()


def test_a_search_ef_reaches_every_backend_as_a_servers_search_params(
        tmp_path, gateway_factory) -> None:
    """``qdrant_search_ef`` goes into every search request as ``SearchParams.hnsw_ef``,
    which a Qdrant server reads; Edge takes it from the request the same way; unset, each
    engine keeps its own; a bad value is refused by name."""
    import pytest
    from pydantic import ValidationError
    from qdrant_client import models

    from service.state.config import Settings
    from service.state.gallery.edge import EdgeClient

    server_api = QdrantClient(location=":memory:")  # the server's client API
    sent: list = []
    real = server_api.query_batch_points

    def recording(collection_name: str, requests: list) -> list:
        sent.append(requests)
        return real(collection_name, requests=requests)
    server_api.query_batch_points = recording  # type: ignore[method-assign]
    items = [Item(f"a{i}", {"image": unit(i)}) for i in range(6)]
    for ef, want in ((128, 128), (None, None)):
        store = GalleryStore(server_api, serialise=True, search_ef=ef)
        store.create(f"g{want}", 8)
        store.upsert(f"g{want}", items, "v1", "s")
        assert store.search(f"g{want}", unit(3), "image", 2)[0].id == "a3"
        params = sent[-1][0].params
        assert (params.hnsw_ef if params else None) == want

    client = EdgeClient(tmp_path / "edge", indexer=False, search_ef=32)
    try:
        store = GalleryStore(client, serialise=False, search_ef=128)
        store.create("g", 8)
        store.upsert("g", items, "v1", "s")
        assert store.search("g", unit(4), "image", 2)[0].id == "a4"
        query = models.QueryRequest(query=[0.0] * 8, using="image", limit=2)
        assert client._params(query).hnsw_ef == 32  # the client's own when none is sent
        sent_ef = models.QueryRequest(query=[0.0] * 8, using="image", limit=2,
                                      params=models.SearchParams(hnsw_ef=128))
        assert client._params(sent_ef).hnsw_ef == 128
        client.search_ef = None
        assert client._params(query) is None  # Edge's own
    finally:
        client.close()

    with gateway_factory(qdrant_search_ef=96) as api:  # the gateway's store sends it
        assert api.app.state.gateway.store._search.hnsw_ef == 96
    with pytest.raises(ValidationError, match="qdrant_search_ef"):
        Settings(qdrant_search_ef=0)


def _resident(path) -> float:
    """The share of ``path``'s pages in the page cache (``mincore`` of a mapping)."""
    import ctypes
    import ctypes.util
    import mmap
    import os

    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    size = os.path.getsize(path)
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        vec = (ctypes.c_ubyte * pages)()
        assert libc.mincore(ctypes.c_void_p(addr), size, vec) == 0, ctypes.get_errno()
        libc.munmap(ctypes.c_void_p(addr), size)
    finally:
        os.close(fd)
    return sum(b & 1 for b in vec) / pages


def test_an_edge_shard_is_mapped_not_read_at_load_and_warmed_before_it_serves(
        tmp_path) -> None:
    """A new collection's vectors, graphs, payloads, id tracker and keyword indexes are
    mapped and not read at load (a load that read them held the interpreter lock for
    seconds at a million points). Edge drops a shard's files from the page cache when it
    closes it (the index build's child closes its copy), so the store reads the files in
    itself: before a new generation serves, and at open."""
    from service.state.gallery.edge import EdgeClient

    store = GalleryStore(EdgeClient(tmp_path, indexer=False, indexing_threshold_kb=10),
                         serialise=True)
    store.create("g", 64)
    vectors = np.random.default_rng(0).normal(size=(6000, 64)).astype(np.float32)
    store.upsert("g", [Item(f"i{n}", {"image": vectors[n]}) for n in range(6000)], "v", "s")
    collection = store.collection_of("g")
    config = json.loads((store.client.shard_path(collection) / "edge_config.json").read_text())
    assert config["payload_memory"] == config["id_tracker_memory"] == "cold"
    assert config["hnsw_config"]["memory"] == "cold"
    assert {v["memory"] for v in config["vectors"].values()} == {"cold"}
    store.client.optimize(collection)
    served = store.client.shard_path(collection)
    matrices = sorted(served.rglob("matrix.dat"))  # the indexed segment's two vectors
    assert len(matrices) >= 2 and store.client.last_build["warm_s"] >= 0
    assert min(_resident(f) for f in matrices) > 0.9  # read in before it served
    assert store.search("g", vectors[5], "image", 1)[0].id == "i5"
    store.close()
    assert max(_resident(f) for f in matrices) < 0.5  # a close drops them...
    again = GalleryStore(EdgeClient(tmp_path, indexer=False), serialise=True)
    assert min(_resident(f) for f in matrices) > 0.9  # ...and an open reads them in again
    assert again.count("g") == 6000 and again.search("g", vectors[7], "image", 1)[0].id == "i7"
    again.close()
