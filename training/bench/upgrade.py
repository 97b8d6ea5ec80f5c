"""``nobackfill bench upgrade``: which upgrade method to use, on the standard OLD/NEW models.

One table on ``bench base``'s models (``--base DIR`` holds ``old/`` and ``new/``): old->old,
new->new (the full backfill) and new->old for every method: the adapter routes fitted on
a K-item sample (procrustes, affine, residual-mlp; one map per modality and one shared
map; each also SLERP-mixed with OLD's own query), XBT (no anchor, corpus anchor, both
anchors; and XBT and XBT+pairs with phi starting from the Procrustes fit of stage 1's
text pairs; each XBT row also SLERP-mixed with OLD's own query; every XBT stage 2 selected
on a validation draw, ``select_every``), its text-only stage 1, and Direct (at XBT's total
optimizer steps, and "short": at stage 2's). Per row: R@1/5/10 both directions, the
share of the re-embedding gain recovered at R@1, the negative-flip rate against old->old
(BCT: queries the old system answered right and the new one gets wrong), fit or train
seconds, whether it needs a GPU-class budget (training through the towers), and the
query latency it adds over NEW's own forward.

``--seed`` changes the test set, the adapters' sample, XBT's pairs and every training
seed, so the table can be checked on other draws.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from training.bench.xbt import (
    BENCH_CORPUS,
    BENCH_PAIRS,
    PAPER_ROW,
    Gallery,
    XbtBench,
    cell,
    default_config,
    load_gallery,
    open_base,
    recalls,
    reference,
    run_upgrades,
    share_text,
)
from training.console import report_command

MARGIN = 0.01  # the compatibility gate: new->old R@1 >= old->old + MARGIN, both directions
SAMPLE = 10_000  # adapter sample (gallery items whose OLD vectors are stored)
SAMPLE_SEED = 30_000
SLERP_T = 0.5  # weight of OLD's own query in the SLERP rows
ADAPTER_ROWS = (("procrustes", {}), ("affine", {}), ("residual-mlp", {}),
                ("procrustes shared", {"per_modality": False}),
                ("affine shared", {"per_modality": False}))
SLERP_ROWS = ("procrustes", "affine", "residual-mlp")
XBT_INITS = ("procrustes",)  # XBT again with phi starting from the Procrustes fit
LATENCY_QUERIES = 40
FIT_LIMIT_S = 60.0


# ---------------------------------------------------------------------------- adapters
def adapter_sample(old: Any, k: int, draw: int) -> Any:
    """K fresh items with OLD's vectors, as the gallery stores them (images and captions)."""
    from training.data import PairDataset, generate_items
    from training.upgrades.adapter.fit import sample_from_dataset

    items = generate_items(k, seed=SAMPLE_SEED + 101 * draw, languages=("en",),
                           id_prefix="sample-")
    return sample_from_dataset(old, PairDataset.from_synth(items), k, seed=draw)


def run_adapters(old: Any, new: Any, k: int, draw: int, gallery: Gallery,
                 out: Path) -> tuple[dict[str, tuple], dict[str, float]]:
    """Every adapter row: (artifact, test-set embeddings) and fit seconds per row."""
    from training.bench.xbt import artifact_embeddings
    from training.upgrades.adapter import AdapterFitConfig
    from training.upgrades.adapter.fit import fit_adapter

    sample = adapter_sample(old, k, draw)
    rows: dict[str, tuple] = {}
    seconds: dict[str, float] = {}
    settings = [(name, {"method": name.split()[0], **extra}) for name, extra in ADAPTER_ROWS]
    settings += [(f"{name}+slerp", {"method": name, "slerp_t": SLERP_T}) for name in SLERP_ROWS]
    for name, values in settings:
        cfg = AdapterFitConfig.from_dict({**values, "seed": draw})
        art = fit_adapter(new, sample, cfg, old.space, out / name.replace(" ", "-"), old=old,
                          version_id=name.replace(" ", "-").replace("+", "-"))
        seconds[name] = float(art.manifest["metrics"]["fit_seconds"])
        seconds[f"{name} (embed sample)"] = float(art.manifest["metrics"]["embed_seconds"])
        rows[f"{name} new->old"] = (art, artifact_embeddings(art, old.space, gallery))
    return rows, seconds


