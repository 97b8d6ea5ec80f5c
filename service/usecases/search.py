"""Answer one query against one gallery, on the version that serves it when the query
arrives (captured once, so a swap mid-request cannot mix versions)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np

from service.runtime.embedder import Embedder
from service.runtime.gateway import Gateway
from service.state.config import Settings
from service.state.errors import InvalidInput
from service.state.gallery.store import Hit, Where
from service.usecases.media import decode_image_async


@dataclass(frozen=True)
class Query:
    text: str | None = None
    image: bytes | None = None
    kind: str = "image"  # which items to return
    top_k: int = 10
    where: Where | None = None  # payload filter


@dataclass(frozen=True)
class Answer:
    gallery: str
    version: str  # the version that embedded the query
    route: str
    space: str
    kind: str
    hits: list[Hit]


async def search(gateway: Gateway, gallery: str, query: Query) -> Answer:
    check_query(query, gateway.settings.top_k_max)
    serving = gateway.runtime.serving(gallery)
    embedder = serving.ready()  # 409 when the version has no route into the gallery's space
    vector = await embed_query(embedder, query, gateway.settings)
    hits = await gateway.searches.search(serving.collection, vector, query.kind, query.top_k,
                                         query.where)
    return Answer(gallery, embedder.version, embedder.route, embedder.space, query.kind, hits)


def check_query(query: Query, top_k_max: int) -> None:
    if (query.text is None) == (query.image is None):
        raise InvalidInput("give exactly one of a text or an image query")
    if query.text is not None and not query.text.strip():
        raise InvalidInput("the query text is empty")
    if not 1 <= query.top_k <= top_k_max:
        raise InvalidInput(f"top_k must be between 1 and {top_k_max}, got {query.top_k}")


async def embed_query(embedder: Embedder, query: Query, settings: Settings) -> np.ndarray:
    """[D] query embedding in the gallery's space."""
    if query.text is not None:
        return await embedder.embed_text(query.text)
    assert query.image is not None
    image = await decode_image_async(query.image, settings, embedder.image_side)
    pixels = await asyncio.to_thread(embedder.pixels, image)
    return await embedder.embed_pixels(pixels)
