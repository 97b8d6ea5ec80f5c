"""Jobs end to end: the HTTP API, a real Redis, a real Celery worker process (no eager
mode), tiny real models. Also the embedded (filesystem) broker, SIGKILL, 503 (no broker,
no live worker) and 422 (bad parameters, paths outside the allowed roots)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from conftest import ADMIN, ADMIN_KEY
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.stack.launch import stop
from service.state.config import Settings
from service.state.jobs.workers import live_workers, write_beat
from service.state.registry import Registry
from training.data import write_dataset

REPO = Path(__file__).resolve().parents[1]
REDIS = "redis://127.0.0.1:6379"
TINY_XBT = {"pretrain_steps": 3, "pretrain_batch_size": 16, "steps": 2, "batch_size": 8}
# lr so small that the weights do not move: the candidate retrieves exactly like its parent,
# so the gate passes deterministically (this tests the job machinery, not the method).
STILL = {"lr": 1e-12}


def redis_up() -> None:
    try:
        redis.Redis.from_url(REDIS).ping()
    except redis.ConnectionError as exc:
        pytest.fail(f"the job tests need Redis on 127.0.0.1:6379 (.ci/run starts it): {exc}")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("world")
    write_dataset(out, 40, seed=7, languages=("en",), image_size=32)
    return out


def job_settings(data: Path, datasets: Path, broker: bool, queue: str) -> dict[str, str]:
    """What the gateway and the worker share (as NOBACKFILL_* values); ``datasets`` is the
    allowed root the jobs' datasets lie under."""
    values = {"data_dir": str(data), "datasets_dir": str(datasets), "training_queue": queue,
              "job_heartbeat_s": "0.3", "device": "cpu"}
    if broker:
        values |= {"broker_url": f"{REDIS}/0", "result_backend": f"{REDIS}/1"}
    return values


@contextlib.contextmanager
def worker_process(values: dict[str, str], log: Path) -> Iterator[subprocess.Popen]:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "NOBACKFILL_WORKER_NAME": f"test-{uuid.uuid4().hex[:6]}@localhost",
           **{f"NOBACKFILL_{k.upper()}": v for k, v in values.items()}}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "worker"], cwd=REPO, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: "ready" in log.read_text(), 90, f"worker start ({log})", proc)
        yield proc
    finally:
        stop(proc, 15)


def wait_for(ok, timeout: float, what: str, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = ok()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"worker exited with {proc.returncode} while waiting for {what}")
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


@contextlib.contextmanager
def gateway(values: dict[str, str], micro_versions: dict[str, Path], world: Path,
            **extra: object) -> Iterator[TestClient]:
    settings = Settings(**values, qdrant_path=":memory:", admin_api_keys={"ops": ADMIN_KEY},
                        registry_poll_interval_s=0.05, **extra)
    registry = Registry(settings.registry_dir)
    for vid in ("v1", "v3"):
        registry.register(micro_versions[vid], by="fixture")
    with TestClient(create_app(settings)) as client:
        r = client.post("/v1/galleries", headers=ADMIN, json={
            "name": "shapes", "space": "v1", "version": "v1", "validation": str(world)})
        assert r.status_code == 201, r.text
        r = client.post("/v1/galleries/shapes/items", headers=ADMIN, json={"items": [
            {"id": f"t{i}", "text": f"a red square number {i}"} for i in range(5)]})
        assert r.status_code == 200, r.text
        yield client


def submit(client: TestClient, kind: str, params: dict, status: int = 202, **body) -> dict:
    r = client.post("/v1/jobs", headers=ADMIN,
                    json={"kind": kind, "gallery": "shapes", "params": params, **body})
    assert r.status_code == status, r.text
    return r.json()


def job(client: TestClient, job_id: str) -> dict:
    r = client.get(f"/v1/jobs/{job_id}", headers=ADMIN)
    assert r.status_code == 200, r.text
    return r.json()


def until(client: TestClient, job_id: str, statuses: tuple[str, ...], proc=None,
          timeout: float = 120) -> dict:
    def finished() -> dict | None:
        current = job(client, job_id)
        return current if current["status"] in statuses else None
    return wait_for(finished, timeout, f"job {job_id} to reach {statuses}", proc)


