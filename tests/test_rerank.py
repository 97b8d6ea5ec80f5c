# ruff: noqa: F811  (the module-scoped fixtures of test_migration are imported by name)
"""Rerank on read (service/usecases/rerank.py) through the real gateway on the embedded
store, with the trained micro model 'up' (test_migration_transform's ``up_trained``) as the
new version of a migrating gallery whose new side starts empty (a worker is seen but
busy, so the backfill never runs: what the new side holds, the reads put there)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import ADMIN
from test_migration import ITEMS, migrate, migrating_stack, migration, world  # noqa: F401
from test_migration_transform import up_trained  # noqa: F401

from service.state.jobs.workers import write_beat
from service.state.registry.index import utc_now
from service.vectors.writer import Batch, DirectWriter

QUERY = "a red circle"


def _migrating(client) -> dict:
    gw = client.app.state.gateway  # type: ignore[attr-defined]
    write_beat(gw.settings, "busy@elsewhere", utc_now())
    migrate(client, shards=1, batch_size=8)
    return migration(client)


def _search(client, **body) -> dict:
    r = client.post("/v1/galleries/shapes/search", json={"text": QUERY, **body})
    assert r.status_code == 200, r.text
    return r.json()


def _new_ranking(up: Path, world: Path, ids: list[str]) -> list[str]:
    """NEW's own ranking of ``ids`` (world items w<n>) for the query, computed apart from
    the gateway: the version's native encoder over the world's image files."""
    from PIL import Image

    from training.artifacts import load_artifact
    from training.versions import load_encoder

    rows = [json.loads(line) for line in (world / "manifest.jsonl").read_text().splitlines()]
    enc = load_encoder(load_artifact(up), "v3", None)
    images = [Image.open(world / rows[int(i[1:])]["image"]).convert("RGB") for i in ids]
    scores = enc.encode_images(images) @ enc.encode_texts([QUERY])[0]
    return [ids[n] for n in np.argsort(-scores, kind="stable")]


def test_a_reranked_answer_is_new_ranking_of_the_routes_candidates_and_fills_once(
        micro_versions, world, up_trained, tmp_path) -> None:
    # no batching wait: only what is submitted in one event-loop turn shares a forward
    with migrating_stack(tmp_path, micro_versions, world, up_trained,
                         batch_max_wait_ms=0.0) as (client, _):
        view = _migrating(client)
        route = _search(client, top_k=10, rerank=False)
        assert route["route"] != "rerank" and route["reranked"] is None
        candidates = [h["id"] for h in route["hits"]]
        gw = client.app.state.gateway  # type: ignore[attr-defined]

        def image_forwards() -> tuple[float, float]:
            get = gw.metrics.registry.get_sample_value
            return (get("nobackfill_batch_size_count", {"modality": "image"}) or 0.0,
                    get("nobackfill_batch_size_sum", {"modality": "image"}) or 0.0)
        before = image_forwards()
        first = _search(client, top_k=10, rerank=True, rerank_k=10)
        assert first["route"] == "rerank"
        after = image_forwards()  # the 10 candidates' images went in one forward
        assert (after[0] - before[0], after[1] - before[1]) == (1.0, 10.0)
        assert [h["id"] for h in first["hits"]] == _new_ranking(up_trained, world, candidates)
        assert first["reranked"]["read"] == 0 and first["reranked"]["embedded"] == 10
        assert first["reranked"]["kept_route_place"] == []
        assert all(h["space"] == "v3" for h in first["hits"])
        # what it embedded is on the new side, once, marked as filled by a read
        serving = gw.runtime.serving("shapes")  # the route is NEW's towers + a map: the
        assert serving.ready().shares_towers(serving.others[0].embedder)  # query, one forward
        target = view["target"]["collection"]
        from test_worker import wait_for

        # written just after the answer (one batch): wait for all 10
        held = wait_for(lambda: len(h := gw.store.stored(target)) == 10 and h, 30, "the fills")
        made = {i: s.made for i, s in held.items()}
        assert sorted(made) == sorted(candidates)
        assert all(m == {"by": "embed", "version": "up", "via": "read"} for m in made.values())
        again = _search(client, top_k=5, rerank=True, rerank_k=10)
        assert again["reranked"]["read"] == 10 and again["reranked"]["embedded"] == 0
        assert [h["id"] for h in again["hits"]] == [h["id"] for h in first["hits"]][:5]
        # a migration served by rerank reranks every search unless it says otherwise
        assert _search(client, top_k=5)["route"] != "rerank"
        r = client.post("/v1/galleries/shapes/search",
                        json={"text": QUERY, "rerank": True, "hybrid": True})
        assert r.status_code == 422 and "not both" in r.text, r.text
        r = client.post("/v1/galleries/shapes/search",
                        json={"text": QUERY, "top_k": 10, "rerank": True, "rerank_k": 5})
        assert r.status_code == 422 and "at least top_k" in r.text, r.text


def test_an_unreadable_source_keeps_its_route_place(micro_versions, world, up_trained,
                                                    tmp_path) -> None:
    with migrating_stack(tmp_path, micro_versions, world, up_trained) as (client, values):
        _migrating(client)
        route = [h["id"] for h in _search(client, top_k=8, rerank=False)["hits"]]
        lost = route[2]  # its kept original disappears
        gw = client.app.state.gateway  # type: ignore[attr-defined]
        origin = gw.store.stored(migration(client)["source"]["collection"], [lost])[lost].origin
        digest = str(origin["image"]).removeprefix("cas:")
        for path in (Path(values["data_dir"]) / "sources").rglob(f"*{digest}*"):
            path.unlink()
        answer = _search(client, top_k=8, rerank=True, rerank_k=8)
        ids = [h["id"] for h in answer["hits"]]
        assert ids[2] == lost and answer["reranked"]["kept_route_place"] == [lost]
        assert sorted(ids) == sorted(route)  # never dropped
        assert answer["reranked"]["embedded"] == 7


def test_the_budget_cuts_a_slow_rerank_and_the_fill_still_lands(micro_versions, world,
                                                                up_trained, tmp_path) -> None:
    with migrating_stack(tmp_path, micro_versions, world, up_trained,
                         rerank_budget_ms=1) as (client, _):
        _migrating(client)
        route = [h["id"] for h in _search(client, top_k=10, rerank=False)["hits"]]
        cut = _search(client, top_k=10, rerank=True, rerank_k=10)["reranked"]
        assert cut["over_budget"] >= 1 and cut["over_budget"] == len(cut["kept_route_place"])
        kept = set(cut["kept_route_place"])
        answer = _search(client, top_k=10, rerank=True, rerank_k=10)  # after the fills
        for _ in range(50):
            if answer["reranked"]["read"] == 10:
                break
            answer = _search(client, top_k=10, rerank=True, rerank_k=10)
        assert answer["reranked"]["read"] == 10 and kept  # the cut ones were filled after
        assert sorted(h["id"] for h in answer["hits"]) == sorted(route)


def test_a_fill_never_brings_back_a_deleted_item_nor_overwrites_new_vectors(
        micro_versions, world, up_trained, tmp_path) -> None:
    with migrating_stack(tmp_path, micro_versions, world, up_trained) as (client, _):
        view = _migrating(client)
        gw = client.app.state.gateway  # type: ignore[attr-defined]
        source, target = view["source"]["collection"], view["target"]["collection"]
        stored = gw.store.stored(source, ["w1", "w2"])
        writer = DirectWriter.registered(gw.store, gw.settings, gw.registry, "shapes")
        r = client.post("/v1/galleries/shapes/items/delete", headers=ADMIN,
                        json={"ids": ["w1"]})
        assert r.status_code == 200, r.text
        vector = {"image": np.ones(32, np.float32) / np.sqrt(32)}
        made = {"by": "embed", "version": "up", "via": "read"}
        applied = writer.write(Batch("fill", "up", [{"id": "w1", "etag": stored["w1"].etag}],
                                     {"v3": [vector]}, made=made))
        assert applied.written == 0 and "w1" not in gw.store.stored(target)
        first = _search(client, top_k=10, rerank=True, rerank_k=10)  # fills w2 if it is a
        assert first["route"] == "rerank"                             # candidate, or not
        from test_worker import wait_for

        # the fills are written just after the answer (batched): wait for them
        held = wait_for(lambda: gw.store.stored(target), 30, "the search's fills")
        own = next(iter(held))
        before = gw.store.vectors(target, [own])[own]
        applied = writer.write(Batch("fill", "up", [{"id": own, "etag": held[own].etag}],
                                     {"v3": [vector]}, made=made))
        assert applied.written == 0  # NEW's own vector there is never replaced by a fill
        after = gw.store.vectors(target, [own])[own]
        assert all(np.allclose(before[k], after[k]) for k in before)


@pytest.mark.parametrize("state", ["none"])
def test_rerank_without_a_migration_is_409(micro_versions, world, up_trained, tmp_path,
                                           state) -> None:
    with migrating_stack(tmp_path, micro_versions, world, up_trained) as (client, _):
        r = client.post("/v1/galleries/shapes/search", json={"text": QUERY, "rerank": True})
        assert r.status_code == 409 and "rerank needs one" in r.text, r.text


def test_a_migration_served_by_rerank_reranks_every_search_and_counts_its_fill(
        micro_versions, world, up_trained, tmp_path) -> None:
    with migrating_stack(tmp_path, micro_versions, world, up_trained) as (client, _):
        gw = client.app.state.gateway  # type: ignore[attr-defined]
        write_beat(gw.settings, "busy@elsewhere", utc_now())
        migrate(client, shards=1, batch_size=8, serving="rerank", rerank_k=6)
        view = migration(client)
        assert (view["serving"], view["rerank_k"]) == ("rerank", 6)
        answer = _search(client, top_k=3)
        assert answer["route"] == "rerank" and answer["reranked"]["k"] == 6
        assert answer["reranked"]["embedded"] == 6
        assert _search(client, top_k=3, rerank=False)["route"] != "rerank"
        from test_worker import wait_for

        # written once each item has every kind (its caption is embedded after the answer)
        progress = wait_for(lambda: (p := migration(client)["progress"])["filled_by_reads"]
                            == 6 and p, 30, "the fills")
        assert progress["filled_by_backfill"] == 0


def test_a_lazy_migration_fills_by_reads_then_its_backfill_skips_them(
        micro_versions, world, up_trained, tmp_path) -> None:
    """A migration started with its backfill paused and served by rerank: a real worker
    parks its shard at the cursor, searches fill the new side, pause/resume are the
    operator's, and the resumed backfill embeds only the items the reads did not fill
    (each item ends with one vector by NEW; the read-filled ones are never rewritten)."""
    from test_worker import wait_for, worker_process

    with migrating_stack(tmp_path, micro_versions, world, up_trained) as (client, values):
        gw = client.app.state.gateway  # type: ignore[attr-defined]
        write_beat(gw.settings, "starting@here", utc_now())  # the worker starts below
        migrate(client, shards=1, batch_size=8, serving="rerank", rerank_k=10,
                backfill="paused")
        with worker_process(values, tmp_path / "worker.log") as proc:
            def parked() -> bool:
                job = gw.jobs.get(migration(client)["job"])
                return bool(job.shards) and job.shards[0]["state"] == "paused"
            wait_for(parked, 120, "the paused shard", proc)
            view = migration(client)
            assert view["progress"]["paused"] is True and view["phase"] == "backfilling"
            assert set(view["options"]) == {"cancel", "resume"}
            r = client.post("/v1/galleries/shapes/migration/pause", headers=ADMIN)
            assert r.status_code == 409 and "allowed now: cancel, resume" in r.text, r.text
            answer = _search(client, top_k=5)
            assert answer["route"] == "rerank" and answer["reranked"]["embedded"] == 10
            target = view["target"]["collection"]
            filled = wait_for(lambda: len(got := {i: s.etag for i, s in gw.store.stored(
                target).items()}) == 10 and got, 30, "the fills (written after the answer)")
            time.sleep(1.0)
            assert len(gw.store.stored(target)) == 10  # only the reads wrote: it is parked
            r = client.post("/v1/galleries/shapes/migration/resume", headers=ADMIN)
            assert r.status_code == 200 and r.json()["progress"]["paused"] is False, r.text
            done = wait_for(lambda: (v := migration(client))["job_status"] == "succeeded"
                            and v, 240, "the resumed backfill", proc)
        assert done["state"] == "switched"
        assert done["progress"]["filled_by_reads"] == 10
        assert done["progress"]["applied"] == ITEMS - 10  # the backfill skipped the 10
        stored = gw.store.stored(target)
        assert len(stored) == ITEMS
        assert all((s.made or {}).get("by") == "embed" for s in stored.values())
        for item, etag in filled.items():  # never rewritten by the backfill
            assert stored[item].made["via"] == "read" and stored[item].etag == etag


def test_pausing_a_running_backfill_is_the_operators_and_the_applier_requeues_it(
        micro_versions, world, up_trained, tmp_path) -> None:
    """pause: 409 unless a backfill runs unpaused; the flag holds the job's shards (a
    shard that paused is queued again by the applier once resumed)."""
    with migrating_stack(tmp_path, micro_versions, world, up_trained) as (client, _):
        gw = client.app.state.gateway  # type: ignore[attr-defined]
        r = client.post("/v1/galleries/shapes/migration/pause", headers=ADMIN)
        assert r.status_code == 404 or "no migration" in r.text, r.text
        view = _migrating(client)
        r = client.post("/v1/galleries/shapes/migration/pause", headers=ADMIN)
        assert r.status_code == 200 and r.json()["progress"]["paused"] is True, r.text
        job = view["job"]
        gw.jobs.start_shard(job, 0, "test@here")  # as a worker would, then it pauses
        gw.jobs.finish_shard(job, 0, "paused")
        time.sleep(1.0)  # applier ticks: paused stays parked
        assert gw.jobs.get(job).shards[0]["state"] == "paused"
        r = client.post("/v1/galleries/shapes/migration/resume", headers=ADMIN)
        assert r.status_code == 200, r.text
        for _ in range(50):
            if gw.jobs.get(job).shards[0]["state"] == "queued":
                break
            time.sleep(0.1)
        shard = gw.jobs.get(job).shards[0]
        assert shard["state"] == "queued" and shard["sends"] == 2


def test_a_fused_rerank_ranks_by_the_new_cosine_plus_the_routes(micro_versions, world,
                                                                 up_trained, tmp_path) -> None:
    """rerank_score fused: each candidate scored by NEW's cosine (computed here apart from
    the gateway) plus the route's, best first."""
    from PIL import Image

    from training.artifacts import load_artifact
    from training.versions import load_encoder

    with migrating_stack(tmp_path, micro_versions, world, up_trained,
                         rerank_score="fused") as (client, _):
        _migrating(client)
        route = {h["id"]: h["score"] for h in _search(client, top_k=10, rerank=False)["hits"]}
        answer = _search(client, top_k=10, rerank=True, rerank_k=10)
        rows = [json.loads(line) for line in (world / "manifest.jsonl").read_text().splitlines()]
        enc = load_encoder(load_artifact(up_trained), "v3", None)
        ids = list(route)
        images = [Image.open(world / rows[int(i[1:])]["image"]).convert("RGB") for i in ids]
        new = dict(zip(ids, (enc.encode_images(images) @ enc.encode_texts([QUERY])[0]).tolist(),
                       strict=True))
        fused = {i: new[i] + route[i] for i in ids}
        got = [h["id"] for h in answer["hits"]]
        assert got == sorted(ids, key=lambda i: -fused[i])
        for h in answer["hits"]:
            assert h["score"] == pytest.approx(fused[h["id"]], abs=1e-4)


