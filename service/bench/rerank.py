"""``nobackfill bench rerank``: rerank on read (``service/usecases/rerank.py``) through the
real gateway and worker processes on the embedded default, a 20,000-item gallery
mid-migration.

The gallery is ``bench migrate``'s (``service.bench.migrate.prepare``: the test set and
synthetic images on disk, embedded by OLD, NEW's Procrustes route promoted). A migration
to NEW's native space starts with ``backfill: "paused"`` and ``serving: "route"``: the
bulk backfill waits (a worker runs; its shard parks), so the new side fills only by what
reranked searches embed and write (read-through fill), and the gallery stays
mid-migration for the whole run. Text queries (a reranked t2i search embeds its candidate
images) are distinct captions of the test items, ``top_k = rerank_k = k`` so that every
candidate is in the answer.

1. Plain search (``rerank: false``): p50/p99 at 1 client over the queries; QPS at
   ``--clients`` clients.
2. For k in 10 and 20, on a fresh set of queries each, in ``ROUNDS`` rounds: a cold pass
   (their candidates are not embedded yet, except where they overlap an earlier query's)
   and a warm pass (the same queries again: every candidate is read from the new side) at
   1 client, each reranked search right after the same query's plain search (A B A B:
   each round's ratio has its denominator measured beside it, under the same load; a
   pause of ``GAP_S`` after each answer lets the fills a cold rerank writes after
   answering end before the next search, which would otherwise pay for them); the
   ratios per round with their spread, and where a reranked search's time went
   (``reranked.stages_ms``: the query's embeddings, the route's search, the new side's
   read, the wait for its embeddings, and of those the decode and the forward); QPS at
   ``--clients`` clients, warm; vectors embedded and read per search, searches that
   embedded nothing, kept candidates, over-budget candidates, errors. A search may
   embed every one of its candidates (``rerank_embed_max_per_request`` = the largest k).
3. The gateway's resident memory; the new side read back after the run: its items are
   exactly the candidates the reranked answers ranked by NEW (every candidate not kept in
   the route's place), all of them written by reads.
4. What keeping both sides costs (a migration's end state ``kept``,
   ``service/jobkinds/migrate/keep.py``): writes through the items API (``--writes``
   items with their images, in requests of ``WRITE_BATCH``, 1 client) timed with one side
   (before the migration starts) and with both (the migration open: each write embedded
   into both spaces), new ids each time; and the engine's bytes on disk of each side
   after the run (the source side holds every item; the new side only what reads filled,
   and the engine's preallocated files dominate it at that size: the disk of a full
   side is the source side's, so two full sides take about twice it).

The rerank budget (``NOBACKFILL_RERANK_BUDGET_MS``) is fixed by ``--budget-ms``.
Targets: warm p50 <= 1.3x plain; cold p50 <= 3x plain at k = 20; rerank p99 <= plain p99
+ the budget; 0 errors.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from service.bench.phases import Phases, add_device_option, resolve_device
from training.console import report_command

KS = (10, 20)
ROUNDS = 3  # rounds of interleaved plain and reranked searches per k (each ratio's spread)
# between two interleaved searches (not timed): the work a cold rerank leaves after its
# answer (writing its fills) ends before the next search starts, so the plain search
# after it is not slowed by it (measured: 13.6-14.6 ms against 8.0 alone, at k = 20)
GAP_S = 0.05
WARM_RATIO = 1.3  # warm rerank p50 over plain p50
COLD_RATIO = 3.0  # cold rerank p50 over plain p50, at k = COLD_K
COLD_K = 20
WARMUP = 5  # plain searches (and reranks of k = 1) before anything is measured
QUICK = {"items": 600, "test_items": 200, "sample": 300, "queries": 12, "writes": 32}
WRITE_BATCH = 16  # items per POST .../items of the write timing


def register(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="rerank on read, a 20,000-item gallery mid-migration: "
                                  "plain search against rerank@10 and @20, cold and warm")
    p.add_argument("--base", default="runs/bench-base", help="holds bench base's old/ and new/")
    p.add_argument("--out", default="runs/bench-rerank", help="results, logs and work files")
    p.add_argument("--items", type=int, default=20_000, help="gallery size (test set included)")
    p.add_argument("--test-items", type=int, default=1000,
                   help="bench base's test set size (the first items of the gallery)")
    p.add_argument("--sample", type=int, default=10_000, help="items the route is fitted on")
    p.add_argument("--batch-size", type=int, default=256, help="items per forward of the "
                                                               "gallery's ingest")
    p.add_argument("--queries", type=int, default=200,
                   help="text queries per pass (each k gets a fresh set)")
    p.add_argument("--clients", type=int, default=8, help="concurrent clients for QPS")
    p.add_argument("--budget-ms", type=float, default=250.0,
                   help="the gateway's rerank_budget_ms (NOBACKFILL_RERANK_BUDGET_MS)")
    p.add_argument("--writes", type=int, default=256, help="items written through the API, "
                                                        "with one side and with both")
    p.add_argument("--quick", action="store_true", help="smoke run: random tiny models, 600 "
                                                        "items, 12 queries per pass")
    add_device_option(p, "the models: the gallery's ingest, the gateway's and the worker's")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=report_command(run, render))


def run(args: argparse.Namespace) -> dict[str, Any]:
    from service.bench.migrate import PREPARE_PHASES, _stack, prepare
    from service.bench.setup import fresh_work_dir

    device = resolve_device(getattr(args, "device", None))  # before anything starts
    phase = Phases("rerank", PREPARE_PHASES + 5 + len(KS))  # prepare's, then the run's
    if args.quick:
        args = argparse.Namespace(**{**vars(args), **QUICK})
    out = Path(args.out)
    work = fresh_work_dir(out)
    old, new, _, data, setup = prepare(args, work, device, phase)
    texts = _queries(data["test"], WARMUP + args.queries * len(KS))
    if len(texts) < WARMUP + args.queries * len(KS):
        raise SystemExit(f"bench rerank: the test set has {len(texts)} distinct captions; "
                         f"{WARMUP + args.queries * len(KS)} are needed")
    warmup, sets = texts[:WARMUP], [texts[WARMUP + i * args.queries:
                                          WARMUP + (i + 1) * args.queries]
                                    for i in range(len(KS))]
    result: dict[str, Any] = {"items": args.items, "device": device, "old": old.version_id,
                              "new": new.version_id, "setup": setup,
                              "queries": args.queries, "clients": args.clients,
                              "budget_ms": args.budget_ms}
    answers: list[dict[str, Any]] = []  # every reranked answer (the fill check)
    env = {"NOBACKFILL_RERANK_BUDGET_MS": str(args.budget_ms),  # no per-search cap below k:
           "NOBACKFILL_RERANK_EMBED_MAX_PER_REQUEST": str(max(KS))}  # a cold one embeds all
    writes = _write_bodies(data["fill"], args.writes)
    phase(f"the gateway and a worker start; writes with one side ({len(writes)} items)")
    with _stack(work, device, env) as stack:
        stack.start_worker()
        result["writes"] = {"one_side": _write_rate(stack.url, writes, "one")}
        phase("migration to NEW started (backfill paused, serving the route); warm-up")
        job = stack.start_migration({"shards": 1, "batch_size": args.batch_size,
                                     "serving": "route", "backfill": "paused"})
        result["migration"] = {"job": job["id"], "view": _brief(stack.view())}
        url = stack.url
        answers += _warm_up(url, warmup)
        result["rss_kib_before"] = stack.rss()
        phase(f"plain search: {args.queries} queries at 1 client and at {args.clients}")
        plain = [{"text": t, "top_k": KS[-1], "rerank": False} for t in sets[0]]
        result["plain"] = {"k": KS[-1], **_cell(_drive(url, plain, 1)),
                           "qps": _cell(_drive(url, plain, args.clients))["qps"]}
        result["rerank"] = {}
        for k, queries in zip(KS, sets, strict=True):
            phase(f"rerank@{k}: {args.queries} queries in {ROUNDS} rounds, each plain and "
                  f"reranked in turn, cold then warm, at 1 client; warm at {args.clients}")
            bodies = [{"text": t, "top_k": k, "rerank": True, "rerank_k": k} for t in queries]
            rounds, passes = [], {"cold": [], "warm": []}
            for chunk in _rounds(bodies, ROUNDS):
                plain_chunk = [{**b, "rerank": False} for b in chunk]
                both = {}
                for name in ("cold", "warm"):
                    if name == "warm":
                        _settle(stack)  # embeddings that outlived their budget are written
                    a, b = _split(_drive(url, _interleaved(plain_chunk, chunk), 1, GAP_S))
                    passes[name].append(b)
                    both[name] = _ratio(a, b)
                rounds.append(both)
            busy = _drive(url, bodies, args.clients)
            cold, warm = _joined(passes["cold"]), _joined(passes["warm"])
            answers += [a for r in (cold, warm, busy) for a in r["answers"]]
            result["rerank"][str(k)] = {"cold": _cell(cold), "warm": _cell(warm),
                                        "warm_clients": _cell(busy), "rounds": rounds}
        _settle(stack)
        phase(f"writes with both sides ({len(writes)} items); the stack stops")
        result["writes"]["both_sides"] = _write_rate(url, writes, "both")
        _settle(stack)
        result["rss_kib_after"] = stack.rss()
        result["migration"]["after"] = _brief(stack.view())
        result["migration"]["target"] = stack.view()["target"]
        result["migration"]["source"] = stack.view()["source"]
    phase("checks: the new side read back against the reranked answers, bytes on disk")
    result["fill"] = _fill_check(work, result, answers)
    result["kept_cost"] = _kept_cost(work, result)
    result["targets"] = targets(result)
    (out / "bench-rerank.json").write_text(json.dumps(result, indent=2))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return result


def _rounds(bodies: list[dict[str, Any]], n: int) -> list[list[dict[str, Any]]]:
    """``bodies`` in ``n`` consecutive rounds, as even as they split."""
    bounds = [round(r * len(bodies) / n) for r in range(n + 1)]
    return [bodies[bounds[r]:bounds[r + 1]] for r in range(n)]


def _interleaved(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A B A B ...: each plain search followed by the same query reranked, so both see the
    same load and the same moment of the run (the denominator is measured beside the
    numerator, not once before it)."""
    return [x for pair in zip(a, b, strict=True) for x in pair]


