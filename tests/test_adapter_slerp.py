"""SLERP on a gallery served through a route, through a real gateway and a real worker
process (the embedded default): SLERP mixes the route's query with the old model's own
query in the gallery's space, so an ``adapter`` job with ``slerp_t`` > 0 is refused before
anything is fitted when the gallery's active version is not native to that space."""

from __future__ import annotations

from conftest import ADMIN
from test_worker import gateway, job_settings, submit, until, worker_process, world

__all__ = ["world"]  # the module-scoped dataset fixture, shared with the job tests

from service.state.registry import Registry
from training.artifacts import load_artifact
from training.data import open_dataset


def test_slerp_is_refused_before_any_fit_when_the_gallery_is_served_through_a_route(
        micro_versions, world, tmp_path) -> None:
    """SLERP mixes the route's query with the old model's own query in the gallery's
    space. Once 'shapes' is served by 'r3' (v3's weights routed into v1), it has no native
    old query: an adapter job with slerp_t > 0 is 422 at submission (nothing queued), and
    one queued before the gallery moved fails in the worker before it reads or fits
    anything, naming why; slerp_t = 0 is still accepted."""
    from service.state.jobs.workers import write_beat
    from training.upgrades.adapter import AdapterFitConfig
    from training.upgrades.adapter.fit import fit_adapter, sample_from_dataset

    data = open_dataset(str(world))
    sample = sample_from_dataset(load_artifact(micro_versions["v1"]), data, k=16)
    r3 = fit_adapter(load_artifact(micro_versions["v3"]), sample, AdapterFitConfig(), "v1",
                     tmp_path / "r3", version_id="r3")
    values = job_settings(tmp_path / "data", world, broker=False, queue="training")
    mixed = {"new": {"version": "v3"}, "sample": 5,
             "config": {"method": "procrustes", "slerp_t": 0.5}}
    with gateway(values, micro_versions, world) as client:
        settings = client.app.state.gateway.settings
        write_beat(settings, "gpu0@host", "now")
        queued = submit(client, "adapter", mixed)  # served by v1 (native): accepted
        Registry(settings.registry_dir).register(r3.path, by="test")
        r = client.post("/v1/models/r3/promote", headers=ADMIN, json={
            "gallery": "shapes", "force": True, "reason": "serve through a route"})
        assert r.status_code == 200, r.text
        r = client.post("/v1/jobs", headers=ADMIN, json={
            "kind": "adapter", "gallery": "shapes", "params": mixed})
        assert r.status_code == 422, r.text
        message = r.json()["error"]["message"]
        assert "slerp_t=0.5" in message and "'r3' through a route" in message
        assert "no native old query" in message
        assert [j["id"] for j in client.get("/v1/jobs", headers=ADMIN).json()] == [queued["id"]]
        with worker_process(values, tmp_path / "worker.log") as proc:
            done = until(client, queued["id"], ("succeeded", "failed"), proc)
        assert done["status"] == "failed" and done["version"] is None
        assert "'r3' through a route" in done["error"], done["error"]
        assert "no native old query" in done["error"]
        assert done["progress"].get("stage") is None  # refused before reading or fitting
        assert {v["version_id"] for v in client.get("/v1/models", headers=ADMIN).json()
                } == {"v1", "v3", "r3"}
        plain = {**mixed, "config": {"method": "procrustes", "slerp_t": 0.0}}
        assert submit(client, "adapter", plain)["status"] == "queued"
