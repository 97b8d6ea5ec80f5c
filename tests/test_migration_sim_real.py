# ruff: noqa: F811  (the module-scoped fixtures of test_migration are imported by name)
"""The simulation's stand-ins checked against the real thing: random sequences (seeded)
of the same operations through the real gateway (its applier drives the migration every
0.2 s), a real Redis and real Celery worker processes, kills included: pause, resume,
cancel, rollback, adds, deletes, searches, a SIGKILL of the worker and a new one. After
each operation and at rest, the same invariants as ``tests/migration_sim.py``: the
phase moved along the table, searches answer 200 from one side, the serving side holds
exactly the live items, every vector on the target side is the new version's own or a
marked transform, and the view's counts are the store's.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
from conftest import ADMIN
from test_migration import (  # noqa: F401
    ITEMS,
    add,
    migrate,
    migrating_stack,
    migration,
    up_version,
    world,
    world_items,
)
from test_worker import wait_for, worker_process

from service.jobkinds.migrate.lifecycle import OPERATOR, TRANSITIONS

OPS = ("wait", "wait", "pause", "resume", "cancel", "rollback", "add", "delete", "kill")
APPLIER = ("progressive", "switch_back", "finish", "gate_failed", "fail", "cancel")


def _reachable(phase: str) -> set[str]:
    once = {t for a in TRANSITIONS[phase].values() for t in a.split("|")}
    return {phase} | once | {t for p in once for a in TRANSITIONS[p].values()
                             for t in a.split("|")}


def _check(client, gw, live: set[str], before: str) -> str:
    r = client.post("/v1/galleries/shapes/search", json={"text": "a red circle", "top_k": 5})
    assert r.status_code == 200, r.text
    assert {h["space"] for h in r.json()["hits"]} <= {r.json()["space"]}
    r = client.get("/v1/galleries/shapes/migration", headers=ADMIN)
    if r.status_code == 404:
        phase, view = "ended", None
    else:
        assert r.status_code == 200, r.text
        view = r.json()
        phase = view["phase"]
    assert phase in _reachable(before), f"{before} -> {phase}"
    record = gw.registry.gallery("shapes")
    serving = record.collection or gw.store.collection_of("shapes")
    assert gw.store.collection_of("shapes") == serving
    assert set(gw.store.stored(serving)) == live
    if view is not None:
        target = gw.store.stored(view["target"]["collection"])
        assert set(target) <= live
        for s in target.values():
            made = s.made or {}
            assert made.get("by") in ("embed", "transform") and made.get("version") == "up"
        own = sum(1 for s in target.values() if (s.made or {}).get("by") != "transform")
        p = view["progress"]
        if p:  # the view's counts are a recount of the side
            assert (p["reembedded"], p["transformed"]) == (own, len(target) - own)
        assert set(view["options"]) == {a for a in OPERATOR if a in view["options"]}
    return phase


def _phase_and_options(client) -> tuple[str, list[str]]:
    r = client.get("/v1/galleries/shapes/migration", headers=ADMIN)
    if r.status_code == 404:
        return "ended", []
    assert r.status_code == 200, r.text
    return r.json()["phase"], r.json()["options"]


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_random_sequences_through_the_real_worker(micro_versions, world, up_version,
                                                  tmp_path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    with migrating_stack(tmp_path, micro_versions, world, up_version) as (client, values):
        gw = client.app.state.gateway  # type: ignore[attr-defined]
        live = {f"w{i}" for i in range(ITEMS)}
        params = ({"transform": True, "switch": "progressive", "sample": 8, "order": "random",
                   "transform_config": {"method": "procrustes"}} if seed % 2 else {})
        logs = iter(range(100))
        proc_cm = worker_process(values, tmp_path / f"worker{next(logs)}.log")
        proc = proc_cm.__enter__()
        try:
            migrate(client, shards=2, batch_size=4, rate_limit=8, **params)
            phase, added = "backfilling", 0
            for _ in range(8):
                op = OPS[int(rng.integers(len(OPS)))]
                if op == "wait":
                    time.sleep(1.0)
                elif op == "kill":
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    proc_cm.__exit__(None, None, None)
                    proc_cm = worker_process(values, tmp_path / f"worker{next(logs)}.log")
                    proc = proc_cm.__enter__()
                elif op == "add":
                    added += 1
                    add(client, world_items(world, range(added, added + 1), prefix=f"n{seed}-"))
                    live.add(f"n{seed}-{added}")
                elif op == "delete":
                    gone = sorted(live)[int(rng.integers(len(live)))]
                    r = client.post("/v1/galleries/shapes/items/delete", headers=ADMIN,
                                    json={"ids": [gone]})
                    assert r.status_code == 200, r.text
                    live.discard(gone)
                else:
                    # The applier moves the migration on its own (a cancel it carries out,
                    # the end of the backfill): the table is asked of the phase read just
                    # before the call, and a call that disagrees with it must find the
                    # phase moved since.
                    seen = _phase_and_options(client)
                    r = client.post(f"/v1/galleries/shapes/migration/{op}", headers=ADMIN,
                                    **({"json": {}} if op == "rollback" else {}))
                    went = r.status_code in (200, 204)
                    if not went:
                        assert r.status_code in (404, 409), (op, r.text)
                        if r.status_code == 409:
                            assert f"cannot {op}" in r.text or "no migration" in r.text, r.text
                    if went != (op in seen[1]):
                        assert _phase_and_options(client)[0] != seen[0], (op, seen, r.text)
                    if went and op not in seen[1]:  # the applier moved it first, into a
                        # phase that allows the call
                        moved = {t for a in APPLIER for t in
                                 TRANSITIONS[seen[0]].get(a, "").split("|") if t}
                        assert any(op in TRANSITIONS[m] for m in moved), (op, seen)
                phase = _check(client, gw, live, phase)
            # At rest: a paused backfill resumed, the driver and a worker finish it.
            if phase not in ("ended",) and migration(client)["progress"].get("paused"):
                client.post("/v1/galleries/shapes/migration/resume", headers=ADMIN)

            def at_rest() -> bool:
                r = client.get("/v1/galleries/shapes/migration", headers=ADMIN)
                return r.status_code == 404 or r.json()["job_status"] in (
                    "succeeded", "failed", "cancelled")
            wait_for(at_rest, 240, "the migration at rest", proc)
            time.sleep(0.5)
            phase = _check(client, gw, live, phase)
            assert phase in ("switched", "awaiting", "ended", "stopped", "rolled_back")
        finally:
            proc_cm.__exit__(None, None, None)