def continual(world: Path, steps: int = 3, **config: object) -> dict:
    return {"method": "seqft", "data": str(world), "domain": "polygons", "steps": steps,
            "batch_size": 8, "config": {**STILL, **config}}


def served_version(client: TestClient) -> str:
    r = client.post("/v1/galleries/shapes/search", json={"text": "a red square", "top_k": 1,
                                                         "kind": "text"})
    assert r.status_code == 200, r.text
    return r.json()["version"]


# ---------------------------------------------------------------- the Redis path
def test_jobs_run_gate_and_promote_through_a_real_worker(micro_versions, world, tmp_path) -> None:
    redis_up()
    values = job_settings(tmp_path / "data", world, broker=True, queue=f"test-{uuid.uuid4().hex}")
    with gateway(values, micro_versions, world) as client, \
            worker_process(values, tmp_path / "worker.log") as proc:
        # A tiny continual phase: progress, a passing gate, auto-promotion, a swap.
        first = submit(client, "continual", continual(world, steps=3), auto_promote=True)
        assert first["status"] == "queued"
        done = until(client, first["id"], ("succeeded", "failed"), proc)
        assert done["status"] == "succeeded", done["error"]
        assert done["progress"]["step"] == done["progress"]["total"] == 3
        assert done["progress"]["stage"] == "gate" and done["progress"]["loss"] > 0
        assert done["started_at"] and done["ended_at"] and done["worker"]
        gate = done["gate"]
        assert gate["passed"] is True and {c["direction"] for c in gate["checks"]} == {"t2i", "i2t"}
        assert any(c["subset"] == "old domains" for c in gate["checks"])  # retention checked
        assert done["promoted"] is True
        new = done["version"]
        models = client.get("/v1/models", headers=ADMIN).json()
        stored = next(m for m in models if m["version_id"] == new)
        assert stored["manifest"]["gate"]["passed"] is True  # the report lives in the manifest
        assert stored["manifest"]["parent"] == "v1"
        wait_for(lambda: served_version(client) == new, 10, "the gateway to swap to " + new)

        # A tiny XBT upgrade of v3 into the gallery's space: the gate decides promotion.
        up = submit(client, "xbt", {"new": {"version": "v3"}, "corpus": "synth:300",
                                    "pairs": str(world), "config": TINY_XBT}, auto_promote=True)
        done = until(client, up["id"], ("succeeded", "failed"), proc)
        assert done["status"] == "succeeded", done["error"]
        # The last training progress was stage 2's final step; then the gate ran.
        assert done["progress"]["stage"] == "gate" and done["progress"]["step"] == 2
        assert set(done["gate"]) >= {"passed", "checks", "matrix"}
        assert done["promoted"] is done["gate"]["passed"]
        xbt_version = done["version"]
        gallery = client.get("/v1/galleries/shapes", headers=ADMIN).json()
        assert gallery["active"] == (xbt_version if done["gate"]["passed"] else new)

        # evaluate re-runs the gate of a registered version and stores the report.
        ev = submit(client, "evaluate", {"version": xbt_version})
        done_ev = until(client, ev["id"], ("succeeded", "failed"), proc)
        assert done_ev["status"] == "succeeded", done_ev["error"]
        assert client.get(f"/v1/models/{xbt_version}", headers=ADMIN).json()["gate"][
            "candidate"] == xbt_version
        # Bound to where it was measured: this gallery, its incumbent, its validation set.
        last = client.get(f"/v1/models/{xbt_version}", headers=ADMIN).json()["gates"][-1]
        assert (last["gallery"], last["incumbent"], last["current"]) == \
            ("shapes", gallery["active"], True)
        assert last["validation"] == str(world) and last["validation_digest"].startswith("sha256:")
        assert [j["id"] for j in client.get("/v1/jobs", headers=ADMIN).json()] == \
            [ev["id"], up["id"], first["id"]]


