"""Move a local-mode data directory (qdrant-client's embedded store) into Qdrant Edge, the
embedded default: every collection with its vector widths, every point (id, vectors,
payload) and every alias; then checked, per collection, by counts and by a digest of
every point's id, vectors (float32 bytes) and payload. The local directory is read only
and left as it was (delete it once satisfied). A failed check leaves the target out of
use (renamed ``*.failed``) and says which collection differs.

A move that is interrupted (Ctrl-C, OOM, a kill) must never leave a half store that opens:
the target's marker (``move.json``, ``edge.MOVE_MARKER``) is written first, saying the move
is under way and from where, and rewritten last, saying it is done, with its counts and
digests. ``EdgeClient`` refuses a directory whose marker is not done and names the command
that redoes the move; running that command again removes the unfinished copy and starts
over (the source is only read, so the copy is always remade whole). A target that holds
anything else (a store, or files that are not one) is refused: a move is never merged
into data it could overwrite."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from qdrant_client import QdrantClient, models

from service.state.errors import Conflict
from service.state.gallery.client import is_local_mode_dir
from service.state.gallery.edge import (
    CATALOG,
    MOVE_MARKER,
    EdgeClient,
    read_move_marker,
    write_json_durably,
)

PAGE = 1000


@dataclass
class Moved:
    """What a move copied and checked."""

    source: str
    target: str
    collections: dict[str, int] = field(default_factory=dict)  # name -> points
    aliases: dict[str, str] = field(default_factory=dict)
    digests: dict[str, str] = field(default_factory=dict)  # name -> sha256 (equal both sides)
    seconds: float = 0.0


def digest(client: Any, collection: str) -> tuple[int, str]:
    """(points, sha256 over every point in id order: id, each named vector's float32
    bytes in name order, the payload as sorted JSON)."""
    rows: list[tuple[str, bytes]] = []
    offset = None
    while True:
        points, offset = client.scroll(collection, limit=PAGE, offset=offset,
                                       with_payload=True, with_vectors=True)
        for p in points:
            vectors = p.vector or {}
            blob = b"".join(name.encode() + np.asarray(vectors[name], np.float32).tobytes()
                            for name in sorted(vectors))
            blob += json.dumps(p.payload or {}, sort_keys=True).encode()
            rows.append((str(p.id), blob))
        if offset is None:
            break
    h = hashlib.sha256()
    for pid, blob in sorted(rows):
        h.update(pid.encode() + b"\0" + blob)
    return len(rows), h.hexdigest()


def _prepare_target(source: Path, target: Path) -> bool:
    """Make ``target`` ready for a new copy: missing or empty, or an interrupted move from
    ``source`` (removed: True). Anything else is refused."""
    if not target.exists() or not any(target.iterdir()):
        return False
    marker = read_move_marker(target)
    if marker is None:
        what = ("an Edge store (catalog.json)" if (target / CATALOG).exists()
                else f"{sum(1 for _ in target.iterdir())} entries that are not a store")
        raise Conflict(f"{target} is not empty: it holds {what}, and a move never writes "
                       f"into an existing directory (choose another --to, or remove it)")
    if marker.get("state") == "done":
        raise Conflict(f"{target} already holds a finished move (from {marker.get('source')}"
                       f"): remove it first to move again")
    if Path(marker.get("source", "")).resolve() != source.resolve():
        raise Conflict(f"{target} holds an interrupted move from {marker.get('source')}, not "
                       f"from {source}: finish that one, or remove {target}")
    shutil.rmtree(target)
    return True


def move_local_to_edge(source: Path, target: Path,
                       progress: Callable[[str], None] | None = None) -> Moved:
    """Copy ``source`` (local mode) into a new Edge store at ``target``, then check it;
    ``progress`` is told each step (a page of points, a check, the index build)."""
    say = progress or (lambda _: None)
    start = time.perf_counter()
    if not is_local_mode_dir(source):
        raise Conflict(f"{source} does not hold qdrant-client local-mode data (no meta.json)")
    if _prepare_target(source, target):
        say(f"an interrupted move into {target} was removed; starting over")
    target.mkdir(parents=True, exist_ok=True)
    write_json_durably(target / MOVE_MARKER, {"state": "copying", "source": str(source),
                                              "target": str(target)})
    local = QdrantClient(path=str(source))
    moved = Moved(str(source), str(target))
    try:
        dst = EdgeClient(target, indexer=False, moving=True)
        try:
            for c in local.get_collections().collections:
                vectors = local.get_collection(c.name).config.params.vectors
                assert isinstance(vectors, dict), "nobackfill collections have named vectors"
                dst.create_collection(c.name, vectors_config=vectors)
                offset, copied = None, 0
                while True:
                    points, offset = local.scroll(c.name, limit=PAGE, offset=offset,
                                                  with_payload=True, with_vectors=True)
                    dst.upsert(c.name, [models.PointStruct(id=str(p.id), vector=p.vector or {},
                                                           payload=p.payload)
                                        for p in points])
                    copied += len(points)
                    say(f"copied {copied:,} points of {c.name}")
                    if offset is None:
                        break
            moved.aliases = {a.alias_name: a.collection_name
                             for a in local.get_aliases().aliases}
            dst.update_collection_aliases([models.CreateAliasOperation(
                create_alias=models.CreateAlias(collection_name=c, alias_name=a))
                for a, c in moved.aliases.items()])
            say(f"aliases: {len(moved.aliases)}; checking every collection")
            problems = []
            for c in local.get_collections().collections:
                want, got = digest(local, c.name), digest(dst, c.name)
                if want != got:
                    problems.append(f"{c.name}: {want[0]} points {want[1][:12]} in local "
                                    f"mode, {got[0]} points {got[1][:12]} in Edge")
                moved.collections[c.name], moved.digests[c.name] = want
            if {a.alias_name: a.collection_name for a in dst.get_aliases().aliases} \
                    != moved.aliases:
                problems.append("the aliases differ")
            for c in moved.collections:
                if not problems:
                    say(f"indexing {c}")
                    dst.optimize(c, off_process=False)  # index now, before a gateway serves
            dst.flush()
        finally:
            dst.close()
    finally:
        local.close()
    if problems:
        failed = target.with_name(target.name + ".failed")
        shutil.rmtree(failed, ignore_errors=True)
        target.rename(failed)
        raise Conflict(f"the move did not check out ({'; '.join(problems)}); the local "
                       f"directory is unchanged, the copy is at {failed}")
    assert (target / CATALOG).exists()
    moved.seconds = round(time.perf_counter() - start, 2)
    write_json_durably(target / MOVE_MARKER, {  # last: from here the store opens
        "state": "done", "source": str(source), "target": str(target),
        "collections": moved.collections, "digests": moved.digests,
        "aliases": moved.aliases, "seconds": moved.seconds})
    return moved