# ---------------------------------------------------------------------------- measures
def flips(query: tuple, old_emb: tuple, gallery: Gallery) -> dict[str, dict[str, float]]:
    """Negative and positive flip rates against old->old, per direction."""
    from training.evaluate import cross_top1_hits, negative_flip_rate, positive_flip_rate

    before = cross_top1_hits(old_emb[1], old_emb[0], old_emb[0], old_emb[1], gallery.relevance)
    after = cross_top1_hits(query[1], query[0], old_emb[0], old_emb[1], gallery.relevance)
    return {d: {"negative": negative_flip_rate(before[d], after[d]),
                "positive": positive_flip_rate(before[d], after[d])} for d in ("t2i", "i2t")}


def query_ms(encoder: Any, gallery: Gallery, n: int = LATENCY_QUERIES) -> dict[str, float]:
    """Median ms of one text and one image query (batch of 1), after a warm-up."""
    from training.upgrades.plan.run import query_ms as median_query_ms

    return median_query_ms(encoder, gallery.texts, gallery.images, n)


def added_latency(art: Any, space: str, native_ms: dict[str, float],
                  gallery: Gallery) -> dict[str, float]:
    from training.versions import load_encoder

    routed = query_ms(load_encoder(art, space), gallery)
    return {kind: routed[kind] - native_ms[kind] for kind in routed}


# ---------------------------------------------------------------------------- the table
def r1(c: dict[str, Any], direction: str) -> float:
    return float(c[direction]["R@1"])


def gain_share(cells: dict[str, Any], name: str, direction: str) -> float | None:
    """(new->old - old->old) / (new->new - old->old) at R@1; None when NEW is no better."""
    old, new = r1(cells["old->old"], direction), r1(cells["new->new"], direction)
    return None if new <= old else (r1(cells[name], direction) - old) / (new - old)


def passes_gate(cells: dict[str, Any], name: str) -> bool:
    return all(r1(cells[name], d) >= r1(cells["old->old"], d) + MARGIN for d in ("t2i", "i2t"))


def targets(result: dict[str, Any]) -> dict[str, bool]:
    cells, rows = result["cells"], result["rows"]
    adapters = [n for n, r in rows.items() if r["family"] == "adapter"]
    xbts = [n for n in rows if n.startswith("xbt")]
    out: dict[str, bool] = {}
    for d in ("t2i", "i2t") if xbts else ():
        best_adapter = max(r1(cells[n], d) for n in adapters)
        out[f"best xbt beats best adapter {d} R@1"] = max(r1(cells[n], d) for n in xbts) \
            > best_adapter
    out[f"adapter fit on {result['sample']} items < {FIT_LIMIT_S:.0f} s"] = all(
        rows[n]["seconds"] < FIT_LIMIT_S for n in adapters)
    for name in rows:
        out[f"{name}: gate (>= old->old + {MARGIN}, both directions)"] = passes_gate(cells, name)
    return out


def describe_rows(cells: dict[str, Any], routed: dict[str, tuple], seconds: dict[str, float],
                  latency: dict[str, dict[str, float]], old_emb: tuple,
                  gallery: Gallery) -> dict[str, Any]:
    rows = {}
    for name, (art, emb) in routed.items():
        family = art.manifest.get("kind", "xbt")
        short = name.removesuffix(" new->old")
        rows[name] = {
            "family": family,
            "gain_share": {d: gain_share(cells, name, d) for d in ("t2i", "i2t")},
            "flips": flips(emb, old_emb, gallery),
            "seconds": _seconds(short, seconds),
            "gpu_class_budget": family != "adapter",
            "added_query_ms": latency[name]}
    return rows


XBT_TIMINGS = {"xbt": "stage2", "xbt+anchor": "stage2_anchor", "xbt+pairs": "stage2_pairs",
               PAPER_ROW: "stage2_paper"}


def _seconds(short: str, seconds: dict[str, float]) -> float:
    """A row's own cost: an adapter's fit; Direct's training; an XBT row's stage 1 (shared
    by the rows of the same start) + its stage 2 (a "+slerp" row is the same training)."""
    if short in seconds:
        return seconds[short]
    short = short.replace("+slerp", "")
    if short in XBT_TIMINGS:  # a row of the first stage 1, whatever its name
        return seconds["stage1"] + seconds[XBT_TIMINGS[short]]
    base, _, init = short.partition(" (")  # "xbt+pairs (procrustes init)"
    suffix = f" ({init}" if init else ""
    return seconds["stage1" + suffix] + seconds[XBT_TIMINGS[base] + suffix]


