"""``nobackfill bench language``: add German, Spanish and Russian to an English-only model.

Starts from ``--base DIR``/old (English captions only) and adds one language per phase,
in order de, es, ru (Russian: a non-Latin script), with ``teir`` (CLL-CLIP with TEIR),
``teir-protect`` (the same with ``protect_teacher_tokens``) and the plain CLL-CLIP
baseline (``cll-clip``). Each phase trains on parallel
captions (a new language and English) of all five domains. It prints the text->image
R@1 matrix (rows: after each phase; columns: English and every language, so the row
"old" shows the zero-shot start), English retention, and whether the image tower is
bit-identical to the original after every phase (the gallery stays valid). Bench
settings that differ from METHODS.md defaults are in ``BENCH_OVERRIDES``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.console import report_command
from training.data import DEFAULT_DOMAINS, PairDataset, generate_items

LANGUAGES = ("de", "es", "ru")
TEST_SEED = 40_000
# A phase of a few hundred steps needs a larger learning rate than the paper's 5e-5 over
# three epochs of COCO; everything else is the METHODS.md default. ``teir-protect`` adds
# the option beyond METHODS.md that keeps English's own token rows still: under the
# METHODS.md rule a row shared with English (Spanish "a") still moves at full speed,
# because Adam divides a constant gradient scale out again.
BENCH_OVERRIDES: dict[str, tuple[str, dict[str, Any]]] = {
    "teir": ("teir", {"lr": 5e-3}),
    "teir-protect": ("teir", {"lr": 5e-3, "protect_teacher_tokens": True}),
    "cll-clip": ("cll-clip", {"lr": 5e-3}),
}
RATIO = 0.7  # each new language's R@1 >= RATIO x English R@1
ENGLISH_DROP = 0.01


@dataclass
class LanguageBench:
    languages: tuple[str, ...] = LANGUAGES
    train_images: int = 1000  # per language, five parallel captions each
    test_images: int = 300
    steps: int = 300  # per language
    batch_size: int = 128
    seed: int = 0


QUICK = LanguageBench(languages=("de", "ru"), train_images=80, test_images=60, steps=3,
                      batch_size=32)


@dataclass
class TestSet:
    texts: dict[str, list[str]]  # language -> captions
    relevance: dict[str, np.ndarray]  # language -> [M, N]
    pixels: torch.Tensor  # [N, 3, H, W]


def test_set(bench: LanguageBench, encoder: Any) -> TestSet:
    from training.pairs import image_pixels

    languages = ("en", *bench.languages)
    data = PairDataset.from_synth(generate_items(bench.test_images, seed=TEST_SEED,
                                                 domains=DEFAULT_DOMAINS, languages=languages,
                                                 id_prefix="test-"))
    return TestSet({lang: data.captions(lang)[0] for lang in languages},
                   {lang: data.relevance(lang) for lang in languages}, image_pixels(data, encoder))


def train_sets(bench: LanguageBench) -> list[PairDataset]:
    return [PairDataset.from_synth(generate_items(
        bench.train_images, seed=300 + k, domains=DEFAULT_DOMAINS, languages=("en", lang),
        id_prefix=f"{lang}-")) for k, lang in enumerate(bench.languages)]


def scores(art: Any, test: TestSet) -> dict[str, float]:
    """Text->image R@1 per language of one version."""
    from training.evaluate import retrieval_metrics
    from training.versions import load_encoder

    encoder = load_encoder(art, device="cpu")
    images = encoder.encode_image_tensors(test.pixels)
    return {lang: retrieval_metrics(images, encoder.encode_texts(texts),
                                    test.relevance[lang])["t2i"]["R@1"]
            for lang, texts in test.texts.items()}


def image_tower_identical(a: Any, b: Any) -> bool:
    """Every ``visual.*`` tensor of two versions equal bit for bit."""
    from training.routes import native_model

    sa, sb = native_model(a).state_dict(), native_model(b).state_dict()
    keys = [k for k in sa if k.startswith("visual.")]
    return bool(keys) and all(torch.equal(sa[k], sb[k]) for k in keys)


def run_variant(name: str, method: str, overrides: dict[str, Any], base: Any,
                phases: list[PairDataset], test: TestSet, bench: LanguageBench,
                workdir: Path) -> dict[str, Any]:
    from training.continual import get_strategy
    from training.continual.phase import run_phase
    from training.continual.strategy import PhaseOptions

    config = get_strategy(method).Config.from_dict(overrides)
    parent, rows = base, []
    for k, lang in enumerate(bench.languages):
        options = PhaseOptions(steps=bench.steps, batch_size=bench.batch_size,
                               seed=bench.seed + k, language=lang,
                               version_id=f"{name}-{k + 1}-{lang}")
        start = time.perf_counter()
        art = run_phase(parent, method, phases[k], workdir / f"{name}-{k + 1}", config, options)
        seconds = time.perf_counter() - start
        rows.append({"language": lang, "r1": scores(art, test), "phase_seconds": seconds,
                     "image_tower_identical": image_tower_identical(base, art),
                     "new_tokens": art.manifest["phase"]["new_tokens"]})
        parent = art
    final = rows[-1]["r1"]
    return {"method": method, "config": config.to_dict(), "phases": rows,
            "final_new_language_r1": float(np.mean([final[lang] for lang in bench.languages]))}


def check_targets(result: dict[str, Any]) -> dict[str, bool | None]:
    """The issue's TEIR targets, for every variant that runs ``teir``."""
    variants, start = result["variants"], result["start"]
    teirs = {name: v for name, v in variants.items() if v["method"] == "teir"}
    if not teirs:
        return {"teir run": None}
    targets: dict[str, bool | None] = {}
    for name, v in teirs.items():
        rows = v["phases"]
        targets[f"{name}: each new language R@1 >= {RATIO} x English"] = all(
            r["r1"][r["language"]] >= RATIO * r["r1"]["en"] for r in rows)
        targets[f"{name}: English R@1 drops <= {ENGLISH_DROP}"] = all(
            start["en"] - r["r1"]["en"] <= ENGLISH_DROP for r in rows)
        if "cll-clip" in variants:
            targets[f"{name} >= cll-clip (final R@1 averaged over new languages)"] = (
                v["final_new_language_r1"] >= variants["cll-clip"]["final_new_language_r1"])
    targets["image tower bit-identical after every phase"] = all(
        r["image_tower_identical"] for v in variants.values() for r in v["phases"])
    return targets


