"""What machines do to the embedded engine (Qdrant Edge, ``service/state/gallery/edge.py``):
a move killed part way, a restart before indexing, a gateway killed during an index build
(its child process, the copy it writes), and the two durability levels. Each test drives
the engine itself in real processes; nothing is stood in for."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from qdrant_client import QdrantClient, models

from service.state.config import Settings
from service.state.gallery import GalleryStore, Item, open_qdrant
from service.state.gallery.edge import (
    BUILD_LOCK,
    HNSW,
    INDEXED,
    MOVE_MARKER,
    EdgeClient,
    IncompleteStore,
)

REPO = Path(__file__).resolve().parents[1]


def unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    v = rng.normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


# --------------------------------------------------------------------------- moves
def _local_source(data: Path) -> dict[str, str]:
    """Local-mode data with two collections (2,400 and 900 points) and an alias; the
    fingerprint of each (the gallery by its alias, the side by its name)."""
    rng = np.random.default_rng(0)
    local = GalleryStore(QdrantClient(path=str(data / "qdrant")), serialise=True)
    local.create("g", 16)
    vecs = unit(rng, 2400, 16)
    local.upsert("g", [Item(f"a{i}", {"image": vecs[i], "text": vecs[-1 - i]},
                            payload={"n": i}) for i in range(2400)], "v1", "s")
    side = local.create_side("g", 16)
    local.upsert(side, [Item(f"a{i}", {"image": vecs[i]}) for i in range(900)], "v2", "t")
    prints = {"g": local.fingerprint("g"), side: local.fingerprint(side)}
    local.close()
    return prints


def _move(data: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", "import sys; from training.cli import main; sys.exit(main())",
         "store", "move", "--data-dir", str(data)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_move_killed_at_any_point_is_refused_until_run_again_then_complete(tmp_path) -> None:
    """``store move`` killed after its k-th step (pages copied, the check, the index build)
    leaves a store that neither the gateway's opener nor ``EdgeClient`` opens: the error
    names the command that redoes it. Running the command again starts over and ends with
    every point of the source, and the store opens."""
    data = tmp_path / "data"
    prints = _local_source(data)
    settings = Settings(data_dir=data)
    refused = 0
    for k in (1, 2, 4, 6):
        proc = _move(data)
        assert proc.stderr is not None
        for _ in range(k):
            if not proc.stderr.readline():
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        target = data / "qdrant-edge"
        try:
            store = GalleryStore(open_qdrant(settings), serialise=True)
        except IncompleteStore as exc:  # the usual case: the kill landed mid-move
            refused += 1
            assert "nobackfill store move" in str(exc) and str(target) in str(exc)
            with pytest.raises(IncompleteStore):
                EdgeClient(target, indexer=False)
            continue
        # the kill came after the marker's last write: a finished move, whole
        assert {c: store.fingerprint(c) for c in prints} == prints
        store.close()
        break
    assert refused >= 2, "the kills should land while the move is under way"
    done = _move(data)
    out, err = done.communicate(timeout=300)
    if refused == 4:
        assert done.returncode == 0, err
        assert "starting over" in err  # the interrupted copy was removed first
    store = GalleryStore(open_qdrant(settings), serialise=True)
    assert {c: store.fingerprint(c) for c in prints} == prints
    assert store.collection_of("g") not in (None, side := next(c for c in prints if c != "g"))
    assert store.count(side) == 900
    store.close()
    again = _move(data)  # a finished move is not redone over itself
    out, _ = again.communicate(timeout=120)
    assert again.returncode == 1 and "already holds a finished move" in out


def test_a_move_refuses_a_foreign_target_and_the_gateway_an_empty_store_beside_local_data(
        tmp_path) -> None:
    """An Edge folder made beforehand and left empty does not hide local-mode data from
    the gateway (it names the move); a target holding files that are not a move, or
    another move's unfinished copy, is refused with what it holds."""
    from service.state.errors import Conflict, Unavailable
    from service.state.gallery.move import move_local_to_edge

    data = tmp_path / "data"
    _local_source(data)
    (data / "qdrant-edge").mkdir()
    with pytest.raises(Unavailable, match="nobackfill store move --data-dir"):
        open_qdrant(Settings(data_dir=data))
    (data / "qdrant-edge" / "notes.txt").write_text("mine")
    with pytest.raises(Conflict, match="1 entries that are not a store"):
        move_local_to_edge(data / "qdrant", data / "qdrant-edge")
    assert (data / "qdrant-edge" / "notes.txt").read_text() == "mine"  # left alone
    (data / "qdrant-edge" / "notes.txt").unlink()
    (data / "qdrant-edge" / MOVE_MARKER).write_text(
        '{"state": "copying", "source": "/elsewhere/qdrant"}')
    with pytest.raises(Conflict, match="interrupted move from /elsewhere/qdrant"):
        move_local_to_edge(data / "qdrant", data / "qdrant-edge")


