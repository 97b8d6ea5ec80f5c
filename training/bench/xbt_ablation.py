"""``nobackfill bench xbt-ablation``: what in XBT's stage 2 undoes stage 1 (issue 24).

One stage 1 (as ``bench xbt``: the same corpus, pairs and validation draw of ``--seed``),
then stage 2 again from that phi on fresh adapters for each variant, each one change
away from the bench's stage 2: the learning rates, which parts train (text LoRA, vision
LoRA, soft prompts, tower LayerNorms, phi's LayerNorms), LoRA dropout, the anchoring
terms, steps, batch size and the number of pairs. No selection: each row is the route
stage 2 ends with, as the paper ships it.

Per variant: the share of the re-embedding gain recovered at R@1 on bench base's test set
(text->image / image->text; 0 = old->old, 1 = new->new), and its drift on the validation
draw, every ``--every`` steps: the mean cosine of the routed text embedding with the old
model's embedding of the same caption (``cos w``), of the routed image embedding with the
old model's embedding of the same image (``cos v``), and validation R@1 both ways. The
row "adapters attached, untrained" is step 0 with fresh adapters: what inserting the
prompts alone changes. There is no augmentation in stage 2 (pairs are preprocessed once),
so there is no augmentation row.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from training.bench.xbt import (
    BENCH_CORPUS,
    BENCH_PAIRS,
    BENCH_VALIDATION,
    cell,
    default_config,
    embed,
    gap_closure,
    load_gallery,
    open_base,
    paired_set,
    reference,
    validation_set,
)
from training.console import report_command
from training.upgrades.xbt.config import PAPER_PROMPTS

TEXT_LORA = r"transformer\.resblocks\.\d+\.(attn|mlp\.c_fc|mlp\.c_proj)"
VISION_LORA = r"visual\.transformer\.resblocks\.\d+\.(attn|mlp\.c_fc|mlp\.c_proj)"
# name -> (XbtConfig overrides, train phi's LayerNorms, paired-set size or None)
VARIANTS: dict[str, tuple[dict[str, Any], bool, int | None]] = {
    "bench stage 2 (lr 3e-4, 10 prompts)": ({}, True, None),
    "paper lr 1e-4": ({"lr": 1e-4}, True, None),
    "no soft prompts": ({"prompts": 0}, True, None),
    "prompt lr 1e-3 (10x lr, not 100x)": ({"prompt_lr": 1e-3}, True, None),
    "text LoRA only (no vision LoRA)": ({"lora_targets": TEXT_LORA}, True, None),
    "vision LoRA only (no text LoRA)": ({"lora_targets": VISION_LORA}, True, None),
    "no tower LayerNorms": ({"layer_norms": False}, True, None),
    "phi's LayerNorms frozen": ({}, False, None),
    "LoRA dropout 0": ({"lora_dropout": 0.0}, True, None),
    "+ corpus anchor": ({"anchor": True}, True, None),
    "+ pair anchor": ({"pair_anchor": True}, True, None),
    "+ pair anchor x10": ({"pair_anchor": True, "pair_anchor_weight": 10.0}, True, None),
    "300 steps": ({"steps": 300}, True, None),
    "batch 128": ({"batch_size": 128}, True, None),
    "10,000 pairs": ({}, True, 10_000),
    "no prompts, text LoRA only": ({"prompts": 0, "lora_targets": TEXT_LORA}, True, None),
    "no prompts, paper lr 1e-4": ({"prompts": 0, "lr": 1e-4}, True, None),
    "no prompts + pair anchor": ({"prompts": 0, "pair_anchor": True}, True, None),
    "no prompts + pair anchor x10": ({"prompts": 0, "pair_anchor": True,
                                      "pair_anchor_weight": 10.0}, True, None),
}


class Probe:
    """The route's drift on the validation draw (old embeddings cached in stage 1)."""

    def __init__(self, validation: Any) -> None:
        self.validation = validation

    def __call__(self, model: Any, phi: Any) -> dict[str, float]:
        import numpy as np

        from training.evaluate import cross_metrics
        from training.upgrades.xbt.selection import route_embeddings

        v = self.validation
        images, texts = route_embeddings(model, phi, v)  # [N, D_old], [M, D_old]
        old_images, old_texts = v.old_images.numpy(), v.old_texts.numpy()
        cells = cross_metrics(texts, images, old_images, old_texts, v.relevance, ks=(1,),
                              map_k=1)
        return {"cos_w": float(np.mean(np.sum(texts * old_texts, axis=1))),
                "cos_v": float(np.mean(np.sum(images * old_images, axis=1))),
                "t2i": float(cells["t2i"]["R@1"]), "i2t": float(cells["i2t"]["R@1"])}


