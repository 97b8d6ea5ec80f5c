"""Start and stop the gateway as a child process (``python -m service``), drive it with
the load-generating process, and pool the rounds of one measurement."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx

from service.bench.load import percentile
from service.stack.launch import gateway_process

ADMIN_KEY = "bench-admin"


@contextlib.contextmanager
def gateway(data_dir: Path, qdrant_path: Path, log: Path, batch_size: int,
            max_wait_ms: float | None,
            device: str | None, ready_timeout_s: float = 600.0) -> Iterator[str]:
    """A running gateway with the batching settings under test, on its own copy of the
    embedded Qdrant (one process per path); yields its base URL."""
    env = {"NOBACKFILL_DATA_DIR": str(data_dir), "NOBACKFILL_QDRANT_PATH": str(qdrant_path),
           "NOBACKFILL_REGISTRY_POLL_INTERVAL_S": "0",  # nothing is promoted during the run
           "NOBACKFILL_BATCH_MAX_SIZE": str(batch_size),
           "NOBACKFILL_ADMIN_API_KEYS": json.dumps({"bench": ADMIN_KEY}),
           "NOBACKFILL_ACCESS_LOG": "false"}  # a log line per request would cost CPU
    if max_wait_ms is not None:  # else the gateway's default
        env["NOBACKFILL_BATCH_MAX_WAIT_MS"] = str(max_wait_ms)
    if device:
        env["NOBACKFILL_DEVICE"] = device
    with gateway_process(env, log, ready_timeout_s) as url:
        yield url


def warm_up(url: str, gallery: str, text: str, image: str, rounds: int = 3) -> None:
    """First requests pay one-off costs (allocator, caches); keep them out of the numbers."""
    for _ in range(rounds):
        for body in ({"text": text}, {"image_base64": image}):
            r = httpx.post(f"{url}/v1/galleries/{gallery}/search", json=body, timeout=600)
            r.raise_for_status()


def load(url: str, gallery: str, queries: Path, modality: str, concurrency: int,
         duration: float, warmup: float = 0.0) -> dict:
    """One measurement by a separate load-generating process (``warmup`` seconds of load
    first, not counted)."""
    cmd = [sys.executable, "-m", "service.bench.load", "--url",
           f"{url}/v1/galleries/{gallery}/search", "--queries", str(queries), "--modality",
           modality, "--concurrency", str(concurrency), "--duration", str(duration),
           "--warmup", str(warmup)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def pool(runs: list[dict]) -> dict:
    """One cell from the rounds of the same measurement: counts and time summed, latency
    percentiles over every request of every round."""
    latencies = [x for run in runs for x in run["latencies_ms"]]
    seconds = sum(run["seconds"] for run in runs)
    errors = [run["first_error"] for run in runs if run["first_error"]]
    return {"concurrency": runs[0]["concurrency"], "rounds": len(runs),
            "requests": len(latencies), "errors": sum(run["errors"] for run in runs),
            "first_error": errors[0] if errors else None, "seconds": round(seconds, 2),
            "qps": len(latencies) / seconds if seconds else 0.0,
            "p50_ms": percentile(latencies, 50), "p99_ms": percentile(latencies, 99),
            "mean_ms": sum(latencies) / max(1, len(latencies)),
            "slowest": sorted(x for run in runs for x in run.get("slowest", []))[-10:]}
