"""``nobackfill bench frontier``: how much of NEW's gain a migration brings, and when.

On ``bench base``'s models and a gallery of ``--gallery`` items (the first ``--test``
are a test draw whose first 1,000 are the standard test set; the rest are more items of
the world), every way of getting from the OLD gallery to NEW's space is measured at
fractions of the backfill (the share of items re-embedded by NEW): R@1 both directions
of the text queries of the test items against every item's image, and of the test
items' images against every item's caption (one per item, as a gallery stores), as a
share of the gain ``(x - old->old) / (new->new - old->old)`` with its bootstrap standard
error over the queries.

Ways (``training.upgrades.transform.simulate``):
- ``today``: routed until the switch at 100% (the query route is Procrustes fitted on the
  sample, SLERP-mixed with OLD's own query, t = 0.5)
- ``transform+<order>``: the K-item sample is embedded by NEW (its items are the first
  re-embedded), every other item's stored vectors are transformed (``--method``), and
  the backfill re-embeds in ``id``, ``random`` or ``learned`` order
- ``progressive``: the learned order's side served from the fraction where, on a
  separate validation draw simulated the same way, it beats the routed side in both
  directions at that fraction and every later one (routed before)
- ``hybrid+<order>``: each item scored by both sides, fused (the gateway's ``hybrid``
  search), under the learned and the random order

The compute of each point is a fraction of a full backfill (NEW embedding every item's
image and caption, timed here): the items re-embedded, plus the transform's fit and
application. Two seeds (``--seeds``) give two independent draws; the mean's error is
their errors combined. Writes ``frontier.json`` and ``frontier.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from training.console import report_command

TEST_SEED = 10_000  # bench base's: the first 1,000 test items are the standard test set
ITEM_SEED = 40_000
SAMPLE_SEED = 41_000
VALIDATION_SEED = 42_000
SLERP_T = 0.5
ORDERS = ("id", "random", "learned")
FRACTIONS = (0.0, 0.01, 0.05, 0.10, 0.25, 0.50, 1.0)
TARGETS = {"transform_t2i": 0.3, "transform_i2t": 0.5, "at_10": 0.5, "at_50": 0.8,
           "transform_compute": 0.02, "se": 0.05}


@dataclass
class Embedded:
    """One draw: per item, OLD's and NEW's image and caption vectors; per test query,
    OLD's and NEW's caption vectors; attributes for relevance; NEW's timing."""

    vectors: dict[str, np.ndarray]  # "old_image", "new_image", "old_text", "new_text" [N, D]
    queries: dict[str, np.ndarray]  # "old_text", "new_text" [Q, D]; images: the test rows
    item_attributes: list[dict[str, str]]
    query_attributes: list[dict[str, str]]
    caption_attributes: list[dict[str, str]]  # of each item's stored caption
    new_seconds: float  # NEW embedding every item (image + caption): a full backfill


def _items(seed: int, n: int, test: int, prefix: str = "") -> list[Any]:
    from training.bench.base_models import BaseBench
    from training.data import generate_items

    domains = BaseBench().domains
    items = generate_items(test, seed=TEST_SEED + 101 * seed, domains=domains,
                           languages=("en",), id_prefix=f"{prefix}test-")
    if n > test:
        items += generate_items(n - test, seed=ITEM_SEED + 101 * seed, domains=domains,
                                languages=("en",), id_prefix=f"{prefix}item-")
    return items


def embed_draw(old: Any, new: Any, items: list[Any], test: int, chunk: int = 2000) -> Embedded:
    """Render and embed every item with both models, a chunk at a time."""
    from training.data import PairDataset
    from training.versions import load_encoder

    enc = {"old": load_encoder(old), "new": load_encoder(new)}
    parts: dict[str, list[np.ndarray]] = {}
    new_seconds = 0.0
    for start in range(0, len(items), chunk):
        data = PairDataset.from_synth(items[start:start + chunk])
        images = [data.load_image(i) for i in range(len(data))]
        captions = [r.captions["en"][0] for r in data.records]
        for name, e in enc.items():
            t = time.perf_counter()
            parts.setdefault(f"{name}_image", []).append(e.encode_images(images))
            parts.setdefault(f"{name}_text", []).append(e.encode_texts(captions))
            if name == "new":
                new_seconds += time.perf_counter() - t
    vectors = {k: np.concatenate(v) for k, v in parts.items()}
    test_data = PairDataset.from_synth(items[:test])
    texts, _ = test_data.captions("en")
    mentions, _ = test_data.attribute_sets("en")
    queries = {f"{name}_text": e.encode_texts(texts) for name, e in enc.items()}
    return Embedded(vectors, queries, [dict(i.attributes) for i in items], mentions,
                    [dict(i.caption_attributes[0]) for i in items], new_seconds)