def _split(run: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """An interleaved pass cut into its plain (even) and reranked (odd) requests."""
    def part(parity: int) -> dict[str, Any]:
        kept = [r for n, r in enumerate(run["results"]) if n % 2 == parity]
        ok = [r for r in kept if isinstance(r, dict)]
        errors = [r for r in kept if not isinstance(r, dict)]
        share = len(kept) / max(1, len(run["results"]))
        return {"clients": run["clients"], "requests": len(kept),
                "seconds": run["seconds"] * share, "results": kept,
                "latencies_ms": [r["ms"] for r in ok], "answers": [r["answer"] for r in ok],
                "errors": len(errors), "first_error": errors[0] if errors else None}
    return part(0), part(1)


def _joined(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several passes as one (their requests, latencies, answers, errors together)."""
    errors = [e for r in runs for e in ([r["first_error"]] if r["first_error"] else [])]
    return {"clients": runs[0]["clients"], "requests": sum(r["requests"] for r in runs),
            "seconds": sum(r["seconds"] for r in runs),
            "results": [x for r in runs for x in r["results"]],
            "latencies_ms": [x for r in runs for x in r["latencies_ms"]],
            "answers": [x for r in runs for x in r["answers"]],
            "errors": sum(r["errors"] for r in runs),
            "first_error": errors[0] if errors else None}


def _ratio(plain: dict[str, Any], reranked: dict[str, Any]) -> dict[str, Any]:
    """One round's p50s and their ratio, and where the reranked searches spent their time
    (p50 of each stage, ``reranked.stages_ms``)."""
    from service.bench.load import percentile

    a, b = percentile(plain["latencies_ms"], 50), percentile(reranked["latencies_ms"], 50)
    return {"plain_p50_ms": round(a, 2), "rerank_p50_ms": round(b, 2),
            "plain_errors": plain["errors"],
            "ratio": round(b / a, 3) if a else None, "stages_p50_ms": _stages(reranked)}


def _stages(run: dict[str, Any]) -> dict[str, float]:
    from service.bench.load import percentile

    stages: dict[str, list[float]] = {}
    for a in run["answers"]:
        for name, ms in ((a["reranked"] or {}).get("stages_ms") or {}).items():
            stages.setdefault(name, []).append(ms)
    return {name: round(percentile(v, 50), 2) for name, v in stages.items()}


def _queries(test: Any, n: int) -> list[str]:
    """Up to ``n`` distinct captions, one item after another (its first caption not
    already taken), then the items' further captions."""
    texts, owners = test.captions("en")
    by_item: dict[int, list[str]] = {}
    for text, owner in zip(texts, owners, strict=True):
        by_item.setdefault(owner, []).append(text)
    seen: dict[str, None] = {}
    for round_ in range(max(len(v) for v in by_item.values())):
        for item in sorted(by_item):
            if round_ < len(by_item[item]) and by_item[item][round_] not in seen:
                seen[by_item[item][round_]] = None
                if len(seen) == n:
                    return list(seen)
    return list(seen)


def _brief(view: dict[str, Any]) -> dict[str, Any]:
    p = view.get("progress", {})
    return {"state": view["state"], "phase": view.get("phase"), "serving": view.get("serving"),
            **{k: p.get(k) for k in ("paused", "filled_by_reads", "filled_by_backfill",
                                     "done", "total")}}


def _warm_up(url: str, texts: list[str]) -> list[dict[str, Any]]:
    """First requests pay one-off costs: plain searches, and reranks of one candidate (the
    new side's embedder loads; each fills at most one item). Waits (up to 5 minutes) until
    a rerank is answered: the gateway serves the migration. Its reranked answers."""
    deadline = time.monotonic() + 300
    while True:
        probe = _drive(url, [{"text": texts[0], "top_k": 1, "rerank": True, "rerank_k": 1}], 1)
        if not probe["errors"]:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"bench rerank: a rerank is refused: {probe['first_error']}")
        time.sleep(0.5)
    _drive(url, [{"text": t, "top_k": 10, "rerank": False} for t in texts], 1)
    warm = _drive(url, [{"text": t, "top_k": 1, "rerank": True, "rerank_k": 1} for t in texts], 1)
    if warm["errors"]:
        raise SystemExit(f"bench rerank: warm-up failed: {warm['first_error']}")
    return probe["answers"] + warm["answers"]


def _settle(stack: Any, quiet_s: float = 1.0, timeout: float = 120.0) -> None:
    """Until the new side's count (filled by reads) has not moved for ``quiet_s``."""
    deadline = time.monotonic() + timeout
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        count = stack.view()["progress"].get("filled_by_reads")
        if count != last:
            last, since = count, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.2)


