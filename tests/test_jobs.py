"""Job records (lifecycle, idempotent start, cancel, reaping) and the compatibility gate."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from service.state.errors import Conflict
from service.state.jobs import JobNotFound, JobStore
from service.state.jobs.store import CHECKPOINT_FILE, MAX_ATTEMPTS, Reaped
from training.artifacts import load_artifact, write_artifact
from training.data import PairDataset, generate_items
from training.errors import ConfigError
from training.gate import GateCriterion, run_gate


def test_a_job_runs_once_and_ends_once(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    job = store.create("continual", "g", {"method": "seqft"}, by="ops")
    assert store.get(job.id).status == "queued"
    running = store.start(job.id, "w@h:1")
    assert running is not None and running.status == "running" and running.worker == "w@h:1"
    assert store.start(job.id, "w@h:2") is None  # a duplicate delivery does not run it again
    store.beat(job.id, {"step": 3, "total": 10})
    assert store.get(job.id).progress == {"step": 3, "total": 10}
    store.work_dir(job.id).mkdir()
    done = store.finish(job.id, "succeeded", version="v2")
    assert (done.status, done.version) == ("succeeded", "v2") and done.ended_at
    assert not store.work_dir(job.id).exists()
    assert store.finish(job.id, "failed", error="late").status == "succeeded"  # first word wins
    with pytest.raises(Conflict, match="already succeeded"):
        store.cancel(job.id)


def test_what_the_gateway_counted_survives_the_workers_summary(tmp_path: Path) -> None:
    # The gateway applies an ingest job's spool while its worker still runs and counts
    # what it wrote in the job's result; the worker's summary at hand-off and the final
    # word add to that result, never replace it (CI once saw "items 40, applied 24").
    store = JobStore(tmp_path)
    job = store.create("ingest", "g", {}, by="ops")
    store.start(job.id, "w@h:1")
    store.update(job.id, lambda j: replace(j, result={**j.result, "applied": 16}))
    handed = store.hand_off(job.id, result={"items": 40})
    assert handed.status == "applying" and handed.result == {"applied": 16, "items": 40}
    store.update(job.id, lambda j: replace(j, result={**j.result, "applied": 40}))
    done = store.finish(job.id, "succeeded", result={"note": "ok"})
    assert done.result == {"applied": 40, "items": 40, "note": "ok"}


def test_cancel_a_queued_job_at_once_and_flag_a_running_one(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    queued = store.create("evaluate", "g", {}, by="ops")
    assert store.cancel(queued.id).status == "cancelled"
    assert store.start(queued.id, "w@h:1") is None  # the task arrives later: it skips
    running = store.create("evaluate", "g", {}, by="ops")
    store.start(running.id, "w@h:1")
    flagged = store.cancel(running.id)
    assert flagged.status == "running" and flagged.cancel_requested


def test_heartbeats_never_lose_a_concurrent_cancel(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    job = store.create("continual", "g", {}, by="ops")
    store.start(job.id, "w@h:1")
    beats = [threading.Thread(target=lambda i=i: [store.beat(job.id, {"step": i * 100 + k})
                                                  for k in range(20)]) for i in range(4)]
    for t in beats:
        t.start()
    store.cancel(job.id)
    for t in beats:
        t.join()
    assert store.get(job.id).cancel_requested


def test_reap_fails_silent_jobs_and_jobs_of_a_restarted_node(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    a, b = (store.create("continual", "g", {}, by="ops") for _ in range(2))
    store.start(a.id, "gpu0@h:11")
    store.start(b.id, "gpu1@h:12")
    assert store.reap(stale_after_s=60) == Reaped()  # both beat just now
    assert store.reap(stale_after_s=0, worker="gpu0@h") == Reaped(failed=[a.id])
    failed = store.get(a.id)
    assert failed.status == "failed" and "worker lost" in failed.error
    assert store.get(b.id).status == "running"
    store.update(b.id, lambda j: replace(j, heartbeat_at="2000-01-01T00:00:00+00:00"))
    assert store.reap(stale_after_s=60) == Reaped(failed=[b.id])


def _checkpoint(store: JobStore, job_id: str, stage: str = "") -> Path:
    saved = store.checkpoint_dir(job_id) / stage / CHECKPOINT_FILE
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_bytes(b"state")
    return saved


def test_a_dead_job_with_a_checkpoint_is_queued_again_until_its_starts_run_out(
        tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    job = store.create("continual", "g", {}, by="ops")
    for attempt in range(1, MAX_ATTEMPTS + 1):
        running = store.start(job.id, f"gpu0@h:{attempt}")
        assert running is not None and running.attempts == attempt
        saved = _checkpoint(store, job.id)
        reaped = store.reap(stale_after_s=0, worker="gpu0@h")
        if attempt < MAX_ATTEMPTS:
            assert reaped == Reaped(requeued=[job.id])
            again = store.get(job.id)
            assert again.status == "queued" and again.worker is None
            assert [r["attempt"] for r in again.result["requeued"]] == list(range(1, attempt + 1))
            assert saved.is_file()  # the work directory (and its checkpoint) stays
    assert reaped == Reaped(failed=[job.id])
    failed = store.get(job.id)
    assert failed.status == "failed" and f"after {MAX_ATTEMPTS} starts" in failed.error
    assert not store.work_dir(job.id).exists()


def test_a_stage_folder_of_saves_counts_as_a_checkpoint(tmp_path: Path) -> None:
    """An XBT upgrade saves each stage in its own folder (stage1/, stage2/)."""
    store = JobStore(tmp_path)
    job = store.create("xbt", "g", {}, by="ops")
    store.start(job.id, "gpu0@h:1")
    _checkpoint(store, job.id, "stage2")
    assert store.reap(stale_after_s=0, worker="gpu0@h") == Reaped(requeued=[job.id])


def test_the_store_looks_for_the_file_the_training_loop_saves() -> None:
    from training.trainer import TrainState

    assert CHECKPOINT_FILE == TrainState.FILE


def test_a_dead_job_without_a_saved_checkpoint_fails(
        tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    job = store.create("continual", "g", {}, by="ops")
    store.start(job.id, "gpu0@h:1")
    store.checkpoint_dir(job.id).mkdir(parents=True)  # a directory, but nothing saved yet
    assert store.reap(stale_after_s=0, worker="gpu0@h") == Reaped(failed=[job.id])


def test_a_superseded_run_neither_finishes_the_job_nor_beats_for_it(tmp_path: Path) -> None:
    """A run given up for dead (queued again, started by another worker) that comes back
    to life leaves the job to its current run and keeps the work directory."""
    store = JobStore(tmp_path)
    job = store.create("continual", "g", {}, by="ops")
    store.start(job.id, "gpu0@h:1")
    saved = _checkpoint(store, job.id)
    store.reap(stale_after_s=0, worker="gpu0@h")
    assert store.finish(job.id, "failed", attempt=1, error="late").status == "queued"
    current = store.start(job.id, "gpu1@h:2")
    assert current is not None and current.attempts == 2
    store.beat(job.id, {"step": 99}, attempt=1)
    assert store.get(job.id).progress != {"step": 99}
    assert store.finish(job.id, "cancelled", attempt=1).status == "running"
    assert saved.is_file()
    store.beat(job.id, {"step": 7}, attempt=2)
    assert store.get(job.id).progress == {"step": 7}
    assert store.finish(job.id, "succeeded", attempt=2).status == "succeeded"
    assert not store.work_dir(job.id).exists()


def test_a_requeued_job_the_broker_refuses_fails_naming_why(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    job = store.create("continual", "g", {}, by="ops")
    store.start(job.id, "gpu0@h:1")
    _checkpoint(store, job.id)
    store.reap(stale_after_s=0, worker="gpu0@h")
    failed = store.requeue_failed_to_send(job.id, "broker down")
    assert failed.status == "failed" and "broker down" in failed.error
    assert not store.work_dir(job.id).exists()


def test_unknown_and_unsafe_job_ids_are_not_found(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    for bad in ("job-nope", "../index", ".hidden", ""):
        with pytest.raises(JobNotFound):
            store.get(bad)


# ---------------------------------------------------------------- the gate
@pytest.fixture(scope="module")
def versions(micro_versions: dict[str, Path], tmp_path_factory) -> dict[str, object]:
    """v1, a byte-identical copy of it under another id (same space), and v3 (other space)."""
    v1 = load_artifact(micro_versions["v1"])
    twin = tmp_path_factory.mktemp("twin") / "twin"
    manifest = {k: v for k, v in v1.manifest.items() if k not in ("files", "created_at")}
    write_artifact(twin, {**manifest, "version_id": "twin"}, {"model.safetensors": v1.tensors()})
    return {"v1": v1, "twin": load_artifact(twin), "v3": load_artifact(micro_versions["v3"])}


@pytest.fixture(scope="module")
def validation() -> PairDataset:
    return PairDataset.from_synth(generate_items(24, seed=11, languages=("en",)), image_size=32)


def test_gate_passes_an_equal_candidate_and_fails_an_impossible_margin(versions,
                                                                        validation) -> None:
    report = run_gate(versions["twin"], versions["v1"], validation)
    assert report["passed"] is True and len(report["checks"]) == 2
    for check in report["checks"]:
        assert check["new_to_old"] == pytest.approx(check["old_to_old"])
    assert report["matrix"]["models"] == ["v1", "twin"]
    json.dumps(report)  # stored in manifests and job records
    strict = run_gate(versions["twin"], versions["v1"], validation, GateCriterion(margin=1.0))
    assert strict["passed"] is False and not any(c["passed"] for c in strict["checks"])


def test_gate_checks_old_domains_for_a_domain_phase(versions, validation) -> None:
    criterion = GateCriterion(retention_limit=0.02, new_domain=validation.domains()[0])
    report = run_gate(versions["twin"], versions["v1"], validation, criterion)
    old = [c for c in report["checks"] if c["subset"] == "old domains"]
    assert len(old) == 2 and report["criterion"]["old_domains"] == validation.domains()[1:]
    assert all(c["required"] == pytest.approx(c["old_to_old"] - 0.02) for c in old)


def test_gate_checks_the_new_language_for_gain_and_english_for_retention(versions) -> None:
    bilingual = PairDataset.from_synth(generate_items(24, seed=12, languages=("en", "de")),
                                       image_size=32)
    criterion = GateCriterion(margin=0.0, retention_limit=0.02, new_language="de")
    report = run_gate(versions["twin"], versions["v1"], bilingual, criterion)
    subsets = [(c["subset"], c["direction"]) for c in report["checks"]]
    assert subsets == [("language de", "t2i"), ("language en", "t2i"), ("language en", "i2t")]
    english = [c for c in report["checks"] if c["subset"] == "language en"]
    assert all(c["required"] == pytest.approx(c["old_to_old"] - 0.02) for c in english)
    assert report["passed"] is True  # an identical twin neither gains nor loses
    demanding = GateCriterion(margin=1.0, retention_limit=0.02, new_language="de")
    assert run_gate(versions["twin"], versions["v1"], bilingual, demanding)["passed"] is False
    with pytest.raises(ConfigError, match="no 'ru' captions"):
        run_gate(versions["twin"], versions["v1"], bilingual,
                 GateCriterion(retention_limit=0.02, new_language="ru"))
    with pytest.raises(ConfigError, match="a domain or a language"):
        GateCriterion(new_domain="basic", new_language="de")


def test_gate_refuses_a_candidate_without_a_route_into_the_space(versions, validation) -> None:
    with pytest.raises(ConfigError, match="no route into the gallery's space 'v1'"):
        run_gate(versions["v3"], versions["v1"], validation)
    with pytest.raises(ConfigError, match="margin"):
        GateCriterion(margin=-0.1)


# ---------------------------------------------------------------- worker liveness
def test_worker_liveness_records(tmp_path: Path) -> None:
    from service.state.config import Settings
    from service.state.errors import Unavailable
    from service.state.jobs.workers import (
        live_workers,
        record_path,
        remove_beat,
        require_live_worker,
        workers,
        write_beat,
    )

    settings = Settings(data_dir=tmp_path, worker_stale_after_s=30)
    with pytest.raises(Unavailable, match="no worker has been seen for 30s"):
        require_live_worker(settings)
    odd = "../gpu 0@host/"  # any node name becomes one safe file under REGISTRY/workers
    beat = write_beat(settings, odd, "2020-01-01T00:00:00+00:00")
    assert record_path(settings, odd).parent == tmp_path / "registry" / "workers"
    assert [b.name for b in live_workers(settings)] == [odd] and beat.pid > 0
    require_live_worker(settings)
    (tmp_path / "registry" / "workers" / "junk.json").write_text("{not json")
    stale = {**json.loads(record_path(settings, odd).read_text()), "name": "old@h",
             "pid": 1, "at": "2000-01-01T00:00:00+00:00"}
    record_path(settings, "old@h").write_text(json.dumps(stale))
    assert [b.name for b in workers(settings)] == [odd, "old@h"]  # junk is no record
    assert [b.name for b in live_workers(settings)] == [odd]
    remove_beat(settings, "old@h")  # another process's record: left alone
    assert len(workers(settings)) == 2
    remove_beat(settings, odd)
    with pytest.raises(Unavailable, match="the last one, old@h"):
        require_live_worker(settings)
