"""What users retrieve, counted and used: the served-candidate counts
(``service.state.candidates``: decayed, bounded, several processes adding up, a bad file
read as none) and the backfill order ``candidates`` planned from them at a migration's
start and dealt again when a paused backfill resumes (``planning.replan_paused``), on the
real control code, job store and embedded store (``tests/migration_sim``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from migration_sim import GALLERY, World

from service.jobkinds.migrate import actions, submit
from service.jobkinds.migrate import record as records
from service.jobkinds.migrate.params import MigrateParams
from service.jobkinds.migrate.planning import CANDIDATES, by_candidates
from service.state.candidates import CandidateCounts, Counted, read_counted
from service.state.errors import InvalidInput
from service.state.jobs.shards import PAUSED, read_cursor, read_items, write_cursor


def counts(root: Path, **kw: float) -> CandidateCounts:
    return CandidateCounts(root, **{"half_life_s": 3600.0, "items_max": 100,
                                    "searches_kept": 10, **kw})  # type: ignore[arg-type]


def test_counts_add_up_once_per_search_across_processes_and_restarts(tmp_path: Path) -> None:
    a, b = counts(tmp_path), counts(tmp_path)  # two gateway processes, one registry
    a.record("g", ["x", "y", "x"])  # an id served twice in one search counts once
    a.record("g", ["x"])
    b.record("g", ["y", "z"])
    a.save()
    b.save()
    got = counts(tmp_path).load("g")  # a restarted process reads what both saved
    assert got.counts == pytest.approx({"x": 2.0, "y": 2.0, "z": 1.0}, rel=1e-3)
    # y's second count is the later one, so it has decayed less: most counted first
    assert got.order() == ["y", "x", "z"]
    assert got.searches == [["x", "y"], ["x"], ["y", "z"]]
    # each distinct set of candidates served (x twice in a search: the set {x, y})
    assert got.sets == pytest.approx({("x", "y"): 1.0, ("x",): 1.0, ("y", "z"): 1.0},
                                     rel=1e-3)
    assert counts(tmp_path).load("other").counts == {}


def test_the_sets_served_most_are_kept_and_decay_with_the_counts(tmp_path: Path) -> None:
    c = counts(tmp_path, half_life_s=1.0, sets_max=2)
    for ids in (["a", "b"], ["b", "a"], ["c"], ["c"], ["c"], ["d"]):
        c.record("g", ids)
    c.save()
    assert c.load("g").sets == pytest.approx({("c",): 3.0, ("a", "b"): 2.0})  # not {d}
    time.sleep(1.1)
    c.record("g", ["d"])
    c.save()
    later = c.load("g").sets
    # halved: c's 3 to under 1.5, {a, b}'s 2 to under 1, below {d} served just now
    assert later[("c",)] < 1.5 and set(later) == {("c",), ("d",)}
    # a file written before sets were kept reads as none (the order then uses searches)
    c.path("h").write_text(json.dumps({"schema_version": 1, "at": 1.0, "counts": {"x": 1.0},
                                       "searches": [["x"]]}))
    old = read_counted(c.path("h"))
    assert old.sets == {} and old.searches == [["x"]] and old.counts == {"x": 1.0}
    assert counts(tmp_path, sets_max=0).sets_max == 0
    with pytest.raises(ValueError, match="sets_max"):
        counts(tmp_path, sets_max=-1)


def test_counts_decay_by_their_half_life_and_keep_the_most_counted(tmp_path: Path) -> None:
    c = counts(tmp_path, half_life_s=1.0, items_max=3, searches_kept=2)
    for ids in (["a", "b"], ["a", "c"], ["a", "b", "d"]):
        c.record("g", ids)
    c.save()
    first = c.load("g")
    assert set(first.counts) == {"a", "b", "c"} or set(first.counts) == {"a", "b", "d"}
    assert first.counts["a"] == pytest.approx(3.0) and len(first.searches) == 2
    time.sleep(1.1)
    c.record("g", ["e"])
    c.save()
    later = c.load("g")
    assert later.counts["a"] < 1.5  # halved (at least) since the last save
    assert later.counts["e"] == pytest.approx(1.0)
    assert len(later.counts) == 3 and later.order()[0] == "a"


def test_an_unreadable_counts_file_is_counting_from_scratch(tmp_path: Path) -> None:
    c = counts(tmp_path)
    c.root.mkdir(parents=True, exist_ok=True)
    c.path("g").write_text("{not json")
    assert c.load("g").counts == {}
    c.record("g", ["x"])
    c.save()  # replaced by a good file
    assert read_counted(c.path("g")).counts == {"x": 1.0}
    c.forget("g")
    assert not c.path("g").exists()


def test_the_candidate_order_puts_retrieved_items_first_then_the_default_order() -> None:
    items = [{"id": f"i{n:02d}"} for n in range(8)]
    counts = {"i05": 3.0, "i02": 1.0, "i07": 3.0, "i01": 2.0, "i03": 1.0}
    # no recorded searches: the items by count (ties by the order given), then the rest
    got = [i["id"] for i in by_candidates(items, Counted(counts, [], 0.0))]
    assert got == ["i05", "i07", "i01", "i02", "i03", "i00", "i04", "i06"]
    # recorded searches first: {i03, i06} twice (worth 2 / 2), {i02} once (1 / 1), then
    # {i01, i02} (1 / 1 once i02 is held); then by count, then the rest
    searches = [["i06", "i03"], ["i02"], ["i03", "i06"], ["i01", "i02"]]
    got = [i["id"] for i in by_candidates(items, Counted(counts, searches, 0.0))]
    assert got[:4] in (["i03", "i06", "i02", "i01"], ["i02", "i03", "i06", "i01"])
    assert got[4:] == ["i05", "i07", "i00", "i04"]
    # served sets with their counts take the place of the searches: {i07} served 5 times
    # (5 / 1) first, then {i04, i05} (3 / 2), then {i00, i03} (1 / 2)
    sets = {("i07",): 5.0, ("i04", "i05"): 3.0, ("i00", "i03"): 1.0}
    got = [i["id"] for i in by_candidates(items, Counted(counts, searches, 0.0, sets))]
    assert got[:5] == ["i07", "i04", "i05", "i00", "i03"]
    assert got[5:] == ["i01", "i02", "i06"]  # counted by count (i01 2, i02 1), then the rest


def test_candidates_with_a_transform_is_refused_with_a_reason() -> None:
    with pytest.raises(InvalidInput, match="without transform"):
        MigrateParams(transform=True, order="candidates").check(None, None)  # type: ignore[arg-type]


def _shard_ids(world: World, job: str) -> list[list[str]]:
    work = world.port.jobs.work_dir(job)
    return [[i["id"] for i in read_items(work, n)]
            for n, s in enumerate(world.port.jobs.get(job).shards)
            if s.get("task", "backfill") == "backfill"]


def test_a_lazy_migration_plans_from_the_counts_and_deals_again_on_resume(
        tmp_path: Path) -> None:
    world = World(tmp_path, items=12, seed=0)
    port = world.port
    try:
        for _ in range(3):
            port.candidates.record(GALLERY, ["i7", "i3"])
        port.candidates.record(GALLERY, ["i3"])  # i3: 4, i7: 3
        params = MigrateParams(shards=2, batch_size=4, serving="rerank", backfill="paused",
                               order="candidates")
        job = port.jobs.create("migrate", GALLERY, params.model_dump(), by="test")
        world.run(submit.start(port, job, params))
        shards = _shard_ids(world, job.id)
        assert [s[0] for s in shards] == ["i3", "i7"]  # dealt in turn: i3, i7, then by id
        assert sorted(x for s in shards for x in s) == sorted(f"i{n}" for n in range(12))
        kept = json.loads((records.folder(port.jobs, job.id) / CANDIDATES).read_text())
        assert kept["planned"] == "start" and kept["first"] == 2
        assert [i for i, _ in kept["items"]] == ["i3", "i7"]
        # The shards ran into the pause (shard 0 had done one batch before it); the
        # searches meanwhile retrieved other items.
        work = port.jobs.work_dir(job.id)
        write_cursor(work, 0, 1)
        for n in range(len(shards)):
            port.jobs.finish_shard(job.id, n, "paused")
        for _ in range(10):
            port.candidates.record(GALLERY, ["i11", "i10"])
        before = _shard_ids(world, job.id)
        world.run(actions.resume(port, GALLERY))
        after = _shard_ids(world, job.id)
        assert after[0][0] == before[0][0] == "i3"  # what a shard did stays
        assert read_cursor(work, 0) == 1
        assert [after[0][1], after[1][0]] == ["i10", "i11"]  # most retrieved now, first
        assert [len(s) for s in after] == [len(s) for s in before]
        assert sorted(x for s in after for x in s) == sorted(x for s in before for x in s)
        state = records.load(port.jobs, job.id)
        assert state is not None and state.candidates is not None
        assert state.candidates["planned"] == "resume"
        assert port.jobs.get(job.id).result[PAUSED] is False
    finally:
        world.close()


def test_the_gateway_counts_what_its_searches_serve(gateway_factory, tmp_path: Path) -> None:
    """Real searches through the gateway: each one's served candidates (here the plain
    route's top_k) are counted, no query text is kept, and the counts are saved at close
    for the next process."""
    from test_service_api import add, search, world_items

    items = world_items()
    with gateway_factory(max_image_pixels=64 * 64, top_k_max=20,
                         candidate_searches_kept=5) as client:
        add(client, items)
        served = [search(client, text=items[n]["text"], top_k=3)["hits"] for n in range(4)]
        search(client, status=422, text=" ", top_k=3)  # refused: nothing counted
    saved = read_counted(tmp_path / "data" / "registry" / "candidates" / "shapes.json")
    expected: dict[str, float] = {}
    for hits in served:
        for h in hits:
            expected[h["id"]] = expected.get(h["id"], 0.0) + 1.0
    assert saved.counts == pytest.approx(expected, rel=1e-3)
    assert saved.searches == [[h["id"] for h in hits] for hits in served]
    text = (tmp_path / "data" / "registry" / "candidates" / "shapes.json").read_text()
    assert all(items[n]["text"] not in text for n in range(4))


def test_the_plan_measures_the_candidate_order_on_the_gallery_s_own_searches(
        tmp_path: Path) -> None:
    """``with_workload``: each rerank option gets the warm curves of the recorded searches
    and applies with the candidate order exactly when that order is warm no later than
    the read-through alone at every pace; too few searches leave the option as it was."""
    import numpy as np

    from service.jobkinds.plan import with_workload
    from service.stack.plan_cli import warm_rows

    rng = np.random.default_rng(0)
    queries = rng.integers(0, 3000, size=(400, 20))  # 400 queries' candidates, 3,000 items
    p = 1.0 / np.arange(1, 401) ** 1.1
    picked = rng.choice(400, size=2000, p=p / p.sum())
    c = counts(tmp_path / "candidates", searches_kept=5000)
    for q in picked:
        c.record("g", [f"item{i:05d}" for i in queries[q]])
    c.save()

    def plan() -> dict:
        return {"options": [
            {"name": "rerank@10", "apply": {"params": {"serving": "rerank", "rerank_k": 10}}},
            {"name": "rerank@20", "apply": {"params": {"serving": "rerank", "rerank_k": 20}}},
            {"name": "adapter", "apply": {"params": {"transform": False}}}]}

    got = plan()
    with_workload(got, tmp_path, "g", 3000)
    assert got["workload"] == {"searches": 2000,
                               "sets": len({tuple(sorted(queries[q])) for q in picked})}
    assert "warm" not in got["options"][2]
    for o in got["options"][:2]:
        warm = o["warm"]
        assert warm["searches"] == 2000 and warm["learned_from"] == 1000
        assert warm["learned_sets"] is not None  # from the sets, less the measured half
        alone = warm["read_through"]["warm_80_at_filled"]
        paced = [x["warm_80_at_filled"] for x in warm["candidates"]]
        assert [x["pace"] for x in warm["candidates"]] == [1.0, 4.0]
        no_later = all(x is not None and (alone is None or x <= alone) for x in paced)
        assert warm["candidates_no_later"] is no_later
        assert (o["apply"]["params"].get("order") == "candidates") is no_later
    assert got["options"][0]["warm"] != got["options"][1]["warm"]  # cut to each k
    rows = warm_rows(got)
    assert [r[0] for r in rows] == ["rerank@10", "rerank@20"] and rows[0][1] == "2000"
    few = plan()
    with_workload(few, tmp_path, "none-recorded", 3000)
    assert few["workload"] == {"searches": 0, "sets": 0} and few["options"][0]["warm"] is None
    assert "order" not in few["options"][0]["apply"]["params"]


def test_the_plans_order_learns_from_every_set_served_before_the_measured_searches() -> None:
    """With the gallery's sets (every search's, the kept ones included), the plan's
    candidate order is learned from the sets less the measured half of the kept searches:
    exactly the order of the searches served before that half (weights 1: no decay
    here), measured on that half; a set served only in the measured half teaches nothing."""
    import numpy as np

    from training.upgrades.rerank import PACES, candidate_order, fill_curve, workload_curves

    rng = np.random.default_rng(3)
    queries = np.array([rng.choice(2000, 10, replace=False) for _ in range(300)])
    p = 1.0 / np.arange(1, 301) ** 1.1
    picked = rng.choice(300, size=4000, p=p / p.sum())
    ids = [[f"item{i:05d}" for i in queries[q]] for q in picked]
    earlier, kept = ids[:3000], ids[3000:]  # the gateway keeps the last 1,000 searches
    only_measured = [f"new{j}" for j in range(10)]  # served once, in the measured half
    kept[-1] = only_measured
    sets: dict[tuple[str, ...], float] = {}
    for s in earlier + kept:
        sets[tuple(sorted(s))] = sets.get(tuple(sorted(s)), 0.0) + 1.0
    got = workload_curves(kept, 2000, sets=sets)
    assert got is not None and got["learned_from"] == 500

    taught = earlier + kept[:500]
    assert got["learned_sets"] == len({tuple(sorted(s)) for s in taught})
    named = sorted({i for s in earlier + kept for i in s})
    n = max(2000, len(named))
    place = {i: int(j * n / len(named)) for j, i in enumerate(named)}
    grid = np.array([[place[i] for i in s] for s in kept])
    order = candidate_order(np.array([[place[i] for i in s] for s in taught]), n)
    assert not set(order[:len({i for s in taught for i in s})]) & {place[i] for i in only_measured}
    for c, pace in zip(got["candidates"], PACES, strict=True):
        per = n / (pace * 500)
        want = fill_curve(grid[500:], n, window=got["window"], backfill=order, per_search=per)
        assert c["warm_80_at_filled"] == want["warm_80_at_filled"]
        assert c["curve"] == want["curve"]
    first_half = workload_curves(kept, 2000)  # no sets: the first half teaches
    assert first_half is not None and first_half["learned_sets"] is None
