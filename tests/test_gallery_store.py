"""GalleryStore against qdrant-client's local mode (the server's API)."""

from __future__ import annotations

import numpy as np
from qdrant_client import QdrantClient

from service.state.gallery import GalleryStore
from service.state.gallery.store import Item


def unit(seed: int, dim: int = 8) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=dim).astype(np.float32)
    return v / np.linalg.norm(v)


def test_fingerprint_counts_per_version_and_changes_only_when_a_vector_does() -> None:
    store = GalleryStore(QdrantClient(":memory:"), serialise=True)
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


def test_an_embedded_store_on_disk_commits_in_wal_mode_and_keeps_every_write(tmp_path) -> None:
    """Writes to local mode on a path switch its SQLite file to write-ahead logging (no
    fsync per point); what was written, rewritten and deleted is all there after reopening,
    also for a side created later and written through its name."""
    import sqlite3

    store = GalleryStore(QdrantClient(path=str(tmp_path)), serialise=True)
    store.create("g", 8)
    store.upsert("g", [Item(f"a{i}", {"image": unit(i)}) for i in range(300)], "v1", "s")
    store.upsert("g", [Item("a0", {"image": unit(999)})], "v2", "s")
    store.delete("g", ["a1"])
    side = store.create_side("g", 8)
    store.upsert(side, [Item("b0", {"text": unit(7)})], "v3", "t")
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
