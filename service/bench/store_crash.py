"""``bench store``'s crash test: a process serving the store is SIGKILLed at random points
(while it writes, deletes, indexes off the process, swaps the indexed copy in, moves an
alias), and after each kill the store is reopened and checked against every operation
the process acknowledged; on Edge, ``store move`` is also killed part way and must be
refused until it is run again, then hold every point of its source.

The writer prints each operation once its call has returned (acknowledged) as a JSON
line: ``put`` (fresh ids, or existing ids rewritten, with the seed their vectors come
from), ``del`` (ids deleted), ``alias`` (the gallery's alias moved to a collection) and
``phase`` (what it is about to do: the kill's place, with what a rewrite writes). The
reference model replays the acknowledged operations; an operation in flight at the kill
may have happened or not, so an id it touched may hold its old or its new state, never
anything else, and after the check the reference takes on the state found (``settle``). Ids are never
written again once deleted, so a deleted point found after a reopen is one brought back.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

READY_TIMEOUT_S = 120.0  # the longest a writer may take to start before it is killed anyway

WRITER = """
import json, sys, threading
from pathlib import Path
import numpy as np
from service.bench.store_crash import vectors
from service.state.gallery import GalleryStore, Item
from service.state.gallery.client import open_embedded
from service.state.gallery.edge import EdgeClient

engine, path, dim, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
client = (EdgeClient(path, indexer=False, indexing_threshold_kb=1) if engine == "edge"
          else open_embedded("local", path))
store = GalleryStore(client, serialise=engine == "local")
store.create("g", dim)
rng = np.random.default_rng(seed)
say = threading.Lock()

def ack(**op):
    with say:
        print(json.dumps(op), flush=True)

ack(op="ready")  # started (imports, open): the kill's clock starts here

def put(collection, ids, vseed):
    v = vectors(vseed, len(ids), dim)
    store.upsert(collection, [Item(i, {"image": v[n]}) for n, i in enumerate(ids)], "v", "s")
    ack(op="put", collection=collection, ids=ids, seed=vseed)

live = {c: [] for c in [store.collection_of("g")]}
fresh, extra = seed * 10_000_000, seed * 10_000_000 + 5_000_000
def step():
    global fresh, extra
    collection = store.collection_of("g")
    ids = live.setdefault(collection, [])
    roll = rng.random()
    if roll < 0.55 or len(ids) < 200:
        new = [f"p{fresh + n}" for n in range(100)]
        fresh += 100
        ack(op="phase", what="write", ids=new)
        put(collection, new, int(rng.integers(1 << 30)))
        ids += new
    elif roll < 0.7:
        pick = [ids[i] for i in sorted(rng.choice(len(ids), 50, replace=False))]
        vseed = int(rng.integers(1 << 30))
        ack(op="phase", what="rewrite", ids=pick, collection=collection, seed=vseed)
        put(collection, pick, vseed)
    elif roll < 0.82:
        gone = [ids[i] for i in sorted(rng.choice(len(ids), 30, replace=False))]
        ack(op="phase", what="delete", ids=gone, collection=collection)
        store.delete(collection, gone)
        ack(op="del", collection=collection, ids=gone)
        for i in gone:
            ids.remove(i)
    elif roll < 0.92 and engine == "edge":
        ack(op="phase", what="build", ids=[])  # writes go on from another thread meanwhile
        done = threading.Event()
        def during():
            global extra
            n = 0
            while not done.is_set() and n < 5:
                new = [f"p{extra + k}" for k in range(20)]
                extra += 20
                put(collection, new, int(rng.integers(1 << 30)))
                n += 1
        t = threading.Thread(target=during)
        t.start()
        store.client.optimize(collection)
        done.set()
        t.join()
        ack(op="phase", what="built", ids=[])
    else:
        move = ids[-100:]
        ack(op="phase", what="alias", ids=[])  # a new side: nothing acknowledged in it yet
        side = store.create_side("g", dim)
        put(side, move, int(rng.integers(1 << 30)))
        store.point_alias("g", side)
        ack(op="alias", collection=side)
        live[side] = list(move)

while True:
    step()