# ------------------------------------------------------------------ the clients
def _drive(url: str, bodies: list[dict[str, Any]], clients: int,
           gap_s: float = 0.0) -> dict[str, Any]:
    """Every body sent once, by ``clients`` closed-loop clients (each takes the next body;
    one keep-alive connection each, ``service.bench.load``'s lean HTTP client), each
    pausing ``gap_s`` after an answer (not timed); the answers are parsed after the pass,
    so that parsing does not take CPU from the gateway."""
    return asyncio.run(_pass(url, bodies, clients, gap_s))


async def _pass(url: str, bodies: list[dict[str, Any]], clients: int,
                gap_s: float = 0.0) -> dict[str, Any]:
    from service.bench.load import Connection, post_json
    from service.bench.migrate import GALLERY

    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    path = f"/v1/galleries/{GALLERY}/search"
    requests = [post_json(host, port, path, body) for body in bodies]
    raw: list[tuple[float, int, bytes] | str | None] = [None] * len(requests)
    taken = iter(range(len(requests)))

    async def client() -> None:
        connection = Connection(host, port)
        try:
            for i in taken:
                t0 = time.perf_counter()
                try:
                    status, body = await connection.send(requests[i])
                except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
                    raw[i] = f"{type(exc).__name__}: {exc}"
                else:
                    raw[i] = ((time.perf_counter() - t0) * 1e3, status, body)
                if gap_s:
                    await asyncio.sleep(gap_s)
        finally:
            connection.close()

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    seconds = time.perf_counter() - start
    latencies, answers, errors = [], [], []
    results: list[dict[str, Any] | str] = []  # per request, in order: its answer or error
    for got in raw:
        if not isinstance(got, tuple):
            errors.append(str(got))
            results.append(errors[-1])
            continue
        ms, status, body = got
        if status != 200:
            errors.append(f"{status}: {body[:200].decode(errors='replace')}")
            results.append(errors[-1])
            continue
        latencies.append(ms)
        answer = json.loads(body)
        answers.append({"ids": [h["id"] for h in answer["hits"]], "route": answer["route"],
                        "reranked": answer.get("reranked")})
        results.append({"ms": ms, "answer": answers[-1]})
    return {"clients": clients, "requests": len(bodies), "seconds": seconds,
            "latencies_ms": latencies, "errors": len(errors),
            "first_error": errors[0] if errors else None, "answers": answers,
            "results": results}