def stage2_run(p: Any, phi: Any, cfg: Any, anchors: Any, train_phi_norms: bool, every: int,
               probe: Probe) -> tuple[Any, list[dict[str, Any]], float]:
    """Stage 2 as ``train_stage2`` runs it, with the drift probed every ``every`` steps;
    (the trained phi, the curve, seconds)."""
    from training.pairs import pair_index_batches
    from training.trainer import train
    from training.upgrades.xbt.stage2 import XbtTask, stage2_groups

    model = p.adapters.model
    groups = stage2_groups(p.adapters, phi, cfg, train_phi="layer_norms")
    if not train_phi_norms:
        phi.requires_grad_(False)
        groups = [g for g in groups if not any(q is r for q in g["params"]
                                               for r in phi.parameters())]
    curve = [{"step": 0, **probe(model, phi)}]

    def at(step: int) -> None:
        model.eval()
        phi.eval()
        curve.append({"step": step, **probe(model, phi)})
        p.adapters.train_mode()
        phi.train()

    p.adapters.train_mode()
    phi.train()
    start = time.perf_counter()
    try:
        train(XbtTask(model, phi, p.pairs, cfg, anchors),
              pair_index_batches(p.pairs, cfg.batch_size, cfg.seed), groups,
              replace(cfg.stage2_config(), checkpoint_every=every), desc="ablation stage 2",
              show_progress=False, on_checkpoint=at)
    finally:
        model.eval()
        phi.eval()
    return phi, curve, time.perf_counter() - start


def run(args: argparse.Namespace) -> dict[str, Any]:
    from training.upgrades.prepare import prepare, with_fresh_adapters
    from training.upgrades.xbt.stage1 import cache_text, pretrain_fresh

    base, out = Path(args.base), Path(args.out)
    old, new = open_base(base, out)
    out.mkdir(parents=True)
    gallery = load_gallery()
    old_emb, cells, _ = reference(old, new, gallery)
    # The bench's stage 2 as issue 24 found it: the paper's soft prompts, no selection.
    cfg = replace(default_config(), seed=args.seed, select_every=0, prompts=PAPER_PROMPTS,
                  **({"pretrain_steps": args.pretrain_steps} if args.pretrain_steps else {}),
                  **({"steps": args.steps} if args.steps else {}))
    anchored = replace(cfg, anchor=True, pair_anchor=True, select_every=args.every)
    names = [n for n in VARIANTS if not args.only or any(o in n for o in args.only)]

    def shares(c: dict[str, Any]) -> dict[str, float | None]:
        table = {**cells, "row": c}
        return {d: gap_closure(table, "row", d) for d in ("t2i", "i2t")}

    def route_cell(p: Any, phi: Any, adapters_on: bool) -> dict[str, Any]:
        from training.encoders import Encoder
        from training.upgrades.xbt.projector import ProjectorHead

        head = ProjectorHead(phi)
        p.adapters.set_enabled(adapters_on)
        try:
            encoder = Encoder(p.model, p.encoder.tokenizer, p.device, text_head=head,
                              image_head=head)
            return cell(embed(encoder, gallery), old_emb, gallery)
        finally:
            p.adapters.set_enabled(True)

    result: dict[str, Any] = {"seed": args.seed, "every": args.every, "rows": {},
                              "reference": cells}
    prepared: dict[int, tuple] = {}

    def stage1_for(pairs: int) -> tuple:
        if pairs not in prepared:
            p = prepare(old, new, f"synth:{args.corpus}", paired_set(pairs, args.seed),
                        anchored, validation=validation_set(args.validation, args.seed))
            cache, anchors = cache_text(p, anchored, show_progress=False)
            # stage 1 reads the corpus only: another paired set starts from the same phi
            phi1 = (prepared[args.pairs][1] if args.pairs in prepared
                    else pretrain_fresh(p, cache, anchored, show_progress=False)[0])
            prepared[pairs] = (p, phi1, anchors)
        return prepared[pairs]

    p, phi1, anchors = stage1_for(args.pairs)
    probe = Probe(anchors.validation)
    stage1 = route_cell(p, phi1, adapters_on=False)
    result["rows"]["phi after stage 1 (adapters off)"] = {
        "cell": stage1, "share": shares(stage1), "curve": [{"step": 0, **_off(probe, p, phi1)}]}
    untouched = with_fresh_adapters(p, cfg)
    result["rows"]["adapters attached, untrained"] = {
        "cell": (c := route_cell(untouched, phi1, adapters_on=True)), "share": shares(c),
        "curve": [{"step": 0, **probe(untouched.adapters.model, phi1)}]}
    for name in names:
        overrides, norms, pairs = VARIANTS[name]
        variant = replace(cfg, **overrides)
        base_p, base_phi, base_anchors = stage1_for(pairs or args.pairs)
        fresh = with_fresh_adapters(base_p, variant)
        phi, curve, seconds = stage2_run(fresh, copy.deepcopy(base_phi), variant,
                                         base_anchors.for_config(variant), norms, args.every,
                                         Probe(base_anchors.validation))
        c = route_cell(fresh, phi, adapters_on=True)
        result["rows"][name] = {"cell": c, "share": shares(c), "curve": curve,
                                "seconds": round(seconds, 1), "overrides": overrides,
                                "train_phi_layer_norms": norms, "pairs": pairs or args.pairs}
        print(f"{name}: {render_row(name, result['rows'][name])}", flush=True)
    (out / "bench-xbt-ablation.json").write_text(json.dumps(result, indent=2, default=str))
    return result


