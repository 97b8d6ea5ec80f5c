"""``nobackfill bench base``: the two standard tiny models of the synthetic world.

OLD: small model, less data. NEW: more data and capacity. Both are evaluated on a
held-out 1,000-image test set and kept under ``--out`` (the XBT and continual
benchmarks start from them). Targets: OLD text->image R@1 >= 0.80, NEW >= 0.93, NEW
better than OLD in both directions, NEW trained in under 15 minutes.

The recipes are set by recall per CPU second on 2 cores. The image tower is what
limits recall (linear probes on OLD's image embeddings: shape and position lag, text
attributes do not), and only more optimizer steps fixed it: at 1,000 OLD steps
t2i R@1 was 0.533; a higher image-tower lr (0.407), a smaller batch with twice the
steps (0.505), AdamW beta2 0.98 (0.524), 3x more images (0.447) and 8-pixel patches
(0.182 at 600 steps, 4x the cost) did not help. So OLD gets 3,000 steps (about 12
minutes here, not the "few minutes" first planned) and NEW a cheaper step
(``tiny-new-bench``: text tower as wide as OLD's, image tower deeper and wider than
OLD's) so that it fits 2,700 steps in 15. The demo keeps ``tiny-new`` (wider text
tower, 800 steps): with ``tiny-new-bench`` at 800 steps its XBT upgrade failed the gate.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from training.configs import config_path
from training.console import report_command
from training.data import DEFAULT_DOMAINS, PairDataset, generate_items

TEST_SEED = 10_000
TARGETS = {"old_t2i_r1": 0.80, "new_t2i_r1": 0.93, "new_seconds": 15 * 60}


@dataclass
class ModelRecipe:
    """How one standard tiny model is trained (data size, steps, optimiser)."""

    config: str  # packaged JSON model config name
    images: int
    steps: int
    batch_size: int = 128
    lr: float = 5e-4  # higher rates (1e-3..3e-3) gave lower recall on this world
    seed: int = 0


@dataclass
class BaseBench:
    old: ModelRecipe = field(default_factory=lambda: ModelRecipe("tiny-old", 4000, 3000, seed=1))
    new: ModelRecipe = field(default_factory=lambda: ModelRecipe("tiny-new-bench", 6000, 2700, seed=2))
    test_images: int = 1000
    domains: tuple[str, ...] = DEFAULT_DOMAINS


def test_set(bench: BaseBench, languages: tuple[str, ...] = ("en",), draw: int = 0,
             ) -> PairDataset:
    """The held-out test set; ``draw`` > 0 renders another one of the same size and domains."""
    items = generate_items(bench.test_images, seed=TEST_SEED + 101 * draw, domains=bench.domains,
                           languages=languages, id_prefix="test-")
    return PairDataset.from_synth(items)


def train_set(recipe: ModelRecipe, bench: BaseBench) -> PairDataset:
    items = generate_items(recipe.images, seed=recipe.seed, domains=bench.domains,
                           languages=("en",), id_prefix=f"train{recipe.seed}-")
    return PairDataset.from_synth(items)


def train_standard(name: str, recipe: ModelRecipe, bench: BaseBench, out: Path,
                   test: PairDataset) -> dict[str, Any]:
    from training.contrastive import train_contrastive
    from training.encoders import ModelSpec
    from training.trainer import TrainConfig

    cfg = TrainConfig(steps=recipe.steps, batch_size=recipe.batch_size, lr=recipe.lr,
                      weight_decay=0.1, warmup=0.05, seed=recipe.seed)
    start = time.perf_counter()
    art = train_contrastive(ModelSpec.from_json(config_path(recipe.config)), train_set(recipe, bench),
                     cfg, out / name, eval_dataset=test, version_id=name)
    return {"artifact": str(art.path), "seconds": time.perf_counter() - start,
            "recipe": asdict(recipe), **art.manifest["metrics"]["eval"]}


def check_targets(old: dict[str, Any], new: dict[str, Any]) -> dict[str, bool]:
    return {
        "old_t2i_r1>=0.80": old["t2i"]["R@1"] >= TARGETS["old_t2i_r1"],
        "new_t2i_r1>=0.93": new["t2i"]["R@1"] >= TARGETS["new_t2i_r1"],
        "new_better_t2i": new["t2i"]["R@1"] > old["t2i"]["R@1"],
        "new_better_i2t": new["i2t"]["R@1"] > old["i2t"]["R@1"],
        "new_under_15_min": new["seconds"] < TARGETS["new_seconds"],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    bench = BaseBench()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    test = test_set(bench)
    result: dict[str, Any] = {"test_images": len(test), "domains": list(bench.domains)}
    for name in ("old", "new"):
        if (out / name).exists():
            raise SystemExit(f"{out / name} exists; remove it or choose another --out")
        result[name] = train_standard(name, getattr(bench, name), bench, out, test)
    result["targets"] = check_targets(result["old"], result["new"])
    (out / "bench-base.json").write_text(json.dumps(result, indent=2))
    return result


def render(result: dict[str, Any]) -> str:
    lines = ["model  t2i R@1/5/10         i2t R@1/5/10         train s"]
    for name in ("old", "new"):
        r = result[name]
        t2i = "/".join(f"{r['t2i'][f'R@{k}']:.3f}" for k in (1, 5, 10))
        i2t = "/".join(f"{r['i2t'][f'R@{k}']:.3f}" for k in (1, 5, 10))
        lines.append(f"{name:5}  {t2i:19}  {i2t:19}  {r['seconds']:.0f}")
    lines += [f"target {k}: {'met' if v else 'MISSED'}" for k, v in result["targets"].items()]
    return "\n".join(lines)


def register(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="train and evaluate the standard OLD and NEW tiny models")
    p.add_argument("--out", default="runs/bench-base", help="keeps old/ and new/ artifacts")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=report_command(run, render))

