"""A plan goes stale when what it measured moved (``service.jobkinds.plan.staleness``),
read through the real gateway: the space the gallery is served in (a migration switched,
then rolled back), the gallery's migration (opened by someone else), and the candidate's
content (a model config file rewritten on disk, a registered version removed).

Each plan is submitted through the API, which records its basis; no worker runs it (a
liveness record with no worker behind it lets the API queue it): the test finishes it as
its worker would, with an empty plan, since only its staleness is read. The migration is
opened through the API too (its job stays queued: the gallery stays backfilling), then
switched and rolled back by the registry's own transitions (the operator's switch waits
for a backfill that nothing runs here)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from conftest import ADMIN, MICRO_CONFIG, MICRO_PREPROCESS, bound
from fastapi.testclient import TestClient
from test_migration import add, up_version, world, world_items
from test_worker import gateway, job_settings

__all__ = ["up_version", "world"]  # fixtures

from service.state.jobs.workers import write_beat
from service.state.registry import Registry

EMPTY_PLAN = {"options": [], "recommendation": {"option": None, "why": "not measured"}}


@contextlib.contextmanager
def planning(tmp_path: Path, micro_versions: dict[str, Path], world: Path,
             up: Path) -> Iterator[tuple[TestClient, Registry]]:
    """'shapes' (space v1, ten world items) served by 'up' (native to v3, a route into
    v1), so that a migration can move it to v3."""
    values = job_settings(tmp_path / "data", world, broker=False, queue="training")
    with gateway(values, micro_versions, world) as client:
        settings = client.app.state.gateway.settings  # type: ignore[attr-defined]
        write_beat(settings, "idle@test", "2020-01-01T00:00:00+00:00")
        registry = Registry(settings.registry_dir)
        registry.register(up, by="test", gate=bound({"passed": True}, validation=str(world)))
        r = client.post("/v1/models/up/promote", headers=ADMIN, json={"gallery": "shapes"})
        assert r.status_code == 200, r.text
        add(client, world_items(world, range(10)))
        yield client, registry


def planned(client: TestClient, new: dict[str, Any]) -> str:
    """A plan of 'shapes' for ``new`` through the API, finished as its worker leaves it."""
    r = client.post("/v1/galleries/shapes/plans", headers=ADMIN, json={"new": new})
    assert r.status_code == 202, r.text
    plan_id = r.json()["id"]
    jobs = client.app.state.gateway.jobs  # type: ignore[attr-defined]
    assert jobs.start(plan_id, "test:1") is not None
    jobs.finish(plan_id, "succeeded", result={"plan": EMPTY_PLAN})
    return plan_id


def stale(client: TestClient, plan_id: str) -> list[str]:
    r = client.get(f"/v1/galleries/shapes/plans/{plan_id}", headers=ADMIN)
    assert r.status_code == 200, r.text
    return r.json()["stale"]


def test_a_migration_and_a_change_of_the_serving_space_make_a_plan_stale(
        micro_versions, world, up_version, tmp_path) -> None:
    with planning(tmp_path, micro_versions, world, up_version) as (client, registry):
        before = planned(client, {"version": "v3"})
        assert stale(client, before) == []
        r = client.post("/v1/galleries/shapes/migration", headers=ADMIN, json={"shards": 1})
        assert r.status_code == 202, r.text
        job = r.json()["id"]
        opened = f"the gallery's migration (job {job}) is backfilling now (none was open when "
        assert stale(client, before) == [opened + "planned)"]
        backfilling = planned(client, {"version": "v3"})
        assert stale(client, backfilling) == []
        registry.switch_migration("shapes", by="test")
        assert stale(client, backfilling) == [
            "the gallery is now served in space 'v3' (the plan measured it in 'v1')"]
        switched = planned(client, {"version": "v3"})
        assert stale(client, switched) == []
        registry.rollback_migration("shapes", by="test")
        assert stale(client, switched) == [
            "the gallery is now served in space 'v1' (the plan measured it in 'v3')"]
        # Back in its space, the gallery still has the migration, rolled back now.
        rolled_back = f"the gallery's migration (job {job}) is rolled_back now (backfilling "
        assert stale(client, backfilling) == [rolled_back + "when planned)"]


def test_a_candidate_that_changed_makes_its_plan_stale(micro_versions, world, up_version,
                                                      tmp_path) -> None:
    with planning(tmp_path, micro_versions, world, up_version) as (client, _):
        config = tmp_path / "data" / "candidate.json"  # under DATA_DIR: an allowed path
        spec = {"model_cfg": MICRO_CONFIG, "preprocess_cfg": MICRO_PREPROCESS}
        config.write_text(json.dumps(spec))
        by_file = planned(client, {"model_config": str(config)})
        by_version = planned(client, {"version": "v3"})
        assert stale(client, by_file) == stale(client, by_version) == []
        wider = json.loads(json.dumps(spec))
        wider["model_cfg"]["text_cfg"]["width"] = 128
        config.write_text(json.dumps(wider, indent=1))
        assert stale(client, by_file) == [
            f"the candidate ({config}) changed since the plan measured it"]
        assert stale(client, by_version) == []
        r = client.delete("/v1/models/v3", headers=ADMIN)
        assert r.status_code in (200, 204), r.text
        assert stale(client, by_version) == [
            "the candidate (version 'v3') changed since the plan measured it"]