def _cell(run: dict[str, Any]) -> dict[str, Any]:
    """A pass's figures: latency, QPS, errors; for reranked answers, what they did."""
    from service.bench.load import percentile

    lat, answers = run["latencies_ms"], run["answers"]
    out: dict[str, Any] = {
        "clients": run["clients"], "requests": run["requests"], "errors": run["errors"],
        "first_error": run["first_error"], "qps": round(len(lat) / run["seconds"], 2),
        "p50_ms": round(percentile(lat, 50), 2), "p99_ms": round(percentile(lat, 99), 2),
        "mean_ms": round(sum(lat) / max(1, len(lat)), 2)}
    reranked = [a["reranked"] for a in answers if a["reranked"]]
    if reranked:
        n = len(reranked)
        out.update({
            "reranked": n, "embedded_mean": round(sum(r["embedded"] for r in reranked) / n, 2),
            "read_mean": round(sum(r["read"] for r in reranked) / n, 2),
            "embedded_none_share": round(sum(r["embedded"] == 0 for r in reranked) / n, 3),
            "embedded": sum(r["embedded"] for r in reranked),
            "kept": sum(len(r["kept_route_place"]) for r in reranked),
            "over_budget": sum(r["over_budget"] for r in reranked),
            "budget_ms": reranked[0]["budget_ms"]})
    if len(reranked) != len(answers):
        out["not_reranked"] = len(answers) - len(reranked)
    return out


