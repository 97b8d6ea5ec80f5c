"""``nobackfill bench plan``: does the plan measure what the benchmarks measure, and what
does a plan cost?

On ``bench base``'s models and one seed:

1. **Agreement.** The plan (``training.upgrades.plan.run``, the code the ``plan`` job runs)
   on the standard test set as its validation set and ``bench upgrade``'s adapter sample
   (same items, same size, same seed), against ``bench upgrade``'s own adapter rows on the
   same draw (``run_adapters``: fitted, written as versions and scored through their
   served routes by the benchmark's code). Target: every share within 0.03. (``bench
   frontier`` measures another gallery: 50,000 items around its test set, its sample drawn
   from that gallery, image queries against one stored caption per item; its route is
   ``bench upgrade``'s procrustes+slerp row, and its transform is the plan's code.)
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
    p.add_argument("--gallery", type=int, nargs="+", default=[20_000, 200_000],
                   help="cost: the galleries' sizes (items) to plan for")
    p.add_argument("--probe", type=int, default=2_000, help="cost: items NEW re-embeds to "
                   "measure its rate")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=report_command(run, render))
