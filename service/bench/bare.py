"""The bare cost of answering one query in-process: encoder forward + Qdrant search, no
HTTP, no batching, the same model and gallery as the gateway."""

from __future__ import annotations

import base64
import io
import statistics
import time
from collections.abc import Callable

import numpy as np
from PIL import Image

from service.bench.setup import GALLERY, VERSION, Queries
from service.core.config import Settings
from service.core.threads import limit_blas_threads
from service.gallery import GalleryStore, open_qdrant
from service.registry import Registry
from training.versions import load_encoder


def measure(settings: Settings, queries: Queries, repeats: int, top_k: int = 10) -> dict:
    limit_blas_threads(settings.blas_threads)  # as the gateway does
    encoder = load_encoder(Registry(settings.registry_dir).artifact(VERSION), VERSION,
                           settings.device)
    store = GalleryStore(open_qdrant(settings), serialise=True)
    images = [Image.open(io.BytesIO(base64.b64decode(b))).convert("RGB") for b in queries.images]
    try:
        def text(i: int) -> np.ndarray:
            return encoder.encode_texts([queries.texts[i % len(queries.texts)]])[0]

        def image(i: int) -> np.ndarray:
            return encoder.encode_images([images[i % len(images)]])[0]
        return {name: _time(fn, store, repeats, top_k) for name, fn in
                (("text", text), ("image", image))}
    finally:
        store.close()


def _time(embed: Callable[[int], np.ndarray], store: GalleryStore, repeats: int,
          top_k: int) -> dict:
    for i in range(3):  # warm-up
        store.search(GALLERY, embed(i), "image", top_k)
    encode, search = [], []
    for i in range(repeats):
        t0 = time.perf_counter()
        vector = embed(i)
        t1 = time.perf_counter()
        store.search(GALLERY, vector, "image", top_k)
        t2 = time.perf_counter()
        encode.append(t1 - t0)
        search.append(t2 - t1)
    total = [a + b for a, b in zip(encode, search, strict=True)]
    return {"p50_ms": statistics.median(total) * 1000,
            "encode_p50_ms": statistics.median(encode) * 1000,
            "search_p50_ms": statistics.median(search) * 1000, "repeats": repeats}