# ------------------------------------------------------------------ after the run
def _fill_check(work: Path, result: dict[str, Any],
                answers: list[dict[str, Any]]) -> dict[str, Any]:
    """The new side read back (the gateway stopped: local Qdrant is one process's) against
    what the reranked answers said: the candidates NEW ranked (each answer's hits but those
    that kept the route's place) are the items the side holds, every one written by a read
    (``made.via: "read"``)."""
    from service.bench.migrate import _settings
    from service.state.gallery import GalleryStore, open_qdrant

    ranked: set[str] = set()
    for a in answers:
        ranked |= set(a["ids"]) - set((a["reranked"] or {}).get("kept_route_place", ()))
    collection = result["migration"]["target"]["collection"]
    store = GalleryStore(open_qdrant(_settings(work)), serialise=True)
    try:
        stored = store.stored(collection)
        points = store.count(collection)
    finally:
        store.close()
    via_read = sum((s.made or {}).get("via") == "read" for s in stored.values())
    embedded = sum(a["reranked"]["embedded"] for a in answers if a["reranked"])
    return {"new_side_items": len(stored), "new_side_points": points, "via_read": via_read,
            "by_embed": sum((s.made or {}).get("by", "embed") == "embed"
                            for s in stored.values()),
            "filled_by_reads_view": result["migration"]["after"]["filled_by_reads"],
            "filled_by_backfill_view": result["migration"]["after"]["filled_by_backfill"],
            "ranked_by_new": len(ranked), "missing": len(ranked - set(stored)),
            "unexplained": len(set(stored) - ranked),
            "embedded_reported": embedded, "reranked_answers": sum(
                1 for a in answers if a["reranked"])}


