"""Admin routes that change what exists: registering (only from the allowed roots, 201 new,
200 the same again, 409 other files under a taken id), gates the caller cannot supply,
forced promotions shown as forced, and deleting galleries and versions."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import ADMIN
from fastapi.testclient import TestClient
from test_service_api import assert_error, search, world_items

from training.data import write_dataset


@pytest.fixture
def client(gateway_factory):
    with gateway_factory() as c:
        yield c


def copy_as(source: Path, dest: Path, version_id: str, **fields: object) -> Path:
    shutil.copytree(source, dest)
    manifest = json.loads((dest / "manifest.json").read_text())
    (dest / "manifest.json").write_text(json.dumps({**manifest, "version_id": version_id,
                                                    **fields}))
    return dest


def gateway_of(client: TestClient):
    return client.app.state.gateway


# ---------------------------------------------------------------- registering
def test_registering_again_is_200_and_other_files_under_a_taken_id_409(
        client: TestClient, micro_versions: dict[str, Path], tmp_path: Path) -> None:
    source = copy_as(micro_versions["v1"], tmp_path / "v4", "v4")
    first = client.post("/v1/models", headers=ADMIN, json={"source": str(source)})
    assert first.status_code == 201, first.text
    again = client.post("/v1/models", headers=ADMIN, json={"source": str(source)})
    assert again.status_code == 200 and again.json() == first.json()
    impostor = copy_as(micro_versions["v2"], tmp_path / "impostor", "v4")
    r = client.post("/v1/models", headers=ADMIN, json={"source": str(impostor)})
    assert "different files" in assert_error(r, 409, "already_exists")["message"]
    assert client.get("/v1/models/v4", headers=ADMIN).json()["registered_at"] == \
        first.json()["registered_at"]


def test_register_only_from_the_allowed_roots(gateway_factory, micro_versions: dict[str, Path],
                                              tmp_path: Path) -> None:
    outside = micro_versions["v1"]  # the session's artifact dir: not a root of this gateway
    with gateway_factory(allowed_roots=()) as client:
        for source in (str(outside), "/etc", "/proc/self/environ", "/" + "y" * 4000):
            r = client.post("/v1/models", headers=ADMIN, json={"source": source})
            message = assert_error(r, 422, "invalid_input")["message"]
            # the input is echoed bounded (the message also lists the roots, whose length
            # depends on where pytest puts tmp_path)
            assert "outside the allowed roots" in message and "y" * 65 not in message
            assert len(message) < 300 + len(str(tmp_path)) * 3
        r = client.post("/v1/models", headers=ADMIN,
                        json={"source": str(tmp_path / "data" / ("a" * 300))})
        assert_error(r, 422, "invalid_artifact")
        inside = copy_as(outside, tmp_path / "data" / "datasets" / "v4", "v4")
        r = client.post("/v1/models", headers=ADMIN, json={"source": str(inside)})
        assert r.status_code == 201, r.text


def test_a_gate_in_the_manifest_is_not_a_passed_gate(client: TestClient,
                                                     micro_versions: dict[str, Path],
                                                     tmp_path: Path) -> None:
    source = copy_as(micro_versions["v2"], tmp_path / "v4", "v4", gate={"passed": True})
    r = client.post("/v1/models", headers=ADMIN, json={"source": str(source)})
    assert r.status_code == 201, r.text
    version = r.json()
    assert version["gate"] is None and version["gate_status"] == "none"
    assert "gate" not in version["manifest"]
    r = client.post("/v1/models/v4/promote", headers=ADMIN, json={"gallery": "shapes"})
    assert "no gate report" in assert_error(r, 409, "gate_failed")["message"]


def test_a_forced_promotion_shows_as_forced(client: TestClient,
                                            micro_versions: dict[str, Path],
                                            tmp_path: Path) -> None:
    source = copy_as(micro_versions["v2"], tmp_path / "v4", "v4")
    assert client.post("/v1/models", headers=ADMIN, json={"source": str(source)}).status_code \
        == 201
    r = client.post("/v1/models/v4/promote", headers=ADMIN,
                    json={"gallery": "shapes", "force": True, "reason": "incident 7"})
    assert r.status_code == 200, r.text
    event = r.json()["history"][-1]
    assert (event["forced"], event["overrides"], event["by"], event["reason"]) == \
        (True, ["gate"], "ops", "incident 7")
    version = client.get("/v1/models/v4", headers=ADMIN).json()
    assert version["gate_status"] == "forced" and version["gate"] is None
    assert version["forced"] == [{"gallery": "shapes", "by": "ops", "at": event["at"],
                                  "reason": "incident 7", "overrides": ["gate"]}]
    v2 = client.get("/v1/models/v2", headers=ADMIN).json()
    assert (v2["gate_status"], v2["forced"]) == ("passed", [])


def evaluate(client: TestClient, version: str, gallery: str) -> dict:
    """An evaluate job run to its end by the worker's own code, in this process."""
    from worker.lifecycle import run

    gateway = gateway_of(client)
    job = gateway.jobs.create("evaluate", gallery, {"version": version}, by="ops")
    done = run(job.id, gateway.settings, "test-worker")
    assert done is not None and done.status == "succeeded", done and done.error
    return done.gate


