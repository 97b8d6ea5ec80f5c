"""Managed migration end to end: the real gateway (its applier writes what workers spool),
a real Redis, real Celery worker processes, tiny real models.

The gallery 'shapes' is in space v1; version 'up' (native space v3, an adapter route
into v1) serves it. A migration re-embeds every item with 'up' natively into a new side
and switches the gallery to space v3, while searches, adds and deletes go on.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import ADMIN, bound
from fastapi.testclient import TestClient
from test_worker import gateway, job, job_settings, redis_up, wait_for, worker_process

from service.state.registry import Registry
from training.data import open_dataset, write_dataset

ITEMS = 48


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("migration-world")
    write_dataset(out, ITEMS, seed=11, languages=("en",), image_size=32)
    return out


@pytest.fixture(scope="module")
def up_version(micro_versions: dict[str, Path], world: Path,
               tmp_path_factory: pytest.TempPathFactory) -> Path:
    """'up': v1's weights relabelled as native to space v3, with a Procrustes route into
    v1 fitted on v1's own vectors (close to the identity). So new->new and the route
    new->old retrieve alike and the migration gate passes: these tests are about the
    mechanism, not the model."""
    from training.artifacts import load_artifact
    from training.upgrades.adapter import AdapterFitConfig
    from training.upgrades.adapter.fit import fit_adapter, sample_from_dataset

    root = tmp_path_factory.mktemp("up")
    relabelled = root / "v1-as-v3"
    shutil.copytree(micro_versions["v1"], relabelled)
    manifest = json.loads((relabelled / "manifest.json").read_text())
    (relabelled / "manifest.json").write_text(json.dumps({**manifest, "space": "v3",
                                                          "version_id": "v1-as-v3"}))
    old = load_artifact(micro_versions["v1"])
    sample = sample_from_dataset(old, open_dataset(world), k=ITEMS)
    art = fit_adapter(load_artifact(relabelled), sample, AdapterFitConfig(), "v1", root / "up",
                      version_id="up")
    return art.path


def png_b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def add(client: TestClient, items: list[dict]) -> None:
    r = client.post("/v1/galleries/shapes/items", headers=ADMIN, json={"items": items})
    assert r.status_code == 200, r.text


def world_items(world: Path, ids: range, prefix: str = "w") -> list[dict]:
    rows = [json.loads(line) for line in (world / "manifest.jsonl").read_text().splitlines()]
    return [{"id": f"{prefix}{i}", "text": rows[i]["captions"]["en"][0],
             "image_base64": png_b64(world / rows[i]["image"])} for i in ids]


@contextlib.contextmanager
def migrating_stack(tmp_path: Path, micro_versions: dict[str, Path], world: Path, up: Path,
                    **extra: object) -> Iterator[tuple[TestClient, dict[str, str]]]:
    """The gateway with 'shapes' holding ITEMS items (API-ingested: their originals are
    kept) and 'up' promoted; the worker is the test's to start."""
    redis_up()
    values = job_settings(tmp_path / "data", world, broker=True, queue=f"mig-{uuid.uuid4().hex}")
    with gateway(values, micro_versions, world, **{"apply_interval_s": 0.2, **extra}) as client:
        client.post("/v1/galleries/shapes/items/delete", headers=ADMIN,
                    json={"ids": [f"t{i}" for i in range(5)]})  # the fixture's text items
        add(client, world_items(world, range(ITEMS)))
        registry = Registry(Path(values["data_dir"]) / "registry")
        registry.register(up, by="test", gate=bound({"passed": True, "note": "test fixture"},
                                                    validation=str(world)))
        r = client.post("/v1/models/up/promote", headers=ADMIN, json={"gallery": "shapes"})
        assert r.status_code == 200, r.text
        yield client, values


def migrate(client: TestClient, status: int = 202, **params: object) -> dict:
    r = client.post("/v1/galleries/shapes/migration", headers=ADMIN, json=params)
    assert r.status_code == status, r.text
    return r.json()


def migration(client: TestClient) -> dict:
    r = client.get("/v1/galleries/shapes/migration", headers=ADMIN)
    assert r.status_code == 200, r.text
    return r.json()


def migration_where(client: TestClient, key: str, value: str) -> dict | None:
    """The migration's view once ``view[key] == value`` (else None, to poll again)."""
    view = migration(client)
    return view if view[key] == value else None


def switched_and_done(client: TestClient) -> dict | None:
    """The migration's view once it switched and its job ended (else None)."""
    view = migration(client)
    return view if view["state"] == "switched" and view["job_status"] == "succeeded" else None


def search(client: TestClient, **query: object) -> dict:
    r = client.post("/v1/galleries/shapes/search", json={"top_k": 5, **query})
    assert r.status_code == 200, r.text
    return r.json()