def _write_bodies(dataset: Any, n: int) -> list[dict[str, Any]]:
    """``n`` items of ``dataset`` (images and captions) as items API bodies, without ids."""
    import base64

    out = []
    for i in range(min(n, len(dataset))):
        record = dataset.records[i]
        image = base64.b64encode(Path(record.image_path).read_bytes()).decode()
        caption = next((c[0] for c in record.captions.values() if c), None)
        out.append({"image_base64": image, **({"text": caption} if caption else {})})
    return out


def _write_rate(url: str, bodies: list[dict[str, Any]], tag: str) -> dict[str, Any]:
    """Write ``bodies`` (new ids ``kept-<tag>-<n>``) through POST .../items in requests of
    ``WRITE_BATCH``, one client: items/s, and each request's ms (p50); then delete them
    (a delete reaches every side), so the gallery and its new side are as they were."""
    import statistics

    import httpx

    from service.bench.migrate import ADMIN_KEY, GALLERY

    times, errors = [], 0
    with httpx.Client(base_url=url, headers={"X-API-Key": ADMIN_KEY}, timeout=300) as http:
        start = time.perf_counter()
        for first in range(0, len(bodies), WRITE_BATCH):
            batch = [{"id": f"kept-{tag}-{first + n}", **b}
                     for n, b in enumerate(bodies[first:first + WRITE_BATCH])]
            t = time.perf_counter()
            r = http.post(f"/v1/galleries/{GALLERY}/items", json={"items": batch})
            times.append((time.perf_counter() - t) * 1e3)
            errors += r.status_code >= 400
        seconds = time.perf_counter() - start
        ids = [f"kept-{tag}-{n}" for n in range(len(bodies))]  # the gallery as it was
        if ids:
            errors += http.post(f"/v1/galleries/{GALLERY}/items/delete",
                                json={"ids": ids}).status_code >= 400
    return {"items": len(bodies), "seconds": round(seconds, 2),
            "items_per_s": round(len(bodies) / seconds, 1) if seconds else None,
            "request_p50_ms": round(statistics.median(times), 1) if times else None,
            "errors": errors}


def _kept_cost(work: Path, result: dict[str, Any]) -> dict[str, Any]:
    """Bytes on disk of each side (the engine's files of its collection and of its
    index) and its points, read after the gateway stopped (module docstring, 4); with the
    write rates of one side and of both."""
    from service.bench.migrate import _settings
    from service.state.gallery import GalleryStore, open_qdrant

    settings = _settings(work)
    root = Path(settings.qdrant_location)
    view = result["migration"]["after"]
    sides = {"source": result["migration"]["source"]["collection"],
             "target": result["migration"]["target"]["collection"]}
    store = GalleryStore(open_qdrant(settings), serialise=True)
    try:
        points = {k: store.count(c) for k, c in sides.items() if c}
    finally:
        store.close()
    out: dict[str, Any] = {"filled_by_reads": view.get("filled_by_reads")}
    for name, collection in sides.items():
        if not collection:
            continue
        disk = sum(f.stat().st_size for d in (root / "collections" / collection,
                                               root / "indexed" / collection)
                   if d.exists() for f in d.rglob("*") if f.is_file())
        out[name] = {"collection": collection, "points": points[name], "disk_bytes": disk,
                     "bytes_per_point": round(disk / points[name]) if points[name] else None}
    w = result["writes"]
    one, both = w["one_side"]["items_per_s"], w["both_sides"]["items_per_s"]
    out["write_rate_ratio"] = round(both / one, 3) if one and both else None
    return out


