"""``nobackfill bench migrate``: a managed migration of a 20,000-item gallery on the
embedded default (local Qdrant, filesystem broker), through the real gateway and worker
processes, on ``bench base``'s OLD and NEW models.

The gallery holds the test set (1,000 images) and 19,000 more synthetic images, all
written to disk (their paths are the items' origins) and embedded by OLD. NEW reaches
OLD's space through a Procrustes adapter route fitted on a 10,000-item sample (the cheap
route of ``bench upgrade``), which is promoted. Then:

1. NEW's own batched image throughput (preloaded images, batches of 64).
2. Run A: a migration with no rate limit and no search load (one worker, one shard):
   backfill items/s against (1) (target >= 0.8x). Then rollback and retire: the gallery
   is back in OLD's space, served by the route.
3. Text search p50 and QPS at ``--clients`` clients, idle, then during run B: a migration
   with the rate limit on (target: p50 <= 2x idle). Run B's worker is killed twice (SIGKILL,
   then restarted); afterwards every item must be in the new side exactly once.
   With ``--transform``, run B is a migration with the gallery-side transform and the
   learned backfill order (``service.jobkinds.migrate.transform``); in either case
   ``--deletes`` items are deleted through the API while run B backfills, and must come
   back in neither side (0 resurrected). With ``--reads``, run B serves reranked searches
   (``serving: "rerank"``): the search load fills the new side by reads (read-through
   fill) while the backfill writes it; every item must still end with one vector that NEW
   embedded (none transformed), deleted items in neither side.
4. R@1 both directions on the test set, routed (before: the route's queries against the
   OLD vectors the gallery stored) and migrated (after: NEW's queries against the vectors
   the migration stored); the stored vectors are checked against NEW's own embeddings.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from service.bench.phases import Phases, add_device_option, resolve_device
from training.console import report_command

GALLERY = "bench"
THROUGHPUT_RATIO = 0.8  # backfill items/s over NEW's batched encoder items/s, one worker
P50_RATIO = 2.0  # text search p50 during the rate-limited backfill over idle
P99_RATIO = 3.0  # and its p99
READS_RERANK_K = 20  # run B's rerank_k with --reads
QUICK = {"items": 600, "test_items": 200, "duration": 3.0, "clients": 2, "sample": 300}
PREPARE_PHASES = 3  # the phases ``prepare`` announces
PHASES = PREPARE_PHASES + 5


def register(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="managed migration of a 20,000-item gallery: backfill "
                                  "throughput, search latency during it, R@1 routed vs "
                                  "migrated, exactly-once after two worker kills")
    p.add_argument("--base", default="runs/bench-base", help="holds bench base's old/ and new/")
    p.add_argument("--out", default="runs/bench-migrate", help="results, logs and work files")
    p.add_argument("--items", type=int, default=20_000, help="gallery size (test set included)")
    p.add_argument("--test-items", type=int, default=1000,
                   help="bench base's test set size (the first items of the gallery)")
    p.add_argument("--sample", type=int, default=10_000, help="items the route is fitted on")
    p.add_argument("--batch-size", type=int, default=256,
                   help="items per forward, of the backfill and of the encoder baseline")
    p.add_argument("--rate-limit", type=float, default=None,
                   help="run B's items/s (default: half of NEW's measured throughput)")
    p.add_argument("--clients", type=int, default=4, help="concurrent search clients")
    p.add_argument("--duration", type=float, default=15.0, help="seconds per search window")
    p.add_argument("--transform", action="store_true", help="run B: transform, then the "
                                                            "learned order")
    p.add_argument("--transform-sample", type=int, default=400,
                   help="run B's transform sample (items NEW embeds first)")
    p.add_argument("--deletes", type=int, default=50, help="items deleted during run B")
    p.add_argument("--reads", action="store_true",
                   help="run B serves reranked searches (serving: rerank, rerank_k "
                        f"{READS_RERANK_K}): its search load fills the new side by reads "
                        "while the backfill writes it")
    p.add_argument("--quick", action="store_true", help="smoke run: random tiny models, 600 "
                                                        "items, short windows")
    add_device_option(p, "the models: the bench's own, the gateway's and the worker's")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=report_command(run, render))


def run(args: argparse.Namespace) -> dict[str, Any]:
    from service.bench.setup import fresh_work_dir

    device = resolve_device(getattr(args, "device", None))  # before anything starts
    phase = Phases("migrate", PHASES)
    if args.quick:
        args = argparse.Namespace(**{**vars(args), **QUICK})
    out = Path(args.out)
    work = fresh_work_dir(out)
    old, new, route, data, setup = prepare(args, work, device, phase)
    result: dict[str, Any] = {"items": args.items, "test_items": args.test_items,
                              "device": device, "old": old.version_id, "new": new.version_id,
                              "setup": setup, "reads": bool(getattr(args, "reads", False))}
    phase(f"NEW's batched image throughput on {device} (batches of {args.batch_size})")
    result["encoder"] = _encoder_throughput(new, data, device, batch=args.batch_size)
    rate = args.rate_limit or round(result["encoder"]["items_per_s"] / 2, 1)
    phase(f"run A: backfill with no rate limit ({args.items:,} items; the gateway and a "
          f"worker start)")
    with _stack(work, device) as stack:
        result["run_a"] = stack.migrate(args.batch_size, 0.0)
        stack.undo()
        phase(f"idle search: {args.clients} clients for {args.duration:g} s (run A rolled "
              f"back and retired)")
        result["idle"] = stack.search_load(args.clients, args.duration)
        extra = ({"transform": True, "order": "learned", "sample": args.transform_sample}
                 if args.transform else {})
        if result["reads"]:
            extra.update({"serving": "rerank", "rerank_k": READS_RERANK_K})
        phase(f"run B: backfill rate-limited to {rate:g} items/s ({args.items:,} items), "
              f"search at {args.clients} clients, {args.deletes} deletes, 2 worker kills"
              + (f", {extra}" if extra else ""))
        result["run_b"] = stack.migrate(args.batch_size, rate, search=(args.clients,
                                                                       args.duration),
                                        kills=2, extra=extra,
                                        deletes=[r.id for r in data["fill"].records[::37]][
                                            :args.deletes])
    phase(f"checks: run B's sides read back (exactly once), R@1 on the {args.test_items:,} "
          f"test items")
    result["exactly_once"] = _exactly_once(work, result["run_b"])
    result["fill"] = _fill(result)
    result["recall"] = _recall(work, old, new, route, data, result["run_b"], device)
    result["targets"] = targets(result)
    (out / "bench-migrate.json").write_text(json.dumps(result, indent=2))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return result


# ------------------------------------------------------------------ setup
def prepare(args: argparse.Namespace, work: Path, device: str,
            phase: Any = None) -> tuple[Any, Any, Any, dict[str, Any], dict[str, Any]]:
    """OLD and NEW (``--quick``: random tiny ones), the images on disk, the route fitted,
    the gallery built by OLD on ``device`` and the route promoted: (old, new, route, data,
    setup). ``phase``: told each of its ``PREPARE_PHASES`` phases as it starts."""
    phase = phase or (lambda what: None)
    phase(f"setup: OLD and NEW models, {args.items:,} images written to disk")
    old, new = _models(args, work)
    start = time.perf_counter()
    data = _write_images(work, args)
    phase(f"setup: fit the route (procrustes adapter) on {args.sample:,} items")
    route = _fit_route(old, new, data, args, work)
    phase(f"setup: build the gallery ({args.items:,} items embedded by OLD on {device}), "
          f"promote the route")
    setup = _build(work, old, route, data, device)
    setup["seconds"] = round(time.perf_counter() - start, 1)
    return old, new, route, data, setup


def _models(args: argparse.Namespace, work: Path) -> tuple[Any, Any]:
    from training.artifacts import load_artifact

    if args.quick:
        return _random_model(work / "old", "old", 1), _random_model(work / "new", "new", 2)
    base = Path(args.base)
    if not (base / "old").is_dir() or not (base / "new").is_dir():
        raise SystemExit(f"{base} has no old/ and new/ models: run `nobackfill bench base "
                         f"--out {base}` first")
    return load_artifact(base / "old"), load_artifact(base / "new")


def _random_model(out: Path, name: str, seed: int) -> Any:
    import torch

    from training.artifacts import WEIGHTS, model_state, write_artifact
    from training.configs import config_path
    from training.encoders import ModelSpec, create_model, model_embed_dim

    spec = ModelSpec.from_json(config_path("tiny-old"))
    torch.manual_seed(seed)
    model = create_model(spec)
    manifest = {"version_id": name, "space": name, "model_spec": spec.to_dict(),
                "embed_dim": model_embed_dim(model), "kind": "bench-random-init"}
    return write_artifact(out, manifest, {WEIGHTS: model_state(model)})


def _write_images(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The test set and the filler images on disk; their datasets."""
    from training.bench.base_models import TEST_SEED, BaseBench
    from training.data import open_dataset, write_dataset

    bench = BaseBench()
    test = work / "data" / "datasets" / "test"
    write_dataset(test, args.test_items, seed=TEST_SEED, domains=bench.domains,
                  languages=("en",), id_prefix="test-")
    fill = work / "data" / "datasets" / "fill"
    write_dataset(fill, args.items - args.test_items, seed=31_337, domains=bench.domains,
                  languages=("en",), id_prefix="fill-")
    return {"test": open_dataset(test), "fill": open_dataset(fill), "test_dir": test}