def stored_ids(values: dict[str, str], collection: str, client: TestClient) -> list[str]:
    store = client.app.state.gateway.store  # type: ignore[attr-defined]
    return sorted(store.stored(collection))


class Searcher(threading.Thread):
    """Searches without a pause until stopped; every answer must come from one space."""

    def __init__(self, client: TestClient) -> None:
        super().__init__(daemon=True)
        self.client, self.stop, self.spaces, self.problems = client, threading.Event(), [], []

    def run(self) -> None:
        while not self.stop.is_set():
            r = self.client.post("/v1/galleries/shapes/search",
                                 json={"text": "a red circle", "top_k": 5})
            if r.status_code != 200:
                self.problems.append(f"{r.status_code}: {r.text[:200]}")
                continue
            body = r.json()
            hit_spaces = {h["space"] for h in body["hits"]}
            if hit_spaces - {body["space"]}:
                self.problems.append(f"mixed answer: query in {body['space']}, hits {hit_spaces}")
            self.spaces.append(body["space"])


def test_the_whole_story_through_the_api(micro_versions, world, up_version, tmp_path) -> None:
    with migrating_stack(tmp_path, micro_versions, world, up_version) as (client, values), \
            worker_process(values, tmp_path / "worker.log") as proc:
        before = search(client, text="a red circle")
        assert before["space"] == "v1" and before["route"] == "adapter"
        searcher = Searcher(client)
        searcher.start()
        started = migrate(client, shards=2, batch_size=4, rate_limit=12)
        assert started["kind"] == "migrate" and len(started["shards"]) == 2
        assert sum(s["total"] for s in started["shards"]) == ITEMS
        migrate(client, status=409)  # a second migration of the same gallery
        view = migration(client)
        assert view["state"] == "backfilling" and view["target"]["space"] == "v3"

        # Writes during the backfill reach both sides; deletes are not undone.
        wait_for(lambda: migration(client)["progress"]["done"] > 0, 60, "progress", proc)
        add(client, world_items(world, range(3), prefix="new"))
        client.post("/v1/galleries/shapes/items/delete", headers=ADMIN,
                    json={"ids": ["w0", "w1", "w40", "w47"]})
        progress = migration(client)["progress"]
        assert progress["total"] == ITEMS and progress["items_per_s"] > 0
        in_job = job(client, started["id"])["progress"]  # the job API shows it too
        assert in_job["total"] == ITEMS and in_job["done"] > 0 and "eta_s" in in_job
        assert progress["eta_s"] is not None and progress["stage"] == "backfill"

        # The switch comes first, then the job ends (a view between the two says switched
        # with the job still running): wait for both.
        done = wait_for(lambda: switched_and_done(client), 120, "the switch", proc)
        # The searcher's request in flight at the switch may still be answered in v1; the
        # ones after it are answered in v3.
        seen = len(searcher.spaces)
        wait_for(lambda: len(searcher.spaces) > seen + 1 and searcher.spaces[-1] == "v3", 30,
                 "searches answered in the new space", proc)
        searcher.stop.set()
        searcher.join()
        assert searcher.problems == []
        assert "v1" in searcher.spaces and searcher.spaces[-1] == "v3"
        assert done["job_status"] == "succeeded" and done["result"]["switched"] is True
        shards = job(client, started["id"])["shards"]
        assert [s["task"] for s in shards] == ["backfill", "backfill", "gate"]  # no catch-up
        assert done["gate"]["passed"] is True
        assert {c["direction"] for c in done["gate"]["checks"]} == {"t2i", "i2t"}
        after = search(client, text="a red circle")
        assert after["space"] == "v3" and after["route"] == "native"
        assert {h["space"] for h in after["hits"]} == {"v3"}
        expected = sorted({f"w{i}" for i in range(ITEMS)} - {"w0", "w1", "w40", "w47"}
                          | {"new0", "new1", "new2"})
        assert stored_ids(values, done["target"]["collection"], client) == expected
        assert stored_ids(values, done["source"]["collection"], client) == expected
        gallery = client.get("/v1/galleries/shapes", headers=ADMIN).json()
        assert gallery["space"] == "v3" and gallery["items"] == len(expected)
        assert gallery["history"][-1]["action"] == "migrate"

        # Rollback: v1's space and the route again, in one call; then the new side retires.
        r = client.post("/v1/galleries/shapes/migration/rollback", headers=ADMIN,
                        json={"reason": "check"})
        assert r.status_code == 200 and r.json()["state"] == "rolled_back", r.text
        back = search(client, text="a red circle")
        assert back["space"] == "v1" and back["route"] == "adapter"
        r = client.post("/v1/galleries/shapes/migration/retire", headers=ADMIN)
        assert r.status_code == 200 and r.json()["dropped"]["space"] == "v3", r.text
        assert client.get("/v1/galleries/shapes/migration", headers=ADMIN).status_code == 404
        store = client.app.state.gateway.store  # type: ignore[attr-defined]
        assert not store.client.collection_exists(done["target"]["collection"])
        assert search(client, text="a red circle")["space"] == "v1"


