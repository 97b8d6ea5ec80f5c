"""The crash windows of the embedded engine's off-process index build
(``service/state/gallery/edge.py``), each hit deterministically: a real process serving a
real Edge store is SIGKILLed at an injected point of the build (the copy, the child's
index, the rename of the copy to its generation, the replay of the journal, the catalog
naming the new generation, the removal of the old one, writes on the new one, a second
generation) or of the next open's cleanup; the store is reopened and every acknowledged
operation checked with the crash test's own reference (``service.bench.store_crash``).

And the crash test's reference itself: an operation in flight at a kill that did land (a
rewrite or a delete applied before its acknowledgement was printed) is excused at that
kill's check, and the reference then takes on the state found (``settle``); before it
did, every later check counted those points as lost again. That was the 1,150 points a
30-kill run reported lost: one rewrite of 50 points that landed at the first of its 24
writer kills, counted at each of the 23 checks after it (50 x 23 = 1,150)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from service.bench.store_crash import Reference, check, settle, vectors
from service.state.gallery import GalleryStore, Item
from service.state.gallery.edge import EdgeClient

REPO = Path(__file__).resolve().parents[1]
DIM = 16

# A process serving the store: 300 points, then index builds (``builds`` of them), each
# with writes made while its child indexes (journaled: new points, a rewrite, a delete)
# and writes after it (on the new generation); it SIGKILLs itself at ``point`` of build
# ``at`` (or after its last writes: "end"). Each acknowledged operation is printed as the
# crash test's writer prints it; "killing" says the kill point was reached.
GATEWAY = r"""
import json, os, shutil, signal, subprocess, sys
from pathlib import Path
from service.bench.store_crash import vectors
from service.state.gallery import GalleryStore, Item
from service.state.gallery import edge as E

root, point, at, builds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
store = GalleryStore(E.EdgeClient(root, indexer=False, indexing_threshold_kb=1), False)
store.create("g", 16)
col = store.collection_of("g")
state = {"build": 0, "named": None, "seed": 100, "fresh": 0}

def ack(**op):
    print(json.dumps(op), flush=True)

def die(where):
    ack(op="phase", what="killing", at=where)
    os.kill(os.getpid(), signal.SIGKILL)

def here(where):
    if point == where and state["build"] == at:
        die(where)

def put(ids):
    state["seed"] += 1
    v = vectors(state["seed"], len(ids), 16)
    store.upsert(col, [Item(i, {"image": v[n]}) for n, i in enumerate(ids)], "v", "s")
    ack(op="put", collection=col, ids=ids, seed=state["seed"])

def new(n):
    ids = [f"p{state['fresh'] + k}" for k in range(n)]
    state["fresh"] += n
    return ids

live = []
def writes(n_new):  # new points, a rewrite of 50 and a delete of 30 of those held
    for k in range(0, n_new, 100):  # batches of 100 at most, as the crash test's
        ids = new(min(100, n_new - k))
        put(ids)
        live.extend(ids)
    put(live[:50])
    gone = live[50:80]
    store.delete(col, gone)
    ack(op="del", collection=col, ids=gone)
    del live[50:80]

real_copytree, real_rename, real_rmtree = shutil.copytree, os.rename, shutil.rmtree
def copytree(src, dst, *a, **k):
    out = real_copytree(src, dst, *a, **k)
    here("copied")
    return out
def rename(src, dst):
    real_rename(src, dst)
    if "/indexed/" in str(dst):
        here("renamed")
def rmtree(path, *a, **k):
    if state["named"] is not None and Path(path) == state["named"]:
        here("retiring")  # the old generation, before any of it is removed
        real_rmtree(Path(path) / "segments", ignore_errors=True)
        here("half-retired")  # part of it removed
    return real_rmtree(path, *a, **k)
E.shutil.copytree, E.os.rename, E.shutil.rmtree = copytree, rename, rmtree

class Popen(subprocess.Popen):  # the writes made while the copy is indexed: journaled
    def communicate(self, *a, **k):
        writes(20)
        out = super().communicate(*a, **k)
        here("built")
        return out
E.subprocess.Popen = Popen

real_name_path = E.EdgeClient._name_path
def name_path(self, name, c, path):
    here("replayed")  # the new generation loaded, replayed and flushed; the catalog old
    before = c.path
    real_name_path(self, name, c, path)
    state["named"] = before
    here("named")  # the catalog names the new generation; the handle not switched yet
E.EdgeClient._name_path = name_path

writes(300)
for b in range(1, builds + 1):
    state["build"], state["named"] = b, None
    store.client.optimize(col)
    here("switched")
    writes(100)  # on the new generation
    here("served")
