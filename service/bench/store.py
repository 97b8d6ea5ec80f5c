"""``nobackfill bench store``: the embedded engines side by side, through ``GalleryStore``
(the service's own calls), on synthetic galleries of N points with two named 512-d
vectors and a gallery's payload.

Vectors: L2-normalised, clustered like embeddings (1,024 random centres; each point
``normalise(centre + 1.2 * noise / sqrt(D))``, cosine to its centre about 0.64), drawn
chunk by chunk from a seed, so the parent computes the exact answers by streaming the
same chunks and each engine's process holds only what the engine holds. Queries: 200
stored image vectors plus noise.

Per engine and size, in a process of its own: bulk load (1,000 points a call), index
(Edge's ``optimize``; local mode has none), a backfill's write (10,000 points rewritten,
256 a call; on Edge, searches while they are indexed, off the process and in it), a migration's read (retrieve by id, 256 a call; scroll with vectors),
search p50/p99 at 1 client and QPS at 8 client threads with recall@10 against exact
search (mean and its standard error over the queries), a filtered search (a payload key
matching 1/10 of the points), the writes' rate at each durability level (``process``,
``power``: 256-point calls, and 1-point calls from 4 threads at once, where ``power``'s
flushes are shared), reopen time (close, drop the page cache when the machine allows it,
open, first search), RSS and disk. Then the crash test per engine
(``service/bench/store_crash.py``): a serving process SIGKILLed at random points (writes,
deletes, index builds and swaps, alias moves; on Edge also ``store move``), every
acknowledged operation checked after each reopen.

Local mode above ``--local-max`` points is skipped and said so (pure Python: its own
docs advise against more than 20,000 points).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from service.bench.store_crash import crash
from training.console import report_command

DIM = 512
CENTRES = 1024
SPREAD = 1.2
CHUNK = 10_000


def chunk_vectors(seed: int, chunk: int, n: int, dim: int, kind: str) -> np.ndarray:
    """Rows [chunk * CHUNK, chunk * CHUNK + n) of the ``kind`` vectors (deterministic)."""
    centres = np.random.default_rng([seed, 0]).normal(size=(CENTRES, dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    rng = np.random.default_rng([seed, 1 if kind == "image" else 2, chunk])
    picks = rng.integers(0, CENTRES, n)
    v = centres[picks] + SPREAD * rng.normal(size=(n, dim)).astype(np.float32) / np.sqrt(dim)
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def chunks(points: int) -> list[tuple[int, int]]:
    return [(c, min(CHUNK, points - c * CHUNK)) for c in range((points + CHUNK - 1) // CHUNK)]


def queries_and_truth(seed: int, points: int, dim: int, queries: int,
                      ) -> tuple[np.ndarray, list[list[str]]]:
    """Noisy copies of random stored image vectors, and their exact top 10 ids."""
    rng = np.random.default_rng([seed, 3])
    pick = np.sort(rng.choice(points, queries, replace=False))
    q = np.zeros((queries, dim), np.float32)
    for c, n in chunks(points):
        rows = pick[(pick >= c * CHUNK) & (pick < c * CHUNK + n)]
        if len(rows):
            v = chunk_vectors(seed, c, n, dim, "image")
            q[np.searchsorted(pick, rows)] = v[rows - c * CHUNK]
    q += 0.5 * rng.normal(size=q.shape).astype(np.float32) / np.sqrt(dim)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    best_s = np.full((queries, 10), -np.inf, np.float32)
    best_i = np.zeros((queries, 10), np.int64)
    for c, n in chunks(points):
        s = q @ chunk_vectors(seed, c, n, dim, "image").T
        top = np.argpartition(-s, min(10, n - 1), axis=1)[:, :10]
        s_all = np.concatenate([best_s, np.take_along_axis(s, top, 1)], 1)
        i_all = np.concatenate([best_i, top + c * CHUNK], 1)
        order = np.argsort(-s_all, axis=1)[:, :10]
        best_s, best_i = np.take_along_axis(s_all, order, 1), np.take_along_axis(i_all, order, 1)
    return q, [[f"p{i}" for i in row] for row in best_i]


# ------------------------------------------------------------------ one engine, one size
EF_SWEEP = (64, 128, 256, 512)
# Edge indexes its appendable segments when asked, one graph per segment: indexing every
# INDEX_EVERY points of a bulk load (as the store's indexer does when a load pauses) keeps
# each graph at about INDEX_EVERY / 2 points (two appendable segments), where one index
# at the end makes two graphs of N / 2 points, with a lower recall at the same ef
INDEX_EVERY = 100_000


def _open(engine: str, path: Path, **edge_options: Any) -> Any:
    """A ``GalleryStore`` on ``engine`` at ``path``; ``edge_options``: ``EdgeClient``'s
    ``hnsw``, ``search_ef``, ``segments`` (None: the store's)."""
    from service.state.gallery import GalleryStore
    from service.state.gallery.client import open_embedded
    from service.state.gallery.edge import EdgeClient

    client = (EdgeClient(path, indexer=False, **edge_options) if engine == "edge"
              else open_embedded("local", str(path)))
    return GalleryStore(client, serialise=True)


def _items(seed: int, c: int, n: int, dim: int) -> list[Any]:
    from service.state.gallery.store import Item

    image, text = chunk_vectors(seed, c, n, dim, "image"), chunk_vectors(seed, c, n, dim, "text")
    base = c * CHUNK
    return [Item(f"p{base + r}", {"image": image[r], "text": text[r]},
                 payload={"caption": f"a synthetic caption number {base + r}",
                          "group": (base + r) % 10},
                 origin={"text": f"a synthetic caption number {base + r}",
                         "image": f"/data/images/{base + r:08d}.png"})
            for r in range(n)]


def _searches(store: Any, queries: np.ndarray, truth: list[list[str]]) -> dict[str, float]:
    """p50/p99 (ms) of one search per query at 1 client, and recall@10 against ``truth``
    with its standard error over the queries (each query an independent draw)."""
    lat, recalls = [], []
    for v, want in zip(queries, truth):
        t = time.perf_counter()
        hits = store.search("g", v, "image", 10)
        lat.append(time.perf_counter() - t)
        recalls.append(len({h.id for h in hits} & set(want)) / 10)
    return {"p50_ms": round(_pct(lat, 50), 2), "p99_ms": round(_pct(lat, 99), 2),
            "recall_at_10": round(float(np.mean(recalls)), 4),
            "recall_se": round(float(np.std(recalls, ddof=1) / np.sqrt(len(recalls)))
                               if len(recalls) > 1 else 0.0, 4)}


def _search_during(store: Any, queries: np.ndarray, build: Any) -> dict[str, float]:
    """Searches one after another at 1 client while ``build`` runs in another thread: the
    build's seconds, the searches made, their p50/p99/max (ms)."""
    lat: list[float] = []
    took: list[float] = []

    def timed() -> None:
        t = time.perf_counter()
        build()
        took.append(time.perf_counter() - t)
    th = threading.Thread(target=timed)
    last = time.perf_counter()
    th.start()
    while True:  # at least one; each the time since the previous one ended (from the
        # build's start for the first), so that a build holding the GIL counts wherever
        store.search("g", queries[len(lat) % len(queries)], "image", 10)
        alive = th.is_alive()
        now = time.perf_counter()
        lat.append(now - last)
        last = now
        if not alive:
            break
    th.join()
    return {"index_s": round(took[0], 1), "searches": len(lat),
            "p50_ms": round(_pct(lat, 50), 2), "p99_ms": round(_pct(lat, 99), 2),
            "max_ms": round(max(lat) * 1e3, 1)}


def _set_durability(engine: str, store: Any, level: str) -> None:
    if engine == "edge":
        store.client.durability = level
    else:  # local mode's SQLite commits (``tune_local_writes``)
        store.client.nobackfill_durability = level


def _durability_rates(engine: str, store: Any, seed: int, rewrite: int, dim: int,
                      ) -> dict[str, Any]:
    """Writes per second at ``process`` and ``power``: existing points rewritten 256 a
    call from one thread, and 1-point calls from 4 threads at once (1,000 in all)."""
    out: dict[str, Any] = {}
    items = _items(seed + 5, 0, rewrite, dim)
    for level in ("process", "power"):
        _set_durability(engine, store, level)
        before = getattr(store.client, "syncs", 0)
        t = time.perf_counter()
        for i in range(0, rewrite, 256):
            store.upsert("g", items[i:i + 256], "v2", "t")
        batched = rewrite / (time.perf_counter() - t)

        def one_by_one(rows: range) -> None:
            for r in rows:
                store.upsert("g", [items[r]], "v2", "t")
        threads = [threading.Thread(target=one_by_one, args=(range(k, 1000, 4),))
                   for k in range(4)]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        out[level] = {"batched_per_s": round(batched),
                      "single_4_threads_per_s": round(1000 / (time.perf_counter() - t)),
                      "flushes": getattr(store.client, "syncs", 0) - before}
    _set_durability(engine, store, "process")
    return out


def _drop_page_cache() -> bool:
    """Drop the kernel's page cache (root on Linux), so a reopen reads from disk; False
    when this machine does not allow it (the reopen is then timed warm)."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1e3, q))


def _memory_mb() -> dict[str, int]:
    """This process's resident set: all of it, and the part that is not mapped files
    (Edge maps its segments: those pages are the page cache's, which the kernel can
    reclaim)."""
    fields = {"VmRSS": "rss_mb", "RssAnon": "anon_mb"}
    out = {}
    with open("/proc/self/status") as status:
        for line in status:
            name = line.split(":")[0]
            if name in fields:
                out[fields[name]] = round(int(line.split()[1]) / 1024)
    return out


def _disk_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def case(engine: str, points: int, dim: int, work: Path, seed: int, clients: int,
         truth_file: Path, hnsw: str = "", search_ef: int = 0, segments: int = 0,
         ) -> dict[str, Any]:
    """One engine at one size (run in a process of its own); ``hnsw`` "m,ef" or "";
    ``search_ef``, ``segments``: 0 for Qdrant's."""
    options = {"hnsw": tuple(int(x) for x in hnsw.split(",")) if hnsw else None,
               "search_ef": search_ef or None, "segments": segments or None}
    data = np.load(truth_file)
    q, truth = data["q"], [list(r) for r in data["truth"]]
    path = work / f"{engine}-{points}"
    shutil.rmtree(path, ignore_errors=True)
    out: dict[str, Any] = {"engine": engine, "points": points, "dim": dim}
    store = _open(engine, path, **options)
    store.create("g", dim)
    load = index = 0.0
    for c, n in chunks(points):
        t = time.perf_counter()
        items = _items(seed, c, n, dim)
        for i in range(0, n, 1000):
            store.upsert("g", items[i:i + 1000], "v1", "s")
        load += time.perf_counter() - t
        if engine == "edge" and ((c + 1) * CHUNK) % INDEX_EVERY == 0:
            t = time.perf_counter()  # index what is written so far: segments of this size
            store.client.optimize(store.collection_of("g"))
            index += time.perf_counter() - t
    t = time.perf_counter()
    if engine == "edge":
        store.client.optimize(store.collection_of("g"))
        out["indexed"] = store.client.indexed(store.collection_of("g"))
    out["load_s"], out["index_s"] = round(load, 1), round(index + time.perf_counter() - t, 1)
    # searches, on the loaded (and indexed) gallery
    first = _searches(store, q, truth)
    out.update(search_p50_ms=first["p50_ms"], search_p99_ms=first["p99_ms"],
               recall_at_10=first["recall_at_10"], recall_se=first["recall_se"])
    if engine == "edge":  # the search's ef against recall and latency, on the same index
        sweep = {}
        for ef in EF_SWEEP:
            store.client.search_ef = ef
            sweep[ef] = _searches(store, q, truth)
        out["ef_sweep"] = sweep
        store.client.search_ef = options["search_ef"]
    done, errors = [0], []

    def client_loop(rows: np.ndarray) -> None:
        try:
            for v in rows:
                store.search("g", v, "image", 10)
                done[0] += 1
        except Exception as exc:  # noqa: BLE001 (counted and reported)
            errors.append(repr(exc))
    threads = [threading.Thread(target=client_loop, args=(q[k::clients],))
               for k in range(clients)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    out[f"qps_{clients}_clients"] = round(done[0] / (time.perf_counter() - t), 1)
    out["errors"] = len(errors)
    flat = []
    for v in q[:100]:
        t = time.perf_counter()
        store.search("g", v, "image", 10, where={"group": 3})
        flat.append(time.perf_counter() - t)
    out["filtered_p50_ms"] = round(_pct(flat, 50), 2)
    # a backfill's write: 10,000 existing points rewritten with new vectors, 256 a call
    rewrite = min(10_000, points)
    items = _items(seed + 1, 0, rewrite, dim)
    t = time.perf_counter()
    for i in range(0, rewrite, 256):
        store.upsert("g", items[i:i + 256], "v2", "t")
    out["update_per_s"], out["rewritten"] = round(rewrite / (time.perf_counter() - t)), rewrite
    out["durability"] = _durability_rates(engine, store, seed, rewrite, dim)
    if engine == "edge":  # searches while the rewritten points are indexed: off the
        # process (the store's way) and, for comparison, in it (holding the GIL)
        collection = store.collection_of("g")
        out["during_index"] = _search_during(store, q, lambda: store.client.optimize(
            collection))
        # the build's steps: each of flush, load, new_flush and close holds the
        # interpreter lock through one call, so the slowest search waits for the longest
        out["during_index"]["steps"] = dict(store.client.last_build)
        again = _items(seed + 2, 0, rewrite, dim)
        for i in range(0, rewrite, 256):
            store.upsert("g", again[i:i + 256], "v3", "t")
        out["during_index_in_process"] = _search_during(store, q, lambda: store.client.optimize(
            collection, off_process=False))
    ids = [f"p{i}" for i in np.random.default_rng(seed).choice(points, rewrite, replace=False)]
    t = time.perf_counter()
    for i in range(0, rewrite, 256):
        store.stored("g", ids[i:i + 256])
    out["retrieve_per_s"] = round(rewrite / (time.perf_counter() - t))
    t, scanned = time.perf_counter(), 0
    for page_ids, _ in store.scan_vectors("g"):
        scanned += len(page_ids)
        if scanned >= 50_000:
            break
    out["scroll_per_s"] = round(scanned / (time.perf_counter() - t))
    out.update(_memory_mb())
    store.close()
    out["disk_mb"] = round(_disk_mb(path))
    out["reopen_cache"] = "cold" if _drop_page_cache() else "warm"
    t = time.perf_counter()
    store = _open(engine, path, **options)
    store.search("g", q[0], "image", 10)
    out["reopen_s"] = round(time.perf_counter() - t, 2)
    assert store.count("g") == points, "points lost across reopen"
    store.close()
    shutil.rmtree(path, ignore_errors=True)
    return out


# ------------------------------------------------------------------ the command
def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in str(args.points).split(",")]
    engines = args.engines.split(",")
    rows, skipped = [], []
    for points in sizes:
        t = time.perf_counter()
        q, truth = queries_and_truth(args.seed, points, args.dim, args.queries)
        truth_file = work / f"truth-{points}.npz"
        np.savez(truth_file, q=q, truth=np.asarray(truth))
        print(f"[store] exact answers for {points:,} points in "
              f"{time.perf_counter() - t:.0f} s", file=sys.stderr)
        for engine in engines:
            if engine == "local" and points > args.local_max:
                skipped.append(f"local mode at {points:,} points (above --local-max "
                               f"{args.local_max:,})")
                continue
            code = ("import json, sys; from pathlib import Path; "
                    "from service.bench.store import case; "
                    "print(json.dumps(case(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), "
                    "Path(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), Path(sys.argv[7]), "
                    "sys.argv[8], int(sys.argv[9]), int(sys.argv[10]))))")
            t = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", code, engine, str(points),
                                   str(args.dim), str(work), str(args.seed), str(args.clients),
                                   str(truth_file), args.hnsw, str(args.search_ef),
                                   str(args.segments)], check=False, capture_output=True,
                                  text=True)
            if done.returncode != 0:
                raise RuntimeError(f"{engine} at {points}: {done.stderr[-2000:]}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(f"[store] {engine} {points:,}: {time.perf_counter() - t:.0f} s "
                  f"{row}", file=sys.stderr)
    crashes = []
    for engine in engines:
        t = time.perf_counter()
        crashes.append(crash(engine, work, min(args.dim, 64), args.kills))
        print(f"[store] crash test {engine}: {time.perf_counter() - t:.0f} s {crashes[-1]}",
              file=sys.stderr)
    return {"rows": rows, "crash": crashes, "skipped": skipped, "dim": args.dim,
            "hnsw": args.hnsw or "the store's default (16, 64)",
            "search_ef": args.search_ef or "qdrant default", "segments": args.segments
            or "qdrant default (one per CPU)",
            "queries": args.queries, "clients": args.clients}