# --------------------------------------------------------------------------- indexing
def test_a_restart_right_after_a_bulk_load_indexes_what_was_not_indexed(tmp_path) -> None:
    """Points written and never indexed (the gateway closed before the indexer ran) are
    due again when the store opens: the reopened store indexes them once quiet, without
    waiting for ``index_after`` new writes."""
    rng = np.random.default_rng(1)
    first = EdgeClient(tmp_path, indexer=False, index_after=1000, indexing_threshold_kb=1)
    store = GalleryStore(first, serialise=False)
    store.create("g", 32)
    vecs = unit(rng, 3000, 32)
    store.upsert("g", [Item(f"i{n}", {"image": vecs[n], "text": vecs[n]})
                       for n in range(3000)], "v", "s")
    collection = store.collection_of("g")
    assert first.indexed(collection)["indexed_vectors"] == 0
    store.close()
    again = EdgeClient(tmp_path, index_after=1000, quiet_s=0.3, indexing_threshold_kb=1)
    try:
        assert again._collection(collection).changed >= 1000  # due from the start
        deadline = time.monotonic() + 60
        while again.indexed(collection)["indexed_vectors"] == 0:
            assert time.monotonic() < deadline, "the restarted store never indexed"
            time.sleep(0.2)
        assert again.indexed(collection)["indexed_vectors"] >= 3000
    finally:
        again.close()
    idle = EdgeClient(tmp_path, indexer=False, index_after=1000, indexing_threshold_kb=1)
    assert idle._collection(collection).changed < 1000  # indexed: nothing due any more
    idle.close()


# --------------------------------------------------------------------------- children
GATEWAY = """
import sys, numpy as np
from service.state.gallery import GalleryStore, Item
from service.state.gallery.edge import EdgeClient
root, start = sys.argv[1], int(sys.argv[2])
store = GalleryStore(EdgeClient(root, indexer=False, indexing_threshold_kb=1), serialise=False)
store.create("g", 64)
rng = np.random.default_rng(start)
n = start
while True:
    v = rng.normal(size=(500, 64)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    store.upsert("g", [Item(f"p{n + i}", {"image": v[i]}) for i in range(500)], "v", "s")
    print(n, flush=True)  # acknowledged
    n += 500
    if n - start >= 20000:
        store.client.optimize(store.collection_of("g"))
"""


def _index_children(pid: int) -> list[psutil.Process]:
    try:
        return [c for c in psutil.Process(pid).children()
                if "EdgeShard.load" in " ".join(c.cmdline())]
    except psutil.NoSuchProcess:
        return []


