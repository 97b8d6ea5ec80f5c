"""``nobackfill bench transform``: what transforming a gallery costs against re-embedding it.

On the embedded default (local Qdrant on a path), a gallery of ``--items`` items, each with
an image and a caption vector in OLD's space, is transformed into NEW's space the way a
migration does it (``service.jobkinds.migrate.transform``): the gateway reads every stored
vector into the job's snapshot (read), a worker maps them and predicts each one's error
and spools the batches (map), and the gateway's applier writes them into the target side
through the ``DirectWriter``'s transform mode (write). Against it: the time NEW needs to
re-embed the same items, from its measured rate on ``--probe`` items read from image
files the way a backfill reads them (decode, preprocess, forward; captions too).
Target: transform <= 1/20 of the re-embedding.

It also times a search against the two sides it built, plain (one text forward, one
search of the serving side) and ``hybrid`` (``service.usecases.search``: a forward per
side, a search per side, the candidates' vectors read on the side that did not return
them, the fused ranking), in process, median over ``--queries`` text queries: what the
hybrid option adds to a query.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from training.console import report_command

TARGET_RATIO = 1 / 20


def build(store: Any, collection: str, items: int, dim: int, seed: int = 0) -> None:
    """``items`` points with unit image and text vectors and an ingest-like payload."""
    from service.state.gallery.store import Item

    rng = np.random.default_rng(seed)
    for start in range(0, items, 2000):
        n = min(2000, items - start)
        vecs = rng.normal(size=(2, n, dim)).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=2, keepdims=True)
        store.upsert(collection, [Item(f"item-{start + i:08d}", {
            "image": vecs[0, i], "text": vecs[1, i]}, {"caption": f"caption {start + i}"},
            {"text": f"caption {start + i}", "image": f"/data/img/{start + i}.png"})
            for i in range(n)], "old", "old")


def fitted_transform(old_dim: int, new_dim: int, method: str) -> Any:
    """A transform fitted on 2,000 random pairs (its cost is the sample's, not measured
    here): the map's size is what matters for the timing."""
    from training.upgrades.transform import TransformConfig, fit_transform

    rng = np.random.default_rng(1)
    x = rng.normal(size=(2000, old_dim)).astype(np.float32)
    y = np.tanh(x @ rng.normal(size=(old_dim, new_dim))).astype(np.float32)
    pairs = {"image": x, "text": x}
    return fit_transform(pairs, {"image": y, "text": y},
                         TransformConfig(method=method, steps=50))


def new_encoder(base: Path | None) -> tuple[Any, str]:
    """bench base's NEW, or the same architecture at random init; and what it is."""
    from training.configs import config_path
    from training.encoders import Encoder, ModelSpec, create_model, create_tokenizer

    if base is not None and (base / "new" / "manifest.json").is_file():
        from training.versions import load_encoder

        return load_encoder(str(base / "new")), f"{base / 'new'} (bench base NEW)"
    spec = ModelSpec.from_json(config_path("tiny-new-bench"))
    return (Encoder(create_model(spec), create_tokenizer(spec)),
            "tiny-new-bench (random init: the rate does not depend on the weights)")


def reembed_rate(encoder: Any, probe: int, work: Path) -> dict[str, Any]:
    """NEW's items/s re-embedding ``probe`` items from image files (+ their captions)."""
    from service.state.paths import Roots
    from service.vectors.backfill import OriginReader, _rows
    from service.vectors.embed import Pixels, embed
    from service.vectors.sources import SourceStore
    from training.data import generate_items, render

    folder = work / "images"
    folder.mkdir(parents=True)
    items = []
    for it in generate_items(probe, seed=3, languages=("en",)):
        path = folder / f"{it.id}.png"
        render(it, 64).save(path)
        items.append({"id": it.id, "kinds": ["image", "text"],
                      "origin": {"text": it.captions["en"][0], "image": str(path)}})

    root = Path(os.path.realpath(work))
    reader = OriginReader(SourceStore(work / "sources"), Roots((root,)), encoder.image_tensors)

    for _first, loaded in reader.batches(items[:256], 0, 256):  # warm-up, not timed
        embed(Pixels(encoder, loaded["pixels"]), _rows(loaded))
    start = time.perf_counter()
    for _first, loaded in reader.batches(items, 0, 256):
        embed(Pixels(encoder, loaded["pixels"]), _rows(loaded))
    seconds = time.perf_counter() - start
    return {"probe_items": probe, "items_per_s": probe / seconds}