def _fit_route(old: Any, new: Any, data: dict[str, Any], args: argparse.Namespace,
               work: Path) -> Any:
    from training.upgrades.adapter import AdapterFitConfig
    from training.upgrades.adapter.fit import fit_adapter, sample_from_dataset

    sample = sample_from_dataset(old, data["fill"], k=args.sample, seed=0)
    return fit_adapter(new, sample, AdapterFitConfig(method="procrustes"), old.space,
                       work / "route", old=old, version_id=f"{new.version_id}-routed")


def _build(work: Path, old: Any, route: Any, data: dict[str, Any],
           device: str) -> dict[str, Any]:
    """Register OLD and the route version, create the gallery, embed every image with OLD
    through the shared ingest pipeline (the origin of each item is its file), promote."""
    from service.state.gallery import GalleryStore, open_qdrant
    from service.state.registry import Registry
    from service.state.registry.gates import Binding
    from service.state.thumbnails import ThumbnailStore
    from service.vectors.ingest import ingest_dataset
    from service.vectors.writer import DirectWriter
    from training.gate import run_gate
    from training.versions import load_encoder

    settings = _settings(work, device)
    registry = Registry.of(settings)
    registry.register(old.path, by="bench")
    gallery = registry.create_gallery(GALLERY, old.space, by="bench", version=old.version_id,
                                      validation=str(data["test_dir"]))
    binding = Binding.now(gallery, registry.gate_policy)  # a report counts where measured
    gate = binding.apply(run_gate(route, old, data["test"], registry.gate_policy.criterion()))
    registry.register(route.path, by="bench", gate=gate)
    encoder = load_encoder(old, old.space, settings.device)
    store = GalleryStore(open_qdrant(settings), serialise=True)
    start = time.perf_counter()
    try:
        store.create(GALLERY, encoder.embed_dim)
        writer = DirectWriter.fixed(store, ThumbnailStore.of(settings), GALLERY, old.space)
        for dataset in (data["test"], data["fill"]):
            ingest_dataset({old.space: encoder}, old.version_id, writer, dataset, 256)
        count = store.count(GALLERY)
    finally:
        store.close()
    registry.promote(GALLERY, route.version_id, by="bench", force=not gate["passed"],
                     reason=None if gate["passed"] else "bench: measure the route anyway")
    return {"gallery_items": count, "ingest_seconds": round(time.perf_counter() - start, 1),
            "route": "procrustes adapter", "route_gate_passed": gate["passed"]}


