"""The benchmark's steps: build the gallery, measure the bare path, then drive the
gateway with batching on and off."""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Any

from service.bench import server
from service.bench.bare import measure
from service.bench.setup import GALLERY, build_gallery, make_queries
from service.core.config import Settings
from training.encoders import ModelSpec

QUICK = {"points": 1000, "embed": 64, "duration": 2.0, "model_config": "tiny-old"}
TEXT_SPEEDUP = 3.0  # batched text QPS at 32 clients over unbatched
LATENCY_RATIO = 1.5  # gateway p50 at 1 client over the bare encoder + search


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    if args.quick:
        args = argparse.Namespace(**{**vars(args), **QUICK})
    out = Path(args.out)
    work = out / "work"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    settings = Settings(data_dir=work / "data", device=args.device)
    spec = _spec(args)
    result: dict[str, Any] = {"model": spec.describe(), "device": args.device or "auto"}
    result["setup"] = build_gallery(settings, spec, args.points, args.embed, work)
    queries = make_queries()
    query_file = work / "queries.json"
    query_file.write_text(json.dumps(queries.to_json()))
    result["bare"] = measure(settings, queries, repeats=10 if args.quick else 30)
    levels = [int(c) for c in str(args.concurrency).split(",") if c.strip()]
    for mode, size in (("batched", args.batch_size), ("unbatched", 1)):
        result[mode] = _drive(work, mode, size, args, levels, query_file, queries)
    result["targets"] = targets(result, levels)
    (out / "bench-serve.json").write_text(json.dumps(result, indent=2))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return result


def _spec(args: argparse.Namespace) -> ModelSpec:
    if args.model_config:
        path = Path(args.model_config)
        if not path.exists():  # a packaged config name, e.g. "tiny-old"
            from training.bench.base import config_path

            path = config_path(args.model_config)
        return ModelSpec.from_json(path)
    return ModelSpec(arch=args.arch)


def _drive(work: Path, mode: str, batch_size: int, args: argparse.Namespace, levels: list[int],
           query_file: Path, queries: Any) -> dict[str, Any]:
    cells: dict[str, Any] = {"batch_max_size": batch_size, "text": {}, "image": {}}
    start = time.perf_counter()
    with server.gateway(work / "data", work.parent / f"gateway-{mode}.log", batch_size,
                        args.max_wait_ms, args.device) as url:
        server.warm_up(url, GALLERY, queries.texts[0], queries.images[0])
        for modality in ("text", "image"):
            for level in levels:
                cells[modality][str(level)] = server.load(url, GALLERY, query_file, modality,
                                                          level, args.duration)
    cells["seconds"] = round(time.perf_counter() - start, 1)
    return cells


def targets(result: dict[str, Any], levels: list[int]) -> dict[str, Any]:
    checks: dict[str, Any] = {}
    top, one = str(max(levels)), str(min(levels))
    batched, unbatched = result["batched"]["text"][top], result["unbatched"]["text"][top]
    speedup = batched["qps"] / max(unbatched["qps"], 1e-9)
    checks[f"text_qps_batched/unbatched@{top}>={TEXT_SPEEDUP}"] = {
        "value": round(speedup, 2), "met": speedup >= TEXT_SPEEDUP}
    for modality in ("text", "image"):
        ratio = result["batched"][modality][one]["p50_ms"] / result["bare"][modality]["p50_ms"]
        checks[f"{modality}_p50@{one}/bare<={LATENCY_RATIO}"] = {
            "value": round(ratio, 2), "met": ratio <= LATENCY_RATIO}
    errors = sum(c["errors"] for m in ("batched", "unbatched") for k in ("text", "image")
                 for c in result[m][k].values())
    checks["no_errors"] = {"value": errors, "met": errors == 0}
    return checks