die("end")
"""

# An open killed in its cleanup: at its first removal of a directory the catalog does
# not name (a generation the kill before left), before any of it is removed.
REOPEN = r"""
import os, shutil, signal, sys
from service.state.gallery import edge as E
real = shutil.rmtree
def rmtree(path, *a, **k):
    print("killing", path, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
E.shutil.rmtree = rmtree
E.EdgeClient(sys.argv[1], indexer=False)
print("opened", flush=True)
"""


def _serve(root: Path, point: str, at: int, builds: int, ref: Reference) -> None:
    """Run ``GATEWAY`` to its kill; every acknowledged operation into ``ref``."""
    proc = subprocess.run([sys.executable, "-c", GATEWAY, str(root), point, str(at),
                           str(builds)], cwd=REPO, capture_output=True, text=True, check=False,
                          timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    ops = [json.loads(line) for line in proc.stdout.splitlines() if line.endswith("}")]
    assert ops and ops[-1] == {"op": "phase", "what": "killing", "at": point}, \
        proc.stderr[-3000:]
    for op in ops:
        if op["op"] != "phase":
            ref.apply(op)


def _checked(root: Path, ref: Reference) -> dict[str, int]:
    """Every acknowledged operation checked in the reopened store (nothing was in flight:
    each kill came between operations); what the open left on disk."""
    store = GalleryStore(EdgeClient(root, indexer=False), serialise=False)
    try:
        found = check(store, ref, DIM, set())
        serving = {c.path for c in store.client._open.values()}
    finally:
        store.close()
    strays = [p for p in [*(root / "collections").iterdir(), *(root / "indexed").glob("*/*")]
              if p not in serving]
    assert not strays and not (root / "building").exists()
    return found


@pytest.mark.parametrize(("point", "at", "builds"), [
    ("copied", 1, 1),  # the shard copied, the child not started
    ("built", 1, 1),  # the copy indexed, writes made meanwhile only in the journal's shard
    ("renamed", 1, 1),  # the copy moved to its generation directory
    ("replayed", 1, 1),  # the generation loaded, brought up to date, flushed
    ("named", 1, 1),  # the catalog names it, the handle is not switched
    ("retiring", 1, 1),  # switched; the old shard about to be removed
    ("half-retired", 1, 1),  # part of the old shard removed
    ("served", 1, 1),  # writes on the new generation
    ("renamed", 2, 2),  # a second generation, from the first
    ("named", 2, 2),
    ("end", 0, 2),  # two generations, writes on the second
])
def test_a_kill_anywhere_in_an_index_build_loses_no_acknowledged_write(
        tmp_path, point, at, builds) -> None:
    root, ref = tmp_path / "store", Reference()
    _serve(root, point, at, builds, ref)
    assert sum(len(h) for h in ref.points.values()) >= 250
    assert _checked(root, ref) == {"lost": 0, "back": 0, "alias": 0}


def test_a_kill_in_the_cleanup_of_the_open_after_a_build_kill_loses_nothing(tmp_path) -> None:
    """The gateway killed once the catalog names the new generation (the old one left on
    disk), then its restart killed as its open removes that old generation: the next open
    serves the named generation with every acknowledged write."""
    root, ref = tmp_path / "store", Reference()
    _serve(root, "named", 1, 1, ref)
    proc = subprocess.run([sys.executable, "-c", REOPEN, str(root)], cwd=REPO, check=False,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL and "killing" in proc.stdout, proc.stderr
    assert _checked(root, ref) == {"lost": 0, "back": 0, "alias": 0}


@pytest.mark.parametrize("in_flight_op", ["rewrite", "delete"])
def test_an_operation_in_flight_at_a_kill_is_never_counted_lost_later(
        tmp_path, in_flight_op) -> None:
    """The crash test's bookkeeping over three kills, without a real kill: 200 points
    acknowledged, then a rewrite of 50 (or a delete of 30) that Edge applied but whose
    acknowledgement the kill cut off (the writer printed its phase line, not its ``put``
    or ``del``). It is excused at that kill's check; the next two kills' checks (in
    other phases) must not count it either: the store holds one of the two states the
    operation allowed, and nothing was lost."""
    store = GalleryStore(EdgeClient(tmp_path, indexer=False), serialise=False)
    store.create("g", DIM)
    col = store.collection_of("g")
    assert col is not None
    ref = Reference()
    ids = [f"p{n}" for n in range(200)]
    for start, seed in ((0, 1), (100, 2)):
        batch, v = ids[start:start + 100], vectors(seed, 100, DIM)
        store.upsert(col, [Item(i, {"image": v[n]}) for n, i in enumerate(batch)], "v", "s")
        ref.apply({"op": "put", "collection": col, "ids": batch, "seed": seed})
    if in_flight_op == "rewrite":
        pick, v = ids[::4], vectors(3, 50, DIM)
        store.upsert(col, [Item(i, {"image": v[n]}) for n, i in enumerate(pick)], "v", "s")
    else:
        pick = ids[::5][:30]
        store.delete(col, pick)
    store.close()  # the kill: the operation applied, its acknowledgement never printed
    step = ({"what": "rewrite", "ids": pick, "collection": col, "seed": 3}
            if in_flight_op == "rewrite" else {"what": "delete", "ids": pick, "collection": col})
    lost = []
    for in_flight in (set(pick), {"p-other"}, {"p-other"}):  # this kill's, then the next two
        store = GalleryStore(EdgeClient(tmp_path, indexer=False), serialise=False)
        lost.append(check(store, ref, DIM, in_flight)["lost"])
        if in_flight == set(pick):
            settle(store, ref, step, DIM)  # as the crash test does after each kill's check
        store.close()
    assert lost == [0, 0, 0]  # [0, 50, 50] (rewrite) or [0, 30, 30] (delete) unsettled
    if in_flight_op == "delete":
        assert set(pick) <= ref.deleted[col]  # and a point brought back would now count
    else:
        assert all(ref.points[col][i] == (3, n) for n, i in enumerate(pick))
