"""``nobackfill bench edge-shards``: would splitting a collection into smaller Qdrant Edge
shards meet the million-point targets on this machine?

The store keeps a collection in one Edge shard. Swapping an index build in loads the new
generation (``EdgeShard.load``), and at a million points that load stalls every search of
the gateway for seconds (``bench store``). Split into parts of S points, each part would be
built and swapped on its own, so the stall would be one part's load; but every search
would then ask every part. Whether both targets can hold at once depends on three facts
about the engine, which this command measures on ``bench store``'s data:

- whether parts could be searched at once: searches on two shards from two threads against
  one thread on one shard, with the CPU time one thread's searches take per second (above
  1: Edge already spreads one search over its own threads), and whether a load lets a
  search on another shard run (the longest wait of a search while another shard loads);
- per part size S: the load of an indexed part (warm page cache, as at a swap: the build
  has just written it), and one part's search (one call without payloads, as a fan-out
  would make; the merged top hits' payloads are read once after) at several search ef
  values, with recall@10 against exact search within the part;
- optionally, int8 scalar quantization: its index build, load and recall against none.

Projected to ``--target`` points: ``ceil(target / S)`` parts; a search costs the parts'
calls one after another when they do not overlap (divided over the cores when they do),
plus one read of the merged hits' payloads, and must keep recall@10 >= 0.95; the stall is
the slowest part load (a swap also replays and flushes: it stalls at least that long).
Each projection says which targets it meets.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from service.bench.store import (
    CHUNK,
    INDEX_EVERY,
    _items,
    _open,
    _pct,
    chunk_vectors,
    chunks,
    queries_and_truth,
)
from service.state.gallery.ids import point_id
from training.console import report_command

SEARCH_P50_MS = 5.0  # the million-point targets (bench store)
STALL_MS = 500.0
RECALL = 0.95
EFS = (16, 32, 64)


def _say(message: str) -> None:
    print(f"[edge-shards] {message}", file=sys.stderr, flush=True)


def build_part(path: Path, points: int, dim: int, seed: int) -> tuple[Path, float]:
    """An indexed part of ``points`` points, written and indexed the store's way (1,000 a
    call, indexed off the process every 100,000); its shard directory and build seconds."""
    store = _open("edge", path)
    store.create("g", dim)
    t = time.perf_counter()
    for c, n in chunks(points):
        items = _items(seed, c, n, dim)
        for i in range(0, n, 1000):
            store.upsert("g", items[i:i + 1000], "v1", "s")
        if ((c + 1) * CHUNK) % INDEX_EVERY == 0:
            store.client.optimize(store.collection_of("g"))
    store.client.optimize(store.collection_of("g"))
    took = time.perf_counter() - t
    shard_dir = store.client.shard_path(store.collection_of("g"))
    store.close()
    return shard_dir, took


def _request(edge: Any, vector: np.ndarray, ef: int | None, quantized: bool = False) -> Any:
    params = None
    if ef is not None or quantized:
        params = edge.SearchParams(hnsw_ef=ef, quantization=edge.QuantizationSearchParams(
            rescore=True) if quantized else None)
    return edge.QueryBatchRequest([edge.QueryRequest(
        limit=10, query=edge.Query.Nearest(vector.tolist(), using="image"),
        with_payload=False, params=params)])


def part_search(shard: Any, queries: np.ndarray, truth: list[set[str]], ef: int | None,
                quantized: bool = False) -> dict[str, float]:
    """One part's search, one call each (no payloads): p50/p99 ms and recall@10."""
    import qdrant_edge as edge

    lat, fetch, recalls = [], [], []
    for v, want in zip(queries, truth):
        request = _request(edge, v, ef, quantized)
        t = time.perf_counter()
        found = shard.query_batch(request)[0]
        lat.append(time.perf_counter() - t)
        ids = [str(p.id) for p in found]
        recalls.append(len(set(ids) & want) / 10)
        t = time.perf_counter()  # the merged hits' payloads, read once after the parts
        shard.retrieve(ids, with_payload=True, with_vector=False)
        fetch.append(time.perf_counter() - t)
    return {"p50_ms": round(_pct(lat, 50), 3), "p99_ms": round(_pct(lat, 99), 3),
            "fetch_p50_ms": round(_pct(fetch, 50), 3),
            "recall_at_10": round(float(np.mean(recalls)), 4)}


def load_times(path: Path, repeats: int) -> list[float]:
    import qdrant_edge as edge

    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        shard = edge.EdgeShard.load(str(path))
        out.append(round(time.perf_counter() - t, 3))
        shard.close()
    return out