class LazyRelevance:
    """[Q, N] bool relevance computed a block of queries at a time (25,000 x 50,000 would
    be 1.25 GB at once)."""

    def __init__(self, mentions: list[dict[str, str]], images: list[dict[str, str]],
                 transpose: bool = False) -> None:
        self.mentions, self.images, self.transpose = mentions, images, transpose

    def __getitem__(self, rows: slice) -> np.ndarray:
        from training.data.dataset import attribute_relevance

        if self.transpose:  # image queries against captions: [Q images, N captions]
            return attribute_relevance(self.mentions, self.images[rows]).T
        return attribute_relevance(self.mentions[rows], self.images)


def routed_queries(sample_idx: np.ndarray, e: Embedded, test: int) -> dict[str, np.ndarray]:
    """NEW's queries carried into OLD's space: Procrustes fitted on the sample (NEW ->
    OLD), SLERP-mixed with OLD's own query (t = 0.5)."""
    import torch

    from training.upgrades.adapter.maps import procrustes, slerp

    out = {}
    for kind in ("text", "image"):
        w = procrustes(torch.from_numpy(e.vectors[f"new_{kind}"][sample_idx]),
                       torch.from_numpy(e.vectors[f"old_{kind}"][sample_idx]))
        q_new = e.queries["new_text"] if kind == "text" else e.vectors["new_image"][:test]
        q_old = e.queries["old_text"] if kind == "text" else e.vectors["old_image"][:test]
        mapped = torch.nn.functional.normalize(torch.from_numpy(q_new) @ w, dim=-1)
        out[kind] = slerp(mapped, torch.from_numpy(q_old), SLERP_T).numpy()
    return out


def simulated(e: Embedded, routed: dict[str, np.ndarray], transformed: dict[str, np.ndarray],
              test: int) -> tuple[Any, Any]:
    """The draw as ``simulate.curve`` reads it: every item (OLD, NEW, transformed) and the
    first ``test`` items' queries (captions against the images; images against the
    items' stored captions)."""
    from training.upgrades.transform.simulate import Items, Queries

    items = Items({k: e.vectors[f"old_{k}"] for k in ("image", "text")},
                  {k: e.vectors[f"new_{k}"] for k in ("image", "text")}, transformed)
    queries = Queries(
        new={"text": e.queries["new_text"], "image": e.vectors["new_image"][:test]},
        routed=routed,
        old={"text": e.queries["old_text"], "image": e.vectors["old_image"][:test]},
        relevant={"t2i": LazyRelevance(e.query_attributes, e.item_attributes),
                  "i2t": LazyRelevance(e.caption_attributes, e.item_attributes[:test],
                                       transpose=True)})
    return items, queries


def transform_orders(t: Any, e: Embedded, sample_idx: np.ndarray, transformed: dict,
                     seed: int, names: list[str]) -> tuple[dict[str, list[int]], np.ndarray]:
    """Each order over the items, the sample first (NEW embedded it to fit the map); the
    predicted error of every item (the learned order's key). The id order sorts the items
    by a hash of their names: a gallery's ids say nothing of which items are queried
    (sorting the names themselves would put the test items, ``test-...``, last)."""
    from training.upgrades.transform.order import order_items

    n = len(e.vectors["old_image"])
    scores = sum(t.predicted_error(k, e.vectors[f"old_{k}"], transformed[k]) for k in t.kinds)
    in_sample = np.zeros(n, bool)
    in_sample[sample_idx] = True
    rest = np.flatnonzero(~in_sample)
    ids = [hashlib.sha1(names[i].encode()).hexdigest() for i in rest]
    orders = {}
    for name in ORDERS:
        picked = order_items(name, ids, scores[rest], seed=seed)
        orders[name] = [int(i) for i in sample_idx] + [int(rest[p]) for p in picked]
    return orders, scores


def drawn(old: Any, new: Any, args: argparse.Namespace, seed: int,
          ) -> tuple[list[Any], Embedded, float]:
    """One draw's items, embedded by OLD and NEW, and the seconds that took."""
    start = time.perf_counter()
    items = _items(seed, args.gallery, args.test)
    return items, embed_draw(old, new, items, args.test), time.perf_counter() - start


