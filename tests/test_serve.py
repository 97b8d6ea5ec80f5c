"""`make serve`'s launcher from an empty data directory: the bootstrap (reduced size), the
embedded worker and the gateway reach a healthy /readyz; a killed worker is restarted and
the log says so; a second start reuses it all."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.stack.launch import free_port, stop
from service.state.config import Settings
from service.state.jobs.workers import live_workers

REPO = Path(__file__).resolve().parents[1]
KEY = "serve-test-key"


@contextlib.contextmanager
def launched(data: Path, port: int, log: Path) -> Iterator[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NOBACKFILL_DATA_DIR": str(data),
           "NOBACKFILL_PORT": str(port), "NOBACKFILL_BOOTSTRAP_IMAGES": "40",
           "NOBACKFILL_BOOTSTRAP_STEPS": "2", "NOBACKFILL_DEVICE": "cpu",
           "NOBACKFILL_ADMIN_API_KEYS": f'{{"ops": "{KEY}"}}'}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "service.stack.launch"], cwd=REPO, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"launcher exited early:\n{log.read_text()[-3000:]}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                    break
            time.sleep(0.5)
        else:
            pytest.fail(f"/readyz never became healthy:\n{log.read_text()[-3000:]}")
        yield base
    finally:
        stop(proc, 30)


def _alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie (waits up to 10 s for it to go)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return False
        if state == "Z":
            return False
        time.sleep(0.2)
    return True


def _kill_the_worker_and_see_it_restarted(data: Path, log: Path) -> int:
    """SIGKILL the embedded worker (and its pool); the launcher's supervisor starts a new
    one, which announces itself. The killed pid."""
    settings = Settings(data_dir=data)
    deadline = time.monotonic() + 120
    while not live_workers(settings):
        assert time.monotonic() < deadline, f"no live worker:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)
    killed = live_workers(settings)[0].pid
    os.killpg(killed, signal.SIGKILL)
    while not [b for b in live_workers(settings) if b.pid != killed]:
        assert time.monotonic() < deadline + 120, \
            f"the worker was not restarted:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)
    assert "embedded worker restarted (pid" in log.read_text()
    return killed


def test_serve_bootstraps_once_and_answers(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with launched(data, free_port(), tmp_path / "first.log") as base:
        gallery = httpx.get(f"{base}/v1/galleries/demo", headers={"X-API-Key": KEY}).json()
        assert gallery["active"] == "v1" and gallery["items"] == 40
        assert gallery["validation"].endswith("validation")
        hits = httpx.post(f"{base}/v1/galleries/demo/search",
                          json={"text": "a red circle", "top_k": 3}).json()
        assert hits["version"] == "v1" and len(hits["hits"]) == 3
        thumb = httpx.get(f"{base}/v1/galleries/demo/items/{hits['hits'][0]['id']}/thumbnail")
        assert thumb.status_code == 200 and thumb.content[:4] == b"\x89PNG"
        killed = _kill_the_worker_and_see_it_restarted(data, tmp_path / "first.log")
    first = (tmp_path / "first.log").read_text()
    assert "step 1/4" in first and "step 4/4: bootstrap done" in first
    pids = [int(p) for p in re.findall(r"embedded worker started \(pid (\d+)\)", first)]
    assert pids[0] == killed and len(pids) == 2
    assert f"(pid {killed}) exited" in first and "killed by SIGKILL (exit code -9)" in first
    assert not any(_alive(pid) for pid in pids)  # SIGTERM to the launcher stopped it too
    with launched(data, free_port(), tmp_path / "second.log") as base:
        gallery = httpx.get(f"{base}/v1/galleries/demo", headers={"X-API-Key": KEY}).json()
        assert gallery["items"] == 40
    assert "step 1/4" not in (tmp_path / "second.log").read_text()  # reused, not redone
