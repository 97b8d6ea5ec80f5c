"""A seeded sample of a gallery's stored items, written to a file a worker can read.

Adapter fits read the OLD vectors the gallery already stores. The process that owns the
gallery store (the gateway: the embedded Qdrant allows one process per path) takes the
sample when the job is submitted and writes it beside the job; the worker reads the file
and never opens Qdrant, so the same code runs on the embedded default and on a server.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from service.state.gallery.store import GalleryStore

SAMPLE_FILE = "sample.npz"
KINDS = ("image", "text")


def take_sample(store: GalleryStore, gallery: str, k: int, seed: int) -> dict[str, Any]:
    """Up to ``k`` stored items, drawn uniformly with ``seed``: ids, payloads, and per kind
    the rows of the items that hold a vector of that kind."""
    points = store.points(gallery)
    rng = np.random.default_rng(seed)
    chosen = sorted(rng.permutation(len(points))[:k].tolist())
    ids = [points[i][0] for i in chosen]
    payloads = [points[i][1] for i in chosen]
    stored = store.stored(gallery, ids) if ids else {}
    origins = [dict(stored[i].origin) if i in stored else {} for i in ids]
    sample: dict[str, Any] = {"ids": ids, "payloads": payloads, "origins": origins}
    vectors = store.vectors(gallery, ids)
    for kind in KINDS:
        rows = [n for n, item in enumerate(ids) if kind in vectors.get(item, {})]
        sample[f"{kind}_rows"] = np.asarray(rows, dtype=np.int64)
        sample[kind] = (np.stack([vectors[ids[n]][kind] for n in rows]).astype(np.float32)
                        if rows else np.zeros((0, 0), np.float32))
    return sample


def write_sample(sample: dict[str, Any], directory: Path) -> Path:
    """``directory/sample.npz``, written atomically (a temporary file, then a rename)."""
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {k: v for k, v in sample.items() if isinstance(v, np.ndarray)}
    arrays["meta"] = np.frombuffer(json.dumps({
        "ids": sample["ids"], "payloads": sample["payloads"],
        "origins": sample.get("origins", [{} for _ in sample["ids"]])}).encode(), dtype=np.uint8)
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=".npz.tmp")
    with os.fdopen(fd, "wb") as fh:
        np.savez(fh, **arrays)
    os.replace(tmp, directory / SAMPLE_FILE)
    return directory / SAMPLE_FILE


def read_sample(directory: Path) -> dict[str, Any]:
    with np.load(directory / SAMPLE_FILE) as data:
        out: dict[str, Any] = {k: data[k] for k in data.files if k != "meta"}
        out.update(json.loads(bytes(data["meta"]).decode()))
    return out