def sample_rows(n: int, k: int, seed: int) -> np.ndarray:
    """The rows of the draw's K-item sample (sorted): the items NEW embeds to fit the
    transform and the route, re-embedded first."""
    return np.sort(np.random.default_rng(SAMPLE_SEED + seed).permutation(n)[:k])


def measure_draw(old: Any, new: Any, args: argparse.Namespace, seed: int,
                 out: Path, draw: tuple[list[Any], Embedded, float] | None = None,
                 ) -> dict[str, Any]:
    """Every way measured on one draw (``draw``: ``drawn``'s, when the caller has it)."""
    from training.upgrades.transform import TransformConfig, fit_transform
    from training.upgrades.transform.order import errors, spearman
    from training.upgrades.transform.simulate import curve

    items, e, embed_s = draw or drawn(old, new, args, seed)
    n = len(items)
    sample_idx = sample_rows(n, args.sample, seed)
    cfg = TransformConfig.from_dict({"method": args.method, "ensemble": args.ensemble,
                                     "seed": seed})
    t0 = time.perf_counter()
    t = fit_transform({k: e.vectors[f"old_{k}"][sample_idx] for k in ("image", "text")},
                      {k: e.vectors[f"new_{k}"][sample_idx] for k in ("image", "text")}, cfg)
    fit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    transformed = {k: t.apply(k, e.vectors[f"old_{k}"]) for k in ("image", "text")}
    apply_s = time.perf_counter() - t0
    orders, scores = transform_orders(t, e, sample_idx, transformed, seed,
                                      [it.id for it in items])
    true_err = sum(errors(transformed[k], e.vectors[f"new_{k}"]) for k in ("image", "text"))
    rest = np.setdiff1d(np.arange(n), sample_idx)
    routed = routed_queries(sample_idx, e, args.test)
    gallery, queries = simulated(e, routed, transformed, args.test)
    first = args.sample / n
    fractions = sorted({max(f, first) for f in FRACTIONS})
    t0 = time.perf_counter()
    hits = curve(gallery, queries, orders, fractions)
    curve_s = time.perf_counter() - t0
    switch = validation_switch(old, new, t, args, seed)
    return {"seed": seed, "gallery": n, "test_items": args.test, "sample": args.sample,
            "t2i_queries": len(e.queries["new_text"]), "i2t_queries": args.test,
            "transform": {"method": args.method, "ensemble": args.ensemble, **t.metrics},
            "order_spearman": round(spearman(scores[rest], true_err[rest]), 4),
            "seconds": {"embed_draw": round(embed_s, 1), "new_full_backfill": round(
                e.new_seconds, 2), "transform_fit": round(fit_s, 2), "transform_apply": round(
                apply_s, 3), "curve": round(curve_s, 1)},
            "fractions": fractions, "switch_fraction": switch, "hits": _packed(hits)}