def test_a_gate_passed_on_another_gallery_does_not_promote(client: TestClient,
                                                          micro_versions: dict[str, Path],
                                                          tmp_path: Path) -> None:
    """Issue 30's reproduction: 'bad' (random weights) fails the gate on 'shapes' (here:
    it has no validation set); 'wash', a gallery in the same space served by 'bad' with a
    4-image validation set, gates it against itself and passes. 'bad' must stay out of
    'shapes' (409 naming the report), and both reports show where they were measured."""
    bad = copy_as(micro_versions["v2"], tmp_path / "bad", "bad")
    assert client.post("/v1/models", headers=ADMIN, json={"source": str(bad)}).status_code \
        == 201
    assert evaluate(client, "bad", "shapes")["passed"] is False
    r = client.post("/v1/models/bad/promote", headers=ADMIN, json={"gallery": "shapes"})
    assert "did not pass" in assert_error(r, 409, "gate_failed")["message"]
    write_dataset(tmp_path / "wash-set", 4, seed=5, languages=("en",), image_size=16)
    r = client.post("/v1/galleries", headers=ADMIN, json={
        "name": "wash", "space": "v1", "version": "bad", "validation": str(tmp_path / "wash-set")})
    assert r.status_code == 201, r.text
    assert evaluate(client, "bad", "wash")["passed"] is True  # against itself
    r = client.post("/v1/models/bad/promote", headers=ADMIN, json={"gallery": "shapes"})
    message = assert_error(r, 409, "gate_failed")["message"]
    assert "gallery 'shapes'" in message and "did not pass" in message
    shapes = client.get("/v1/galleries/shapes", headers=ADMIN).json()
    assert shapes["active"] == "v1" and len(shapes["history"]) == 1
    assert search(client, text="a red circle")["version"] == "v1"
    gates = client.get("/v1/models/bad", headers=ADMIN).json()["gates"]
    assert [(g["gallery"], g["incumbent"], g["passed"], g["current"]) for g in gates] == [
        ("shapes", "v1", False, True), ("wash", "bad", True, True)]
    assert gates[0]["validation_digest"] is None
    assert gates[1]["validation_digest"].startswith("sha256:")
    assert gates[1]["criterion"] == {"metric": "R@1", "margin": 0.0, "retention_limit": 0.02,
                                     "max_negative_flip": None}
    assert gates[1]["report"]["matrix"] and gates[1]["stale"] == []


