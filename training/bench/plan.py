"""``nobackfill bench plan``: does the plan measure what the benchmarks measure, and what
does a plan cost?

On ``bench base``'s models and one seed:

1. **Agreement.** The plan (``training.upgrades.plan.run``, the code the ``plan`` job runs)
   on the standard test set as its validation set and ``bench upgrade``'s adapter sample
   (same items, same size, same seed), against ``bench upgrade``'s own adapter rows on the
   same draw (``run_adapters``: fitted, written as versions and scored through their
   served routes by the benchmark's code). And the plan's migrations on one of ``bench
   frontier``'s draws (same seed, same 50,000-item gallery, same K-item sample) against
   ``bench frontier``'s own measure of that draw (``frontier_agreement``). Target: every
   share within 0.03.
2. **Cost.** A plan for a ``--gallery``-item gallery (20,000 by default) with the plan
   job's default sample (2% of the gallery, at least 500), timed end to end, against the
   time NEW needs to re-embed that gallery on this host (NEW's rate measured on
   ``--probe`` items rendered to files and read back as a backfill reads them).
   Target: the plan takes at most 1/10 of it. Where the time goes is printed.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from training.console import report_command

AGREEMENT = 0.03
COST_RATIO = 0.10
SAMPLE_SHARE, SAMPLE_MIN = 0.02, 500


def agreement(old: Any, new: Any, seed: int, sample_k: int, validation: Any,
              out: Path) -> dict[str, Any]:
    """The plan's route shares against bench upgrade's on one draw (``validation``: that
    draw's standard test set)."""
    import numpy as np

    from training.bench.upgrade import adapter_sample, gain_share, run_adapters
    from training.bench.xbt import cell, load_gallery, reference
    from training.upgrades.plan.decide import Constraints
    from training.upgrades.plan.run import run_plan

    gallery = load_gallery(seed)
    plan = run_plan(new, old, old.space, adapter_sample(old, sample_k, seed), validation,
                    len(validation), Constraints(), seed=seed)
    old_emb, cells, _ = reference(old, new, gallery)
    routed, _ = run_adapters(old, new, sample_k, seed, gallery, out)
    cells.update({name: cell(emb, old_emb, gallery) for name, (_, emb) in routed.items()})
    rows = []
    for o in plan["options"]:
        if o["kind"] != "route" or not o["measured"]:
            continue
        name = o["name"].removeprefix("route:")
        bench = {d: gain_share(cells, f"{name} new->old", d) for d in ("t2i", "i2t")}
        mine = {d: o["share"][d]["share"] for d in ("t2i", "i2t")}
        rows.append({"option": o["name"], "against": f"bench upgrade '{name}'",
                     "plan": mine, "bench": bench, "plan_se": {d: o["share"][d]["se"]
                                                               for d in ("t2i", "i2t")},
                     "difference": {d: abs(mine[d] - bench[d]) for d in mine}})
    worst = max(max(r["difference"].values()) for r in rows)
    return {"seed": seed, "sample": sample_k, "validation_items": len(validation),
            "rows": rows, "worst_difference": float(np.round(worst, 4)),
            "met": bool(worst <= AGREEMENT),
            "plan_transform_alone": next(
                {d: o["side_curve"][0][d]["share"] for d in ("t2i", "i2t")}
                for o in plan["options"] if o["name"] == "migrate:transform+random"),
            "recommendation": plan["recommendation"]}


def frontier_agreement(old: Any, new: Any, seed: int, args: argparse.Namespace,
                       out: Path) -> dict[str, Any]:
    """The plan's migrations against ``bench frontier``'s ways on one of its draws (same
    seed, same gallery, same K-item sample): ``bench frontier``'s code measures the draw,
    and the plan's code (``fit_routes``, ``transform_migrations``, ``Scorer``) measures the
    same embedded draw as its items and queries, the sample re-embedded first (it is part of
    this gallery), its route the procrustes+slerp one (frontier's), at frontier's fractions,
    both with errors over the test items (each with its captions and image).
    Compared: the route alone, today's migration, and each order's side as it stands (the
    progressive migration's switch is reported: frontier chooses it on a separate
    validation draw, the plan on the set it measures)."""
    from training.bench import frontier as fr
    from training.upgrades.plan.measure import Embedded, Scorer, fit_routes
    from training.upgrades.plan.run import transform_migrations

    fargs = argparse.Namespace(gallery=args.frontier_gallery, test=args.frontier_test,
                               sample=args.frontier_sample, validation=args.frontier_validation,
                               method="residual-mlp", ensemble=1)
    draw = fr.drawn(old, new, fargs, seed)
    items, e, _ = draw
    measured = fr.measure_draw(old, new, fargs, seed, out, draw)
    rows = fr.strategy_rows(measured)
    _, queries = fr.simulated(e, {}, {}, fargs.test)  # its queries and relevance
    kinds = ("image", "text")
    emb = Embedded(item_old={k: e.vectors[f"old_{k}"] for k in kinds},
                   item_new={k: e.vectors[f"new_{k}"] for k in kinds},
                   query_old=queries.old, query_new=queries.new, relevant=queries.relevant,
                   units=e.units(fargs.test))
    idx = fr.sample_rows(len(items), fargs.sample, seed)
    s_old = {k: emb.item_old[k][idx] for k in kinds}
    s_new = {k: emb.item_new[k][idx] for k in kinds}
    route = next(r for r in fit_routes(s_old, s_new, seed) if r.name == "route:procrustes+slerp")
    routed = route.queries(emb)
    scorer = Scorer(emb.hits(emb.query_old, emb.item_old), emb.hits(emb.query_new, emb.item_new),
                    seed=seed, units=emb.units)
    fractions = measured["fractions"]
    side = transform_migrations(emb, s_old, s_new, {k: [i.id for i in items] for k in kinds},
                                routed, seed, None, first=idx, grid=fractions)
    migs = side.migrations
    pairs = [("route:procrustes+slerp", "today", 0.0, emb.hits(routed, emb.item_old))]
    pairs += [("migrate", "today", f, migs["migrate"][0][f]) for f in fractions]
    for order in ("learned", "random"):
        pairs += [(f"migrate:transform+{order} (side)", f"transform+{order}", f,
                   migs[f"migrate:transform+{order}"][2][f]) for f in fractions]
    compared = []
    for option, way, f, hits in pairs:
        theirs = next(p for p in rows[way] if p["fraction"] == f)
        mine = scorer.shares(hits)
        compared.append({
            "option": option, "against": f"bench frontier '{way}'", "fraction": f,
            "plan": {d: mine[d]["share"] for d in ("t2i", "i2t")},
            "plan_se": {d: mine[d]["se"] for d in ("t2i", "i2t")},
            "bench": {d: theirs[d]["share"] for d in ("t2i", "i2t")},
            "difference": {d: _gap(mine[d]["share"], theirs[d]["share"])
                           for d in ("t2i", "i2t")}})
    worst = max(max(r["difference"].values()) for r in compared)
    return {"seed": seed, "gallery": len(items), "test_items": fargs.test,
            "sample": fargs.sample, "fractions": fractions, "rows": compared,
            "switch": {"plan": migs["migrate:transform+learned"][1],
                       "bench": measured["switch_fraction"]},
            "worst_difference": round(float(worst), 4), "met": bool(worst <= AGREEMENT)}


def _gap(a: float | None, b: float | None) -> float:
    """|a - b|; a share is None where NEW gains nothing in that direction (both: no gap;
    one: they disagree)."""
    if a is None or b is None:
        return 0.0 if a is b else float("inf")
    return abs(a - b)


def backfill_rate(new: Any, probe: int, work: Path) -> float:
    """NEW's items/s re-embedding items read from files (image decoded from disk + its
    caption), batches of 64: how a backfill reads and embeds."""
    from PIL import Image

    from training.data import PairDataset, generate_items
    from training.versions import load_encoder

    data = PairDataset.from_synth(generate_items(probe, seed=77, languages=("en",),
                                                 id_prefix="probe-"))
    work.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(len(data)):
        path = work / f"{i}.png"
        data.load_image(i).save(path)
        paths.append(path)
    captions = [r.captions["en"][0] for r in data.records]
    enc = load_encoder(new)
    enc.encode_images([Image.open(paths[0]).convert("RGB")])  # warm-up
    start = time.perf_counter()
    for s in range(0, len(paths), 64):
        images = [Image.open(p).convert("RGB") for p in paths[s:s + 64]]
        enc.encode_images(images)
        enc.encode_texts(captions[s:s + 64])
    return len(paths) / (time.perf_counter() - start)


def cost(old: Any, new: Any, seed: int, gallery_items: int, rate: float,
         validation: Any) -> dict[str, Any]:
    """A plan for a ``gallery_items`` gallery with the plan job's default sample, timed,
    against NEW re-embedding the gallery at its measured ``rate`` (items/s)."""
    from training.bench.upgrade import adapter_sample
    from training.upgrades.plan.decide import Constraints
    from training.upgrades.plan.run import run_plan

    k = min(gallery_items, max(SAMPLE_MIN, round(SAMPLE_SHARE * gallery_items)))
    sample = adapter_sample(old, k, seed)
    start = time.perf_counter()
    plan = run_plan(new, old, old.space, sample, validation, gallery_items, Constraints(),
                    seed=seed)
    seconds = time.perf_counter() - start
    reembed = gallery_items / rate
    return {"gallery": gallery_items, "sample": k, "validation_items": len(validation),
            "plan_seconds": round(seconds, 2), "parts": plan["seconds"],
            "new_items_per_s": round(rate, 1), "reembed_seconds": round(reembed, 2),
            "ratio": round(seconds / reembed, 3), "met": seconds <= COST_RATIO * reembed,
            "recommendation": plan["recommendation"], "plan": plan}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from training.bench.base_models import BaseBench, test_set
    from training.bench.xbt import open_base

    out = Path(args.out) / f"seed-{args.seed}"
    old, new = open_base(Path(args.base), out)
    validation = test_set(BaseBench(), draw=args.seed)
    rate = backfill_rate(new, args.probe, out / "probe")
    result = {"seed": args.seed,
              "agreement": agreement(old, new, args.seed, args.sample, validation, out),
              "frontier": frontier_agreement(old, new, args.seed, args, out),
              "cost": [cost(old, new, args.seed, n, rate, validation) for n in args.gallery]}
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench-plan.json").write_text(json.dumps(result, indent=2, default=str))
    return result


def _s(v: float | None) -> str:
    return "  n/a" if v is None else f"{v:+.3f}"


def render(result: dict[str, Any]) -> str:
    a, c = result["agreement"], result["cost"]
    lines = [(f"seed {result['seed']}: agreement on the standard test set "
             f"({a['validation_items']} items), sample {a['sample']}"),
             f"{'option':26} {'against':48} {'plan t2i/i2t':17} {'bench t2i/i2t':17} |diff|"]
    for r in a["rows"]:
        p, b = r["plan"], r["bench"]
        lines.append(f"{r['option']:26} {r['against'][:48]:48} {_s(p['t2i'])}/{_s(p['i2t'])}  "
                     f"{_s(b['t2i'])}/{_s(b['i2t'])}  {max(r['difference'].values()):.4f}")
    t = a["plan_transform_alone"]
    lines += [(f"plan: transform alone {_s(t['t2i'])}/{_s(t['i2t'])}; recommended: "
              f"{a['recommendation']['option']}"),
              (f"target: every share within {AGREEMENT}: "
              f"{'met' if a['met'] else 'MISSED'} (worst {a['worst_difference']:.4f})"),
              ""]
    f = result["frontier"]
    lines += [(f"seed {result['seed']}: agreement with bench frontier's draw ({f['gallery']:,} "
               f"items, {f['test_items']:,} test items, sample {f['sample']})"),
              (f"{'option':36} {'against':30} {'backfill':>8} {'plan t2i/i2t':17} "
               f"{'bench t2i/i2t':17} |diff|")]
    for r in f["rows"]:
        p, b = r["plan"], r["bench"]
        lines.append(f"{r['option']:36} {r['against']:30} {r['fraction']:8.1%} "
                     f"{_s(p['t2i'])}/{_s(p['i2t'])}  {_s(b['t2i'])}/{_s(b['i2t'])}  "
                     f"{max(r['difference'].values()):.4f}")
    lines += [(f"progressive switch: plan at {f['switch']['plan']} (on the set it measures), "
               f"bench frontier at {f['switch']['bench']} (on its validation draw)"),
              (f"target: every share within {AGREEMENT}: "
               f"{'met' if f['met'] else 'MISSED'} (worst {f['worst_difference']:.4f})"), ""]
    for c in result["cost"]:
        lines += [(f"cost: a plan for a {c['gallery']:,}-item gallery (sample {c['sample']}, "
                   f"validation {c['validation_items']} items): {c['plan_seconds']:.1f} s; "
                   f"NEW re-embeds at {c['new_items_per_s']:.0f} items/s: "
                   f"{c['reembed_seconds']:.1f} s"),
                  "  parts (s): " + ", ".join(f"{k} {v}" for k, v in c["parts"].items()),
                  (f"  target: plan <= {COST_RATIO:g} x re-embedding: "
                   f"{'met' if c['met'] else 'MISSED'} (ratio {c['ratio']:.3f}); recommended: "
                   f"{c['recommendation']['option']}")]
    return "\n".join(lines)


def register(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="the plan against bench upgrade / bench frontier on the "
                                  "same draw, and what a plan costs against re-embedding")
    p.add_argument("--base", default="runs/bench-base", help="holds old/ and new/ artifacts")
    p.add_argument("--out", default="runs/bench-plan")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sample", type=int, default=10_000, help="agreement: the adapters' "
                   "sample (bench upgrade's default)")
    p.add_argument("--frontier-gallery", type=int, default=50_000, help="frontier agreement: "
                   "items in bench frontier's draw (its default)")
    p.add_argument("--frontier-test", type=int, default=5_000, help="frontier agreement: its "
                   "test items")
    p.add_argument("--frontier-sample", type=int, default=900, help="frontier agreement: its "
                   "sample (K)")
    p.add_argument("--frontier-validation", type=int, default=1_000, help="frontier agreement: "
                   "its validation draw (where it chooses the progressive switch)")
    p.add_argument("--gallery", type=int, nargs="+", default=[20_000, 200_000],
                   help="cost: the galleries' sizes (items) to plan for")
    p.add_argument("--probe", type=int, default=2_000, help="cost: items NEW re-embeds to "
                   "measure its rate")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=report_command(run, render))
