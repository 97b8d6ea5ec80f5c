"""Start and stop the gateway as a child process (``python -m service``) for a measurement."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx

from service.launch import gateway_process

ADMIN_KEY = "bench-admin"


@contextlib.contextmanager
def gateway(data_dir: Path, log: Path, batch_size: int, max_wait_ms: float,
            device: str | None, ready_timeout_s: float = 600.0) -> Iterator[str]:
    """A running gateway with the batching settings under test; yields its base URL."""
    env = {"NOBACKFILL_DATA_DIR": str(data_dir), "NOBACKFILL_BATCH_MAX_SIZE": str(batch_size),
           "NOBACKFILL_BATCH_MAX_WAIT_MS": str(max_wait_ms),
           "NOBACKFILL_ADMIN_API_KEYS": json.dumps({"bench": ADMIN_KEY}),
           "NOBACKFILL_ACCESS_LOG": "false"}  # a log line per request would cost CPU
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
         duration: float) -> dict:
    """One measurement by a separate load-generating process."""
    cmd = [sys.executable, "-m", "service.bench.load", "--url",
           f"{url}/v1/galleries/{gallery}/search", "--queries", str(queries), "--modality",
           modality, "--concurrency", str(concurrency), "--duration", str(duration)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)
