"""``nobackfill bench serve``: throughput and latency of the gateway on the embedded default.

A full-size architecture (ViT-B-32 with random weights: speed does not depend on the
weights) serves a 10,000-point synthetic gallery from local Qdrant. A separate
load-generating process drives the gateway at 1, 8 and 32 concurrent clients with
text and image queries, with dynamic batching and without (two gateways, measured in
alternating rounds); the bare cost of one encoder forward + Qdrant search is sampled in
the same rounds.
Targets: at 32 clients, batched text QPS >= 3x unbatched; at 1 client, gateway p50
<= 1.5x the bare encoder + search time.

Plugged into the CLI through the ``nobackfill.benchmarks`` entry point (training/
never imports service/), so this module imports nothing heavy at the top.
"""

from __future__ import annotations

import argparse
from typing import Any

from service.bench.phases import add_device_option
from service.bench.report import render
from training.console import report_command


def register(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="gateway QPS and latency, batched vs unbatched (embedded "
                                  "Qdrant, ViT-B-32 random init)")
    p.add_argument("--out", default="runs/bench-serve", help="results, logs and work files")
    p.add_argument("--arch", default="ViT-B-32", help="open_clip architecture (random init)")
    p.add_argument("--model-config", help="JSON model config instead of --arch")
    p.add_argument("--points", type=int, default=10_000, help="gallery size")
    p.add_argument("--embed", type=int, default=256,
                   help="items embedded by the real encoder; the rest of the gallery are "
                        "copies of them with deterministic noise (use --embed = --points to "
                        "embed everything)")
    p.add_argument("--concurrency", default="1,8,32", help="comma-separated client counts")
    p.add_argument("--duration", type=float, default=15.0,
                   help="seconds per measurement (split over the rounds)")
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds per measurement, alternating batched and unbatched (and the "
                        "bare encoder + search at 1 client), so drift hits both alike")
    p.add_argument("--warmup", type=float, default=1.0,
                   help="seconds of load before each round's measured window (not counted)")
    p.add_argument("--bare-repeats", type=int, default=30,
                   help="bare encoder + search samples per modality (over the rounds)")
    p.add_argument("--batch-size", type=int, default=32, help="max batch when batching is on")
    p.add_argument("--max-wait-ms", type=float, default=None,
                   help="batching max wait (default: the gateway's; 0: start at once when "
                        "the device is idle)")
    add_device_option(p, "the gateways and the bare encoder + search")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: tiny model, 1,000 points, 2 s per measurement")
    p.add_argument("--keep", action="store_true", help="keep the work directory (artifact, "
                                                       "registry, Qdrant data)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=report_command(run, render))


def run(args: argparse.Namespace) -> dict[str, Any]:
    from service.bench.run import run_bench

    return run_bench(args)