def _off(probe: Probe, p: Any, phi: Any) -> dict[str, float]:
    with p.adapters.disabled():
        return probe(p.adapters.model, phi)


def _share(value: float | None) -> str:
    return "  n/a" if value is None else f"{value:5.2f}"


def render_row(name: str, row: dict[str, Any]) -> str:
    s, curve = row["share"], row["curve"]
    first, last = curve[0], curve[-1]
    drift = (f"cos w {first['cos_w']:.3f}->{last['cos_w']:.3f}, cos v {first['cos_v']:.3f}->"
             f"{last['cos_v']:.3f}, val R@1 {first['t2i']:.3f}/{first['i2t']:.3f}->"
             f"{last['t2i']:.3f}/{last['i2t']:.3f}")
    return f"share t2i/i2t {_share(s['t2i'])}/{_share(s['i2t'])} | {drift}"


def render(result: dict[str, Any]) -> str:
    lines = [(f"bench xbt-ablation, seed {result['seed']} (test-set share of the re-embedding "
              f"gain at R@1; drift on the validation draw, first -> last checkpoint)"), "",
             "| stage 2 variant | share t2i | share i2t | cos w | cos v | val R@1 t2i/i2t | s |",
             "|---|---|---|---|---|---|---|"]
    for name, row in result["rows"].items():
        s, first, last = row["share"], row["curve"][0], row["curve"][-1]
        lines.append(f"| {name} | {_share(s['t2i'])} | {_share(s['i2t'])} | "
                     f"{first['cos_w']:.3f} -> {last['cos_w']:.3f} | "
                     f"{first['cos_v']:.3f} -> {last['cos_v']:.3f} | "
                     f"{first['t2i']:.3f}/{first['i2t']:.3f} -> {last['t2i']:.3f}/"
                     f"{last['i2t']:.3f} | {row.get('seconds', '')} |")
    return "\n".join(lines)


def register(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="ablation of XBT's stage 2 on bench base's models")
    p.add_argument("--base", default="runs/bench-base", help="holds old/ and new/ artifacts")
    p.add_argument("--out", default="runs/bench-xbt-ablation", help="results")
    p.add_argument("--pairs", type=int, default=BENCH_PAIRS, help="image-caption pairs")
    p.add_argument("--corpus", type=int, default=BENCH_CORPUS, help="stage 1 captions")
    p.add_argument("--validation", type=int, default=BENCH_VALIDATION,
                   help="images of the validation draw the drift is measured on")
    p.add_argument("--every", type=int, default=25, help="probe the drift every N steps")
    p.add_argument("--seed", type=int, default=0, help="draw of pairs/validation and seeds")
    p.add_argument("--pretrain-steps", type=int, help="stage 1 steps (default: bench xbt's)")
    p.add_argument("--steps", type=int, help="stage 2 steps (default: bench xbt's)")
    p.add_argument("--only", nargs="*", help="run the variants whose name contains one of these")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=report_command(run, render))
