"""Dynamic batching of gallery searches: the searches that arrive while one Qdrant call
runs go together in the next one, one call per gallery (``query_batch_points``: a single
request to a Qdrant server, one lock hold in local mode).

A query batch from the device lane answers together, so its searches arrive together and
leave together: its clients come back as a group, which keeps the next encoder batch full.
If a grouped call fails, each search of that gallery is retried alone, so an error reaches
only the caller it belongs to. ``max_size=1`` turns it off (one call per search).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor

import numpy as np

from service.runtime.batching import MicroBatcher
from service.state.gallery.store import GalleryStore, Hit, Search, Where

Request = tuple[str, Search]  # gallery, search
Outcome = list[Hit] | Exception


class SearchBatcher:
    def __init__(self, store: GalleryStore, executor: Executor, max_size: int) -> None:
        self.store = store
        # No wait beyond the event-loop turn: one forward's callers search together, and
        # under load the next group gathers while a call runs. One lane thread: local
        # mode is serialised anyway, and a server gets one request per group.
        self._batcher: MicroBatcher[Request, Outcome] = MicroBatcher(
            self._run, executor, max_size, max_wait_s=0.0)

    async def search(self, gallery: str, vector: np.ndarray, kind: str, top_k: int,
                     where: Where | None = None) -> list[Hit]:
        outcome = await self._batcher.submit((gallery, Search(vector, kind, top_k, where)))
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def _run(self, requests: list[Request]) -> Sequence[Outcome]:
        outcomes: dict[int, Outcome] = {}
        by_gallery: dict[str, list[int]] = {}
        for i, (gallery, _) in enumerate(requests):
            by_gallery.setdefault(gallery, []).append(i)
        for gallery, rows in by_gallery.items():
            try:
                found: Sequence[Outcome] = self.store.search_many(
                    gallery, [requests[i][1] for i in rows])
            except Exception:  # noqa: BLE001 - retried one by one below, each keeps its error
                found = [self._alone(gallery, requests[i][1]) for i in rows]
            for i, outcome in zip(rows, found, strict=True):
                outcomes[i] = outcome
        return [outcomes[i] for i in range(len(requests))]

    def _alone(self, gallery: str, search: Search) -> Outcome:
        try:
            return self.store.search_many(gallery, [search])[0]
        except Exception as exc:  # noqa: BLE001 - handed to its caller, who re-raises it
            return exc