@pytest.mark.parametrize("split", [None, "pixels", "bytes"])
def test_candidate_images_decode_to_the_models_inputs_on_one_thread_or_one_per_core(
        micro_spec, tmp_path, monkeypatch, split) -> None:
    """A cold rerank's images (``_pixels``): read and decoded on one thread while they hold
    at most ``SPLIT_PIXELS`` pixels and ``SPLIT_BYTES`` bytes, else on a thread per core
    (the read-ahead stops at the limit: every source is read once); either way each is
    exactly the model's own preprocess of the image, and an unreadable, undecodable,
    missing or outside-root source is None in its own place."""
    import asyncio
    import os
    import threading
    from concurrent.futures import ThreadPoolExecutor
    from types import SimpleNamespace

    import torch
    from PIL import Image

    from service.runtime.embedder import Batching, Embedder
    from service.state.config import Settings
    from service.usecases import rerank
    from training.encoders import Encoder, create_model, create_tokenizer

    encoder = Encoder(create_model(micro_spec), create_tokenizer(micro_spec), "cpu")
    lane = ThreadPoolExecutor(1)
    embedder = Embedder(encoder, "v1", "v1", "native", lane, Batching(8, 0.001))
    data = tmp_path / "data"
    (data / "images").mkdir(parents=True)
    rng = np.random.default_rng(0)
    sizes = [(32, 32), (32, 32), (60, 45), (20, 90), (32, 32), (300, 200)]
    uris: list[str] = []
    for n, (h, w) in enumerate(sizes):
        path = data / "images" / f"{n}.png"
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
        uris.append(str(path))
    (data / "images" / "bad.png").write_bytes(b"not an image")
    outside = tmp_path / "outside.png"
    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(outside)
    broken = [str(data / "images" / "bad.png"), str(data / "images" / "missing.png"),
              str(outside)]
    order = uris[:2] + broken[:1] + uris[2:4] + broken[1:] + uris[4:]
    monkeypatch.setattr(rerank, "SPLIT_PIXELS", 0 if split == "pixels" else 10**9)
    monkeypatch.setattr(rerank, "SPLIT_BYTES", 0 if split == "bytes" else 10**9)
    threads: list[int] = []
    decoded, plan = rerank._decoded, rerank._Reader.plan
    monkeypatch.setattr(rerank, "_decoded", lambda *a: threads.append(
        threading.get_ident()) or decoded(*a))
    reads: list[tuple[int, str]] = []
    monkeypatch.setattr(rerank._Reader, "plan", lambda self, uri: reads.append(
        (threading.get_ident(), uri)) or plan(self, uri))
    ahead: list[int] = []  # sources read when the read-ahead returned
    read_ahead = rerank._read_ahead
    def counted(*args):
        out = read_ahead(*args)
        ahead.append(len(reads))
        return out

    monkeypatch.setattr(rerank, "_read_ahead", counted)
    gateway = SimpleNamespace(settings=Settings(data_dir=data))
    got = asyncio.run(rerank._pixels(gateway, embedder, order))
    assert len(got) == len(order)
    for uri, pixels in zip(order, got, strict=True):
        if uri in broken:
            assert pixels is None, uri
        else:
            with Image.open(uri) as image:
                assert torch.equal(pixels, encoder.preprocess(image.convert("RGB"))), uri
    assert sorted(uri for _, uri in reads) == sorted(order)  # each source read once
    if split is None:  # one thread read and decoded them all
        assert len(threads) == 1 and ahead == [len(order)]
        assert {t for t, _ in reads} == set(threads)
    else:  # the read-ahead stopped at the first image; the rest read where decoded
        assert len(threads) == min(len(order), os.cpu_count() or 1)
        assert ahead == [1] and reads[0][1] == order[0]
    lane.shutdown()


