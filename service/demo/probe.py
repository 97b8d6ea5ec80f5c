"""What users see: held-out text queries sent to the gateway's search, scored by attribute
relevance against the items the gallery holds at that moment.

A query counts only when the gallery holds at least one item relevant to it (symbols
queries before any symbol was ingested have nothing to find). Hits also say which
version embedded each item, so the tables show the gallery was never re-embedded.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.demo.client import Client
from training.data import PairDataset
from training.data.dataset import attribute_relevance

TOP_K = 5


@dataclass(frozen=True)
class Query:
    group: str  # a domain (English queries) or a language code
    text: str
    mentions: dict[str, str]


@dataclass
class Measurement:
    version: str  # the version that embedded the queries
    route: str
    recall: dict[str, dict[str, float | int]]  # group -> R@1, R@5, queries
    embedded_by: dict[str, int] = field(default_factory=dict)  # top-1 hits per version
    items: int = 0  # points in the gallery

    def r1(self, group: str) -> float | None:
        cell = self.recall.get(group)
        return None if not cell or not cell["queries"] else float(cell["R@1"])


def queries(probes: PairDataset, languages: tuple[str, ...]) -> list[Query]:
    """The first caption of each probe item: English by domain, other languages by code."""
    out = []
    for record in probes.records:
        for lang in languages:
            texts, mentions = record.captions.get(lang), record.caption_attributes
            if not texts or mentions is None:
                continue
            group = (record.domain or "?") if lang == "en" else lang
            out.append(Query(group, texts[0], dict(mentions[0])))
    return out


def measure(client: Client, items: dict[str, dict[str, str]], qs: list[Query]) -> Measurement:
    """Send every query; R@1/R@5 per group over queries with something relevant stored.

    ``items``: id -> attributes of every item the gallery holds (the demo ingested them)."""
    ids = list(items)
    relevant = attribute_relevance([q.mentions for q in qs], [items[i] for i in ids])
    findable = relevant.any(axis=1)
    column = {item_id: n for n, item_id in enumerate(ids)}
    hits: dict[str, list[list[bool]]] = {}
    embedded_by: Counter[str] = Counter()
    answer: dict[str, Any] = {}
    for k, q in enumerate(qs):
        answer = client.search(q.text, TOP_K)
        top = answer["hits"]
        if top:
            embedded_by[top[0]["version"]] += 1
        if findable[k]:
            hits.setdefault(q.group, []).append(
                [bool(relevant[k, column[h["id"]]]) if h["id"] in column else False for h in top])
    recall: dict[str, dict[str, float | int]] = {}
    for group in dict.fromkeys(q.group for q in qs):
        rows = hits.get(group, [])
        recall[group] = {"R@1": float(np.mean([r[:1] == [True] for r in rows])) if rows else 0.0,
                         f"R@{TOP_K}": float(np.mean([any(r) for r in rows])) if rows else 0.0,
                         "queries": len(rows)}
    info = client.info()
    return Measurement(answer.get("version", "?"), answer.get("route", "?"), recall,
                       dict(embedded_by), int(info.get("items") or 0))