def search_latency(store: Any, sides: tuple[str, str], encoder: Any, queries: int,
                   old_dim: int, top_k: int = 10) -> dict[str, float]:
    """Median ms of a plain and a hybrid text search (module docstring), in process. The
    routed query is a second forward cut to OLD's width (the cost of a route that runs
    the towers again; an adapter's map on top is a [D x D] product)."""
    import statistics

    from service.usecases.search import HYBRID_POOL, Query, _fuse
    from training.data import generate_items

    texts = [it.captions["en"][0] for it in generate_items(queries, seed=9, languages=("en",))]
    encoder.encode_texts(texts[:1])
    gateway = type("G", (), {"store": store})()
    plain, hybrid = [], []
    for text in texts:
        t = time.perf_counter()
        q = encoder.encode_texts([text])[0]
        store.search(sides[1], q, "image", top_k)
        plain.append(time.perf_counter() - t)
        t = time.perf_counter()
        vectors = [encoder.encode_texts([text])[0][:old_dim], q]
        vectors[0] = vectors[0] / np.linalg.norm(vectors[0])
        found = [store.search(c, v, "image", top_k * HYBRID_POOL)
                 for c, v in zip(sides, vectors, strict=True)]
        _fuse(gateway, sides, vectors, found, Query(text=text, top_k=top_k))
        hybrid.append(time.perf_counter() - t)
    p, h = statistics.median(plain) * 1e3, statistics.median(hybrid) * 1e3
    return {"queries": queries, "plain_ms": round(p, 2), "hybrid_ms": round(h, 2),
            "added_ms": round(h - p, 2)}


def _index(store: Any, collection: str) -> float:
    """Edge: build the collection's index now, untimed; its seconds (0 on local mode)."""
    optimize = getattr(store.client, "optimize", None)
    if optimize is None:
        return 0.0
    t = time.perf_counter()
    optimize(collection)
    return time.perf_counter() - t


def run(args: argparse.Namespace) -> dict[str, Any]:
    from service.bench.setup import fresh_work_dir
    from service.jobkinds.migrate.transform import _map_all, read_snapshot, write_snapshot
    from service.state.gallery.client import open_embedded
    from service.state.gallery.edge import EdgeClient
    from service.state.gallery.store import GalleryStore
    from service.state.registry.records import Migration, Side
    from service.state.thumbnails import ThumbnailStore
    from service.vectors.spool import SpooledWriter, pending, read_batch
    from service.vectors.writer import DirectWriter, Sides

    work = fresh_work_dir(Path(args.out))
    # Edge: indexed at the two points a quiet gallery would be (after the build, after the
    # transform's writes), not by the background indexer at a moment of its own: its
    # build holds the interpreter lock and would land inside a timed step
    client = (EdgeClient(work / "qdrant", indexer=False) if args.engine == "edge"
              else open_embedded(args.engine, str(work / "qdrant")))
    store = GalleryStore(client, serialise=True)
    source, target = store.create_side("g", args.old_dim), store.create_side("g", args.new_dim)
    t = time.perf_counter()
    build(store, source, args.items, args.old_dim)
    build_s = time.perf_counter() - t
    indexed = _index(store, source)  # a gallery that has served is indexed
    listed = [{"id": s.id, "etag": s.etag} for s in store.stored(source).values()]
    fitted = fitted_transform(args.old_dim, args.new_dim, args.method)
    job = work / "job"
    times: dict[str, float] = {}
    t = time.perf_counter()
    write_snapshot(store, source, listed, job)
    times["read"] = time.perf_counter() - t
    t = time.perf_counter()
    ids, etags, old = read_snapshot(job)
    spool = SpooledWriter(job, ThumbnailStore(work / "thumbs"), "g", "0000-", 0)
    made = {"by": "transform", "version": "new", "from_space": "old", "map": args.method}
    _map_all(fitted, ids, old, set(), etags, "new", "new", made, spool)
    times["map"] = time.perf_counter() - t
    migration = Migration("bench", "new", Side("old", source), Side("new", target),
                          "backfilling", "", "bench")
    sides = Sides({"old": source, "new": target}, migration)
    writer = DirectWriter(store, ThumbnailStore(work / "thumbs"), "g", lambda: sides)
    t = time.perf_counter()
    for path in pending(job):
        writer.write(read_batch(path))
        path.unlink()
    times["write"] = time.perf_counter() - t
    indexed += _index(store, target)  # the new side, as the indexer would once writes end
    written = store.count(target)
    stored = store.stored(target, [ids[0]])
    encoder, model = new_encoder(Path(args.base) if args.base else None)
    latency = search_latency(store, (source, target), encoder, args.queries, args.old_dim)
    store.close()
    rate = {"model": model, **reembed_rate(encoder, args.probe, work)}
    total = sum(times.values())
    reembed = args.items / rate["items_per_s"]
    return {"items": args.items, "vectors": 2 * args.items, "engine": args.engine,
            "index_seconds_untimed": round(indexed, 1),
            "old_dim": args.old_dim,
            "new_dim": args.new_dim, "method": args.method, "build_seconds": round(build_s, 1),
            "seconds": {k: round(v, 2) for k, v in times.items()},
            "transform_seconds": round(total, 2), "written": written,
            "made": next(iter(stored.values())).made if stored else None,
            "reembed": {**rate, "items_per_s": round(rate["items_per_s"], 1),
                        "seconds_for_items": round(reembed, 1)},
            "ratio": round(total / reembed, 4), "search": latency,
            "targets": {f"transform <= 1/20 of NEW's re-embedding ({total:.1f} s vs "
                        f"{reembed:.1f} s)": total <= TARGET_RATIO * reembed,
                        "every item written once": written == args.items}}


