"""The files of a sharded job in its work directory (shared by the gateway, which plans
the shards, and the workers, which run them): a shard's items and its cursor (how many
of them are spooled already: where a restarted shard resumes)."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any


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
