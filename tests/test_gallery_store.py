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
