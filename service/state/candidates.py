"""What users retrieve: per gallery, a bounded, decayed count of how often each item was
among a search's served candidates (the route's top-k of real searches, reranked or not),
of how often each distinct set of candidates was served (a query that comes back serves
the same set), and the candidate lists of the last searches. No query text is kept: item
ids only.

A migration's backfill order ``candidates`` re-embeds first the candidates of the sets
served most (``service.jobkinds.migrate.planning``); a plan measures, on the recent
searches, how warm that order keeps a rerank on read against the read-through fill alone
(``training.upgrades.rerank.workload_curves``).

One file per gallery, ``REGISTRY_ROOT/candidates/<gallery>.json``: a search adds to this
process's pending counts (memory only, no I/O on the request path); ``save`` merges them
into the file under a file lock (several gateway processes add up), decaying what the
file held by the time since it was written (half-life ``candidate_half_life_s``), keeps
the ``candidate_items_max`` most counted items, the ``candidate_sets_max`` most served
sets and the last ``candidate_searches_kept`` searches, and replaces the file atomically
(a file this process wrote last is not read again). The gateway saves once a minute at
most, off the event loop, and at close, so a restart loses at most that minute of
counting; at the bounds (200,000 items, 20,000 sets and 5,000 searches of 20) a save takes
about half a second of a worker thread.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock

log = logging.getLogger(__name__)

FOLDER = "candidates"
SCHEMA = 2  # 2: with the sets
Key = tuple[str, ...]  # a set of candidates: its ids, sorted


@dataclass(frozen=True)
class Counted:
    """One gallery's counts as saved: item id -> decayed count (as of ``at``), each
    distinct set of served candidates -> its decayed count, and the last searches'
    candidate lists, oldest first."""

    counts: dict[str, float]
    searches: list[list[str]]
    at: float  # wall-clock time the counts are decayed to
    sets: dict[Key, float] = field(default_factory=dict)

    def order(self) -> list[str]:
        """The counted items, most counted first (ties by id)."""
        return sorted(self.counts, key=lambda i: (-self.counts[i], i))

    def describe(self) -> dict[str, Any]:
        return {"items_counted": len(self.counts), "sets_counted": len(self.sets),
                "searches_kept": len(self.searches), "at": self.at}


EMPTY = Counted({}, [], 0.0)


@dataclass
class _Pending:
    counts: dict[str, float] = field(default_factory=dict)
    sets: dict[Key, float] = field(default_factory=dict)
    searches: list[list[str]] = field(default_factory=list)


class CandidateCounts:
    """This process's counting (``record``, from the search path) and the saved counts
    (``save``, ``load``) under ``root`` (``REGISTRY_ROOT/candidates``)."""

    def __init__(self, root: Path, half_life_s: float, items_max: int, searches_kept: int,
                 save_every_s: float = 60.0, sets_max: int = 20_000) -> None:
        if half_life_s <= 0 or items_max < 1 or searches_kept < 0 or sets_max < 0:
            raise ValueError("half_life_s > 0, items_max >= 1, searches_kept >= 0 and "
                             "sets_max >= 0")
        self.root, self.half_life_s = Path(root), float(half_life_s)
        self.items_max, self.searches_kept = int(items_max), int(searches_kept)
        self.sets_max = int(sets_max)
        self.save_every_s = save_every_s
        self._pending: dict[str, _Pending] = {}
        self._lock = threading.Lock()
        self._saving = threading.Lock()
        self._last_save = time.monotonic()
        # what this process last wrote per gallery, with the file's stamp then: when the
        # file still has that stamp (no other process wrote it), it is not read again
        self._written: dict[str, tuple[tuple[int, int], Counted]] = {}

    # ------------------------------------------------------------ the search path
    def record(self, gallery: str, ids: Iterable[str]) -> None:
        """One search's served candidates (each id counts once per search)."""
        unique = list(dict.fromkeys(ids))
        if not unique:
            return
        with self._lock:
            p = self._pending.setdefault(gallery, _Pending())
            for i in unique:
                p.counts[i] = p.counts.get(i, 0.0) + 1.0
            if self.sets_max:
                key = tuple(sorted(unique))
                p.sets[key] = p.sets.get(key, 0.0) + 1.0
            if self.searches_kept:
                p.searches.append(unique)
                del p.searches[:-self.searches_kept]

    def due(self) -> bool:
        """Whether a save is due (pending counts and ``save_every_s`` since the last)."""
        return bool(self._pending) and time.monotonic() - self._last_save >= self.save_every_s \
            and not self._saving.locked()

    # ------------------------------------------------------------ the files
    def path(self, gallery: str) -> Path:
        return self.root / f"{gallery}.json"

    def save(self) -> None:
        """Merge every gallery's pending counts into its file (module docstring)."""
        if not self._saving.acquire(blocking=False):
            return  # another thread is saving: its merge takes what is pending then
        try:
            with self._lock:
                pending, self._pending = self._pending, {}
                self._last_save = time.monotonic()
            for gallery, p in pending.items():
                try:
                    self._merge(gallery, p)
                except OSError as exc:  # counting is advisory: a full disk loses counts only
                    log.warning("candidate counts of gallery '%s' not saved: %s", gallery, exc)
        finally:
            self._saving.release()

    def _merge(self, gallery: str, p: _Pending) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.path(gallery)) + ".lock"):
            now = time.time()
            old = self.load(gallery)
            decay = 0.5 ** (max(0.0, now - old.at) / self.half_life_s) if old.at else 1.0
            counts = _merged(old.counts, p.counts, decay, self.items_max)
            sets = _merged(old.sets, p.sets, decay, self.sets_max)
            searches = list(deque(old.searches + p.searches, maxlen=self.searches_kept))
            body = {"schema_version": SCHEMA, "gallery": gallery, "at": now,
                    "half_life_s": self.half_life_s, "counts": counts,
                    "sets": [[list(k), c] for k, c in sets.items()], "searches": searches}
            tmp = self.path(gallery).with_name(f".{gallery}.{uuid.uuid4().hex[:8]}.tmp")
            tmp.write_text(json.dumps(body))
            os.replace(tmp, self.path(gallery))
            self._written[gallery] = (_stamp(self.path(gallery)),
                                      Counted(counts, searches, now, sets))

    def load(self, gallery: str) -> Counted:
        """The saved counts of ``gallery`` (``EMPTY`` when none were saved; a file that
        does not parse is logged and read as none: counting starts again); what this
        process wrote last is not read again while the file still has its stamp."""
        mine = self._written.get(gallery)
        if mine is not None and mine[0] == _stamp(self.path(gallery)):
            return mine[1]
        return read_counted(self.path(gallery))

    def forget(self, gallery: str) -> None:
        """Drop a gallery's counts (the gallery was deleted)."""
        with self._lock:
            self._pending.pop(gallery, None)
        self._written.pop(gallery, None)
        self.path(gallery).unlink(missing_ok=True)


