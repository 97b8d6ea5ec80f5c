"""An ``adapter`` job end to end on the embedded default (in-memory Qdrant owned by the
gateway, filesystem broker, a real worker process): the gateway snapshots a sample of
the gallery at submission, the worker fits the route from it, gates, registers and
promotes it; items whose source cannot be read are reported by id."""

from __future__ import annotations

import base64
import io
from pathlib import Path

from conftest import ADMIN
from test_worker import gateway, job_settings, submit, until, wait_for, worker_process, world

__all__ = ["world"]  # the module-scoped dataset fixture, shared with the job tests

from service.state.registry import Registry
from training.artifacts import WEIGHTS, load_artifact, write_artifact
from training.data import open_dataset


def _twin(v1: Path, out: Path) -> Path:
    """v1's weights under another version id, in a space of its own: a 'new' model whose
    fitted route must land exactly on v1's vectors (so the gate passes deterministically)."""
    art = load_artifact(v1)
    manifest = {"version_id": "v1-twin", "space": "twin", "model_spec": art.manifest[
        "model_spec"], "embed_dim": art.manifest["embed_dim"]}
    return write_artifact(out, manifest, {WEIGHTS: art.tensors(WEIGHTS)}).path


def _png(image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def test_an_adapter_job_fits_gates_and_promotes_on_the_embedded_default(
        micro_versions, world, tmp_path) -> None:
    values = job_settings(tmp_path / "data", world, broker=False, queue="training")
    data = open_dataset(str(world))
    with gateway(values, micro_versions, world) as client, \
            worker_process(values, tmp_path / "worker.log") as proc:
        Registry(client.app.state.gateway.settings.registry_dir).register(
            _twin(micro_versions["v1"], tmp_path / "twin"), by="test")
        items = [{"id": r.id, "image_base64": _png(data.load_image(i)),
                  "payload": {"source": str(r.image_path), "caption": r.captions["en"][0]}}
                 for i, r in enumerate(data.records[:24])]
        items.append({"id": "lost", "image_base64": items[0]["image_base64"],
                      "payload": {"source": str(tmp_path / "gone.png")}})
        r = client.post("/v1/galleries/shapes/items", headers=ADMIN, json={"items": items})
        assert r.status_code == 200, r.text
        up = submit(client, "adapter", {"new": {"version": "v1-twin"}, "sample": 1000,
                                        "config": {"method": "procrustes"}}, auto_promote=True)
        done = until(client, up["id"], ("succeeded", "failed"), proc)
        assert done["status"] == "succeeded", done["error"]
        # the 5 text items have no caption in their payload: their kept text is read
        assert done["result"]["pairs"] == {"image": 24, "text": 5}
        assert done["result"]["skipped"]["image"] == ["lost"]  # its source does not exist
        assert done["result"]["skipped"]["text"] == []
        assert done["gate"]["passed"] is True and done["promoted"] is True
        assert set(done["gate"]["negative_flip"]) == {"t2i", "i2t"}
        version = client.get(f"/v1/models/{done['version']}", headers=ADMIN).json()
        route = version["manifest"]["routes"]["v1"]
        assert (route["kind"], route["method"]) == ("adapter", "procrustes")
        assert version["manifest"]["metrics"]["fit_cosine"]["image"] > 0.999

        def serves() -> bool:
            r = client.post("/v1/galleries/shapes/search", json={"text": "a red square"})
            return r.status_code == 200 and r.json()["version"] == done["version"]
        wait_for(serves, 15, "the gateway to swap to the adapter version")


def test_an_adapter_job_on_a_gallery_without_items_is_422(micro_versions, world,
                                                          tmp_path) -> None:
    from service.state.jobs.workers import write_beat

    values = job_settings(tmp_path / "data", world, broker=False, queue="training")
    with gateway(values, micro_versions, world) as client:
        write_beat(client.app.state.gateway.settings, "gpu0@host", "now")
        client.post("/v1/galleries/shapes/items/delete", headers=ADMIN,
                    json={"ids": [f"t{i}" for i in range(5)]})
        r = client.post("/v1/jobs", headers=ADMIN, json={
            "kind": "adapter", "gallery": "shapes", "params": {"new": {"version": "v3"}}})
        assert r.status_code == 422 and "at least 2" in r.json()["error"]["message"]
        r = client.post("/v1/jobs", headers=ADMIN, json={
            "kind": "adapter", "gallery": "shapes",
            "params": {"new": {"version": "v3"}, "config": {"methd": "affine"}}})
        assert r.status_code == 422 and "methd" in r.json()["error"]["message"]
        assert client.get("/v1/jobs", headers=ADMIN).json() == []
