"""The benchmark's steps: build the gallery, start two gateways (batching on and off),
then measure in rounds.

This machine's speed drifts (other tenants, clocks), and each target compares two
measurements, so they are taken side by side: both gateways run for the whole benchmark
(each on its own copy of the embedded Qdrant), every cell is split into ``rounds``
rounds that alternate between the two modes (order flipped every round), and the bare
encoder + search is sampled in the same rounds as the 1-client cells. Each round first
loads the gateway for ``warmup`` seconds that are not counted (closed-loop ramp-up). Idle gateways
cost nothing (no registry polling)."""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
from pathlib import Path
from typing import Any

from service.bench import server
from service.bench.bare import BareMeter, Sample, summary
from service.bench.phases import Phases, resolve_device
from service.bench.setup import GALLERY, Queries, build_gallery, fresh_work_dir, make_queries
from service.state.config import Settings
from training.encoders import ModelSpec

QUICK = {"points": 1000, "embed": 64, "duration": 2.0, "model_config": "tiny-old", "rounds": 2,
         "warmup": 0.25}
TEXT_SPEEDUP = 3.0  # batched text QPS at 32 clients over unbatched
LATENCY_RATIO = 1.5  # gateway p50 at 1 client over the bare encoder + search
MODALITIES = ("text", "image")


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    device = resolve_device(getattr(args, "device", None))  # before anything starts
    phase = Phases("serve", 2 + len(MODALITIES))
    if args.quick:
        args = argparse.Namespace(**{**vars(args), **QUICK})
    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    out = Path(args.out)
    work = fresh_work_dir(out)
    settings = Settings(data_dir=work / "data", device=device)
    spec = _spec(args)
    result: dict[str, Any] = {"model": spec.describe(), "device": device,
                              "rounds": args.rounds}
    phase(f"build the gallery: {args.points:,} points, {min(args.embed, args.points):,} "
          f"embedded by the encoder on {device}")
    result["setup"] = build_gallery(settings, spec, args.points, args.embed, work)
    queries = make_queries()
    query_file = work / "queries.json"
    query_file.write_text(json.dumps(queries.to_json()))
    levels = [int(c) for c in str(args.concurrency).split(",") if c.strip()]
    modes = {"batched": args.batch_size, "unbatched": 1}
    phase(f"start the gateways (batched, max {args.batch_size}; unbatched) on {device} and "
          f"warm them up; load the bare encoder")
    with contextlib.ExitStack() as stack:
        urls = {}
        for mode, size in modes.items():
            qdrant = work / f"qdrant-{mode}"
            shutil.copytree(settings.qdrant_location, qdrant)
            urls[mode] = stack.enter_context(server.gateway(
                settings.data_dir, qdrant, work.parent / f"gateway-{mode}.log", size,
                args.max_wait_ms, device))
            server.warm_up(urls[mode], GALLERY, queries.texts[0], queries.images[0])
        bare = BareMeter(settings, queries)
        stack.callback(bare.close)
        measured = _measure(args, urls, bare, queries, levels, query_file, phase)
    result["bare"] = {m: summary(measured.pop(("bare", m))) for m in MODALITIES}
    for mode, size in modes.items():
        result[mode] = {"batch_max_size": size, **{m: measured[(mode, m)] for m in MODALITIES}}
    result["targets"] = targets(result, levels)
    (out / "bench-serve.json").write_text(json.dumps(result, indent=2))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return result


def _measure(args: argparse.Namespace, urls: dict[str, str], bare: BareMeter,
             queries: Queries, levels: list[int], query_file: Path,
             phase: Phases | None = None) -> dict[tuple, Any]:
    """{(mode, modality): {level: pooled cell}} and {("bare", modality): samples}
    (``phase``: told as each modality starts)."""
    found: dict[tuple, Any] = {}
    repeats = max(1, round(args.bare_repeats / args.rounds))
    for modality in MODALITIES:
        if phase is not None:
            phase(f"{modality} queries: {', '.join(map(str, levels))} clients, "
                  f"{args.rounds} rounds of {args.duration / args.rounds:g} s each, batched "
                  f"and unbatched (and the bare encoder + search)")
        samples: list[Sample] = []
        for level in levels:
            runs: dict[str, list[dict]] = {mode: [] for mode in urls}
            for r in range(args.rounds):
                if level == min(levels):
                    samples += bare.sample(modality, repeats)
                for mode in (list(urls) if r % 2 == 0 else list(urls)[::-1]):
                    runs[mode].append(server.load(urls[mode], GALLERY, query_file, modality,
                                                  level, args.duration / args.rounds,
                                                  args.warmup))
            for mode, mode_runs in runs.items():
                found.setdefault((mode, modality), {})[str(level)] = server.pool(mode_runs)
        found[("bare", modality)] = samples
    return found


def _spec(args: argparse.Namespace) -> ModelSpec:
    if args.model_config:
        path = Path(args.model_config)
        if not path.exists():  # a packaged config name, e.g. "tiny-old"
            from training.configs import config_path

            path = config_path(args.model_config)
        return ModelSpec.from_json(path)
    return ModelSpec(arch=args.arch)


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