# ------------------------------------------------------------------ report
def targets(result: dict[str, Any]) -> dict[str, Any]:
    plain, budget = result["plain"], result["budget_ms"]
    cells = result["rerank"]
    out: dict[str, Any] = {}
    for k, cell in cells.items():
        warm = spread([r["warm"]["ratio"] for r in cell["rounds"]])
        out[f"warm rerank@{k} p50 <= {WARM_RATIO}x plain (the median of {ROUNDS} rounds, "
            f"each against the plain searches interleaved with it)"] = {
            "value": warm["text"], "met": warm["median"] <= WARM_RATIO}
    cold = spread([r["cold"]["ratio"] for r in cells[str(COLD_K)]["rounds"]])
    out[f"cold rerank@{COLD_K} p50 <= {COLD_RATIO}x plain (the median of {ROUNDS} rounds, "
        f"every candidate embedded)"] = {"value": cold["text"],
                                          "met": cold["median"] <= COLD_RATIO}
    worst = max(c[p]["p99_ms"] for c in cells.values() for p in ("cold", "warm"))
    out[f"rerank p99 (1 client) <= plain p99 + budget ({budget:g} ms)"] = {
        "value": f"{worst:.1f} ms <= {plain['p99_ms'] + budget:.1f} ms",
        "met": worst <= plain["p99_ms"] + budget}
    errors = plain["errors"] + sum(
        c[p]["errors"] for c in cells.values() for p in ("cold", "warm", "warm_clients")) + sum(
        r[p]["plain_errors"] for c in cells.values() for r in c["rounds"] for p in r) + sum(
        w["errors"] for w in (result.get("writes") or {}).values())
    out["0 errors"] = {"value": errors, "met": errors == 0}
    fill = result["fill"]
    out["new side == the distinct candidates ranked by NEW, all filled by reads"] = {
        "value": f"{fill['new_side_items']} items, {fill['ranked_by_new']} ranked, "
                 f"{fill['via_read']} via read, view {fill['filled_by_reads_view']}",
        "met": fill["new_side_items"] == fill["ranked_by_new"] == fill["via_read"]
        == fill["filled_by_reads_view"] == fill["new_side_points"]
        and fill["missing"] == fill["unexplained"] == 0 and not fill["filled_by_backfill_view"]}
    warm = sum(c[p].get("embedded", 0) for c in cells.values() for p in ("warm", "warm_clients"))
    out["warm passes embed nothing"] = {"value": warm, "met": warm == 0}
    return out


def spread(ratios: list[float]) -> dict[str, Any]:
    """The rounds' ratios: median, min and max, and as text."""
    import statistics

    med = statistics.median(ratios)
    return {"median": med, "min": min(ratios), "max": max(ratios),
            "text": f"{med:.2f}x (rounds {', '.join(f'{r:.2f}' for r in ratios)})"}


STAGES = ("query", "candidates", "read", "wait", "decode", "forward")


