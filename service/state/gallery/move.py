"""Move a local-mode data directory (qdrant-client's embedded store) into Qdrant Edge, the
embedded default: every collection with its vector widths, every point (id, vectors,
payload) and every alias; then checked, per collection, by counts and by a digest of
every point's id, vectors (float32 bytes) and payload. The local directory is read only
and left as it was (delete it once satisfied); a target that already holds anything is
refused, so a move is never merged into data it could overwrite. A failed check leaves
the target out of use (renamed ``*.failed``) and says which collection differs."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from qdrant_client import QdrantClient, models

from service.state.errors import Conflict
from service.state.gallery.client import is_local_mode_dir
from service.state.gallery.edge import CATALOG, EdgeClient

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


def move_local_to_edge(source: Path, target: Path) -> Moved:
    """Copy ``source`` (local mode) into a new Edge store at ``target``, then check it."""
    import time

    start = time.perf_counter()
    if not is_local_mode_dir(source):
        raise Conflict(f"{source} does not hold qdrant-client local-mode data (no meta.json)")
    if target.exists() and any(target.iterdir()):
        raise Conflict(f"{target} is not empty: a move never writes into an existing store")
    local = QdrantClient(path=str(source))
    moved = Moved(str(source), str(target))
    try:
        dst = EdgeClient(target, indexer=False)
        try:
            for c in local.get_collections().collections:
                vectors = local.get_collection(c.name).config.params.vectors
                assert isinstance(vectors, dict), "nobackfill collections have named vectors"
                dst.create_collection(c.name, vectors_config=vectors)
                offset = None
                while True:
                    points, offset = local.scroll(c.name, limit=PAGE, offset=offset,
                                                  with_payload=True, with_vectors=True)
                    dst.upsert(c.name, [models.PointStruct(id=str(p.id), vector=p.vector or {},
                                                           payload=p.payload)
                                        for p in points])
                    if offset is None:
                        break
            moved.aliases = {a.alias_name: a.collection_name
                             for a in local.get_aliases().aliases}
            dst.update_collection_aliases([models.CreateAliasOperation(
                create_alias=models.CreateAlias(collection_name=c, alias_name=a))
                for a, c in moved.aliases.items()])
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
                dst.optimize(c, off_process=False)  # index now, before a gateway serves
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
    return moved