def _settings(work: Path, device: str = "cpu") -> Any:
    """The work dir's settings, models on ``device`` (the resolved ``--device``; where only
    the stores are read back, no model runs and the default does)."""
    from service.state.config import Settings

    return Settings(data_dir=work / "data", device=device)


def _encoder_throughput(new: Any, data: dict[str, Any], device: str, n: int = 2048,
                        batch: int = 64) -> dict[str, Any]:
    """NEW's batched image embedding rate: on preloaded images (preprocess + forward: the
    target's baseline), and from the image files (decode + preprocess + forward, what a
    plain re-embedding script does, so what the backfill adds beyond reading is visible).
    Each is the median of three passes over the same ``n`` images."""
    from statistics import median

    from training.data.dataset import open_image
    from training.versions import load_encoder

    encoder = load_encoder(new, new.space, device)
    dataset = data["fill"]
    count = min(n, len(dataset))
    paths = [dataset.records[i].image_path for i in range(count)]
    images = [open_image(path) for path in paths]
    encoder.encode_images(images[:batch])  # warm-up

    def rate(embed: Any) -> float:
        start = time.perf_counter()
        for first in range(0, count, batch):
            embed(first)
        return count / (time.perf_counter() - start)

    preloaded = [rate(lambda f: encoder.encode_images(images[f:f + batch])) for _ in range(3)]
    from_files = [rate(lambda f: encoder.encode_images([open_image(p)
                                                        for p in paths[f:f + batch]]))
                  for _ in range(3)]
    return {"items": count, "batch": batch, "items_per_s": round(median(preloaded), 1),
            "passes": [round(r, 1) for r in preloaded],
            "from_files_items_per_s": round(median(from_files), 1),
            "from_files_passes": [round(r, 1) for r in from_files]}