def test_a_gate_report_shows_as_stale_once_its_gallery_changes(
        client: TestClient, micro_versions: dict[str, Path], tmp_path: Path) -> None:
    write_dataset(tmp_path / "set", 4, seed=5, languages=("en",), image_size=16)
    r = client.post("/v1/galleries", headers=ADMIN, json={
        "name": "wash", "space": "v1", "version": "v1", "validation": str(tmp_path / "set")})
    assert r.status_code == 201, r.text
    evaluate(client, "v2", "wash")
    [report] = [g for g in client.get("/v1/models/v2", headers=ADMIN).json()["gates"]
                if g["gallery"] == "wash"]
    assert report["current"] and report["incumbent"] == "v1"
    r = client.post("/v1/models/v3/promote", headers=ADMIN,
                    json={"gallery": "wash", "force": True, "reason": "drill"})
    assert r.status_code == 200, r.text
    (tmp_path / "set" / "manifest.jsonl").write_text(
        "\n".join((tmp_path / "set" / "manifest.jsonl").read_text().splitlines()[:3]) + "\n")
    listed = {v["version_id"]: v for v in client.get("/v1/models", headers=ADMIN).json()}
    [report] = [g for g in listed["v2"]["gates"] if g["gallery"] == "wash"]
    assert not report["current"] and [s.split(":")[0] for s in report["stale"]] == [
        "incumbent changed", "validation set changed"]
    r = client.post("/v1/models/v2/promote", headers=ADMIN, json={"gallery": "wash"})
    assert "is stale: incumbent changed" in assert_error(r, 409, "gate_failed")["message"]


