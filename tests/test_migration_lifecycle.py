# ruff: noqa: F811  (the module-scoped fixtures of test_migration are imported by name)
"""A migration's life as a state machine (service/jobkinds/migrate/lifecycle.py): every
phase with the operator actions it allows and refuses, then the transitions issue 38 found
broken, through the real gateway (its applier drives the migration), a real Redis and,
where something must be re-embedded, a real Celery worker process.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from conftest import ADMIN
from qdrant_client import models
from test_migration import migrate, migrating_stack, migration, up_version, world  # noqa: F401
from test_worker import wait_for, worker_process

from service.jobkinds.migrate import record as records
from service.jobkinds.migrate.lifecycle import OPERATOR, TRANSITIONS, allowed, phase_of, require
from service.jobkinds.migrate.record import MigrationState
from service.state.errors import Conflict
from service.state.jobs.store import Job
from service.state.jobs.workers import write_beat
from service.state.registry.index import utc_now
from service.state.registry.records import Migration, Side

# The operator's actions each phase allows: the specification the table must keep.
EXPECTED = {
    "backfilling": {"cancel", "pause"},
    "serving": {"cancel", "rollback", "pause"},
    "stopped": {"resume", "rollback", "retire"},
    "awaiting": {"switch", "cancel", "keep"},
    "kept": {"switch", "cancel", "keep"},
    "switched": {"rollback", "retire"},
    "undoing": {"cancel"},
    "ended": set(),
}


def _migration(state: str) -> Migration:
    return Migration("job-000000000001", "up", Side("v1", "a"), Side("v3", "b"), state,
                     "2026-01-01T00:00:00+00:00", "test")


def _job(status: str, **result: object) -> Job:
    return Job("job-000000000001", "migrate", "shapes", {}, False, "test", "now",
               status=status, result=dict(result))


CASES = [  # (registry state, job status, job result) -> phase
    ("backfilling", "running", {}, "backfilling"),
    ("backfilling", "queued", {}, "backfilling"),
    ("switched", "running", {}, "serving"),
    ("switched", "cancelled", {}, "stopped"),
    ("switched", "failed", {}, "stopped"),
    ("backfilling", "succeeded", {}, "awaiting"),
    ("backfilling", "failed", {"gate_failed": True}, "awaiting"),
    ("backfilling", "failed", {}, "undoing"),
    ("backfilling", "cancelled", {}, "undoing"),
    ("switched", "succeeded", {}, "switched"),
    ("switched", "failed", {"gate_failed": True}, "switched"),  # forced past its gate
    ("backfilling", "succeeded", {"kept": "rerank"}, "kept"),
    ("backfilling", "failed", {"gate_failed": True, "kept": "hybrid"}, "kept"),
    ("switched", "succeeded", {"kept": "hybrid"}, "switched"),  # switched from kept
]


def _record(gate_failed: bool = False, kept: str | None = None) -> MigrationState:
    return MigrationState(job="job-000000000001", gallery="shapes", listed=48,
                          gate_failed=gate_failed, kept=kept)


@pytest.mark.parametrize(("state", "status", "result", "phase"), CASES)
def test_every_phase_allows_exactly_its_transitions(state, status, result, phase) -> None:
    m, job = _migration(state), _job(status)
    record = _record(**result)
    assert phase_of(m, job, record) == phase
    for action in OPERATOR:
        if action in EXPECTED[phase]:
            assert require("shapes", m, job, action, record) == phase
        else:
            with pytest.raises(Conflict) as refused:
                require("shapes", m, job, action, record)
            message = refused.value.message
            assert f"cannot {action}" in message and f"it is {phase}" in message
            assert "allowed now: " + (", ".join(a for a in OPERATOR if a in EXPECTED[phase])
                                      or "nothing") in message


def test_a_rolled_back_migration_allows_by_its_backfill() -> None:
    m = _migration("rolled_back")
    running, done, stopped = _job("running"), _job("succeeded"), _job("cancelled")
    assert {a for a in OPERATOR if allowed("rolled_back", a, running)} == {"cancel", "pause"}
    assert {a for a in OPERATOR if allowed("rolled_back", a, done)} == {"retire"}
    assert {a for a in OPERATOR if allowed("rolled_back", a, stopped)} == {"retire", "resume"}
    assert phase_of(m, None) == "rolled_back"
    assert phase_of(None, None) == "ended" and not TRANSITIONS["ended"]
    with pytest.raises(Conflict, match="has no migration to retire"):
        require("shapes", None, None, "retire")


def test_a_paused_backfill_allows_resume_instead_of_pause() -> None:
    held = _job("running", backfill_paused=True)
    for state, phase, also in (("backfilling", "backfilling", set()),
                               ("switched", "serving", {"rollback"}),
                               ("rolled_back", "rolled_back", set())):
        m = _migration(state)
        assert phase_of(m, held) == phase
        assert {a for a in OPERATOR if allowed(phase, a, held)} == {"cancel", "resume"} | also
    # a finished job's stale flag does not make it resumable as a pause
    assert not allowed("backfilling", "resume", _job("succeeded", backfill_paused=True))


# ------------------------------------------------------------------ through the gateway
def _filled(client, transformed: int, switched: bool = True, **params: object) -> dict:
    """A migration whose target side is filled without a worker: its job's shard stays
    queued, the target side holds every item (the first ``transformed`` marked as
    transformed, as a transform leaves them), and with ``switched`` the registry switches
    as the applier does (phase ``serving``)."""
    gw = client.app.state.gateway  # type: ignore[attr-defined]
    # A worker is seen (its heartbeat record) but busy elsewhere: the shard stays queued.
    write_beat(gw.settings, "busy@elsewhere", utc_now())
    started = migrate(client, shards=1, batch_size=8, **params)
    view = migration(client)
    source, target = view["source"]["collection"], view["target"]["collection"]
    points, _ = gw.store.client.scroll(source, limit=10_000, with_payload=True,
                                       with_vectors=True)
    made = {"by": "transform", "version": "up", "from_space": "v1", "map": "test"}
    gw.store.client.upsert(target, [models.PointStruct(
        id=p.id, vector=p.vector, payload={**p.payload, **({"made": made} if n < transformed
                                                           else {})})
        for n, p in enumerate(points)])
    if switched:
        gw.registry.switch_migration("shapes", by="test", reason="progressive (test)")
        gw.store.point_alias("shapes", target)
        assert migration(client)["phase"] == "serving"
    return started


def _serving(client, transformed: int) -> dict:
    return _filled(client, transformed)


PROGRESSIVE = {"transform": True, "switch": "progressive", "sample": 8,
               "transform_config": {"method": "procrustes"}}


def test_the_switch_counts_re_embedded_items_on_the_side_not_writes(
        micro_versions, world, up_version, tmp_path) -> None:
    """Finding 10: a restarted shard's writes are counted twice (``applied``); the switch
    reads the side: 8 of 48 items re-embedded is below a switch point of 50%, whatever the
    write count says."""
    from test_migration import ITEMS

    with migrating_stack(tmp_path, micro_versions, world, up_version) as (client, _):
        started = _filled(client, transformed=40, switched=False, **PROGRESSIVE)
        gw = client.app.state.gateway  # type: ignore[attr-defined]
        gw.jobs.update(started["id"], lambda j: j.merged(result={"applied": 2 * ITEMS}))
        records.merge(gw.jobs, started["id"], backfill_planned=True, switch_at=0.5)
        for _ in range(15):  # the applier ticks every 0.2 s
            assert migration(client)["state"] == "backfilling"
            time.sleep(0.2)
        view = migration(client)
        assert view["state"] == "backfilling" and view["progress"]["switched_at"] is None


def test_after_a_switch_the_side_is_checked_again_and_switched_back(
        micro_versions, world, up_version, tmp_path) -> None:
    """Finding 1: after a progressive switch the applier measures the side as it stands
    (the validation items at the current fraction among items read from the gallery's
    two sides) against the route; below it beyond the error, the route serves again."""
    import numpy as np

    from service.jobkinds.migrate.transform import VALIDATION, Simulation
    from training.upgrades.transform.simulate import Items, Queries

    with migrating_stack(tmp_path, micro_versions, world, up_version) as (client, _):
        started = _filled(client, transformed=20, **PROGRESSIVE)
        gw = client.app.state.gateway  # type: ignore[attr-defined]
        rng = np.random.default_rng(0)
        n, dim = 80, 32

        def unit(rows: int) -> np.ndarray:
            v = rng.normal(size=(rows, dim)).astype(np.float32)
            return v / np.linalg.norm(v, axis=1, keepdims=True)

        # The route finds every validation item (its queries are the items' OLD vectors);
        # NEW's queries and vectors are unrelated: the side is far below the route.
        old = {"image": unit(n), "text": unit(n)}
        items = Items(old, {"image": unit(n), "text": unit(n)}, {"image": unit(n),
                                                                   "text": unit(n)})
        eye = np.eye(n, dtype=bool)
        queries = Queries(new={"text": unit(n), "image": unit(n)},
                          routed={"text": old["image"].copy(), "image": old["text"].copy()},
                          old={"text": old["image"].copy(), "image": old["text"].copy()},
                          relevant={"t2i": eye, "i2t": eye})
        sim = Simulation(items, queries, {"image": list(range(n)), "text": list(range(n))},
                         {"t2i": np.arange(n), "i2t": np.arange(n)}, n)
        sim.save(records.folder(gw.jobs, started["id"]) / VALIDATION, "random",
                 ["t2i", "i2t"])
        records.merge(gw.jobs, started["id"], backfill_planned=True, switch_at=0.2,
                      switched_at_fraction=0.2)
        # The registry's switch back lands a moment before the job records it: wait for both.
        view = wait_for(lambda: (v := migration(client))["state"] == "backfilling"
                        and "switched_back_at_fraction" in v["result"] and v,
                        60, "the switch back")
        assert view["phase"] == "backfilling" and view["serving_space"] == "v1"
        check = view["result"]["checks"][-1]
        assert check["below"] is True and check["fraction"] >= 0.2
        assert check["R@1"]["t2i"]["routed"] > check["R@1"]["t2i"]["side"]
        assert view["result"]["switched_back_at_fraction"] == check["fraction"]
        history = client.get("/v1/galleries/shapes", headers=ADMIN).json()["history"]
        assert history[-1]["action"] == "migration-switch-back"
        assert "below the route beyond the error" in history[-1]["reason"]
        for _ in range(10):  # no second progressive switch after a switch back
            time.sleep(0.2)
            assert migration(client)["state"] == "backfilling"


def test_a_failed_end_gate_after_a_progressive_switch_fails_and_switches_back(
        micro_versions, world, up_version, tmp_path) -> None:
    """Finding 2: the gate is read after a progressive switch. Failed: the route serves
    again, the job fails naming the operator's options, the history says why; the
    operator can still force the switch."""
    with migrating_stack(tmp_path, micro_versions, world, up_version) as (client, _):
        started = _serving(client, transformed=0)
        gw = client.app.state.gateway  # type: ignore[attr-defined]
        gw.jobs.add_shards(started["id"], [{"task": "gate", "start": None, "end": None,
                                            "total": 0}])
        target = migration(client)["target"]["collection"]
        gate = {"passed": False, "gallery": "shapes", "target": target, "checks": [
            {"direction": "t2i", "migrated": 0.2, "routed": 0.5, "passed": False},
            {"direction": "i2t", "migrated": 0.6, "routed": 0.5, "passed": True}]}
        gw.jobs.update(started["id"], lambda j: replace(j, status="running", gate=gate, shards=[
            {**s, "state": "done", "done": s["total"]} for s in j.shards]))
        view = wait_for(lambda: (v := migration(client))["job_status"] == "failed" and v,
                        60, "the gate's outcome")
        assert view["state"] == "backfilling" and view["serving_space"] == "v1"
        assert view["phase"] == "awaiting" and set(view["options"]) == {"switch", "cancel", "keep"}
        assert "gate failed" in view["job_error"] and "force=true" in view["job_error"]
        assert view["result"]["gate_failed"] is True and view["result"]["switched"] is False
        history = client.get("/v1/galleries/shapes", headers=ADMIN).json()["history"]
        assert history[-1]["action"] == "migration-switch-back"
        assert "t2i migrated 0.200 vs routed 0.500" in history[-1]["reason"]
        r = client.post("/v1/galleries/shapes/search", json={"text": "a red circle"})
        assert r.status_code == 200 and r.json()["space"] == "v1"
        r = client.post("/v1/galleries/shapes/migration/switch", headers=ADMIN, json={})
        assert r.status_code == 409 and "did not pass" in r.text, r.text
        r = client.post("/v1/galleries/shapes/migration/switch", headers=ADMIN,
                        json={"force": True, "reason": "we checked it by hand"})
        assert r.status_code == 200 and r.json()["phase"] == "switched", r.text


def test_a_cancel_after_the_switch_stops_and_resumes_and_retire_waits_for_it(
        micro_versions, world, up_version, tmp_path) -> None:
    """Finding 3: cancelled after a progressive switch, the backfill stops (resumable);
    retire is refused while items hold transformed vectors, naming how many; resumed, a
    real worker re-embeds what is left and the migration ends switched."""
    with migrating_stack(tmp_path, micro_versions, world, up_version) as (client, values):
        _serving(client, transformed=5)
        r = client.post("/v1/galleries/shapes/migration/cancel", headers=ADMIN)
        assert r.status_code == 204, r.text
        view = wait_for(lambda: (v := migration(client))["phase"] == "stopped" and v, 30,
                        "the stop")
        assert view["state"] == "switched" and view["job_status"] == "cancelled"
        assert set(view["options"]) == {"resume", "rollback", "retire"}
        r = client.post("/v1/galleries/shapes/migration/retire", headers=ADMIN)
        assert r.status_code == 409 and "5 item(s)" in r.text and "resume" in r.text, r.text
        r = client.post("/v1/galleries/shapes/migration", headers=ADMIN, json={})
        assert r.status_code == 409, r.text  # a new migration is refused: resume this one
        r = client.post("/v1/galleries/shapes/migration/resume", headers=ADMIN)
        assert r.status_code == 200 and r.json()["phase"] == "serving", r.text
        assert r.json()["result"]["resumed_items"] == 5
        with worker_process(values, tmp_path / "worker.log") as proc:
            done = wait_for(lambda: (v := migration(client))["job_status"] == "succeeded"
                            and v, 180, "the resumed backfill", proc)
        assert done["phase"] == "switched" and done["result"]["gate_failed"] is False
        gw = client.app.state.gateway  # type: ignore[attr-defined]
        assert gw.store.count_made(done["target"]["collection"], "transform") == 0
        r = client.post("/v1/galleries/shapes/migration/retire", headers=ADMIN)
        assert r.status_code == 200, r.text
        r = client.post("/v1/galleries/shapes/migration/resume", headers=ADMIN)
        assert r.status_code == 409 and "no migration" in r.text


def test_the_progressive_switch_does_not_wait_for_an_empty_spool(
        micro_versions, world, up_version, tmp_path) -> None:
    """Finding 10: a fast backfill keeps the spool busy; the switch is decided on the side
    (every item has a vector there), not delayed while batches wait to be written. The
    applier is slowed so that this test drives one step itself, with a batch waiting."""
    from service.jobkinds.migrate import drive
    from service.vectors.spool import SPOOL

    with migrating_stack(tmp_path, micro_versions, world, up_version,
                         apply_interval_s=3600) as (client, _):
        started = _filled(client, transformed=10, switched=False, **PROGRESSIVE)
        gw = client.app.state.gateway  # type: ignore[attr-defined]
        records.merge(gw.jobs, started["id"], backfill_planned=True, switch_at=0.5)
        waiting = gw.jobs.work_dir(started["id"]) / SPOOL / "0000-999999.npz"
        waiting.parent.mkdir(parents=True, exist_ok=True)
        waiting.write_bytes(b"a batch the applier has not written yet")
        record = gw.registry.gallery("shapes")
        job = gw.jobs.get(started["id"])
        state = records.load(gw.jobs, started["id"])
        client.portal.call(drive.drive, gw, record, job, state, "backfilling")
        view = migration(client)
        assert view["state"] == "switched" and view["phase"] == "serving"
        assert view["progress"]["switched_at_fraction"] == round(38 / 48, 4)


def test_both_sides_kept_serve_fused_searches_through_the_gateway(
        micro_versions, world, up_version, tmp_path) -> None:
    """The end state where both sides are kept (phase kept), through the gateway: the
    view shows the end states and the cost before the choice; a bad mode is a 422 and
    changes nothing; kept with hybrid, a plain search is hybrid (rerank: false the route's
    order), a write reaches both sides; the mode changes to rerank; retire is refused by
    the table; a switch then serves the native side alone."""
    with migrating_stack(tmp_path, micro_versions, world, up_version) as (client, _):
        started = _filled(client, transformed=0, switched=False)
        gw = client.app.state.gateway  # type: ignore[attr-defined]
        target = migration(client)["target"]["collection"]
        measured = {"mode": "route", "rerank_k": 20, "native_below": False,
                    "R@1": {"t2i": {"native": 0.5, "rerank@20": 0.6, "hybrid": 0.62}},
                    "native_below_fused": {"rerank@20": True, "hybrid": True}, "why": "t2i"}
        gw.jobs.update(started["id"], lambda j: j.merged(gate={
            "passed": True, "gallery": "shapes", "target": target, "checks": [],
            "serving": measured}))
        gw.jobs.finish(started["id"], "succeeded")
        before = migration(client)
        assert before["phase"] == "awaiting" and "keep" in before["options"]
        end = before["end"]
        assert [c["end"] for c in end["choices"]] == ["native", "kept:rerank", "kept:hybrid"]
        assert end["choices"][2]["R@1"] == {"t2i": 0.62} and end["choices"][2]["native_below"]
        items = before["progress"]["items"]
        assert end["cost_of_keeping"]["sides"]["target"]["points"] == items

        bad = client.post("/v1/galleries/shapes/migration/keep", headers=ADMIN,
                          json={"mode": "both"})
        assert bad.status_code == 422 and "mode" in bad.text
        assert migration(client)["phase"] == "awaiting"

        kept = client.post("/v1/galleries/shapes/migration/keep", headers=ADMIN,
                           json={"mode": "hybrid", "reason": "fused beats native"})
        assert kept.status_code == 200, kept.text
        view = kept.json()
        assert (view["phase"], view["serving"], view["state"]) == ("kept", "hybrid",
                                                                   "backfilling")
        assert set(view["options"]) == {"switch", "cancel", "keep"}
        assert view["record"]["kept"] == "hybrid" and view["record"]["kept_cost"]

        def search(**extra: object) -> dict:
            r = client.post("/v1/galleries/shapes/search", headers=ADMIN,
                            json={"text": "a red circle", "top_k": 5, **extra})
            assert r.status_code == 200, r.text
            return r.json()

        assert search()["route"] == "hybrid"
        assert search(rerank=False)["route"] not in ("hybrid", "rerank")
        assert search(rerank=True)["route"] == "rerank"
        added = client.post("/v1/galleries/shapes/items", headers=ADMIN, json={"items": [
            {"id": "kept-new", "text": "a green star"}]})
        assert added.status_code in (200, 201, 202), added.text
        for _ in range(50):  # the applier writes it to both sides
            if gw.store.count(target) == items + 1:
                break
            time.sleep(0.2)
        source = view["source"]["collection"]
        assert gw.store.count(target) == gw.store.count(source) == items + 1

        again = client.post("/v1/galleries/shapes/migration/keep", headers=ADMIN,
                            json={"mode": "rerank", "rerank_k": 5})
        assert again.status_code == 200 and (again.json()["serving"],
                                             again.json()["rerank_k"]) == ("rerank", 5)
        assert search()["route"] == "rerank"
        refused = client.post("/v1/galleries/shapes/migration/retire", headers=ADMIN)
        assert refused.status_code == 409 and "it is kept" in refused.text
        switched = client.post("/v1/galleries/shapes/migration/switch", headers=ADMIN, json={})
        assert switched.status_code == 200, switched.text
        assert switched.json()["phase"] == "switched"
        assert search()["route"] == "native"