def test_a_killed_worker_resumes_and_every_item_is_there_once(micro_versions, world,
                                                              up_version, tmp_path) -> None:
    with migrating_stack(tmp_path, micro_versions, world, up_version,
                         job_stale_after_s=2.0) as (client, values):
        for n in range(2):
            with worker_process(values, tmp_path / f"worker{n}.log") as proc:
                if n == 0:
                    started = migrate(client, shards=2, batch_size=4, rate_limit=8)
                target = (n + 1) * 8
                wait_for(lambda t=target: migration(client)["progress"]["done"] >= t, 90,
                         "backfill progress", proc)
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        with worker_process(values, tmp_path / "worker-last.log") as proc:
            done = wait_for(lambda: switched_and_done(client), 120,
                            "the switch after two kills", proc)
        record = job(client, started["id"])
        assert record["status"] == "succeeded"
        assert max(s["attempts"] for s in record["shards"]) >= 2  # resumed, not restarted
        expected = sorted(f"w{i}" for i in range(ITEMS))
        assert stored_ids(values, done["target"]["collection"], client) == expected
        store = client.app.state.gateway.store  # type: ignore[attr-defined]
        assert store.count(done["target"]["collection"]) == ITEMS  # no duplicate points
        fingerprint = store.fingerprint(done["target"]["collection"])
        assert list(fingerprint) == ["up"] and fingerprint["up"]["items"] == ITEMS
        # Retire after the switch: the old side goes, the gallery keeps serving v3.
        r = client.post("/v1/galleries/shapes/migration/retire", headers=ADMIN)
        assert r.status_code == 200 and r.json()["dropped"]["space"] == "v1", r.text
        assert not store.client.collection_exists(done["source"]["collection"])
        assert search(client, text="a blue square")["space"] == "v3"
        r = client.post("/v1/galleries/shapes/migration/rollback", headers=ADMIN, json={})
        assert r.status_code == 409


def test_cancel_undoes_and_an_unreadable_source_blocks_the_switch(micro_versions, world,
                                                                  up_version, tmp_path) -> None:
    with migrating_stack(tmp_path, micro_versions, world, up_version) as (client, values), \
            worker_process(values, tmp_path / "worker.log") as proc:
        # Cancel mid-backfill: the target side is dropped, the gallery serves as before.
        slow = migrate(client, shards=1, batch_size=2, rate_limit=4)
        wait_for(lambda: migration(client)["progress"]["done"] > 0, 60, "progress", proc)
        target = migration(client)["target"]["collection"]
        r = client.delete(f"/v1/jobs/{slow['id']}", headers=ADMIN)
        assert r.status_code == 200, r.text
        wait_for(lambda: job(client, slow["id"])["status"] == "cancelled", 30, "cancel", proc)
        wait_for(lambda: client.get("/v1/galleries/shapes/migration",
                                    headers=ADMIN).status_code == 404, 30, "the undo")
        store = client.app.state.gateway.store  # type: ignore[attr-defined]
        assert not store.client.collection_exists(target)
        assert search(client, text="a red circle")["space"] == "v1"

        # An item whose kept original is gone: named, and the switch waits for the operator.
        sources = Path(values["data_dir"]) / "sources"
        kept = {p.name for p in sources.rglob("*") if p.is_file()}
        add(client, [{"id": "lost", "text": "a lost one",
                      "image_base64": base64.b64encode(_png()).decode()}])
        for path in sources.rglob("*"):
            if path.is_file() and path.name not in kept:
                path.unlink()
        migrate(client, shards=2, batch_size=8)
        view = wait_for(lambda: migration_where(client, "job_status", "succeeded"), 120,
                        "the backfill", proc)
        assert view["state"] == "backfilling" and view["result"]["switched"] is False
        assert [u["id"] for u in view["result"]["unreadable"]] == ["lost"]
        assert "lost" in view["result"]["switch_refused"]
        r = client.post("/v1/galleries/shapes/migration/switch", headers=ADMIN, json={})
        assert r.status_code == 409 and "lost" in r.json()["error"]["message"], r.text
        r = client.post("/v1/galleries/shapes/migration/switch", headers=ADMIN,
                        json={"drop": ["lost"]})
        assert r.status_code == 200 and r.json()["state"] == "switched", r.text
        assert "lost" not in stored_ids(values, r.json()["target"]["collection"], client)
        assert "lost" not in stored_ids(values, r.json()["source"]["collection"], client)
        # Deleting a gallery whose migration keeps two sides drops both collections.
        sides = [r.json()["source"]["collection"], r.json()["target"]["collection"]]
        gone = client.delete("/v1/galleries/shapes", headers=ADMIN)
        assert gone.status_code == 200, gone.text
        assert not any(store.client.collection_exists(c) for c in sides)