# ---------------------------------------------------------------- deleting galleries
def test_delete_a_gallery(client: TestClient, tmp_path: Path) -> None:
    r = client.post("/v1/galleries", headers=ADMIN, json={"name": "doomed", "space": "v1"})
    assert r.status_code == 201, r.text
    items = world_items(3)
    assert client.post("/v1/galleries/doomed/items", headers=ADMIN,
                       json={"items": items}).status_code == 200
    thumbs = tmp_path / "data" / "thumbnails" / "doomed"
    assert len(list(thumbs.iterdir())) == 3
    r = client.delete("/v1/galleries/doomed", headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json() == {"name": "doomed", "space": "v1", "active": "v2", "deleted_by": "ops"}
    assert_error(client.get("/v1/galleries/doomed", headers=ADMIN), 404, "gallery_not_found")
    assert_error(client.post("/v1/galleries/doomed/search", json={"text": "a circle"}), 404)
    assert gateway_of(client).store.dim("doomed") is None  # collection and alias are gone
    assert not thumbs.exists()
    assert "doomed" not in client.get("/readyz", headers=ADMIN).json()["galleries"]
    assert search(client, text="a red circle")["version"] == "v1"  # the others serve on
    again = client.post("/v1/galleries", headers=ADMIN, json={"name": "doomed", "space": "v1"})
    assert again.status_code == 201
    assert client.get("/v1/galleries/doomed", headers=ADMIN).json()["items"] == 0
    assert_error(client.delete("/v1/galleries/nope", headers=ADMIN), 404, "gallery_not_found")
    r = client.delete("/v1/galleries/" + "n" * 3000, headers=ADMIN)
    assert len(assert_error(r, 404)["message"]) < 200


def test_an_interrupted_delete_blocks_the_name_until_it_is_repeated(client: TestClient) -> None:
    assert client.post("/v1/galleries", headers=ADMIN,
                       json={"name": "half", "space": "v1"}).status_code == 201
    client.post("/v1/galleries/half/items", headers=ADMIN, json={"items": world_items(2)})
    gateway_of(client).registry.retire_gallery("half", by="ops")  # then the process died
    assert_error(client.get("/v1/galleries/half", headers=ADMIN), 404)
    assert gateway_of(client).store.dim("half") == 32  # its collection is still there
    r = client.post("/v1/galleries", headers=ADMIN, json={"name": "half", "space": "v1"})
    assert "still being deleted" in assert_error(r, 409, "conflict")["message"]
    assert client.delete("/v1/galleries/half", headers=ADMIN).status_code == 200
    assert gateway_of(client).store.dim("half") is None
    r = client.post("/v1/galleries", headers=ADMIN, json={"name": "half", "space": "v1"})
    assert r.status_code == 201 and r.json()["name"] == "half"
    assert client.get("/v1/galleries/half", headers=ADMIN).json()["items"] == 0


def test_a_gallery_with_an_unfinished_job_is_not_deleted(client: TestClient) -> None:
    job = gateway_of(client).jobs.create("evaluate", "shapes", {"version": "v2"}, by="ops")
    r = client.delete("/v1/galleries/shapes", headers=ADMIN)
    assert job.id in assert_error(r, 409, "conflict")["message"]
    assert_error(client.delete("/v1/models/v2", headers=ADMIN), 409, "conflict")
    gateway_of(client).jobs.cancel(job.id)
    assert client.delete("/v1/galleries/shapes", headers=ADMIN).status_code == 200


# ---------------------------------------------------------------- retiring versions
def test_retire_a_version(client: TestClient, micro_versions: dict[str, Path],
                          tmp_path: Path) -> None:
    versions = tmp_path / "data" / "registry" / "versions"
    r = client.delete("/v1/models/v1", headers=ADMIN)
    assert "serves gallery 'shapes'" in assert_error(r, 409, "conflict")["message"]
    child = copy_as(micro_versions["v1"], tmp_path / "v1.1", "v1.1", parent="v2")
    assert client.post("/v1/models", headers=ADMIN, json={"source": str(child)}).status_code \
        == 201
    client.post("/v1/models/v1.1/promote", headers=ADMIN,
                json={"gallery": "shapes", "force": True, "reason": "test"})
    r = client.delete("/v1/models/v2", headers=ADMIN)
    assert "parent of 'v1.1', which serves gallery 'shapes'" in \
        assert_error(r, 409, "conflict")["message"]
    r = client.delete("/v1/models/v3", headers=ADMIN)
    assert r.status_code == 200 and r.json() == {"version_id": "v3", "deleted_by": "ops"}
    assert_error(client.get("/v1/models/v3", headers=ADMIN), 404, "version_not_found")
    assert not (versions / "v3").exists()
    assert_error(client.delete("/v1/models/v3", headers=ADMIN), 404, "version_not_found")
    r = client.delete("/v1/models/v1", headers=ADMIN)  # only in the history now
    assert r.status_code == 200
    assert_error(client.post("/v1/models/v1/rollback", headers=ADMIN,
                             json={"gallery": "shapes"}), 404, "version_not_found")
    assert search(client, text="a red circle")["version"] == "v1.1"
    r = client.post("/v1/models", headers=ADMIN, json={"source": str(micro_versions["v3"])})
    assert r.status_code == 422  # the session's artifacts are outside this gateway's roots
    shutil.copytree(micro_versions["v3"], tmp_path / "v3")
    r = client.post("/v1/models", headers=ADMIN, json={"source": str(tmp_path / "v3")})
    assert r.status_code == 201  # the id is free again


def test_delete_routes_are_admin_only(client: TestClient) -> None:
    for url in ("/v1/galleries/shapes", "/v1/models/v2"):
        for headers in ({}, {"X-API-Key": "wrong"}):
            assert_error(client.delete(url, headers=headers), 401, "unauthorized")
    assert client.get("/v1/galleries/shapes", headers=ADMIN).status_code == 200
    assert client.get("/v1/models/v2", headers=ADMIN).status_code == 200


def test_gallery_validation_must_be_a_dataset_under_the_roots(client: TestClient,
                                                             tmp_path: Path) -> None:
    write_dataset(tmp_path / "val", 4, seed=3, languages=("en",), image_size=16)
    (tmp_path / "escape.jsonl").write_text(json.dumps({"image": "/etc/passwd",
                                                       "caption": "x"}) + "\n")
    (tmp_path / "notes.json").write_text("{}")
    cases = {"/etc": "outside the allowed roots", "/proc/self/environ": "outside the allowed",
             str(tmp_path / "escape.jsonl"): "image '/etc/passwd' is outside",
             str(tmp_path / "notes.json"): "is not a dataset",
             str(tmp_path / "nothing"): "no dataset at",
             str(tmp_path / ("a" * 300)): "no dataset at",  # a name too long: still a 422
             str(tmp_path / "x\x00y"): "not a usable path"}
    for n, (path, needle) in enumerate(cases.items()):
        r = client.post("/v1/galleries", headers=ADMIN,
                        json={"name": f"g{n}", "space": "v1", "validation": path})
        assert needle in assert_error(r, 422, "invalid_input")["message"], path
    assert [g["name"] for g in client.get("/v1/galleries", headers=ADMIN).json()] == ["shapes"]
    r = client.post("/v1/galleries", headers=ADMIN,
                    json={"name": "checked", "space": "v1", "validation": str(tmp_path / "val")})
    assert r.status_code == 201 and r.json()["validation"] == str(tmp_path / "val")