def validation_switch(old: Any, new: Any, t: Any, args: argparse.Namespace,
                      seed: int) -> float | None:
    """Where a progressive migration would switch: the validation draw (its own items,
    captions as queries) transformed, ordered and re-embedded the same way."""
    from training.upgrades.transform.order import order_items
    from training.upgrades.transform.simulate import curve, switch_fraction

    items = _items(seed, args.validation, args.validation, prefix="val-")
    e = embed_draw(old, new, items, args.validation)
    transformed = {k: t.apply(k, e.vectors[f"old_{k}"]) for k in ("image", "text")}
    scores = sum(t.predicted_error(k, e.vectors[f"old_{k}"], transformed[k]) for k in t.kinds)
    order = order_items("learned", [f"{i:09d}" for i in range(len(items))], scores)
    sample_idx = np.random.default_rng(SAMPLE_SEED + seed).permutation(len(items))[
        :max(2, len(items) // 10)]
    gallery, queries = simulated(e, routed_queries(sample_idx, e, len(items)), transformed,
                                 len(items))
    grid = sorted({*FRACTIONS, *np.round(np.arange(0.0, 1.0001, 0.05), 2).tolist()})
    hits = curve(gallery, queries, {"learned": order}, grid, hybrid=False)
    return switch_fraction(hits, "learned", grid)


def _packed(hits: dict[str, dict[str, np.ndarray]]) -> dict[str, dict[str, str]]:
    """Hits as hex bit strings (the JSON keeps every query's outcome for re-analysis)."""
    return {k: {d: np.packbits(v).tobytes().hex() + f":{len(v)}" for d, v in per.items()}
            for k, per in hits.items()}


def _unpacked(packed: dict[str, dict[str, str]]) -> dict[str, dict[str, np.ndarray]]:
    out = {}
    for k, per in packed.items():
        out[k] = {}
        for d, text in per.items():
            hexed, count = text.split(":")
            out[k][d] = np.unpackbits(np.frombuffer(bytes.fromhex(hexed), np.uint8))[
                :int(count)].astype(bool)
    return out


def strategy_rows(draw: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per way: its points (fraction of the backfill, compute, share and error per
    direction)."""
    from training.upgrades.transform.simulate import share

    hits = _unpacked(draw["hits"])
    secs = draw["seconds"]
    extra = (secs["transform_fit"] + secs["transform_apply"]) / secs["new_full_backfill"]
    fractions = draw["fractions"]
    switch = draw["switch_fraction"]

    def point(f: float, key: str, compute: float) -> dict[str, Any]:
        return {"fraction": f, "compute": compute, **{d: share(hits, key, d) for d in ("t2i", "i2t")}}

    rows: dict[str, list[dict[str, Any]]] = {"today": []}
    for f in [0.0, *fractions]:
        rows["today"].append(point(f, "new->new" if f >= 1 else "routed", f))
    for name in ORDERS:
        rows[f"transform+{name}"] = [point(f, f"side {name} {f:g}", f + extra) for f in fractions]
    rows["progressive"] = [point(f, f"side learned {f:g}" if switch is not None and f >= switch
                                 else "routed", f + extra) for f in fractions]
    for name in ("learned", "random"):
        rows[f"hybrid+{name}"] = [point(f, f"hybrid {name} {f:g}", f + extra) for f in fractions]
    return rows


def combined(draws: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The mean over draws of each point's share; its error: the draws' errors combined."""
    per = [strategy_rows(d) for d in draws]
    out: dict[str, list[dict[str, Any]]] = {}
    for name, points in per[0].items():
        out[name] = []
        for i, p in enumerate(points):
            q = {"fraction": p["fraction"],
                 "compute": float(np.mean([r[name][i]["compute"] for r in per]))}
            for d in ("t2i", "i2t"):
                values = [r[name][i][d] for r in per]
                if any(v["share"] is None for v in values):
                    q[d] = {"share": None, "se": None}
                    continue
                q[d] = {"share": float(np.mean([v["share"] for v in values])),
                        "se": float(np.sqrt(sum(v["se"] ** 2 for v in values)) / len(values))}
            out[name].append(q)
    return out


def check_targets(rows: dict[str, list[dict[str, Any]]], draws: list[dict]) -> dict[str, bool]:
    def at(name: str, f: float) -> dict[str, Any]:
        return min(rows[name], key=lambda p: abs(p["fraction"] - f))

    first = rows["transform+learned"][0]
    best = max((f"transform+{o}" for o in ORDERS), key=lambda n: min(
        at(n, 0.10)["t2i"]["share"], at(n, 0.10)["i2t"]["share"]))
    out = {
        f"transform alone: compute {first['compute']:.4f} <= 0.02":
            first["compute"] <= TARGETS["transform_compute"],
        "transform alone: t2i share >= 0.3": first["t2i"]["share"] >= TARGETS["transform_t2i"],
        "transform alone: i2t share >= 0.5": first["i2t"]["share"] >= TARGETS["transform_i2t"]}
    for f, goal in ((0.10, TARGETS["at_10"]), (0.50, TARGETS["at_50"])):
        p = at(best, f)
        out[f"{best} at {f:.0%}: both shares >= {goal}"] = min(
            p["t2i"]["share"], p["i2t"]["share"]) >= goal
    p = at(best, 1.0)
    out[f"{best} at 100%: share 1.0"] = abs(p["t2i"]["share"] - 1) < 1e-9 and abs(
        p["i2t"]["share"] - 1) < 1e-9
    routed = rows["today"][0]
    prog = rows["progressive"]
    out["progressive: never below the routed side once switched"] = all(
        p["t2i"]["share"] >= routed["t2i"]["share"] and p["i2t"]["share"] >= routed["i2t"]["share"]
        for p in prog)
    out["every share's error <= 0.05 (mean of the draws)"] = all(
        p[d]["se"] is not None and p[d]["se"] <= TARGETS["se"]
        for points in rows.values() for p in points for d in ("t2i", "i2t"))
    return out


def plot(rows: dict[str, list[dict[str, Any]]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), sharey=True)
    for ax, d, label in zip(axes, ("t2i", "i2t"), ("text -> image", "image -> text")):
        for name, points in rows.items():
            xs = [max(p["fraction"], 0.002) for p in points]
            ys = [p[d]["share"] for p in points]
            es = [p[d]["se"] or 0 for p in points]
            ax.errorbar(xs, ys, yerr=es, marker="o", ms=3, capsize=2, label=name,
                        drawstyle="steps-post" if name == "today" else "default")
        ax.set_xscale("log")
        ax.set_xticks([0.002, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0])
        ax.set_xticklabels(["0", "1%", "5%", "10%", "25%", "50%", "100%"])
        ax.axhline(1.0, color="grey", lw=0.6, ls=":")
        ax.axhline(0.0, color="grey", lw=0.6, ls=":")
        ax.set_title(label)
        ax.set_xlabel("fraction of the backfill done (items re-embedded by NEW)")
    axes[0].set_ylabel("share of NEW's R@1 gain (mean of draws, +/- 1 s.e.)")
    axes[1].legend(loc="lower right", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from training.bench.xbt import open_base

    out = Path(args.out)
    old, new = open_base(Path(args.base), out)
    out.mkdir(parents=True)
    draws = []
    for seed in args.seeds:
        draw = measure_draw(old, new, args, seed, out)
        (out / f"draw-{seed}.json").write_text(json.dumps(draw))
        draws.append(draw)
    rows = combined(draws)
    result = {"seeds": list(args.seeds), "gallery": args.gallery, "test_items": args.test,
              "sample": args.sample, "method": args.method, "ensemble": args.ensemble,
              "per_draw": [{k: v for k, v in d.items() if k != "hits"} | {
                  "rows": strategy_rows(d)} for d in draws],
              "rows": rows, "targets": check_targets(rows, draws)}
    plot(rows, out / "frontier.png", f"bench frontier: {args.gallery:,}-item gallery, "
         f"{args.sample:,}-item sample, seeds {', '.join(map(str, args.seeds))}")
    (out / "frontier.json").write_text(json.dumps(result, indent=2))
    result["plot"] = str(out / "frontier.png")
    return result


def _cell(p: dict[str, Any], d: str) -> str:
    v = p[d]
    return "   n/a    " if v["share"] is None else f"{v['share']:5.2f}±{v['se']:.2f}"


def render(result: dict[str, Any]) -> str:
    lines = []
    for d in result["per_draw"]:
        t = d["transform"]
        lines.append(f"seed {d['seed']}: gallery {d['gallery']:,} items, test {d['test_items']:,} "
                     f"items ({d['t2i_queries']:,} t2i / {d['i2t_queries']:,} i2t queries), "
                     f"sample {d['sample']:,}; transform {t['method']} x{t['ensemble']} "
                     f"held-out cosine {t['holdout_cosine']}; learned order spearman "
                     f"{d['order_spearman']}; switch at {d['switch_fraction']}; seconds {d['seconds']}")
    rows = result["rows"]
    lines.append(f"mean of seeds {result['seeds']}: share of the gain t2i / i2t (± s.e.) at each "
                 f"fraction of the backfill; compute as a fraction of a full backfill")
    for name, points in rows.items():
        lines.append(f"{name}")
        for p in points:
            lines.append(f"  {p['fraction']:7.2%}  compute {p['compute']:7.4f}  t2i {_cell(p, 't2i')}"
                         f"  i2t {_cell(p, 'i2t')}")
    lines += [f"target {k}: {'met' if v else 'MISSED'}" for k, v in result["targets"].items()]
    lines.append(f"plot: {result['plot']}")
    return "\n".join(lines)


def register(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="share of NEW's gain against the fraction of the backfill: "
                                  "today's migration, a gallery-side transform with each "
                                  "backfill order, the progressive switch, the hybrid")
    p.add_argument("--base", default="runs/bench-base", help="holds old/ and new/ artifacts")
    p.add_argument("--out", default="runs/bench-frontier")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--gallery", type=int, default=50_000, help="items in the gallery")
    p.add_argument("--test", type=int, default=5_000, help="test items (part of the gallery)")
    p.add_argument("--sample", type=int, default=900, help="K: items NEW embeds to fit the "
                                                           "transform")
    p.add_argument("--validation", type=int, default=1_000, help="validation items (the "
                                                                 "progressive switch)")
    p.add_argument("--method", default="residual-mlp", help="the transform's map")
    p.add_argument("--ensemble", type=int, default=1)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=report_command(run, render))
