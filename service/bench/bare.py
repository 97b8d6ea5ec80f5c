"""The bare cost of answering one query in-process: encoder forward + Qdrant search, no
HTTP, no batching, the same model and gallery as the gateway. Sampled in rounds between
the gateway's measurements, so that both see the machine in the same state."""

from __future__ import annotations

import base64
import io
import itertools
import statistics
import time
from collections.abc import Callable

import numpy as np
from PIL import Image

from service.bench.setup import GALLERY, VERSION, Queries
from service.runtime.threads import limit_blas_threads
from service.state.config import Settings
from service.state.gallery import GalleryStore, open_qdrant
from service.state.registry import Registry
from training.versions import load_encoder

Sample = tuple[float, float]  # seconds: encode, search


class BareMeter:
    def __init__(self, settings: Settings, queries: Queries, top_k: int = 10) -> None:
        limit_blas_threads(settings.blas_threads)  # as the gateway does
        self.encoder = load_encoder(Registry(settings.registry_dir).artifact(VERSION), VERSION,
                                    settings.device)
        self.store = GalleryStore(open_qdrant(settings), serialise=True)
        # each round goes on through the query lists where the last one stopped
        self.texts = itertools.cycle(queries.texts)
        self.images = itertools.cycle([Image.open(io.BytesIO(base64.b64decode(b))).convert("RGB")
                                       for b in queries.images])
        self.top_k = top_k

    def close(self) -> None:
        self.store.close()

    def sample(self, modality: str, repeats: int, warm_up: int = 2) -> list[Sample]:
        embed = self._text if modality == "text" else self._image
        for _ in range(warm_up):
            self._one(embed)
        return [self._one(embed) for _ in range(repeats)]

    def _one(self, embed: Callable[[], np.ndarray]) -> Sample:
        t0 = time.perf_counter()
        vector = embed()
        t1 = time.perf_counter()
        self.store.search(GALLERY, vector, "image", self.top_k)
        return t1 - t0, time.perf_counter() - t1

    def _text(self) -> np.ndarray:
        return self.encoder.encode_texts([next(self.texts)])[0]

    def _image(self) -> np.ndarray:
        return self.encoder.encode_images([next(self.images)])[0]


def summary(samples: list[Sample]) -> dict:
    encode = [e for e, _ in samples]
    search = [s for _, s in samples]
    return {"p50_ms": statistics.median(e + s for e, s in samples) * 1000,
            "encode_p50_ms": statistics.median(encode) * 1000,
            "search_p50_ms": statistics.median(search) * 1000, "repeats": len(samples)}
