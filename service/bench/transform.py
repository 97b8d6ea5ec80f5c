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


def reembed_rate(base: Path | None, probe: int, work: Path) -> dict[str, Any]:
    """NEW's items/s re-embedding ``probe`` items from image files (+ their captions)."""
    from service.state.paths import Roots
    from service.vectors.backfill import OriginReader, _rows
    from service.vectors.embed import Pixels, embed
    from service.vectors.sources import SourceStore
    from training.configs import config_path
    from training.data import generate_items, render
    from training.encoders import Encoder, ModelSpec, create_model, create_tokenizer

    if base is not None and (base / "new" / "manifest.json").is_file():
        from training.versions import load_encoder

        encoder, model = load_encoder(str(base / "new")), f"{base / 'new'} (bench base NEW)"
    else:
        spec = ModelSpec.from_json(config_path("tiny-new-bench"))
        encoder = Encoder(create_model(spec), create_tokenizer(spec))
        model = "tiny-new-bench (random init: the rate does not depend on the weights)"
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

    start = time.perf_counter()
    for _first, loaded in reader.batches(items, 0, 256):
        embed(Pixels(encoder, loaded["pixels"]), _rows(loaded))
    seconds = time.perf_counter() - start
    return {"model": model, "probe_items": probe, "items_per_s": probe / seconds}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from qdrant_client import QdrantClient

    from service.bench.setup import fresh_work_dir
    from service.jobkinds.migrate.transform import _map_all, read_snapshot, write_snapshot
    from service.state.gallery.store import GalleryStore
    from service.state.registry.records import Migration, Side
    from service.state.thumbnails import ThumbnailStore
    from service.vectors.spool import SpooledWriter, pending, read_batch
    from service.vectors.writer import DirectWriter, Sides

    work = fresh_work_dir(Path(args.out))
    store = GalleryStore(QdrantClient(path=str(work / "qdrant")), serialise=True)
    source, target = store.create_side("g", args.old_dim), store.create_side("g", args.new_dim)
    t = time.perf_counter()
    build(store, source, args.items, args.old_dim)
    build_s = time.perf_counter() - t
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
    written = store.count(target)
    stored = store.stored(target, [ids[0]])
    store.close()
    rate = reembed_rate(Path(args.base) if args.base else None, args.probe, work)
    total = sum(times.values())
    reembed = args.items / rate["items_per_s"]
    return {"items": args.items, "vectors": 2 * args.items, "old_dim": args.old_dim,
            "new_dim": args.new_dim, "method": args.method, "build_seconds": round(build_s, 1),
            "seconds": {k: round(v, 2) for k, v in times.items()},
            "transform_seconds": round(total, 2), "written": written,
            "made": next(iter(stored.values())).made if stored else None,
            "reembed": {**rate, "items_per_s": round(rate["items_per_s"], 1),
                        "seconds_for_items": round(reembed, 1)},
            "ratio": round(total / reembed, 4),
            "targets": {f"transform <= 1/20 of NEW's re-embedding ({total:.1f} s vs "
                        f"{reembed:.1f} s)": total <= TARGET_RATIO * reembed,
                        "every item written once": written == args.items}}


def render_result(r: dict[str, Any]) -> str:
    s = r["seconds"]
    lines = [(f"{r['items']:,} items ({r['vectors']:,} vectors, {r['old_dim']}-d -> "
             f"{r['new_dim']}-d, {r['method']}) on the embedded default (local Qdrant)"),
             f"read (snapshot of the stored vectors)  {s['read']:8.2f} s",
             f"map (+ predicted error, spooled)       {s['map']:8.2f} s",
             f"write (applier, transform mode)        {s['write']:8.2f} s",
             f"transform total                        {r['transform_seconds']:8.2f} s",
             (f"NEW re-embedding the same items        {r['reembed']['seconds_for_items']:8.1f} s "
             f"({r['reembed']['items_per_s']:,.0f} items/s reading files; {r['reembed']['model']})"),
             (f"ratio {r['ratio']:.3f} (target <= {TARGET_RATIO:.3f}); points written "
             f"{r['written']:,}; a point's made: {r['made']}")]
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
    p.add_argument("--base", default="runs/bench-base", help="bench base's models (NEW's "
                                                            "rate; random init if absent)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=report_command(run, render_result))