def run(args: argparse.Namespace) -> dict[str, Any]:
    from training.artifacts import load_artifact
    from training.versions import load_encoder

    bench = QUICK if args.quick else LanguageBench()
    base = load_artifact(Path(args.base) / "old")
    test = test_set(bench, load_encoder(base, device="cpu"))
    phases = train_sets(bench)
    result: dict[str, Any] = {"bench": asdict(bench), "base": str(base.path),
                              "start": scores(base, test), "variants": {}}
    with tempfile.TemporaryDirectory(prefix="bench-language-") as tmp:
        for name, (method, overrides) in BENCH_OVERRIDES.items():
            result["variants"][name] = run_variant(name, method, overrides, base, phases, test,
                                                   bench, Path(tmp))
    result["targets"] = check_targets(result)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "bench-language.json").write_text(json.dumps(result, indent=2))
    return result


def render(result: dict[str, Any]) -> str:
    cols = ["en", *result["bench"]["languages"]]
    lines = ["text->image R@1 per language (row 'old': the English-only start)"]
    for name, v in result["variants"].items():
        lines += [(f"== {name} (lr {v['config']['lr']:g}, init {v['config']['init']}, "
                   f"row scaling {v['config']['scale_rows']}, English rows protected "
                   f"{v['config']['protect_teacher_tokens']})"),
                  "after      " + " ".join(f"{c:>6}" for c in cols)
                  + "  en change  new tokens  image tower  secs",
                  "old        " + " ".join(f"{result['start'][c]:6.3f}" for c in cols)]
        for row in v["phases"]:
            r1 = row["r1"]
            lines.append(f"{row['language']:10} " + " ".join(f"{r1[c]:6.3f}" for c in cols)
                         + f"  {r1['en'] - result['start']['en']:+9.3f}  {row['new_tokens']:10d}"
                         f"  {'identical' if row['image_tower_identical'] else 'CHANGED':>11}"
                         f"  {row['phase_seconds']:5.0f}")
        lines.append(f"final R@1 averaged over new languages: {v['final_new_language_r1']:.3f}")
    lines += [f"target {k}: {'not run' if ok is None else 'met' if ok else 'missed'}"
              for k, ok in result["targets"].items()]
    return "\n".join(lines)


def register(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="add de, es, ru to an English-only model: teir vs cll-clip")
    p.add_argument("--base", default="runs/bench-base", help="holds old/ from `bench base`")
    p.add_argument("--out", default="runs/bench-language", help="where the JSON goes")
    p.add_argument("--quick", action="store_true", help="a tiny smoke run")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=report_command(run, render))