"""


def vectors(seed: int, n: int, dim: int) -> np.ndarray:
    v = np.random.default_rng([seed, 11]).normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


class Reference:
    """The acknowledged state: per collection, each id's vector seed (its row in the
    batch), the ids deleted, the gallery's alias; and what the operation in flight may
    have changed."""

    def __init__(self) -> None:
        self.points: dict[str, dict[str, tuple[int, int]]] = {}
        self.deleted: dict[str, set[str]] = {}
        self.alias: str | None = None

    def apply(self, op: dict[str, Any]) -> None:
        if op["op"] == "put":
            held = self.points.setdefault(op["collection"], {})
            for n, i in enumerate(op["ids"]):
                held[i] = (op["seed"], n)
        elif op["op"] == "del":
            held = self.points.setdefault(op["collection"], {})
            for i in op["ids"]:
                held.pop(i, None)
                self.deleted.setdefault(op["collection"], set()).add(i)
        elif op["op"] == "alias":
            self.alias = op["collection"]


def check(store: Any, ref: Reference, dim: int, in_flight: set[str],
          side: str | None = None) -> dict[str, int]:
    """Lost: acknowledged points missing or with another vector (``in_flight`` ids may
    hold a newer one); back: deleted points found again; alias: 1 when the gallery's
    alias is not the last acknowledged one (or, with "alias" in flight, ``side``: the
    collection the alias step in flight was moving it to)."""
    lost = back = 0
    for collection, held in ref.points.items():
        if not held and collection not in ref.deleted:
            continue
        ids = sorted(held)
        got = store.vectors(collection, ids + sorted(ref.deleted.get(collection, ())))
        cache: dict[int, np.ndarray] = {}
        for i in ids:
            seed, row = held[i]
            if seed not in cache:  # a batch is at most 100 points: row ``row`` of its seed
                cache[seed] = vectors(seed, 100, dim)
            if i not in got:
                lost += i not in in_flight
            elif not np.allclose(got[i]["image"], cache[seed][row], atol=1e-5) \
                    and i not in in_flight:
                lost += 1
        back += sum(1 for i in ref.deleted.get(collection, ()) if i in got)
    alias = 0
    allowed = {ref.alias, *([side] if "alias" in in_flight and side else [])}
    if ref.alias is not None and store.collection_of("g") not in allowed:
        alias = 1
    return {"lost": lost, "back": back, "alias": alias}


def settle(store: Any, ref: Reference, step: dict[str, Any], dim: int,
           side: str | None = None) -> None:
    """After a kill's check, the reference takes on what the step in flight did (it may
    have happened or not, and ``check`` allowed either): the rewritten ids that hold the
    step's new vectors are rewritten, the deleted ids that are gone are deleted, and the
    alias is where the store has it (the old collection or ``side``). Without this, a
    step that landed before its acknowledgement was printed would be counted lost at
    every later check."""
    what, collection = step.get("what"), step.get("collection")
    if what == "rewrite" and collection is not None:
        got = store.vectors(collection, list(step["ids"]))
        v = vectors(int(step["seed"]), len(step["ids"]), dim)
        held = ref.points.setdefault(collection, {})
        for n, i in enumerate(step["ids"]):
            if i in got and np.allclose(got[i]["image"], v[n], atol=1e-5):
                held[i] = (int(step["seed"]), n)
    elif what == "delete" and collection is not None:
        got = store.vectors(collection, list(step["ids"]))
        ref.apply({"op": "del", "collection": collection,
                   "ids": [i for i in step["ids"] if i not in got]})
    elif what == "alias" and side is not None and store.collection_of("g") == side:
        ref.alias = side


def crash(engine: str, work: Path, dim: int, kills: int, seed: int = 0) -> dict[str, Any]:
    """``kills`` SIGKILLs of the writer at random points, each followed by a reopen and a
    check of every acknowledged operation so far; on Edge, every fifth kill is of a
    ``store move`` instead (``move_kill``)."""
    from service.state.gallery import GalleryStore
    from service.state.gallery.client import open_embedded
    from service.state.gallery.edge import EdgeClient

    path = work / f"crash-{engine}"
    shutil.rmtree(path, ignore_errors=True)
    rng = np.random.default_rng(seed)
    ref = Reference()
    totals = {"lost": 0, "back": 0, "alias": 0}
    phases: dict[str, int] = {}
    acked_ops = 0
    moves = {"killed": 0, "refused": 0, "redone_equal": 0}
    for k in range(kills):
        if engine == "edge" and k % 5 == 4:
            moved = move_kill(work / f"move-{k}", int(rng.integers(1, 11)))
            for key in moves:
                moves[key] += moved[key]
            continue
        proc = subprocess.Popen([sys.executable, "-c", WRITER, engine, str(path), str(dim),
                                 str(k + 1)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        ops: list[dict[str, Any]] = []
        ready = threading.Event()
        reader = threading.Thread(target=_read_ops, args=(proc.stdout, ops, ready))
        reader.start()
        # at a random point of its work, however long its start (imports, open) took
        ready.wait(READY_TIMEOUT_S)
        time.sleep(float(rng.uniform(0.5, 4.0)))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        reader.join()
        phase = next((o["what"] for o in reversed(ops) if o["op"] == "phase"), "start")
        phases[phase] = phases.get(phase, 0) + 1
        # the step in flight may have rewritten or deleted the ids it named, or moved the
        # alias; nothing else
        at = max((n for n, o in enumerate(ops) if o["op"] == "phase"), default=None)
        last = ops[at] if at is not None else {"ids": []}
        in_flight: set[str] = set(last.get("ids", ()))
        side = None
        if phase == "alias":
            in_flight.add("alias")  # the side it moves to: its put, acknowledged after
            side = next((o["collection"] for o in ops[at + 1:] if o["op"] == "put"), None)
        for o in ops:
            if o["op"] not in ("phase", "ready"):
                ref.apply(o)
                acked_ops += 1
        client = (EdgeClient(path, indexer=False) if engine == "edge"
                  else open_embedded("local", str(path)))
        store = GalleryStore(client, serialise=engine == "local")
        try:
            found = check(store, ref, dim, in_flight, side)
            settle(store, ref, last, dim, side)
        finally:
            store.close()
        for key in totals:
            totals[key] += found[key]
    shutil.rmtree(path, ignore_errors=True)
    return {"engine": engine, "kills": kills, "acknowledged_ops": acked_ops,
            "acknowledged_points": sum(len(h) for h in ref.points.values()),
            "deleted": sum(len(d) for d in ref.deleted.values()), "phases": phases,
            "moves": moves, **totals}


def _read_ops(stream: Any, into: list[dict[str, Any]], ready: threading.Event) -> None:
    """Every whole line the writer printed (one cut by the kill is not acknowledged);
    ``ready`` is set once it said it started (or its output ended)."""
    try:
        for line in stream:
            if line.endswith("\n"):
                into.append(json.loads(line))
                if into[-1]["op"] == "ready":
                    ready.set()
    finally:
        ready.set()


def move_kill(work: Path, after_lines: int) -> dict[str, int]:
    """A local-mode store (3 collections, an alias) moved to Edge by the real command,
    killed once it has said ``after_lines`` steps (of 10: 6 pages, the check, 3 index
    builds): the target must be refused (or, if the move had ended, equal); the command
    run again must end with every point equal."""
    from qdrant_client import QdrantClient

    from service.state.errors import Unavailable
    from service.state.gallery import GalleryStore, Item
    from service.state.gallery.edge import EdgeClient

    shutil.rmtree(work, ignore_errors=True)
    data = work / "data"
    local = GalleryStore(QdrantClient(path=str(data / "qdrant")), serialise=True)
    local.create("g", 32)
    prints = {}
    for c in range(3):
        name = local.collection_of("g") if c == 0 else local.create_side("g", 32)
        v = vectors(c, 1500, 32)
        local.upsert(name, [Item(f"m{n}", {"image": v[n]}) for n in range(1500)], "v", "s")
        prints[name] = local.fingerprint(name)
    local.close()
    cmd = [sys.executable, "-c", "import sys; from training.cli import main; sys.exit(main())",
           "store", "move", "--data-dir", str(data)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for _ in range(after_lines):
        if not proc.stderr.readline():
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    out = {"killed": 1, "refused": 0, "redone_equal": 0}
    target = data / "qdrant-edge"
    if target.exists():
        try:
            EdgeClient(target, indexer=False).close()
        except Unavailable:
            out["refused"] = 1
    if out["refused"] or not target.exists():
        subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    store = GalleryStore(EdgeClient(target, indexer=False), serialise=False)
    out["redone_equal"] = int({c: store.fingerprint(c) for c in prints} == prints)
    store.close()
    shutil.rmtree(work, ignore_errors=True)
    return out