def test_cancel_a_running_job_leaves_no_version(micro_versions, world, tmp_path) -> None:
    redis_up()
    values = job_settings(tmp_path / "data", world, broker=True, queue=f"test-{uuid.uuid4().hex}")
    with gateway(values, micro_versions, world) as client, \
            worker_process(values, tmp_path / "worker.log") as proc:
        long = submit(client, "continual", continual(world, steps=100_000))
        wait_for(lambda: job(client, long["id"])["progress"].get("step", 0) > 0, 90,
                 "progress", proc)
        r = client.delete(f"/v1/jobs/{long['id']}", headers=ADMIN)
        assert r.status_code == 200 and r.json()["cancel_requested"] is True
        done = until(client, long["id"], ("cancelled", "failed", "succeeded"), proc)
        assert done["status"] == "cancelled" and done["version"] is None
        assert 0 < done["progress"]["step"] < 100_000
        assert {m["version_id"] for m in client.get("/v1/models", headers=ADMIN).json()} == \
            {"v1", "v3"}
        assert not (tmp_path / "data" / "registry" / "jobs" / f"{long['id']}.work").exists()
        again = client.delete(f"/v1/jobs/{long['id']}", headers=ADMIN)
        assert again.status_code == 409 and "already cancelled" in again.json()["error"]["message"]


def test_sigkill_mid_training_fails_the_job_and_changes_nothing(micro_versions, world,
                                                                tmp_path) -> None:
    redis_up()
    values = job_settings(tmp_path / "data", world, broker=True, queue=f"test-{uuid.uuid4().hex}")
    with gateway(values, micro_versions, world, job_stale_after_s=2.0) as client:
        registry = Registry(Path(values["data_dir"]) / "registry")
        before = (registry.versions(), registry.gallery("shapes").active)
        with worker_process(values, tmp_path / "worker.log") as proc:
            long = submit(client, "continual", continual(world, steps=100_000))
            wait_for(lambda: job(client, long["id"])["progress"].get("step", 0) > 0, 90,
                     "progress", proc)
            os.killpg(proc.pid, signal.SIGKILL)  # the worker and its child, mid-training
            proc.wait()
        done = until(client, long["id"], ("failed", "succeeded", "cancelled"), timeout=30)
        assert done["status"] == "failed" and "worker lost" in done["error"]
        assert (registry.versions(), registry.gallery("shapes").active) == before
        assert not list((registry.root / "versions").glob(".stage-*"))
        assert not (registry.root / "jobs" / f"{long['id']}.work").exists()
        assert served_version(client) == "v1"


def test_unreachable_broker_is_503_and_creates_nothing(micro_versions, world, tmp_path) -> None:
    values = job_settings(tmp_path / "data", world, broker=False, queue="training")
    values |= {"broker_url": "redis://127.0.0.1:1/0", "broker_timeout_s": "1"}
    with gateway(values, micro_versions, world) as client:
        write_beat(client.app.state.gateway.settings, "elsewhere@host", "now")  # one is live
        r = client.post("/v1/jobs", headers=ADMIN, json={
            "kind": "continual", "gallery": "shapes", "params": continual(world)})
        assert r.status_code == 503, r.text
        assert "job queue" in r.json()["error"]["message"]
        assert client.get("/v1/jobs", headers=ADMIN).json() == []


def test_no_live_worker_is_503_and_nothing_is_queued(micro_versions, world, tmp_path) -> None:
    values = job_settings(tmp_path / "data", world, broker=False, queue="training")
    values["worker_stale_after_s"] = "1"
    queue = tmp_path / "data" / "broker" / "queue"
    body = {"kind": "evaluate", "gallery": "shapes", "params": {"version": "v1"}}
    with gateway(values, micro_versions, world) as client:
        r = client.post("/v1/jobs", headers=ADMIN, json=body)
        assert r.status_code == 503, r.text
        assert "no worker has been seen" in r.json()["error"]["message"]
        assert client.get("/v1/jobs", headers=ADMIN).json() == []
        assert not queue.exists() or list(queue.iterdir()) == []  # nothing queued
        settings = client.app.state.gateway.settings
        write_beat(settings, "gpu0@host", "now")  # what a worker does when it is ready
        assert [b.name for b in live_workers(settings)] == ["gpu0@host"]
        assert submit(client, "evaluate", {"version": "v1"})["status"] == "queued"
        time.sleep(1.3)  # the worker died silently: its record ages past the limit
        assert live_workers(settings) == []
        r = client.post("/v1/jobs", headers=ADMIN, json=body)
        assert r.status_code == 503 and "gpu0@host" in r.json()["error"]["message"]
        assert len(client.get("/v1/jobs", headers=ADMIN).json()) == 1