def run(args: argparse.Namespace) -> dict[str, Any]:
    from training.versions import load_encoder

    out = Path(args.out) / f"seed-{args.seed}"
    old, new = open_base(Path(args.base), out)
    gallery = load_gallery(args.seed)
    old_emb, cells, _ = reference(old, new, gallery)
    routed, seconds = run_adapters(old, new, args.sample, args.seed, gallery, out)
    if not args.skip_xbt:
        bench = XbtBench(pairs=args.pairs, corpus=args.corpus,
                         config=replace(default_config(), seed=args.seed))
        xbt_cells, xbt_seconds, xbt_routed = run_upgrades(old, new, bench, old_emb, gallery,
                                                          out, args.seed, XBT_INITS, SLERP_T)
        cells["phi text-only new->old"] = xbt_cells["phi text-only new->old"]
        routed.update(xbt_routed)
        seconds.update(xbt_seconds)
    cells.update({name: cell(emb, old_emb, gallery) for name, (_, emb) in routed.items()})
    native_ms = query_ms(load_encoder(new), gallery)
    latency = {name: added_latency(art, old.space, native_ms, gallery)
               for name, (art, _) in routed.items()}
    result = {"seed": args.seed, "sample": args.sample, "slerp_t": SLERP_T, "cells": cells,
              "rows": describe_rows(cells, routed, seconds, latency, old_emb, gallery),
              "native_query_ms": native_ms, "seconds": seconds}
    result["targets"] = targets(result)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench-upgrade.json").write_text(json.dumps(result, indent=2, default=str))
    return result


def render(result: dict[str, Any]) -> str:
    native = result["native_query_ms"]
    lines = [(f"seed {result['seed']}; adapters fitted on {result['sample']} items; SLERP t = "
              f"{result['slerp_t']}; NEW's own query: text {native['text']:.1f} ms, image "
              f"{native['image']:.1f} ms"),
             (f"{'query->gallery':28} {'t2i R@1/5/10':19} {'i2t R@1/5/10':19} gain t2i/i2t "
              f"neg.flip t2i/i2t  fit/train s  GPU  +ms text/image")]
    for name, c in result["cells"].items():
        row = result["rows"].get(name)
        line = f"{name:28} {recalls(c, 't2i'):19} {recalls(c, 'i2t'):19}"
        if row:
            g, f, lat = row["gain_share"], row["flips"], row["added_query_ms"]
            line += (f" {share_text(g['t2i'])}/{share_text(g['i2t'])}  {f['t2i']['negative']:.3f}/"
                     f"{f['i2t']['negative']:.3f}   {row['seconds']:9.1f}  "
                     f"{'yes' if row['gpu_class_budget'] else 'no ':3}  "
                     f"{lat['text']:+.2f}/{lat['image']:+.2f}")
        lines.append(line)
    lines += [f"target {k}: {'met' if v else 'MISSED'}" for k, v in result["targets"].items()]
    return "\n".join(lines)


def register(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="every upgrade method on bench base's models: recall, gain "
                                  "recovered, negative flips, cost, added latency")
    p.add_argument("--base", default="runs/bench-base", help="holds old/ and new/ artifacts")
    p.add_argument("--out", default="runs/bench-upgrade", help="keeps the fitted versions "
                                                              "(under seed-N/)")
    p.add_argument("--seed", type=int, default=0,
                   help="draw: test set, adapter sample, XBT pairs and training seeds")
    p.add_argument("--sample", type=int, default=SAMPLE, help="adapter sample size (items)")
    p.add_argument("--pairs", type=int, default=BENCH_PAIRS, help="XBT/Direct image-caption "
                                                                  "pairs")
    p.add_argument("--corpus", type=int, default=BENCH_CORPUS, help="XBT stage 1 captions")
    p.add_argument("--skip-xbt", action="store_true", help="adapters only (minutes, not tens)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=report_command(run, render))
