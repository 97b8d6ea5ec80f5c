# ruff: noqa: F811  (the module-scoped fixtures of test_migration are imported by name)
"""A migration with a gallery-side transform, an ordered backfill and a progressive switch,
end to end: the real gateway (its applier writes what workers spool), a real Redis, real
Celery worker processes, tiny real models (the fixtures of test_migration).

'up' is v1's weights native to space v3 with a Procrustes route into v1 (close to the
identity: the route is as good as NEW, so a side can never beat it); 'up_trained' is a
micro model trained on the world, whose side beats its near-chance route part way
through the backfill.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from conftest import ADMIN
from test_migration import (
    ITEMS,
    Searcher,
    migrate,
    migrating_stack,
    migration,
    search,
    stored_ids,
    switched_and_done,
    up_version,  # noqa: F401
    world,  # noqa: F401
)
from test_worker import job, wait_for, worker_process

from service.jobkinds.migrate import record as records
from service.jobkinds.migrate.transform import ORDER


@pytest.fixture(scope="module")
def up_trained(micro_versions: dict[str, Path], world: Path,
               tmp_path_factory: pytest.TempPathFactory) -> Path:
    """'up' as a model that has learnt the world (a micro model trained on it, native to
    space v3), with a Procrustes route into v1's space: v1 is a random model, so the route
    (and the transform of v1's vectors) is near chance, while the items NEW re-embeds
    are found: the side as it stands beats the route part way through the backfill."""
    from training.artifacts import load_artifact
    from training.contrastive import train_contrastive
    from training.data import open_dataset
    from training.encoders import ModelSpec
    from training.trainer import TrainConfig
    from training.upgrades.adapter import AdapterFitConfig
    from training.upgrades.adapter.fit import fit_adapter, sample_from_dataset

    root = tmp_path_factory.mktemp("up-trained")
    v1 = load_artifact(micro_versions["v1"])
    data = open_dataset(world)
    cfg = TrainConfig(steps=150, batch_size=16, lr=2e-3, warmup=0.1, seed=0)
    trained = train_contrastive(ModelSpec.from_dict(v1.manifest["model_spec"]), data, cfg,
                                root / "trained", version_id="trained", show_progress=False)
    manifest = json.loads((trained.path / "manifest.json").read_text())
    (trained.path / "manifest.json").write_text(json.dumps({**manifest, "space": "v3"}))
    sample = sample_from_dataset(v1, data, k=ITEMS)
    art = fit_adapter(load_artifact(trained.path), sample, AdapterFitConfig(), "v1",
                      root / "up", version_id="up")
    return art.path


def target_made(client, collection: str) -> dict[str, dict]:
    store = client.app.state.gateway.store  # type: ignore[attr-defined]
    return {i: s.made or {} for i, s in store.stored(collection).items()}


def transformed_and_running(client) -> dict | None:
    view = migration(client)
    return view if view["progress"]["transformed"] > 0 else None


def test_a_transformed_side_is_written_then_replaced_in_the_promised_order(
        micro_versions, world, up_version, tmp_path) -> None:
    with migrating_stack(tmp_path, micro_versions, world, up_version) as (client, values), \
            worker_process(values, tmp_path / "worker.log") as proc:
        started = migrate(client, shards=1, batch_size=2, rate_limit=6, transform=True,
                          sample=12, order="learned", transform_config={"method": "procrustes"})
        assert [s["task"] for s in started["shards"]] == ["transform"]
        assert started["shards"][0]["total"] == 12
        view = wait_for(lambda: transformed_and_running(client), 90, "the transform", proc)
        target = view["target"]["collection"]
        gw = client.app.state.gateway  # type: ignore[attr-defined]
        work = records.folder(gw.jobs, started["id"])
        order = json.loads((work / ORDER).read_text())
        assert order["order"] == "learned" and len(order["ids"]) == ITEMS - 12
        # Every point says how it was made: the sample embedded by 'up', the rest mapped.
        made = target_made(client, target)
        sample = {i for i, m in made.items() if m.get("by") == "embed"}
        mapped = {i for i, m in made.items() if m.get("by") == "transform"}
        assert len(sample) == 12 and sample.isdisjoint(order["ids"])
        assert mapped | sample == {f"w{i}" for i in range(ITEMS)}
        some = made[next(iter(mapped))]
        assert some["version"] == "up" and some["from_space"] == "v1"
        assert "procrustes" in some["map"] and started["id"] in some["map"]
        assert all(made[i] == {"by": "embed", "version": "up"} for i in sample)
        # The backfill replaces them in the order: what is re-embedded is always a prefix.
        seen = 0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            made = target_made(client, target)
            embedded = {i for i in order["ids"] if made.get(i, {}).get("by") == "embed"}
            assert embedded == set(order["ids"][:len(embedded)]), "re-embedded out of order"
            seen = max(seen, len(embedded))
            if len(embedded) == len(order["ids"]):
                break
            time.sleep(0.3)
        assert seen == len(order["ids"])
        done = wait_for(lambda: switched_and_done(client), 120, "the end-of-backfill switch",
                        proc)
        assert done["progress"]["fraction"] == 1.0
        assert done["progress"]["switched_at_fraction"] == 1.0  # switch "end": at the end
        assert done["progress"]["switch_at"] is not None or done["progress"]["curve"]
        store = client.app.state.gateway.store  # type: ignore[attr-defined]
        assert store.count(target) == ITEMS  # replaced in place: no duplicate points
        made = target_made(client, target)
        assert all(m.get("by") == "embed" for m in made.values())
        assert done["result"]["transformed"] == ITEMS - 12  # the transformed writes
        assert done["progress"]["transformed"] == 0  # none holds a transformed vector now
        assert [s["task"] for s in job(client, started["id"])["shards"]] == [
            "transform", "backfill", "gate"]


def test_a_progressive_switch_happens_when_the_side_beats_the_route(
        micro_versions, world, up_trained, tmp_path) -> None:
    with migrating_stack(tmp_path, micro_versions, world, up_trained) as (client, values), \
            worker_process(values, tmp_path / "worker.log") as proc:
        searcher = Searcher(client)
        searcher.start()
        started = migrate(client, shards=2, batch_size=2, rate_limit=4, transform=True,
                          sample=8, order="learned", switch="progressive",
                          transform_config={"method": "procrustes"})
        view = wait_for(lambda: migration(client) if migration(client)["state"] == "switched"
                        else None, 120, "the progressive switch", proc)
        p = view["progress"]
        assert p["switch_at"] is not None and p["switched_at_fraction"] is not None
        assert p["switched_at_fraction"] >= p["switch_at"] and p["switched_at_fraction"] < 1
        assert view["job_status"] == "running"  # the backfill goes on
        curve = p["curve"]
        assert curve[0]["fraction"] == 0 and curve[-1]["fraction"] == 1
        first = next(c for c in curve if c["fraction"] == p["switch_at"])
        for d in ("t2i", "i2t"):
            assert first[d]["side"] > p["routed"][d]["R@1"]
        assert p["share_estimate"] is not None
        assert search(client, text="a red circle")["space"] == "v3"
        both = search(client, text="a red circle", hybrid=True)  # scored by both sides
        assert both["route"] == "hybrid" and both["space"] == "v3" and len(both["hits"]) == 5
        scores = [h["score"] for h in both["hits"]]
        assert scores == sorted(scores, reverse=True) and all(-2 <= x <= 2 for x in scores)
        # Retire would drop the side the backfill checks against: refused while it runs;
        # rollback stays one call.
        r = client.post("/v1/galleries/shapes/migration/retire", headers=ADMIN)
        assert r.status_code == 409 and "still runs" in r.text, r.text
        done = wait_for(lambda: switched_and_done(client), 180, "the backfill's end", proc)
        searcher.stop.set()
        searcher.join()
        assert searcher.problems == []
        assert done["result"]["switched"] is True
        assert done["result"]["switched_at_fraction"] == p["switched_at_fraction"]
        target = done["target"]["collection"]
        assert all(m.get("by") == "embed" for m in target_made(client, target).values())
        assert stored_ids(values, target, client) == sorted(f"w{i}" for i in range(ITEMS))
        history = client.get("/v1/galleries/shapes", headers=ADMIN).json()["history"]
        assert history[-1]["action"] == "migrate" and "progressive" in history[-1]["reason"]
        assert job(client, started["id"])["status"] == "succeeded"
        r = client.post("/v1/galleries/shapes/migration/rollback", headers=ADMIN, json={})
        assert r.status_code == 200 and r.json()["state"] == "rolled_back", r.text


def test_no_progressive_switch_when_the_side_never_beats_the_route(
        micro_versions, world, up_version, tmp_path) -> None:
    """'up''s route is NEW itself (the same weights, an exact rotation): the side ties it
    at best, so the gallery switches only at the end, through the gate."""
    with migrating_stack(tmp_path, micro_versions, world, up_version) as (client, values), \
            worker_process(values, tmp_path / "worker.log") as proc:
        migrate(client, shards=2, batch_size=8, transform=True, sample=8, order="random",
                switch="progressive", transform_config={"method": "procrustes"})
        states = []
        while (view := migration(client))["job_status"] not in ("succeeded", "failed"):
            states.append(view["state"])
            if proc.poll() is not None:
                raise AssertionError("the worker exited")
            time.sleep(0.2)
        # Backfilling throughout: the end's switch (through the gate) is made just before
        # the job is marked succeeded, so the last polls may already see it.
        ended = states.index("switched") if "switched" in states else len(states)
        assert set(states[:ended]) <= {"backfilling"} and set(states[ended:]) <= {"switched"}
        assert view["progress"]["switch_at"] is None
        history = client.get("/v1/galleries/shapes", headers=ADMIN).json()["history"]
        assert [e["reason"].split(":")[0] for e in history if e["action"] == "migrate"] == [
            "auto_switch"]  # one switch, at the end: no progressive switch happened
        assert view["state"] == "switched" and view["result"]["switched_at_fraction"] == 1.0


def test_a_killed_worker_resumes_the_ordered_backfill(micro_versions, world, up_version,
                                                      tmp_path) -> None:
    with migrating_stack(tmp_path, micro_versions, world, up_version,
                         job_stale_after_s=2.0) as (client, values):
        with worker_process(values, tmp_path / "worker0.log") as proc:
            started = migrate(client, shards=2, batch_size=2, rate_limit=6, transform=True,
                              sample=8, order="learned",
                              transform_config={"method": "procrustes"})
            wait_for(lambda: migration(client)["progress"]["done"] >= 16, 120,
                     "backfill progress", proc)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        gw = client.app.state.gateway  # type: ignore[attr-defined]
        work = records.folder(gw.jobs, started["id"])
        order = json.loads((work / ORDER).read_text())["ids"]
        with worker_process(values, tmp_path / "worker1.log") as proc:
            done = wait_for(lambda: switched_and_done(client), 180, "the switch after a kill",
                            proc)
        record = job(client, started["id"])
        backfill = [s for s in record["shards"] if s["task"] == "backfill"]
        assert max(s["attempts"] for s in backfill) >= 2  # resumed at its cursor
        target = done["target"]["collection"]
        store = client.app.state.gateway.store  # type: ignore[attr-defined]
        assert store.count(target) == ITEMS
        assert all(m.get("by") == "embed" for m in target_made(client, target).values())
        assert len(order) == ITEMS - 8


def test_an_image_only_gallery_decides_its_switch_on_text_to_image_alone(
        micro_versions, world, up_trained, tmp_path) -> None:
    """Finding 9: a gallery of images and no captions serves text->image only; its curve
    scores that direction alone (the job record says so), not image->text against caption
    vectors that were never transformed."""
    from test_migration import add, world_items

    with migrating_stack(tmp_path, micro_versions, world, up_trained) as (client, values), \
            worker_process(values, tmp_path / "worker.log") as proc:
        r = client.post("/v1/galleries/shapes/items/delete", headers=ADMIN,
                        json={"ids": [f"w{i}" for i in range(ITEMS)]})
        assert r.status_code == 200, r.text
        add(client, [{k: v for k, v in item.items() if k != "text"}
                     for item in world_items(world, range(ITEMS), prefix="img")])
        migrate(client, shards=1, batch_size=8, rate_limit=4, transform=True, sample=8,
                order="random", switch="progressive",
                transform_config={"method": "procrustes"})
        view = wait_for(lambda: (v := migration(client))["progress"].get("curve") and v, 120,
                        "the validation curve", proc)
        p = view["progress"]
        assert view["record"]["curve_directions"] == ["t2i"]
        assert all(set(point) == {"fraction", "t2i"} for point in p["curve"])
        assert set(p["routed"]) == {"t2i"}
        validation = view["record"]["curve_validation"]
        assert validation["directions"] == ["t2i"] and set(validation["distractors"]) == {
            "image"}
        r = client.post("/v1/galleries/shapes/migration/cancel", headers=ADMIN)
        assert r.status_code in (204, 409), r.text
