"""Start and stop the gateway as a child process (``python -m service``) for a measurement."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ADMIN_KEY = "bench-admin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def gateway(data_dir: Path, log: Path, batch_size: int, max_wait_ms: float,
            device: str | None, ready_timeout_s: float = 600.0) -> Iterator[str]:
    """A running gateway; yields its base URL and stops it on exit."""
    port = free_port()
    env = {**os.environ, "NOBACKFILL_DATA_DIR": str(data_dir), "NOBACKFILL_PORT": str(port),
           "NOBACKFILL_HOST": "127.0.0.1", "NOBACKFILL_BATCH_MAX_SIZE": str(batch_size),
           "NOBACKFILL_BATCH_MAX_WAIT_MS": str(max_wait_ms),
           "NOBACKFILL_ADMIN_API_KEYS": json.dumps({"bench": ADMIN_KEY}),
           "NOBACKFILL_ACCESS_LOG": "false"}  # a log line per request would cost CPU
    if device:
        env["NOBACKFILL_DEVICE"] = device
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "service"], env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc, ready_timeout_s, log)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_ready(url: str, proc: subprocess.Popen, timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the gateway exited with {proc.returncode}; see {log}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"the gateway was not ready after {timeout_s:.0f}s; see {log}")


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
