"""Multi-rank jobs through the HTTP API, a real Redis and a real Celery worker process:
a 2-rank continual phase and a 2-rank XBT upgrade end as gated, registered versions; a
cancelled 2-rank job leaves no rank process, no version and no work directory behind.
On this CPU-only host the worker's 2 "GPUs" are 2 gloo processes."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from conftest import ADMIN, artifact_tensors
from test_worker import (  # the job-test harness of test_worker.py
    TINY_XBT,
    continual,
    gateway,
    job,
    job_settings,
    redis_up,
    submit,
    until,
    wait_for,
    worker_process,
)
from test_worker import world as world  # noqa: PLC0414 (the module's dataset fixture)


def rank_processes(session: int) -> list[int]:
    """Pids of the spawned ranks in the worker's session (the worker runs in its own)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue  # exited while we looked
        if int(fields[3]) == session and fields[0] != "Z" and b"spawn_main" in cmdline:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.parametrize("kind,params,needle", [
    ("continual", {"gpus": 0}, "params.gpus: Input should be greater than or equal to 1"),
    ("continual", {"gpus": 2, "batch_size": 9}, "batch_size=9 does not split evenly over gpus=2"),
    ("xbt", {"gpus": 4, "config": {"pretrain_batch_size": 30}},
     "pretrain_batch_size=30 does not split evenly over gpus=4"),
])
def test_gpus_that_cannot_split_the_batch_are_422(kind, params, needle, micro_versions, world,
                                                  tmp_path) -> None:
    values = job_settings(tmp_path / "data", world, broker=False, queue="training")
    values |= {"broker_url": "redis://127.0.0.1:1/0"}  # unreachable: 422 must come first
    base = continual(world) if kind == "continual" else {
        "new": {"version": "v3"}, "corpus": "synth:10", "pairs": str(world)}
    with gateway(values, micro_versions, world) as client:
        r = client.post("/v1/jobs", headers=ADMIN, json={
            "kind": kind, "gallery": "shapes", "params": {**base, **params}})
        assert r.status_code == 422, r.text
        assert needle in r.json()["error"]["message"]
        assert client.get("/v1/jobs", headers=ADMIN).json() == []


def test_two_rank_jobs_register_gated_versions_and_cancel_cleanly(micro_versions, world,
                                                                   tmp_path) -> None:
    redis_up()
    values = job_settings(tmp_path / "data", world, broker=True, queue=f"test-{uuid.uuid4().hex}")
    registry_root = tmp_path / "data" / "registry"
    with gateway(values, micro_versions, world) as client, \
            worker_process(values, tmp_path / "worker.log") as proc:
        # A 2-rank continual phase: gated and registered.
        phase = submit(client, "continual", {**continual(world, steps=3), "gpus": 2},
                       auto_promote=True)
        done = until(client, phase["id"], ("succeeded", "failed"), proc, timeout=240)
        assert done["status"] == "succeeded", done["error"]
        assert done["progress"]["step"] == done["progress"]["total"] == 3  # rank 0's steps
        assert done["gate"]["passed"] is True and done["promoted"] is True
        stored = client.get(f"/v1/models/{done['version']}", headers=ADMIN).json()
        assert stored["manifest"]["metrics"]["ranks"] == 2
        assert stored["manifest"]["hyperparameters"]["train"]["batch_size"] == 8  # global

        # A 2-rank XBT upgrade of v3 into the gallery's space: gated and registered.
        up = submit(client, "xbt", {"new": {"version": "v3"}, "corpus": "synth:300",
                                    "pairs": str(world), "config": TINY_XBT, "gpus": 2})
        done = until(client, up["id"], ("succeeded", "failed"), proc, timeout=240)
        assert done["status"] == "succeeded", done["error"]
        assert set(done["gate"]) >= {"passed", "checks", "matrix"}
        stored = client.get(f"/v1/models/{done['version']}", headers=ADMIN).json()
        assert stored["manifest"]["metrics"]["ranks"] == 2 and stored["gate"] is not None
        versions = {m["version_id"] for m in client.get("/v1/models", headers=ADMIN).json()}

        # Cancel a long 2-rank phase mid-run: both ranks go, nothing is registered.
        long = submit(client, "continual", {**continual(world, steps=100_000), "gpus": 2})
        wait_for(lambda: job(client, long["id"])["progress"].get("step", 0) > 0, 180,
                 "progress of the 2-rank job", proc)
        assert len(rank_processes(proc.pid)) == 2  # really two ranks
        r = client.delete(f"/v1/jobs/{long['id']}", headers=ADMIN)
        assert r.status_code == 200 and r.json()["cancel_requested"] is True
        done = until(client, long["id"], ("cancelled", "failed", "succeeded"), proc)
        assert done["status"] == "cancelled" and done["version"] is None, done["error"]
        assert rank_processes(proc.pid) == []  # stopped before the job was marked cancelled
        assert {m["version_id"] for m in client.get("/v1/models", headers=ADMIN).json()} == \
            versions
        assert not (registry_root / "jobs" / f"{long['id']}.work").exists()

        # A job asking for more ranks than the host has fails, naming the limit (its batch
        # splits evenly over 64 ranks: an uneven one is refused at submission instead).
        too_many = submit(client, "continual", {**continual(world), "gpus": 64,
                                                "batch_size": 128})
        done = until(client, too_many["id"], ("failed", "succeeded"), proc)
        assert done["status"] == "failed" and "gpus=64" in done["error"], done["error"]


