"""What users see: text queries sent to the gateway's search, scored by attribute relevance
against the items the gallery holds at that moment.

The queries are captions of gallery items (images no model trained on). A query counts
once its own item is stored (symbols queries wait for the symbols ingest); any stored
item with every attribute the caption mentions is a correct answer. Hits also say which
version embedded each item, so the tables show the gallery was never re-embedded.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.stack.demo.client import Client
from training.data import PairDataset
from training.data.dataset import attribute_relevance

TOP_K = 5


@dataclass(frozen=True)
class Query:
    group: str  # a domain (English queries) or a language code
    text: str
    mentions: dict[str, str]
    source: str  # the item whose caption it is


@dataclass
class Measurement:
    version: str  # the version that embedded the queries
    route: str
    recall: dict[str, dict[str, float | int]]  # group -> R@1, R@5, queries
    embedded_by: dict[str, int] = field(default_factory=dict)  # top-1 hits per version
    items: int = 0  # points in the gallery
    space: str = "?"  # the space the gallery answered in

    def r1(self, group: str) -> float | None:
        cell = self.recall.get(group)
        return None if not cell or not cell["queries"] else float(cell["R@1"])


def queries(stored: list[PairDataset], per_domain: int,
            languages: tuple[str, ...]) -> list[Query]:
    """One caption each of the first ``per_domain`` items of every domain in the stored
    sets (caption k of the k-th item, so the phrasings vary), in every language: English
    grouped by domain, other languages by their code. Every query has at least its own
    item to find once that item is stored; attribute-equivalent items count as well."""
    out, seen = [], {}
    for dataset in stored:
        for record in dataset.records:
            k = seen[record.domain] = seen.get(record.domain, -1) + 1
            if k >= per_domain or record.caption_attributes is None:
                continue
            for lang in languages:
                texts = record.captions.get(lang)
                if texts:
                    j = k % len(texts)
                    group = (record.domain or "?") if lang == "en" else lang
                    out.append(Query(group, texts[j], dict(record.caption_attributes[j]),
                                     record.id))
    return out


def measure(client: Client, items: dict[str, dict[str, str]], qs: list[Query]) -> Measurement:
    """Send every query; R@1/R@5 per group over the queries whose item is stored.

    ``items``: id -> attributes of every item the gallery holds (the demo ingested them)."""
    ids = list(items)
    relevant = attribute_relevance([q.mentions for q in qs], [items[i] for i in ids])
    findable = [q.source in items for q in qs]
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
                       dict(embedded_by), int(info.get("items") or 0),
                       answer.get("space", "?"))
