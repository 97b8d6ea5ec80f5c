"""The load generator, run as its own process: ``python -m service.bench.load``.

N clients each send one request at a time (closed loop) for a fixed duration; prints
one JSON line: requests, errors, QPS, p50/p99/mean latency in milliseconds and every
latency (so that runs can be pooled).
Imports neither torch nor the gateway, so it costs the machine little.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import httpx


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[rank]


async def drive(url: str, bodies: list[dict], concurrency: int, duration: float) -> dict:
    latencies: list[float] = []
    errors: list[str] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=600.0) as client:
        start = time.perf_counter()
        deadline = start + duration

        async def client_loop(worker: int) -> None:
            n = worker
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                r = await client.post(url, json=bodies[n % len(bodies)])
                if r.status_code == 200:
                    latencies.append(time.perf_counter() - t0)
                else:
                    errors.append(f"{r.status_code}: {r.text[:200]}")
                n += concurrency

        await asyncio.gather(*(client_loop(w) for w in range(concurrency)))
        elapsed = time.perf_counter() - start
    return {"concurrency": concurrency, "requests": len(latencies), "errors": len(errors),
            "first_error": errors[0] if errors else None, "seconds": round(elapsed, 2),
            "qps": len(latencies) / elapsed,
            "p50_ms": percentile(latencies, 50) * 1000, "p99_ms": percentile(latencies, 99) * 1000,
            "mean_ms": sum(latencies) / max(1, len(latencies)) * 1000,
            "latencies_ms": [round(x * 1000, 3) for x in latencies]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--url", required=True)
    p.add_argument("--queries", required=True, help="JSON file: {texts: [...], images: [...]}")
    p.add_argument("--modality", choices=("text", "image"), required=True)
    p.add_argument("--concurrency", type=int, required=True)
    p.add_argument("--duration", type=float, required=True)
    p.add_argument("--top-k", type=int, default=10)
    args = p.parse_args()
    with open(args.queries) as fh:
        queries = json.load(fh)
    key = "text" if args.modality == "text" else "image_base64"
    bodies = [{key: q, "top_k": args.top_k} for q in queries[f"{args.modality}s"]]
    result = asyncio.run(drive(args.url, bodies, args.concurrency, args.duration))
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