def _gone(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_an_index_build_dies_with_its_gateway_and_its_copy_is_removed_after(tmp_path) -> None:
    """10 SIGKILLs of a process serving the store while its index build runs: each time
    the build's child ends with it (0 orphans), the next open removes the copy the child
    was writing, and every acknowledged point is there."""
    root = tmp_path / "store"
    acked: list[int] = []
    orphans = kills = 0
    for k in range(10):
        proc = subprocess.Popen([sys.executable, "-c", GATEWAY, str(root), str(100_000 * k)],
                                cwd=REPO, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        mine: list[int] = []
        children: list[psutil.Process] = []
        deadline = time.monotonic() + 120
        while not children and time.monotonic() < deadline:
            line = proc.stdout.readline()  # the process writes, then builds, then writes
            if not line:
                break
            mine.append(int(line))
            children = _index_children(proc.pid)
            if not children and len(mine) >= 40:  # building: the child shows up soon
                for _ in range(200):
                    children = _index_children(proc.pid)
                    if children:
                        break
                    time.sleep(0.01)
        assert children, "the index build's child never started"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        kills += 1
        acked += mine
        for child in children:  # its build (20,000 points) takes seconds: gone at once
            end = time.monotonic() + 1.0
            while not _gone(child) and time.monotonic() < end:
                time.sleep(0.02)
            orphans += 0 if _gone(child) else 1
            if not _gone(child):
                child.kill()
        store = GalleryStore(EdgeClient(root, indexer=False), serialise=False)
        want = [f"p{n + i}" for n in acked for i in range(0, 500, 50)]
        got = store.vectors("g", want)
        assert len(got) == len(want), f"kill {k}: {len(want) - len(got)} acknowledged lost"
        assert not (root / "building").exists()  # the dead build's copy was removed
        store.close()
    assert kills == 10 and orphans == 0


def test_an_open_never_removes_a_copy_a_live_build_holds(tmp_path) -> None:
    """A copy whose lock is held (a build still running) is left by an open; once the
    lock is free, the next open removes it."""
    EdgeClient(tmp_path, indexer=False).close()
    copy = tmp_path / "building" / "g-1234abcd"
    copy.mkdir(parents=True)
    (copy / "segment.bin").write_bytes(b"x" * 64)
    held = open(copy / BUILD_LOCK, "a")  # noqa: SIM115 - a live build's lock, held here
    fcntl.flock(held, fcntl.LOCK_EX)
    EdgeClient(tmp_path, indexer=False).close()
    assert (copy / "segment.bin").exists()
    fcntl.flock(held, fcntl.LOCK_UN)
    held.close()
    EdgeClient(tmp_path, indexer=False).close()
    assert not (tmp_path / "building").exists()


# --------------------------------------------------------------------------- durability
class _Shard:
    """An Edge shard seen through its calls: numbers its updates (each thread's last)."""

    def __init__(self, shard: object) -> None:
        self.shard, self.updates = shard, 0
        self.mine = threading.local()
        self.lock = threading.Lock()

    def update(self, op: object) -> None:
        self.shard.update(op)  # type: ignore[attr-defined]
        with self.lock:
            self.updates += 1
            self.mine.last = self.updates

    def __getattr__(self, name: str) -> object:
        return getattr(self.shard, name)


class _Syncs:
    """``os.fsync`` observed: each sync of the shard's write-ahead log (its files, then its
    folder: ``_sync_log``) and the last update it began after; ``fail`` makes a sync of
    the log fail as a disk would."""

    def __init__(self, shard: _Shard) -> None:
        self.shard, self.real = shard, os.fsync
        self.synced_upto = self.log_syncs = 0
        self.began: int | None = None  # the updates made when the sync in progress began
        self.fail = False

    def __call__(self, fd: int) -> None:
        name = os.readlink(f"/proc/self/fd/{fd}")
        if "/wal" not in name:  # the catalog, a spooled batch: not the log
            self.real(fd)
            return
        if self.began is None:
            self.began = self.shard.updates
        if self.fail:
            self.began = None
            raise OSError(5, "Input/output error")
        self.real(fd)
        if name.endswith("/wal"):  # the folder: the sync's last step
            self.log_syncs += 1
            self.synced_upto = max(self.synced_upto, self.began)
            self.began = None


def _watched(durability: str, root: Path, monkeypatch) -> tuple[GalleryStore, _Shard, _Syncs]:
    store = GalleryStore(EdgeClient(root, indexer=False, durability=durability),
                         serialise=False)
    store.create("g", 8)
    c = store.client._collection("g")
    c.shard = _Shard(c.shard)
    syncs = _Syncs(c.shard)
    monkeypatch.setattr(os, "fsync", syncs)
    return store, c.shard, syncs


def test_power_durability_acknowledges_a_write_only_after_its_log_is_synced(
        tmp_path, monkeypatch) -> None:
    """At ``power`` every upsert and delete returns only once a sync of the shard's
    write-ahead log that began after its update has finished (files, then folder); 6
    writers at once share syncs (fewer than writes: the sync lets them run). A sync that
    fails fails the write (an error, not an acknowledgement). At ``process`` no write
    waits for a sync."""
    store, shard, syncs = _watched("power", tmp_path / "power", monkeypatch)
    late: list[tuple[int, int]] = []
    rng = np.random.default_rng(2)
    vecs = unit(rng, 600, 8)

    def writer(w: int) -> None:
        for n in range(20):
            store.upsert("g", [Item(f"w{w}-{n}", {"image": vecs[w * 100 + n]})], "v", "s")
            if syncs.synced_upto < shard.mine.last:
                late.append((shard.mine.last, syncs.synced_upto))
        store.delete("g", [f"w{w}-0"])
        if syncs.synced_upto < shard.mine.last:
            late.append((shard.mine.last, syncs.synced_upto))

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not late, f"acknowledged before their sync: {late[:5]}"
    assert 1 <= syncs.log_syncs < shard.updates == 6 * 21
    assert store.client.syncs == syncs.log_syncs and store.count("g") == 6 * 19
    syncs.fail = True
    with pytest.raises(OSError, match="Input/output"):
        store.upsert("g", [Item("refused", {"image": vecs[0]})], "v", "s")
    store.close()

    quick, _, seen = _watched("process", tmp_path / "process", monkeypatch)
    quick.upsert("g", [Item("a", {"image": vecs[0]})], "v", "s")
    seen.fail = True  # never asked for
    quick.upsert("g", [Item("b", {"image": vecs[1]})], "v", "s")
    assert seen.log_syncs == 0 and quick.client.syncs == 0 and quick.count("g") == 2
    quick.close()


def test_the_durability_setting_reaches_the_embedded_engines(tmp_path) -> None:
    """``NOBACKFILL_QDRANT_DURABILITY`` is the Edge client's level (and local mode's
    SQLite commits: FULL at power, NORMAL otherwise); anything else is refused."""
    from pydantic import ValidationError

    from service.state.gallery.client import open_embedded, tune_local_writes

    settings = Settings(data_dir=tmp_path, qdrant_durability="power")
    client = open_qdrant(settings)
    assert client.durability == "power"
    client.close()
    with pytest.raises(ValidationError, match="qdrant_durability"):
        Settings(data_dir=tmp_path, qdrant_durability="disk")
    with pytest.raises(ValueError, match="durability must be one of"):
        EdgeClient(tmp_path / "x", durability="disk")
    for level, want in (("power", 2), ("process", 1)):  # SQLite: FULL 2, NORMAL 1
        local = open_embedded("local", str(tmp_path / f"local-{level}"), level)
        store = GalleryStore(local, serialise=True)
        store.create("g", 4)
        store.upsert("g", [Item("a", {"image": np.eye(4, dtype=np.float32)[0]})], "v", "s")
        assert tune_local_writes(local, store.collection_of("g"))
        sqlite = local._client._get_collection(store.collection_of("g")).storage.storage
        assert sqlite.execute("PRAGMA synchronous").fetchone()[0] == want
        store.close()


# --------------------------------------------------------------------------- server path
class _ServerCalls(QdrantClient):
    """qdrant-client (its local mode: the server's client API) recording the calls that
    local mode accepts but does not act on, so the test sees what a server is asked."""

    def __init__(self) -> None:
        super().__init__(location=":memory:")
        self.calls: list[tuple[str, object]] = []

    def create_collection(self, collection_name: str, **kwargs: object) -> bool:  # type: ignore[override]
        self.calls.append(("hnsw", kwargs.get("hnsw_config")))
        return super().create_collection(collection_name, **kwargs)  # type: ignore[arg-type]

    def create_payload_index(self, collection_name: str, field_name: str,  # type: ignore[override]
                             field_schema: object = None, **kwargs: object) -> object:
        self.calls.append((field_name, field_schema))
        return super().create_payload_index(collection_name, field_name, field_schema,
                                            **kwargs)  # type: ignore[arg-type]


def test_every_backend_gets_the_same_collections_hnsw_and_keyword_indexes(tmp_path) -> None:
    """The store makes a collection the same way on a server as on Edge: its HNSW (m,
    ef_construct) and a keyword index on every key it filters and counts on, for the
    gallery and for a migration's side."""
    client = _ServerCalls()
    store = GalleryStore(client, serialise=True)
    store.create("g", 8)
    store.create_side("g", 8)
    want = [("hnsw", models.HnswConfigDiff(m=HNSW[0], ef_construct=HNSW[1])),
            *((key, models.KeywordIndexParams(type=models.KeywordIndexType.KEYWORD,
                                              on_disk=True)) for key in INDEXED)]
    assert client.calls == want * 2
    store.close()
    edge = EdgeClient(tmp_path, indexer=False)
    try:
        GalleryStore(edge, serialise=False).create("g", 8)
        assert set(INDEXED) <= set(edge._collection("g").shard.info().payload_schema)
    finally:
        edge.close()


def test_a_spooled_batch_is_on_disk_before_it_is_handed_over_at_power(tmp_path,
                                                                        monkeypatch) -> None:
    """At ``power`` a worker's batch file and its folder are synced before ``write_batch``
    returns (the applier may delete it once its write is durable); at ``process`` they are
    not. The batch reads back the same either way."""
    from service.vectors.spool import read_batch, write_batch
    from service.vectors.writer import Batch

    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    v = np.eye(4, dtype=np.float32)
    batch = Batch("backfill", "v2", [{"id": "a", "etag": "e"}], {"s": [{"image": v[1]}]})
    path = write_batch(tmp_path, "0000-000000000", batch, durable=True)
    assert len(synced) == 2  # the file, then the folder that names it
    assert np.array_equal(read_batch(path).vectors["s"][0]["image"], v[1])
    write_batch(tmp_path, "0000-000000001", batch)
    assert len(synced) == 2