def _merged(old: dict[Any, float], new: dict[Any, float], decay: float,
            most: int) -> dict[Any, float]:
    """``old`` decayed plus ``new``, cut to the ``most`` largest (ties by key)."""
    out = {k: c * decay for k, c in old.items()}
    for k, c in new.items():
        out[k] = out.get(k, 0.0) + c
    if len(out) > most:
        keep = sorted(out, key=lambda k: (-out[k], k))[:most]
        out = {k: out[k] for k in keep}
    return out


def _stamp(path: Path) -> tuple[int, int]:
    try:
        st = path.stat()
    except FileNotFoundError:
        return (0, -1)
    return (st.st_mtime_ns, st.st_size)


def read_counted(path: Path) -> Counted:
    """A counts file as ``CandidateCounts.save`` writes it (``EMPTY`` if missing or
    unreadable)."""
    try:
        body = json.loads(Path(path).read_text())
        return Counted({str(k): float(v) for k, v in body["counts"].items()},
                       [[str(i) for i in s] for s in body["searches"]], float(body["at"]),
                       {tuple(str(i) for i in k): float(c)
                        for k, c in body.get("sets", [])})  # schema 1: none kept
    except FileNotFoundError:
        return EMPTY
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("candidate counts at %s unreadable (%s): starting again", path, exc)
        return EMPTY