def render_result(r: dict[str, Any]) -> str:
    s = r["seconds"]
    lines = [(f"{r['items']:,} items ({r['vectors']:,} vectors, {r['old_dim']}-d -> "
             f"{r['new_dim']}-d, {r['method']}) on the embedded engine "
             f"{r.get('engine', 'local')}"),
             f"read (snapshot of the stored vectors)  {s['read']:8.2f} s",
             f"map (+ predicted error, spooled)       {s['map']:8.2f} s",
             f"write (applier, transform mode)        {s['write']:8.2f} s",
             f"transform total                        {r['transform_seconds']:8.2f} s",
             (f"NEW re-embedding the same items        {r['reembed']['seconds_for_items']:8.1f} s "
             f"({r['reembed']['items_per_s']:,.0f} items/s reading files; {r['reembed']['model']})"),
             (f"ratio {r['ratio']:.3f} (target <= {TARGET_RATIO:.3f}); points written "
             f"{r['written']:,}; a point's made: {r['made']}")]
    q = r["search"]
    lines.append(f"text search over both sides, median of {q['queries']}: plain {q['plain_ms']:.2f} "
                 f"ms, hybrid {q['hybrid_ms']:.2f} ms (+{q['added_ms']:.2f} ms: a second "
                 f"forward, a second search, the vector reads, the fuse)")
    lines += [f"target {k}: {'met' if v else 'MISSED'}" for k, v in r["targets"].items()]
    return "\n".join(lines)


def register(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="transforming a gallery's stored vectors (read, map, write) "
                                  "against NEW re-embedding them, on the embedded default")
    p.add_argument("--out", default="runs/bench-transform")
    p.add_argument("--items", type=int, default=100_000)
    p.add_argument("--old-dim", type=int, default=64)
    p.add_argument("--new-dim", type=int, default=128)
    p.add_argument("--method", default="residual-mlp")
    p.add_argument("--probe", type=int, default=2000, help="items NEW re-embeds to time it")
    p.add_argument("--queries", type=int, default=100, help="searches timed, plain and hybrid")
    p.add_argument("--engine", choices=("edge", "local"), default="edge",
                   help="the embedded engine (the default's, Qdrant Edge; or local mode)")
    p.add_argument("--base", default="runs/bench-base", help="bench base's models (NEW's "
                                                            "rate; random init if absent)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=report_command(run, render_result))