@pytest.mark.parametrize("kind,params,needle", [
    ("continual", {"method": "sgd-magic", "data": "WORLD"}, "known methods"),
    ("continual", {"method": "seqft", "data": "/no/such/dataset"}, "outside the allowed"),
    ("continual", {"method": "seqft", "data": "WORLD/missing"}, "no dataset at"),
    ("continual", {"method": "seqft", "data": "WORLD", "base": "v9"}, "'v9' is not registered"),
    ("continual", {"method": "seqft", "data": "WORLD", "config": {"alpha": 1}}, "no field"),
    ("continual", {"data": "WORLD"}, "params.method"),
    ("xbt", {"new": {"version": "nope"}, "corpus": "synth:10", "pairs": "WORLD"},
     "'nope' is not registered"),
    ("xbt", {"new": {"version": "v3", "arch": "ViT-B-32"}, "corpus": "synth:10",
             "pairs": "WORLD"}, "exactly one"),
    ("xbt", {"new": {"version": "v3"}, "corpus": "/no/corpus.txt", "pairs": "WORLD"}, "corpus"),
    ("xbt", {"new": {"version": "v3"}, "corpus": "synth:10", "pairs": "WORLD",
             "config": {"stepz": 1}}, "no field(s) ['stepz']"),
    ("evaluate", {"version": "v404"}, "'v404' is not registered"),
    ("migrate", {"shards": 0}, "params.shards"),
    ("migrate", {"rate_limit": -1}, "params.rate_limit"),
])
def test_bad_job_parameters_are_422_before_anything_is_queued(
        kind, params, needle, micro_versions, world, tmp_path) -> None:
    # The broker is unreachable: a 422 proves the check came first, and nothing is queued.
    values = job_settings(tmp_path / "data", world, broker=False, queue="training")
    values |= {"broker_url": "redis://127.0.0.1:1/0"}
    params = {k: (v.replace("WORLD", str(world)) if isinstance(v, str) else v)
              for k, v in params.items()}
    with gateway(values, micro_versions, world) as client:
        r = client.post("/v1/jobs", headers=ADMIN,
                        json={"kind": kind, "gallery": "shapes", "params": params})
        assert r.status_code == 422, r.text
        assert needle in r.json()["error"]["message"]
        r = client.post("/v1/jobs", headers=ADMIN, json={"kind": "continual", "gallery": "nope",
                                                          "params": continual(world)})
        assert r.status_code == 422 and "gallery 'nope'" in r.json()["error"]["message"]
        assert client.get("/v1/jobs", headers=ADMIN).json() == []


@pytest.fixture(scope="module")
def escapes(world: Path) -> Path:
    """Files inside the allowed root that try to point out of it."""
    bad = world / "bad"
    bad.mkdir()
    (bad / "passwd.jsonl").write_text(json.dumps({"image": "/etc/passwd", "caption": "x"}))
    (bad / "up.csv").write_text("image,caption\n../../../../../../etc/hostname,x\n")
    (bad / "notes.json").write_text("{}")
    (bad / "etc").symlink_to("/etc")
    return bad


