"""The files of a sharded job in its work directory (shared by the gateway, which plans
the shards, and the workers, which run them): a shard's items and its cursor (how many
of them are spooled already: where a restarted shard resumes), and the ids of items a
reader already filled (``FilledByReads``: a backfill skips them). Also how a sharded
job's shards are held: ``PAUSED`` in the job's result, ``Paused`` raised in a shard."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

PAUSED = "backfill_paused"  # a sharded job's result key: its backfill shards wait
FILLED = "filled-by-reads"  # ids of items a read-through fill wrote, one per line


class Paused(Exception):
    """Raised inside a backfill shard when its job's backfill is paused (a lazy
    migration): the shard stops at its cursor and frees the worker; the gateway queues
    it again when the backfill is resumed."""


def record_filled(work: Path, ids: list[str]) -> None:
    """Append ``ids`` (items whose new vector a reader embedded and wrote) to the job's
    record (one write of whole lines in append mode: concurrent appends do not mix)."""
    if ids and work.is_dir():
        with open(work / FILLED, "a", encoding="utf-8") as f:
            f.write("".join(f"{json.dumps(i)}\n" for i in ids))


class FilledByReads:
    """The items a job's readers filled so far, read incrementally (only what was
    appended since the last call, whole lines only)."""

    def __init__(self, work: Path) -> None:
        self.path, self.offset, self.ids = work / FILLED, 0, set[str]()

    def __call__(self) -> set[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return self.ids
        whole = data[:data.rfind(b"\n") + 1]
        self.offset += len(whole)
        self.ids.update(json.loads(line) for line in whole.decode().splitlines() if line)
        return self.ids


def items_file(work: Path, shard: int) -> Path:
    return work / f"shard-{shard:04d}.json"


def write_items(work: Path, shard: int, items: list[dict[str, Any]]) -> None:
    _atomic(items_file(work, shard), json.dumps(items))


def read_items(work: Path, shard: int) -> list[dict[str, Any]]:
    return list(json.loads(items_file(work, shard).read_text()))


def read_cursor(work: Path, shard: int) -> int:
    try:
        return int((work / f"shard-{shard:04d}.cursor").read_text())
    except FileNotFoundError:
        return 0


def write_cursor(work: Path, shard: int, value: int) -> None:
    _atomic(work / f"shard-{shard:04d}.cursor", str(value))


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