def test_bad_migration_requests_are_refused_before_anything_is_queued(
        micro_versions, world, up_version, tmp_path) -> None:
    values = job_settings(tmp_path / "data", world, broker=False, queue="training")
    values |= {"broker_url": "redis://127.0.0.1:1/0"}  # nothing could be queued anyway
    with gateway(values, micro_versions, world) as client:
        r = client.post("/v1/galleries/shapes/migration", headers=ADMIN, json={"shards": 0})
        assert r.status_code == 422 and "shards" in r.text
        r = client.post("/v1/galleries/shapes/migration", headers=ADMIN, json={"speed": 1})
        assert r.status_code == 422 and "speed" in r.text
        # v1 serves 'shapes' natively: there is nothing to migrate to.
        r = client.post("/v1/galleries/shapes/migration", headers=ADMIN, json={})
        assert r.status_code == 409 and "already in space 'v1'" in r.text
        for action in ("switch", "rollback", "retire", "cancel"):
            r = client.post(f"/v1/galleries/shapes/migration/{action}", headers=ADMIN, json={})
            assert r.status_code in (409, 422), r.text
        assert client.get("/v1/jobs", headers=ADMIN).json() == []
        assert Registry(Path(values["data_dir"]) / "registry").gallery("shapes").migration is None


def _png() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (10, 200, 10)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("ahead", [0, 1, 3])
def test_the_backfill_reader_gives_every_batch_in_order_whatever_it_reads_ahead(
        world, tmp_path, ahead) -> None:
    """Reading ahead in a thread changes when a batch is read, never what comes out or in
    which order; an unreadable source is reported by id; a backfill stopped mid-way (a
    cancel) leaves no reader running."""
    import torch

    from service.state.paths import Roots
    from service.vectors.backfill import OriginReader
    from service.vectors.sources import SourceStore

    rows = [json.loads(line) for line in (world / "manifest.jsonl").read_text().splitlines()]
    items = [{"id": f"w{i}", "kinds": ["image", "text"],
              "origin": {"image": str(world / rows[i]["image"]),
                         "text": rows[i]["captions"]["en"][0]}} for i in range(10)]
    items[4]["origin"]["image"] = str(world / "missing.png")
    items[7]["origin"] = {"text": "no image kept"}
    reader = OriginReader(SourceStore(tmp_path / "sources"), Roots((world.resolve(),)),
                          lambda images: torch.stack([torch.tensor(np.array(im)) for im in images]))
    got = list(reader.batches(items, 2, 3, ahead))
    assert [first for first, _ in got] == [2, 5, 8]
    assert [b["n"] for _, b in got] == [3, 3, 2]
    assert [[u["id"] for u in b["unreadable"]] for _, b in got] == [["w4"], ["w7"], []]
    assert "no image source was kept" in got[1][1]["unreadable"][0]["reason"]
    assert got[0][1]["image_rows"] == [0, 1] and sorted(got[0][1]["texts"]) == [0, 1]
    whole = reader.load(items[2:5])
    assert torch.equal(got[0][1]["pixels"], whole["pixels"])
    stream = reader.batches(items, 0, 2, ahead)
    next(stream)
    stream.close()  # as a cancel does: nothing keeps reading
    assert not [t for t in threading.enumerate() if t.name.startswith("backfill-read")]


def test_the_backfill_reads_ahead_on_cuda_and_in_line_on_the_cpu_unless_told(
        monkeypatch) -> None:
    import torch

    from service.state.config import Settings
    from service.vectors.backfill import read_ahead

    monkeypatch.delenv("NOBACKFILL_MIGRATION_READ_AHEAD", raising=False)
    unset = Settings().migration_read_ahead
    assert unset is None
    assert read_ahead(unset, torch.device("cpu")) == 0
    assert read_ahead(unset, torch.device("cuda", 1)) == 1
    monkeypatch.setenv("NOBACKFILL_MIGRATION_READ_AHEAD", "2")
    assert read_ahead(Settings().migration_read_ahead, torch.device("cpu")) == 2
    monkeypatch.setenv("NOBACKFILL_MIGRATION_READ_AHEAD", "-1")
    with pytest.raises(ValueError, match="migration_read_ahead"):
        Settings()
