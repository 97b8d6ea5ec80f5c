"""The plans of a migration's shards: which items each shard re-embeds, in which order.

At the start (``submit``): contiguous ranges of the items by id (``ranges``), or a seeded
random order dealt to the shards in turn (``strided``, so that shards running at once walk
the order together), or the candidate order (what users retrieved most first, then by id),
strided, dealt again when a paused backfill resumes (``replan_paused``); with a transform, one shard of a sample (``sample``). Once the
transform shard is done (``plan_after_transform``): the listed items in the order it
wrote, strided. Catch-up and resumed backfills are ranges of what is left.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from service.jobkinds.base import GatewayPort
from service.jobkinds.migrate import record as records
from service.jobkinds.migrate.params import MigrateParams
from service.jobkinds.migrate.transform import LISTING, read_order
from service.state.candidates import Counted
from service.state.gallery.store import Stored
from service.state.jobs.shards import read_cursor, read_items, write_items
from service.state.jobs.store import Job
from service.vectors.backfill import origin_of

CANDIDATES = "candidates.json"  # the counts a candidate-order plan used (``keep_counts``)


def backfill_item(stored: Stored) -> dict[str, Any]:
    """What a shard needs of an item: id, the etag it was read with, kinds, origin."""
    return {"id": stored.id, "etag": stored.etag, "kinds": list(stored.kinds),
            "origin": origin_of(stored.kinds, stored.origin, stored.payload)}


def ranges(items: list[dict[str, Any]], shards: int) -> list[list[dict[str, Any]]]:
    """Contiguous ranges of the sorted items, as even as they split (at least one)."""
    n = max(1, min(shards, len(items)))
    bounds = [round(k * len(items) / n) for k in range(n + 1)]
    return [items[bounds[k]:bounds[k + 1]] for k in range(n)]


def strided(items: list[dict[str, Any]], shards: int) -> list[list[dict[str, Any]]]:
    """Items in backfill order dealt to the shards in turn (shard k: items k, k + n, ...),
    so that the shards, running at once, walk the order together."""
    n = max(1, min(shards, len(items)))
    return [items[k::n] for k in range(n)]


def planned(items: list[dict[str, Any]], params: MigrateParams) -> list[list[dict[str, Any]]]:
    """The backfill shards of a migration without a transform: id order in contiguous
    ranges, or a seeded random order, strided (the candidate order: ``candidate_plan``)."""
    if params.order == "random":
        perm = np.random.default_rng(params.seed).permutation(len(items))
        return strided([items[i] for i in perm], params.shards)
    return ranges(items, params.shards)


def candidate_plan(gateway: GatewayPort, job: Job, items: list[dict[str, Any]], when: str,
                   shards: int) -> list[list[dict[str, Any]]]:
    """The backfill shards in the candidate order (``keep_counts``), strided."""
    return strided(keep_counts(gateway, job, items, when), shards)


def by_candidates(items: list[dict[str, Any]], counted: Counted) -> list[dict[str, Any]]:
    """The candidate order: the items of the served sets of candidates in the order that
    makes the most searches fully warm soonest (``searched_first`` with each set's decayed
    count: a set served often, or nearly held, first; a file that kept no sets: the last
    searches' lists), then the other items users retrieved by their decayed count, then
    the rest in the order given (id order: the default)."""
    from training.upgrades.rerank import searched_first

    first = (searched_first(list(counted.sets), list(counted.sets.values())) if counted.sets
             else searched_first(counted.searches))
    rank = {i: n for n, i in enumerate(first)}
    last = len(rank)
    return sorted(items, key=lambda item: (rank.get(item["id"], last),
                                           -counted.counts.get(item["id"], 0.0)))


def keep_counts(gateway: GatewayPort, job: Job, items: list[dict[str, Any]],
                when: str) -> list[dict[str, Any]]:
    """``items`` in the candidate order (``by_candidates`` on the gallery's counts now,
    this process's pending ones saved first; the rest by id), kept with the migration
    (``CANDIDATES`` in its folder: the items users retrieved, in that order, with their
    counts, and when)."""
    gateway.candidates.save()
    counted = gateway.candidates.load(job.gallery)
    ordered = by_candidates(sorted(items, key=lambda i: i["id"]), counted)
    first = [i["id"] for i in ordered if i["id"] in counted.counts]
    records.write_json(records.folder(gateway.jobs, job.id) / CANDIDATES, {
        "planned": when, "counts_at": counted.at, "searches_kept": len(counted.searches),
        "items_counted": len(counted.counts), "sets_counted": len(counted.sets),
        "first": len(first),
        "items": [[i, round(counted.counts[i], 4)] for i in first]})
    records.merge(gateway.jobs, job.id, candidates={
        "planned": when, "first": len(first), "left": len(items),
        "items_counted": len(counted.counts), "sets": len(counted.sets),
        "searches": len(counted.searches)})
    return ordered


def replan_paused(gateway: GatewayPort, job: Job) -> int:
    """(A paused backfill, before it resumes, with order ``candidates``.) The items the
    paused shards have not re-embedded yet, dealt again in the candidate order as the
    counts stand now (what the searches served while the backfill waited: the point of a
    lazy migration); each shard keeps its length and what it did. Shards that run (still
    finishing a batch) keep their plan. Returns the items dealt again."""
    work = gateway.jobs.work_dir(job.id)
    shards = [n for n, s in enumerate(job.shards)
              if s.get("task", "backfill") == "backfill" and s["state"] == "paused"]
    if not shards:
        return 0
    lists = {n: read_items(work, n) for n in shards}
    cursors = {n: read_cursor(work, n) for n in shards}
    left = [i for n in shards for i in lists[n][cursors[n]:]]
    queue = iter(keep_counts(gateway, job, left, "resume"))
    dealt: dict[int, list[dict[str, Any]]] = {n: [] for n in shards}
    room = {n: len(lists[n]) - cursors[n] for n in shards}
    while any(room.values()):
        for n in shards:
            if room[n]:
                dealt[n].append(next(queue))
                room[n] -= 1
    for n in shards:
        write_items(work, n, lists[n][:cursors[n]] + dealt[n])
    return len(left)


def sample(items: list[dict[str, Any]], params: MigrateParams) -> list[dict[str, Any]]:
    """The transform's sample: ``sample_size`` listed items drawn with the job's seed."""
    k = params.sample_size(len(items))
    chosen = np.random.default_rng(params.seed).permutation(len(items))[:k]
    return [items[i] for i in sorted(chosen.tolist())]


def plan_after_transform(gateway: GatewayPort, job: Job) -> list[int]:
    """The backfill shards of a transformed migration: the listed items in the order the
    transform shard wrote, strided; their indices (planned once: ``backfill_planned``).
    The transform's outcome (its curve and switch point) goes into the migration's
    record here."""
    params = MigrateParams.model_validate(job.params)
    folder = records.folder(gateway.jobs, job.id)
    listed = {i["id"]: i for i in json.loads((folder / LISTING).read_text())}
    items = [listed[i] for i in read_order(folder) if i in listed]
    planned = write_shards(gateway, job, strided(items, params.shards) if items else [[]])
    outcome = json.loads((folder / records.TRANSFORMED).read_text())
    records.merge(gateway.jobs, job.id, backfill_planned=True,
                  planned_shards=len(gateway.jobs.get(job.id).shards), **outcome)
    return planned


def write_shards(gateway: GatewayPort, job: Job, shards: list[list[dict[str, Any]]],
                 task: str = "backfill") -> list[int]:
    """Write the shards' item files and add them to the job; their indices."""
    first = len(gateway.jobs.get(job.id).shards)
    work = gateway.jobs.work_dir(job.id)
    work.mkdir(parents=True, exist_ok=True)
    for n, items in enumerate(shards):
        write_items(work, first + n, items)
    gateway.jobs.add_shards(job.id, [
        {"task": task, "start": items[0]["id"] if items else None,
         "end": items[-1]["id"] if items else None, "total": len(items)} for items in shards])
    return list(range(first, first + len(shards)))