def test_a_preprocess_step_is_skipped_only_where_it_cannot_change_the_image() -> None:
    """``training.encoders._unchanged``: a resize or centre crop to the size an image has,
    a conversion to the mode it has; nothing else."""
    from open_clip.transform import MaybeConvertMode
    from PIL import Image
    from torchvision import transforms

    from training.encoders import _unchanged

    square, wide = Image.new("RGB", (32, 32)), Image.new("RGB", (48, 32))
    assert _unchanged(transforms.Resize(32), square) and _unchanged(transforms.Resize(32), wide)
    assert _unchanged(transforms.Resize((32, 48)), wide)
    assert not _unchanged(transforms.Resize((48, 32)), wide)
    assert not _unchanged(transforms.Resize(24), square)
    assert not _unchanged(transforms.Resize(32, max_size=40), wide)
    assert _unchanged(transforms.CenterCrop(32), square)
    assert not _unchanged(transforms.CenterCrop(32), wide)
    assert _unchanged(transforms.CenterCrop((32, 48)), wide)
    assert _unchanged(MaybeConvertMode("RGB"), square)
    assert not _unchanged(MaybeConvertMode("RGB"), square.convert("L"))
    assert not _unchanged(transforms.Lambda(lambda x: x), square)
    assert not _unchanged(transforms.Resize(32), np.zeros((32, 32, 3)))