def lock_check(path: Path, work: Path, queries: np.ndarray, rounds: int = 3) -> dict[str, Any]:
    """Whether searches on two shards run at once: QPS of one thread on one shard against
    two threads on two copies of it, and the process's CPU seconds per second meanwhile;
    and the longest a search on one shard waits while the other loads."""
    import qdrant_edge as edge

    copies = [work / "lock-a", work / "lock-b"]
    for c in copies:
        shutil.rmtree(c, ignore_errors=True)
        shutil.copytree(path, c)
    a, b = (edge.EdgeShard.load(str(c)) for c in copies)
    requests = [_request(edge, v, None) for v in queries]

    def loop(shard: Any) -> None:
        for r in requests:
            shard.query_batch(r)

    qps: dict[int, list[float]] = {1: [], 2: []}
    cpu: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(rounds):  # alternating, so drift hits both alike
        for shards in ([a], [a, b]):
            threads = [threading.Thread(target=loop, args=(s,)) for s in shards]
            t, c = time.perf_counter(), time.process_time()
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            wall = time.perf_counter() - t
            qps[len(shards)].append(len(shards) * len(requests) / wall)
            cpu[len(shards)].append((time.process_time() - c) / wall)
    b.close()
    gaps: list[float] = []
    stop = threading.Event()

    def searcher() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            a.query_batch(requests[len(gaps) % len(requests)])
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
    th = threading.Thread(target=searcher)
    th.start()
    time.sleep(0.3)
    t = time.perf_counter()
    b = edge.EdgeShard.load(str(copies[1]))
    load_s = time.perf_counter() - t
    time.sleep(0.3)
    stop.set()
    th.join()
    a.close()
    b.close()
    for c in copies:
        shutil.rmtree(c, ignore_errors=True)
    one, two = float(np.median(qps[1])), float(np.median(qps[2]))
    waited = max(gaps)
    return {"qps_1_thread_1_shard": round(one), "qps_2_threads_2_shards": round(two),
            "parallel_gain": round(two / one, 2),
            "cpu_per_s_1_thread": round(float(np.median(cpu[1])), 2),
            "cpu_per_s_2_threads": round(float(np.median(cpu[2])), 2),
            "load_beside_search_s": round(load_s, 3),
            "search_waited_max_ms": round(waited * 1e3, 1),
            "parts_at_once": two / one >= 1.5, "load_holds_lock": waited >= 0.5 * load_s}


def quantization(work: Path, points: int, dim: int, seed: int, queries: np.ndarray,
                 truth: list[set[str]]) -> dict[str, Any]:
    """One shard of ``points`` points built without and with int8 scalar quantization:
    the index build (one ``optimize``), the load, a search and its recall."""
    import qdrant_edge as edge

    out: dict[str, Any] = {"points": points}
    for mode in ("none", "int8"):
        path = work / f"quant-{mode}"
        shutil.rmtree(path, ignore_errors=True)
        config = edge.EdgeConfig(
            vectors={k: edge.EdgeVectorParams(size=dim, distance=edge.Distance.Dot)
                     for k in ("image", "text")},
            hnsw_config=edge.HnswIndexConfig(m=16, ef_construct=64, full_scan_threshold=10_000),
            quantization_config=None if mode == "none" else edge.ScalarQuantizationConfig(
                type=edge.ScalarType.Int8, always_ram=True),
            payload_memory=edge.Memory.Cached)
        shard = edge.EdgeShard.create(str(path), config)
        for c, n in chunks(points):
            image, text = (chunk_vectors(seed, c, n, dim, k) for k in ("image", "text"))
            for i in range(0, n, 256):
                shard.update(edge.UpdateOperation.upsert_points([edge.Point(
                    point_id(f"p{c * CHUNK + r}"),
                    {"image": image[r].tolist(), "text": text[r].tolist()}, {"n": r})
                    for r in range(i, min(n, i + 256))]))
        t = time.perf_counter()
        shard.optimize()
        build = time.perf_counter() - t
        search = part_search(shard, queries, truth, None, quantized=mode == "int8")
        shard.close()
        out[mode] = {"build_s": round(build, 1), "load_s": load_times(path, 3), **search}
        shutil.rmtree(path, ignore_errors=True)
        _say(f"quantization {mode}: {out[mode]}")
    return out