# Long enough that the kill, soon after step 12, always lands mid-training (at 160 steps a
# fast run could finish before it, with its ranks gone and the candidate registered).
RESUME_STEPS = 480


def test_a_killed_two_rank_job_resumes_from_its_checkpoint(micro_versions, world,
                                                          tmp_path) -> None:
    """A 2-rank continual job saves its training state every 10 steps; its worker (and
    both ranks) is SIGKILLed after a save. The gateway finds the job silent, queues it
    again, and a new worker resumes it from the save: it ends as the same version an
    uninterrupted run of the same job gives, within float tolerance."""
    import os
    import signal

    import torch

    from service.state.registry import Registry

    redis_up()
    values = job_settings(tmp_path / "data", world, broker=True, queue=f"test-{uuid.uuid4().hex}")
    params = {**continual(world, steps=RESUME_STEPS, lr=1e-3), "gpus": 2, "seed": 4,
              "checkpoint_every": 10}
    with gateway(values, micro_versions, world, job_stale_after_s=2.0) as client:
        with worker_process(values, tmp_path / "worker0.log") as proc:
            first = submit(client, "continual", {**params, "version_id": "resumed"})
            wait_for(lambda: job(client, first["id"])["progress"].get("step", 0) >= 12, 180,
                     "a 2-rank job past its first checkpoint", proc)
            assert len(rank_processes(proc.pid)) == 2
            os.killpg(proc.pid, signal.SIGKILL)  # the worker, its task process and both ranks
            proc.wait()
        with worker_process(values, tmp_path / "worker1.log") as proc:
            done = until(client, first["id"], ("succeeded", "failed", "cancelled"), proc,
                         timeout=240)
            assert done["status"] == "succeeded", done["error"]
            assert done["attempts"] == 2 and done["version"] == "resumed"
            assert [r["attempt"] for r in done["result"]["requeued"]] == [1]
            assert done["progress"]["step"] == done["progress"]["total"] == RESUME_STEPS
            log = (tmp_path / "worker1.log").read_text()
            assert "resumes from its checkpoint" in log
            again = submit(client, "continual", {**params, "version_id": "uninterrupted"})
            ref = until(client, again["id"], ("succeeded", "failed", "cancelled"), proc,
                        timeout=240)
            assert ref["status"] == "succeeded" and ref["attempts"] == 1, ref["error"]
    registry = Registry(tmp_path / "data" / "registry")
    resumed, uninterrupted = (artifact_tensors(registry.artifact(v)) for v in ("resumed",
                                                                        "uninterrupted"))
    assert resumed.keys() == uninterrupted.keys()
    parent = artifact_tensors(registry.artifact("v1"))
    moved = [k for k in resumed if k in parent and not torch.equal(parent[k], resumed[k])]
    assert moved, "the phase trained nothing: the comparison would prove nothing"
    for key, value in resumed.items():
        torch.testing.assert_close(value, uninterrupted[key], rtol=1e-4, atol=1e-5, msg=key)


LAUNCHER = """
import sys
from pathlib import Path
from tests.rank_entries import train_forever
from training.distributed import launch
launch(train_forever, Path(sys.argv[1]), gpus=2, device="cpu", threads=1)
"""


def test_ranks_die_with_a_killed_launcher(tmp_path: Path) -> None:
    """A worker killed outright (SIGKILL to the task's process only) leaves no rank behind:
    each rank dies with its launcher."""
    import os
    import signal
    import subprocess
    import sys
    import time

    repo = Path(__file__).resolve().parents[1]
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path)], cwd=repo)
    try:
        wait_for(lambda: len(list(tmp_path.glob("rank*.pid"))) == 2, 120, "both ranks",
                 launcher)
        pids = [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() and
                                                  _running(p) for p in pids):
            time.sleep(0.2)
        assert not [p for p in pids if _running(p)], "a rank outlived its launcher"
    finally:
        if launcher.poll() is None:
            launcher.kill()


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
