"""The compose wiring, proven without containers: the gateway and a worker start as plain
processes with exactly the environment docker-compose gives them (values from
.env.example, as `docker-compose --env-file .env.example` resolves them; empty ones unset,
as deploy/entrypoint.sh does), with the service hosts mapped to localhost: a real Redis,
and Qdrant's local mode standing in for the server (no Qdrant server runs here). One
search and one job go through them."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from service.stack.launch import free_port, stop
from service.state.config import Settings
from service.state.jobs.workers import live_workers

ROOT = Path(__file__).resolve().parents[1]
VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?([-?])([^}]*))?\}")


def env_example() -> dict[str, str]:
    values = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        m = re.match(r"^([A-Z][A-Z0-9_]*)=(.*)$", line.strip())
        if m:
            values[m[1]] = m[2].strip("'\"")
    return values


def compose_env(service: str) -> dict[str, str]:
    spec = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"][service]
    given, out = env_example(), {}
    for key, raw in (spec.get("environment") or {}).items():
        def sub(m: re.Match[str]) -> str:
            value = given.get(m[1], "")
            return value if value or m[2] != "-" else m[3]
        value = VAR.sub(sub, str(raw))
        if value != "":
            out[key] = value  # the entrypoint unsets empty settings
    return out


def localised(env: dict[str, str], tmp: Path) -> dict[str, str]:
    """Hosts -> localhost; the /data volume -> a temp dir; Qdrant server -> local mode."""
    env = {k: v.replace("redis://redis:", "redis://127.0.0.1:") for k, v in env.items()}
    env["NOBACKFILL_DATA_DIR"] = str(tmp / "data")
    env["NOBACKFILL_REGISTRY_ROOT"] = str(tmp / "data" / "registry")
    env.pop("NOBACKFILL_QDRANT_URL", None)
    env["NOBACKFILL_QDRANT_PATH"] = str(tmp / "qdrant")
    env["NOBACKFILL_DEVICE"] = "cpu"  # no GPU on the build machine
    return env


@contextlib.contextmanager
def process(module: str, env: dict[str, str], log: Path):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NOBACKFILL_")}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", module], cwd=ROOT,
                                env={**clean, "OMP_NUM_THREADS": "1", **env}, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        stop(proc, 20)


def poll(check, timeout: float, what: str, log: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            value = check()
            if value:
                return value
        time.sleep(0.3)
    pytest.fail(f"timed out waiting for {what}:\n{log.read_text()[-3000:]}")


def test_gateway_and_worker_run_on_the_compose_environment(micro_versions, tmp_path) -> None:
    gateway_env = localised(compose_env("gateway"), tmp_path)
    worker_env = localised(compose_env("worker"), tmp_path)
    assert gateway_env["NOBACKFILL_BROKER_URL"].startswith("redis://127.0.0.1:6379")
    assert worker_env["NOBACKFILL_BROKER_URL"] == gateway_env["NOBACKFILL_BROKER_URL"]
    port = free_port()
    gateway_env |= {"NOBACKFILL_HOST": "127.0.0.1", "NOBACKFILL_PORT": str(port),
                    # the fixture's artifacts: registering is only from an allowed root
                    "NOBACKFILL_ALLOWED_ROOTS": str(micro_versions["v1"].parent)}
    key = next(iter(json.loads(gateway_env["NOBACKFILL_ADMIN_API_KEYS"]).values()))
    admin, base = {"X-API-Key": key}, f"http://127.0.0.1:{port}"
    with process("service", gateway_env, tmp_path / "gateway.log"), \
            process("worker", worker_env, tmp_path / "worker.log"):
        poll(lambda: httpx.get(f"{base}/healthz").status_code == 200, 120, "the gateway",
             tmp_path / "gateway.log")
        r = httpx.post(f"{base}/v1/models", headers=admin,
                       json={"source": str(micro_versions["v1"])}, timeout=60)
        assert r.status_code == 201, r.text
        r = httpx.post(f"{base}/v1/galleries", headers=admin, timeout=60,
                       json={"name": "g", "space": "v1", "version": "v1"})
        assert r.status_code == 201, r.text
        r = httpx.post(f"{base}/v1/galleries/g/items", headers=admin, timeout=60,
                       json={"items": [{"id": "a", "text": "a red circle"}]})
        assert r.status_code == 200, r.text
        hit = httpx.post(f"{base}/v1/galleries/g/search", timeout=60,
                         json={"text": "a red circle", "kind": "text"}).json()
        assert hit["version"] == "v1" and hit["hits"][0]["id"] == "a"
        shared = Settings(data_dir=tmp_path / "data")  # jobs are refused until a worker is live
        poll(lambda: live_workers(shared), 120, "the worker", tmp_path / "worker.log")
        job = httpx.post(f"{base}/v1/jobs", headers=admin, timeout=60, json={
            "kind": "evaluate", "gallery": "g", "params": {"version": "v1"}}).json()
        def finished() -> dict | None:
            current = httpx.get(f"{base}/v1/jobs/{job['id']}", headers=admin).json()
            return current if current["status"] in ("succeeded", "failed") else None
        done = poll(finished, 120, "the job", tmp_path / "worker.log")
        # Ran by the worker (it needs the broker and the shared registry): the gallery has no
        # validation set, so the gate reports that and the job still succeeds.
        assert done["status"] == "succeeded", done["error"]
        assert done["worker"] and "no validation set" in done["gate"]["reason"]