def project(target: int, size: int, search: dict[str, float], loads: list[float],
            at_once: bool, cores: int) -> dict[str, Any]:
    """``target`` points in parts of ``size``: a search's cost (the parts' calls one after
    another, or spread over the cores when ``at_once``, then one read of the hits'
    payloads) and the stall (the slowest load: the least a swap holds searches off),
    each against its target; the recall is the parts' (each true neighbour is in one)."""
    parts = math.ceil(target / size)
    cost = parts * search["p50_ms"] / (min(parts, cores) if at_once else 1)
    cost += search["fetch_p50_ms"]
    stall = max(loads) * 1e3
    return {"parts": parts, "search_ms": round(cost, 2), "stall_ms": round(stall),
            "search_met": cost <= SEARCH_P50_MS and search["recall_at_10"] >= RECALL,
            "stall_met": stall <= STALL_MS}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import qdrant_edge as edge

    work = Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in str(args.sizes).split(",")]
    cores = os.cpu_count() or 1
    result: dict[str, Any] = {"target": args.target, "cores": cores, "dim": args.dim,
                              "queries": args.queries, "parts": []}
    built: Path | None = None  # the last part's store, kept for the lock check
    for size in sizes:
        if built is not None:
            shutil.rmtree(built, ignore_errors=True)
        built = work / f"part-{size}"
        _say(f"building an indexed part of {size:,} points")
        shard_dir, build_s = build_part(built, size, args.dim, args.seed)
        q, truth_ids = queries_and_truth(args.seed, size, args.dim, args.queries)
        truth = [{point_id(i) for i in row} for row in truth_ids]
        loads = load_times(shard_dir, args.repeats)
        shard = edge.EdgeShard.load(str(shard_dir))
        searches = {str(ef): part_search(shard, q, truth, ef) for ef in EFS}
        shard.close()
        row = {"points": size, "build_s": round(build_s, 1), "load_s": loads,
               "search": searches}
        result["parts"].append(row)
        _say(f"{size:,} points: {row}")
    _say("checking whether searches on two parts overlap and what a load blocks")
    result["lock"] = lock_check(shard_dir, work, q)  # on the largest part's copies
    if built is not None:
        shutil.rmtree(built, ignore_errors=True)
    at_once = bool(result["lock"]["parts_at_once"])
    for row in result["parts"]:
        row["projection"] = {ef: project(args.target, row["points"], s, row["load_s"],
                                         at_once, cores) for ef, s in row["search"].items()}
    if args.quantization:
        q, truth_ids = queries_and_truth(args.seed, args.quantization, args.dim, args.queries)
        result["quantization"] = quantization(work, args.quantization, args.dim, args.seed, q,
                                              [{point_id(i) for i in r} for r in truth_ids])
    return result


def render(result: dict[str, Any]) -> str:
    lock = result["lock"]
    lines = [f"searches on parts at once: 1 thread on 1 shard {lock['qps_1_thread_1_shard']:,} "
             f"QPS ({lock['cpu_per_s_1_thread']} CPU s/s), 2 threads on 2 shards "
             f"{lock['qps_2_threads_2_shards']:,} QPS ({lock['cpu_per_s_2_threads']} CPU s/s):"
             f" {lock['parallel_gain']}x, "
             + ("the parts' searches can overlap" if lock["parts_at_once"]
                else "the parts' searches would take turns"),
             f"a load beside a search: a search on another shard waited up to "
             f"{lock['search_waited_max_ms']} ms while a shard loaded "
             f"({lock['load_beside_search_s']} s): "
             + ("the load holds the interpreter lock" if lock["load_holds_lock"]
                else "the load lets searches run"), "",
             (f"| part points | build s | load s (warm) | search ef | part p50 ms | payloads ms "
              f"| recall@10 | parts for {result['target']:,} | search ms | stall ms "
              f"| all targets |"),
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in result["parts"]:
        for ef, s in row["search"].items():
            p = row["projection"][ef]
            both = "met" if p["search_met"] and p["stall_met"] else "missed (" + ", ".join(
                k for k, met in (("search", p["search_met"]), ("stall", p["stall_met"]))
                if not met) + ")"
            lines.append(f"| {row['points']:,} | {row['build_s']} | "
                         f"{' / '.join(str(x) for x in row['load_s'])} | {ef} | {s['p50_ms']} | "
                         f"{s['fetch_p50_ms']} | {s['recall_at_10']} | {p['parts']} | "
                         f"{p['search_ms']} | "
                         f"{p['stall_ms']} | {both} |")
    quant = result.get("quantization")
    if quant:
        lines.append("")
        for mode in ("none", "int8"):
            d = quant[mode]
            lines.append(f"quantization {mode} at {quant['points']:,} points: index build "
                         f"{d['build_s']} s, load {' / '.join(str(x) for x in d['load_s'])} s, "
                         f"search p50 {d['p50_ms']} ms, recall@10 {d['recall_at_10']}")
    lines.append(f"targets: search p50 <= {SEARCH_P50_MS} ms at recall@10 >= {RECALL} and the "
                 f"worst search during a "
                 f"build <= {STALL_MS:.0f} ms at {result['target']:,} points; "
                 f"{result['queries']} queries, {result['dim']}-d, {result['cores']} cores")
    return "\n".join(lines)


def register(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="whether a collection split into smaller Edge shards would "
                                  "meet the million-point search and stall targets here")
    p.add_argument("--out", default="runs/bench-edge-shards")
    p.add_argument("--sizes", default="80000,100000,125000",
                   help="part sizes, comma-separated")
    p.add_argument("--target", type=int, default=1_000_000, help="the collection's points")
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--queries", type=int, default=500)
    p.add_argument("--repeats", type=int, default=5, help="loads timed per part size")
    p.add_argument("--quantization", type=int, default=40_000, help="points of the int8 "
                   "quantization comparison (0: skip it)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=report_command(run, render))