def test_paths_outside_the_allowed_roots_are_422_and_nothing_is_queued(
        micro_versions, world, escapes, tmp_path) -> None:
    values = job_settings(tmp_path / "data", world, broker=False, queue="training")
    long = "/" + "x" * 5000
    cases = [
        ("continual", {"method": "seqft", "data": "/etc"}, "outside the allowed roots"),
        ("continual", {"method": "seqft", "data": "/proc/self/environ"}, "outside the allowed"),
        ("continual", {"method": "seqft", "data": f"{world}/../.."}, "outside the allowed"),
        ("continual", {"method": "seqft", "data": str(escapes / "etc")}, "outside the allowed"),
        ("continual", {"method": "seqft", "data": str(escapes / "passwd.jsonl")},
         "image '/etc/passwd' is outside"),
        ("continual", {"method": "seqft", "data": str(escapes / "up.csv")}, "line 2: image"),
        ("continual", {"method": "seqft", "data": str(escapes / "notes.json")},
         "is not a dataset"),
        ("continual", {"method": "seqft", "data": str(world), "validation": "/etc"},
         "validation: '/etc' is outside"),
        ("continual", {"method": "seqft", "data": long}, "outside the allowed"),
        ("xbt", {"new": {"version": "v3"}, "corpus": "/proc/self/environ",
                 "pairs": str(world)}, "corpus"),
        ("xbt", {"new": {"arch": "ViT-B-32", "checkpoint": "/etc/passwd"},
                 "corpus": "synth:10", "pairs": str(world)}, "new.checkpoint"),
        ("xbt", {"new": {"model_config": "/etc/hostname"}, "corpus": "synth:10",
                 "pairs": str(world)}, "new.model_config"),
        ("evaluate", {"version": "v1", "validation": str(escapes / "passwd.jsonl")},
         "outside"),
        ("ingest", {"manifest": "/proc/self/environ"}, "manifest: '/proc/self/environ'"),
    ]
    with gateway(values, micro_versions, world) as client:
        write_beat(client.app.state.gateway.settings, "gpu0@host", "now")
        for kind, params, needle in cases:
            r = client.post("/v1/jobs", headers=ADMIN,
                            json={"kind": kind, "gallery": "shapes", "params": params})
            assert r.status_code == 422, (params, r.text)
            message = r.json()["error"]["message"]
            assert needle in message and len(message) < 600, (needle, message)
        r = client.post("/v1/galleries", headers=ADMIN, json={
            "name": "leaky", "space": "v1", "version": "v1", "validation": "/etc"})
        assert r.status_code == 422 and "outside the allowed" in r.text
        r = client.post("/v1/galleries", headers=ADMIN, json={
            "name": "leaky", "space": "v1", "version": "v1",
            "validation": "/proc/self/environ"})
        assert r.status_code == 422 and "outside the allowed" in r.text
        assert client.get("/v1/jobs", headers=ADMIN).json() == []
        assert "leaky" not in [g["name"] for g in client.get("/v1/galleries",
                                                              headers=ADMIN).json()]
    queue = tmp_path / "data" / "broker" / "queue"
    assert not queue.exists() or not any(queue.iterdir())


def test_job_routes_are_admin_only(micro_versions, world, tmp_path) -> None:
    values = job_settings(tmp_path / "data", world, broker=False, queue="training")
    with gateway(values, micro_versions, world) as client:
        assert client.get("/v1/jobs").status_code == 401
        assert client.post("/v1/jobs", json={"kind": "evaluate", "gallery": "shapes",
                                             "params": {"version": "v1"}}).status_code == 401
        assert client.delete("/v1/jobs/x", headers={"X-API-Key": "wrong"}).status_code == 401
        assert client.get("/v1/jobs/job-missing", headers=ADMIN).status_code == 404


# ---------------------------------------------------------------- the embedded broker
def test_embedded_filesystem_broker_runs_the_same_job(micro_versions, world, tmp_path) -> None:
    values = job_settings(tmp_path / "data", world, broker=False, queue="training")
    with gateway(values, micro_versions, world) as client, \
            worker_process(values, tmp_path / "worker.log") as proc:
        first = submit(client, "continual", continual(world, steps=2), auto_promote=True)
        done = until(client, first["id"], ("succeeded", "failed"), proc)
        assert done["status"] == "succeeded", done["error"]
        assert done["gate"]["passed"] is True and done["promoted"] is True
        wait_for(lambda: served_version(client) == done["version"], 10, "the swap")
        # An ingest job on the embedded Qdrant: the worker embeds and spools, the gateway
        # (which owns the store) writes, then finishes the job.
        ingest = submit(client, "ingest", {"manifest": str(world), "kinds": ["image", "text"],
                                           "batch_size": 16})
        done = until(client, ingest["id"], ("succeeded", "failed"), proc)
        assert done["status"] == "succeeded", done["error"]
        assert done["result"]["items"] == done["result"]["applied"] == 40
        gallery = client.get("/v1/galleries/shapes", headers=ADMIN).json()
        assert gallery["items"] == 5 + 40
        hit = client.post("/v1/galleries/shapes/search", json={"text": "a red square",
                                                               "kind": "image", "top_k": 1})
        assert hit.status_code == 200 and hit.json()["hits"][0]["version"] == gallery["active"]
    assert (tmp_path / "data" / "broker" / "queue").is_dir()  # no server was involved