def render(result: dict[str, Any]) -> str:
    setup, plain = result["setup"], result["plain"]
    lines = [(f"bench rerank: {result['items']} items mid-migration (backfill paused), "
              f"device {result.get('device', 'cpu')}, OLD={result['old']} NEW={result['new']} "
              f"(route: {setup['route']}), "
              f"{result['queries']} text queries per pass, top_k = rerank_k = k, "
              f"rerank_budget_ms {result['budget_ms']:g}"), "",
             (f"| t2i search | p50 ms (1 client) | p99 ms (1 client) | QPS ({result['clients']}"
              f" clients) | embedded/search | read/search | embedded 0 | kept | over budget"
              f" | errors |"), "|---|---|---|---|---|---|---|---|---|---|",
             (f"| plain (top_k {plain['k']}) | {plain['p50_ms']:.1f} | {plain['p99_ms']:.1f} | "
              f"{plain['qps']:.1f} | - | - | - | - | - | {plain['errors']} |")]
    for k, cell in result["rerank"].items():
        for name, pass_ in (("cold", cell["cold"]), ("warm", cell["warm"])):
            qps = cell["warm_clients"]["qps"] if name == "warm" else None
            errors = pass_["errors"] + (cell["warm_clients"]["errors"] if name == "warm" else 0)
            lines.append(
                f"| rerank@{k} {name} | {pass_['p50_ms']:.1f} | {pass_['p99_ms']:.1f} | "
                f"{'-' if qps is None else f'{qps:.1f}'} | {pass_.get('embedded_mean', '-')} | "
                f"{pass_.get('read_mean', '-')} | {pass_.get('embedded_none_share', '-')} | "
                f"{pass_.get('kept', '-')} | {pass_.get('over_budget', '-')} | {errors} |")
    lines += ["", ("interleaved rounds (plain, reranked, plain, ...; 1 client): p50 ms plain / "
                   "reranked = ratio; where a reranked search's time went (p50 ms per stage; "
                   "decode and forward: of the embeddings it waited on)"),
              f"| k | pass | round | plain p50 | rerank p50 | ratio | {' | '.join(STAGES)} |",
              "|---" * (6 + len(STAGES)) + "|"]
    for k, cell in result["rerank"].items():
        for name in ("cold", "warm"):
            for n, r in enumerate(cell.get("rounds") or []):
                x = r[name]
                lines.append(f"| {k} | {name} | {n + 1} | {x['plain_p50_ms']:.1f} | "
                             f"{x['rerank_p50_ms']:.1f} | {x['ratio']:.2f} | " + " | ".join(
                                 f"{x['stages_p50_ms'].get(st, 0):.1f}" for st in STAGES) + " |")
    before, after, fill = result["rss_kib_before"], result["rss_kib_after"], result["fill"]
    lines += ["", (f"gateway RSS: {before.get('VmRSS', 0) / 1024:.0f} MiB after warm-up, "
                   f"{after.get('VmRSS', 0) / 1024:.0f} MiB after the run (peak "
                   f"{after.get('VmHWM', 0) / 1024:.0f} MiB)"),
              (f"new side after the run: {fill['new_side_items']} items ({fill['via_read']} "
               f"written by reads; view: filled_by_reads {fill['filled_by_reads_view']}, "
               f"by the backfill {fill['filled_by_backfill_view']}); distinct candidates "
               f"ranked by NEW over {fill['reranked_answers']} reranked answers: "
               f"{fill['ranked_by_new']} ({fill['missing']} not in the side, "
               f"{fill['unexplained']} in it unexplained); embedded as reported, summed: "
               f"{fill['embedded_reported']}"),
              f"migration after the run: {result['migration']['after']}"]
    w, cost = result.get("writes") or {}, result.get("kept_cost") or {}
    if w:
        one, both = w["one_side"], w["both_sides"]
        lines.append(
            f"writes through the API ({one['items']} items with images, {WRITE_BATCH} per "
            f"request, 1 client): one side {one['items_per_s']} items/s (request p50 "
            f"{one['request_p50_ms']} ms), both sides {both['items_per_s']} items/s (p50 "
            f"{both['request_p50_ms']} ms): ratio {cost.get('write_rate_ratio')}; errors "
            f"{one['errors'] + both['errors']}")
    if cost.get("source") and cost.get("target"):
        src, tgt = cost["source"], cost["target"]
        lines.append(
            f"on disk: source side {src['disk_bytes'] / 1e6:.1f} MB for {src['points']} "
            f"points ({src['bytes_per_point']} B each), new side {tgt['disk_bytes'] / 1e6:.1f}"
            f" MB for {tgt['points']} points (the engine's preallocated files dominate a "
            f"side this small)")
    lines += ["", "targets:"]
    for name, check in result["targets"].items():
        lines.append(f"  [{'x' if check['met'] else ' '}] {name}: {check['value']}")
    return "\n".join(lines)