COLUMNS = (("load_s", "load s"), ("index_s", "index s"), ("update_per_s", "update/s"),
           ("retrieve_per_s", "retrieve/s"), ("scroll_per_s", "scroll/s"),
           ("search_p50_ms", "p50 ms"), ("search_p99_ms", "p99 ms"),
           ("recall_at_10", "recall@10"), ("filtered_p50_ms", "filtered p50 ms"),
           ("reopen_s", "reopen s"), ("rss_mb", "RSS MB"), ("anon_mb", "anon MB"),
           ("disk_mb", "disk MB"),
           ("errors", "errors"))


def render(result: dict[str, Any]) -> str:
    clients = result["clients"]
    cols = (*COLUMNS[:8], (f"qps_{clients}_clients", f"QPS {clients} clients"), *COLUMNS[8:])
    head = "| engine | points | " + " | ".join(c[1] for c in cols) + " |"
    lines = [head, "|" + "---|" * (len(cols) + 2)]
    for r in result["rows"]:
        lines.append(f"| {r['engine']} | {r['points']:,} | "
                     + " | ".join(str(r.get(k, "–")) for k, _ in cols) + " |")
    lines.append("")
    for c in result["crash"]:
        phases = ", ".join(f"{n} {p}" for p, n in sorted(c["phases"].items()))
        moves = c["moves"]
        lines.append(f"crash test, {c['engine']}: {c['kills']} SIGKILLs ({phases}; "
                     f"{moves['killed']} of store move: {moves['refused']} refused until "
                     f"redone, {moves['redone_equal']} equal after), "
                     f"{c['acknowledged_ops']:,} acknowledged operations "
                     f"({c['acknowledged_points']:,} points held, {c['deleted']:,} deleted): "
                     f"{c['lost']} lost, {c['back']} deleted points back, {c['alias']} "
                     f"aliases wrong")
    for s in result["skipped"]:
        lines.append(f"skipped: {s}")
    lines.append(f"Edge's HNSW (m, ef_construct): {result['hnsw']}; search ef "
                 f"{result['search_ef']}; segments {result['segments']}; "
                 f"{result['queries']} queries, {result['dim']}-d")
    for r in result["rows"]:
        lines.append(f"{r['engine']} {r['points']:,}: recall@10 {r['recall_at_10']} "
                     f"± {r.get('recall_se', '–')} (s.e. over {result['queries']} queries); "
                     f"reopen {r['reopen_s']} s with a {r.get('reopen_cache', 'warm')} "
                     f"page cache")
        for level, d in (r.get("durability") or {}).items():
            lines.append(f"{r['engine']} {r['points']:,}, durability {level}: "
                         f"{d['batched_per_s']:,} points/s in 256-point calls, "
                         f"{d['single_4_threads_per_s']:,}/s in 1-point calls from 4 "
                         f"threads ({d['flushes']} flushes)")
        for key, how in (("during_index", "off the process (the store's way)"),
                         ("during_index_in_process", "in the process")):
            if key in r:
                d = r[key]
                lines.append(f"{r['engine']} {r['points']:,}, searches while "
                             f"{r['rewritten']:,} rewritten points are indexed {how}: index {d['index_s']} s, "
                             f"{d['searches']} searches, p50 {d['p50_ms']} ms, "
                             f"p99 {d['p99_ms']} ms, max {d['max_ms']} ms")
                if d.get("steps"):
                    lines.append("  its steps (s): " + ", ".join(
                        f"{k.removesuffix('_s')} {v}" for k, v in d["steps"].items()))
        for ef, e in (r.get("ef_sweep") or {}).items():
            lines.append(f"{r['engine']} {r['points']:,}, search ef {ef}: p50 {e['p50_ms']} ms, "
                         f"p99 {e['p99_ms']} ms, recall@10 {e['recall_at_10']}")
    return "\n".join(lines)


def register(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="the embedded engines (Qdrant Edge, local mode) side by "
                                  "side: load, index, write, read, search, reopen, crash")
    p.add_argument("--out", default="runs/bench-store")
    p.add_argument("--points", default="100000,1000000", help="sizes, comma-separated")
    p.add_argument("--engines", default="edge,local")
    p.add_argument("--local-max", type=int, default=100_000,
                   help="local mode is skipped above this many points")
    p.add_argument("--dim", type=int, default=DIM)
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--kills", type=int, default=30, help="SIGKILLs in the crash test "
                   "(on Edge every fifth is of a store move)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--search-ef", type=int, default=0, help="Edge's search ef for the main "
                   "rows (0: Qdrant's)")
    p.add_argument("--segments", type=int, default=0, help="Edge's segments per collection "
                   "(0: Qdrant's, one per CPU)")
    p.add_argument("--hnsw", default="", help="Edge's HNSW as 'm,ef_construct' (default: "
                                              "the store's, 16,64)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=report_command(run, render))