# ------------------------------------------------------------------ the running stack
class Stack:
    """The gateway and a worker on the embedded default; the bench drives them by HTTP."""

    def __init__(self, work: Path, url: str, env: dict[str, str], gateway_pid: int) -> None:
        self.work, self.url, self.env, self.gateway_pid = work, url, env, gateway_pid
        self.worker: subprocess.Popen | None = None
        self.http = httpx.Client(base_url=url, headers={"X-API-Key": ADMIN_KEY}, timeout=120)
        self.starts = 0

    def start_worker(self) -> None:
        from service.stack.launch import start_worker

        self.starts += 1
        log = self.work / f"worker-{self.starts}.log"
        self.worker = start_worker(self.env, log)
        _poll(lambda: "ready" in log.read_text() if log.exists() else False, 300, "worker")

    def kill_worker(self) -> None:
        assert self.worker is not None
        os.killpg(self.worker.pid, signal.SIGKILL)
        self.worker.wait()
        self.worker = None

    def stop_worker(self) -> None:
        from service.stack.launch import stop

        if self.worker is not None:
            stop(self.worker, 30)
            self.worker = None

    def view(self) -> dict[str, Any]:
        r = self.http.get(f"/v1/galleries/{GALLERY}/migration")
        r.raise_for_status()
        return r.json()

    def start_migration(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST the migration (``body``: its parameters); the answer (the job)."""
        r = self.http.post(f"/v1/galleries/{GALLERY}/migration", json=body)
        r.raise_for_status()
        return r.json()

    def rss(self) -> dict[str, int]:
        """The gateway process's resident memory now and at its peak, in KiB."""
        status = Path(f"/proc/{self.gateway_pid}/status").read_text()
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        return {k: int(fields[k].split()[0]) for k in ("VmRSS", "VmHWM") if k in fields}

    def migrate(self, batch_size: int, rate: float, search: tuple[int, float] | None = None,
                kills: int = 0, extra: dict[str, Any] | None = None,
                deletes: list[str] | None = None) -> dict[str, Any]:
        """One migration to the switch; its timings (and the search load measured while it
        backfills, the worker killed ``kills`` times spread over its second half, and
        the ``deletes`` items deleted once the backfill runs). ``extra``: more parameters
        (a transform and its order)."""
        if self.worker is None:
            self.start_worker()
        job = self.start_migration({"shards": 1, "batch_size": batch_size,
                                    "rate_limit": rate, **(extra or {})})
        submitted = time.monotonic()
        total = int(job["result"].get("listed") or sum(s["total"] for s in job["shards"]))
        out: dict[str, Any] = {"rate_limit": rate, "kills": 0, "params": extra or {}}
        _poll(lambda: self.view()["progress"]["done"] > 0, 600, "backfill start")
        started = time.monotonic()
        cpu_before = self.cpu()
        if deletes:
            out["deleted"] = self.delete_some(deletes)
        if search is not None:
            out["search"] = self.search_load(*search)
        for k in range(kills):
            goal = total * (0.5 + 0.4 * k / max(kills, 1))
            _poll(lambda g=goal: self.view()["progress"]["done"] >= g, 3600, "kill point")
            self.kill_worker()
            out["kills"] += 1
            self.start_worker()
        _poll(lambda: self.view()["progress"]["done"] >= total - len(deletes or ())
              or self.view()["job_status"] in ("succeeded", "failed"), 7200, "backfill")
        backfilled = time.monotonic()
        cpu_after = self.cpu()
        if not kills:  # CPU seconds each side spent while the backfill ran (cores: 2 here)
            out["cpu_s"] = {k: round(cpu_after[k] - cpu_before[k], 1) for k in cpu_after}
        view = _poll(self.settled, 1800, "the switch")
        forced = None
        if view["state"] == "backfilling" and view["job_status"] == "succeeded":
            # The gate refused, or the native side is below what serves: say so, go on.
            forced = view["result"].get("switch_refused")
            r = self.http.post(f"/v1/galleries/{GALLERY}/migration/switch", json={
                "force": True, "reason": "bench migrate measures the mechanism"})
            r.raise_for_status()
            view = self.view()
        switched = time.monotonic()
        out["forced_switch"] = forced
        job = self.http.get(f"/v1/jobs/{view['job']}").json()
        out.update({"job": view["job"], "state": view["state"], "total": total,
                    "serving": view.get("serving"),
                    "filled_by_reads": view["progress"].get("filled_by_reads"),
                    "filled_by_backfill": view["progress"].get("filled_by_backfill"),
                    "gate": view["gate"], "result": view["result"],
                    "attempts": [s["attempts"] for s in job["shards"]],
                    "source": view["source"], "target": view["target"],
                    "first_item_s": round(started - submitted, 1),
                    "backfill_s": round(backfilled - started, 1),
                    "to_switch_s": round(switched - submitted, 1),
                    "backfill_items_per_s": round(total / max(backfilled - started, 1e-9), 1)})
        return out

    def delete_some(self, ids: list[str]) -> list[str]:
        """Delete ``ids`` through the API (while the backfill runs)."""
        r = self.http.post(f"/v1/galleries/{GALLERY}/items/delete", json={"ids": ids})
        r.raise_for_status()
        return ids

    def cpu(self) -> dict[str, float]:
        """CPU seconds used so far by the gateway's and the worker's process sessions (each
        process of a session, and the children it reaped)."""
        return {"gateway": _session_cpu(self.gateway_pid),
                "worker": _session_cpu(self.worker.pid) if self.worker else 0.0}

    def settled(self) -> dict[str, Any] | None:
        """The migration's view once it switched or its job ended (else None)."""
        view = self.view()
        done = view["job_status"] in ("succeeded", "failed", "cancelled")
        return view if view["state"] != "backfilling" or done else None

    def undo(self) -> None:
        """Back to the route: roll the switched gallery back and retire the new side."""
        for action in ("rollback", "retire"):
            r = self.http.post(f"/v1/galleries/{GALLERY}/migration/{action}", json={})
            r.raise_for_status()

    def search_load(self, clients: int, duration: float) -> dict[str, Any]:
        from service.bench.server import load, pool

        queries = self.work / "queries.json"
        if not queries.exists():
            from service.bench.setup import make_queries

            queries.write_text(json.dumps(make_queries(n_images=1).to_json()))
        cell = pool([load(self.url, GALLERY, queries, "text", clients, duration, 1.0)])
        return {k: cell[k] for k in ("requests", "errors", "first_error", "qps", "p50_ms",
                                     "p99_ms", "slowest")}


ADMIN_KEY = "bench-admin"


@contextlib.contextmanager
def _stack(work: Path, device: str,
           extra_env: dict[str, str] | None = None) -> Iterator[Stack]:
    """The gateway (a child process) on the work dir's settings, its models (and the
    worker's) on ``device``, ``extra_env`` added (NOBACKFILL_* settings); the worker starts
    on demand."""
    from service.stack.launch import gateway_child

    settings = _settings(work, device)
    env = {"NOBACKFILL_DATA_DIR": str(settings.data_dir), "NOBACKFILL_DEVICE": device,
           "NOBACKFILL_ADMIN_API_KEYS": json.dumps({"bench": ADMIN_KEY}),
           "NOBACKFILL_ACCESS_LOG": "false", "NOBACKFILL_JOB_STALE_AFTER_S": "10",
           "NOBACKFILL_JOB_HEARTBEAT_S": "1", "NOBACKFILL_WORKER_NAME": "bench@localhost",
           "NOBACKFILL_BOOTSTRAP": "false", **(extra_env or {})}
    with gateway_child(env, work / "gateway.log") as (url, gateway):
        stack = Stack(work, url, env, gateway.pid)
        try:
            yield stack
        finally:
            stack.stop_worker()
            stack.http.close()


def _session_cpu(session: int) -> float:
    """User + system CPU seconds of every live process in ``session``, with the children
    each has reaped."""
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == session:  # fields: state ppid pgrp session ...
                ticks += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def _poll(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise SystemExit(f"bench: timed out after {timeout:.0f}s waiting for {what}")


# ------------------------------------------------------------------ checks after the runs
def _exactly_once(work: Path, run_b: dict[str, Any]) -> dict[str, Any]:
    """Both sides of run B, read back: ids lost or extra in the new side, duplicates; who
    made the new side's vectors (``made.by``: embed, or transform) and how (``made.via``:
    read, by a reranked search's read-through fill; else the backfill)."""
    from service.state.gallery import GalleryStore, open_qdrant

    store = GalleryStore(open_qdrant(_settings(work)), serialise=True)
    try:
        source = set(store.stored(run_b["source"]["collection"]))
        target = store.stored(run_b["target"]["collection"])
        points = store.count(run_b["target"]["collection"])
    finally:
        store.close()
    deleted = set(run_b.get("deleted", []))
    made = {str((s.made or {}).get("by", "embed")) for s in target.values()}
    via: dict[str, int] = {}
    for s in target.values():
        key = str((s.made or {}).get("via", "backfill"))
        via[key] = via.get(key, 0) + 1
    return {"via": dict(sorted(via.items())),"source_items": len(source), "target_items": len(target), "target_points": points,
            "lost": len(source - set(target)), "extra": len(set(target) - source),
            "duplicated": points - len(target), "deleted": len(deleted),
            "resurrected": len(deleted & (source | set(target))), "made": sorted(made)}


def _recall(work: Path, old: Any, new: Any, route: Any, data: dict[str, Any],
            run_b: dict[str, Any], device: str) -> dict[str, Any]:
    """R@1 on the test set: routed (route queries against the stored OLD image vectors and
    OLD's caption embeddings) and migrated (NEW's queries against the stored NEW image
    vectors and NEW's caption embeddings); and how close the stored NEW vectors are to
    NEW's own embeddings of the same images."""
    from service.state.gallery import GalleryStore, open_qdrant
    from training.evaluate import cross_metrics
    from training.versions import load_encoder

    test = data["test"]
    ids = [r.id for r in test.records]
    texts, _ = test.captions("en")
    relevance = test.relevance("en")
    images = [test.load_image(i) for i in range(len(test))]
    store = GalleryStore(open_qdrant(_settings(work)), serialise=True)
    try:
        before = store.vectors(run_b["source"]["collection"], ids)
        after = store.vectors(run_b["target"]["collection"], ids)
    finally:
        store.close()
    old_images = np.stack([before[i]["image"] for i in ids])
    new_images = np.stack([after[i]["image"] for i in ids])
    routed_q = load_encoder(route, old.space, device)
    native = load_encoder(new, new.space, device)
    new_own = native.encode_images(images)
    old_texts = load_encoder(old, old.space, device).encode_texts(texts)
    new_texts = native.encode_texts(texts)
    cells = {
        "old->old": cross_metrics(old_texts, old_images, old_images, old_texts, relevance),
        "routed new->old": cross_metrics(routed_q.encode_texts(texts),
                                         routed_q.encode_images(images), old_images, old_texts,
                                         relevance),
        "migrated new->new": cross_metrics(new_texts, new_own, new_images, new_texts,
                                           relevance)}
    cosine = np.sum(new_images * new_own, axis=1)
    return {"cells": {k: {d: round(v[d]["R@1"], 4) for d in ("t2i", "i2t")}
                      for k, v in cells.items()},
            "stored_vs_new_cosine_min": round(float(cosine.min()), 6)}


def _fill(result: dict[str, Any]) -> dict[str, Any]:
    """Who wrote run B's new side: reranked searches (read-through fill) and the backfill,
    as the migration view counted them at the switch and as the side stores them."""
    b, once = result["run_b"], result["exactly_once"]
    reads, backfill = b.get("filled_by_reads") or 0, b.get("filled_by_backfill") or 0
    return {"filled_by_reads": reads, "applied_by_backfill": backfill,
            "sum": reads + backfill, "items": once["target_items"],
            "stored_via": once["via"]}


# ------------------------------------------------------------------ report
def targets(result: dict[str, Any]) -> dict[str, Any]:
    ratio = result["run_a"]["backfill_items_per_s"] / result["encoder"]["items_per_s"]
    p50 = result["run_b"]["search"]["p50_ms"] / result["idle"]["p50_ms"]
    p99 = result["run_b"]["search"]["p99_ms"] / result["idle"]["p99_ms"]
    once = result["exactly_once"]
    errors = result["idle"]["errors"] + result["run_b"]["search"]["errors"]
    return {
        f"backfill/encoder throughput >= {THROUGHPUT_RATIO}": {
            "value": round(ratio, 2), "met": ratio >= THROUGHPUT_RATIO},
        f"search p50 during rate-limited backfill / idle <= {P50_RATIO}": {
            "value": round(p50, 2), "met": p50 <= P50_RATIO},
        f"search p99 during rate-limited backfill / idle <= {P99_RATIO}": {
            "value": round(p99, 2), "met": p99 <= P99_RATIO},
        "0 lost, duplicated or resurrected items after 2 worker kills": {
            "value": once["lost"] + once["duplicated"] + once["extra"] + once["resurrected"],
            "met": once["lost"] == once["duplicated"] == once["extra"] == once["resurrected"]
            == 0 and result["run_b"]["kills"] == 2 and once["made"] == ["embed"]},
        "no search errors": {"value": errors, "met": errors == 0},
        **({"--reads: reranked searches filled part of run B's new side (by reads)": {
            "value": once["via"].get("read", 0), "met": once["via"].get("read", 0) > 0
            and result["run_b"].get("serving") == "rerank"}} if result.get("reads") else {}),
        "both runs switched": {"value": [result["run_a"]["state"], result["run_b"]["state"]],
                               "met": result["run_a"]["state"] == result["run_b"]["state"]
                               == "switched"},
    }


def render(result: dict[str, Any]) -> str:
    a, b, enc = result["run_a"], result["run_b"], result["encoder"]
    setup = result["setup"]
    lines = [(f"bench migrate: {result['items']} items, device {result.get('device', 'cpu')}, "
              f"OLD={result['old']} NEW={result['new']} (route: {setup['route']}, its gate "
              f"passed: "
              f"{setup['route_gate_passed']})"), "",
             "| throughput | items/s |", "|---|---|",
             f"| NEW encoder, batched ({enc['batch']}), preloaded images | {enc['items_per_s']} |",
             (f"| NEW encoder, batched ({enc['batch']}), reading the image files | "
              f"{enc['from_files_items_per_s']} |"),
             f"| run A backfill (1 worker, no limit) | {a['backfill_items_per_s']} |",
             (f"| run B backfill (rate limit {b['rate_limit']}/s, 2 kills) | "
              f"{b['backfill_items_per_s']} |"), "",
             "| text search | QPS | p50 ms | p99 ms | errors |", "|---|---|---|---|---|"]
    during = "during run B" + (" (reranked, k 20)" if result.get("reads") else "")
    for name, cell in (("idle", result["idle"]), (during, b["search"])):
        lines.append(f"| {name} | {cell['qps']:.1f} | {cell['p50_ms']:.1f} | "
                     f"{cell['p99_ms']:.1f} | {cell['errors']} |")
    lines += ["", "| R@1 on the test set | t2i | i2t |", "|---|---|---|"]
    for name, cell in result["recall"]["cells"].items():
        lines.append(f"| {name} | {cell['t2i']:.3f} | {cell['i2t']:.3f} |")
    once = result["exactly_once"]
    lines += ["", ("stored NEW vectors vs NEW's own embeddings: min cosine "
                   f"{result['recall']['stored_vs_new_cosine_min']}"),
              (f"after run B: {once['target_items']} items in the new side for "
               f"{once['source_items']} in the old ({once['lost']} lost, {once['extra']} "
               f"extra, {once['duplicated']} duplicated; {once['deleted']} deleted during "
               f"it, {once['resurrected']} resurrected; the new side's vectors made by "
               f"{once['made']}); shard attempts {b['attempts']}; run B's parameters "
               f"{b['params']}")]
    fill = result.get("fill")
    if fill:
        lines.append(f"run B's new side filled by reads {fill['filled_by_reads']}, applied by "
                     f"the backfill {fill['applied_by_backfill']}: {fill['sum']} for "
                     f"{fill['items']} items (stored: {fill['stored_via']})")
    for name, run in (("A", a), ("B", b)):
        if run.get("forced_switch"):
            lines.append(f"run {name}: the migration did not switch on its own "
                         f"({run['forced_switch']}); the bench switched, by the operator's "
                         f"call")
    lines.append(f"run A against the encoder reading the files (not the target's baseline): "
                 f"{a['backfill_items_per_s'] / enc['from_files_items_per_s']:.2f}x")
    if a.get("cpu_s"):
        lines.append(f"CPU seconds during run A's backfill ({a['backfill_s']} s on "
                     f"{os.cpu_count()} cores): worker {a['cpu_s']['worker']}, gateway "
                     f"{a['cpu_s']['gateway']}")
    lines += [(f"timings: run A first item {a['first_item_s']} s, backfill {a['backfill_s']} "
               f"s, to switch {a['to_switch_s']} s; run B to switch {b['to_switch_s']} s"),
              "", "targets:"]
    for name, check in result["targets"].items():
        lines.append(f"  [{'x' if check['met'] else ' '}] {name}: {check['value']}")
    return "\n".join(lines)
