"""``nobackfill bench distributed``: data-parallel training with 1, 2, ... ranks.

For each rank count: base training (``tiny-old`` from scratch) and XBT stage 2 (``tiny-new-bench``
upgraded into the 1-rank base model's space), the same global batch and steps each time.
Reported per run: training steps/s and samples/s (the loop's own clock, not the ranks'
start-up), the wall time including start-up, and the largest difference of the trained
weights from the 1-rank run's (the equivalence check: 0 up to float noise, which Adam
and many steps amplify). On a CPU host the ranks are gloo processes sharing the cores, so
expect no speed-up; on a GPU host (``--device cuda``) they are NCCL ranks, one per GPU.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from training.configs import config_path
from training.console import csv_list, report_command
from training.data import PairDataset, generate_items

XBT_PRETRAIN_STEPS = 20  # stage 1 is not measured; it only gives stage 2 a trained phi
CORPUS = "synth:2000"


def _data(images: int) -> PairDataset:
    return PairDataset.from_synth(generate_items(images, seed=21, languages=("en",),
                                                 id_prefix="dist-"))


def _train(ranks: int, fn: Any, kwargs: dict[str, Any], device: str | None) -> Any:
    """``fn`` in this process (1 rank) or on ``ranks`` spawned ranks; its artifact."""
    from training.artifacts import load_artifact
    from training.distributed import run_ranks

    if ranks == 1:
        return fn(**kwargs, device=device)
    run_ranks(ranks, fn, kwargs, device=device)
    return load_artifact(kwargs["out"])


def _base(ranks: int, args: argparse.Namespace, data: PairDataset, out: Path) -> Any:
    from training.contrastive import train_contrastive
    from training.encoders import ModelSpec
    from training.trainer import TrainConfig

    cfg = TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=5e-4, seed=0)
    return _train(ranks, train_contrastive, {
        "spec": ModelSpec.from_json(config_path("tiny-old")), "dataset": data, "cfg": cfg,
        "out": out / f"base-{ranks}", "version_id": f"base-{ranks}", "show_progress": False},
        args.device)


def _xbt(ranks: int, args: argparse.Namespace, data: PairDataset, old: Any, out: Path) -> Any:
    from training.encoders import ModelSpec
    from training.xbt.config import XbtConfig
    from training.xbt.upgrade import upgrade

    cfg = XbtConfig(pretrain_steps=XBT_PRETRAIN_STEPS, pretrain_batch_size=args.batch_size,
                    steps=args.steps, batch_size=args.batch_size, lora_dropout=0.0)
    return _train(ranks, upgrade, {
        "old": old, "new": ModelSpec.from_json(config_path("tiny-new-bench")), "corpus": CORPUS,
        "pairs": data, "out": out / f"xbt-{ranks}", "cfg": cfg, "version_id": f"xbt-{ranks}",
        "show_progress": False}, args.device)


def _largest_difference(a: Any, b: Any, files: tuple[str, ...]) -> float:
    worst = 0.0
    for name in files:
        left, right = a.tensors(name), b.tensors(name)
        for key, value in left.items():
            worst = max(worst, float((value.float() - right[key].float()).abs().max()))
    return worst


def _row(job: str, ranks: int, art: Any, wall: float, reference: Any, files: tuple[str, ...],
         batch: int) -> dict[str, Any]:
    metrics = art.manifest["metrics"]
    steps, seconds = ((metrics["stage2"]["steps"], metrics["stage2"]["seconds"]) if job == "xbt"
                      else (art.manifest["hyperparameters"]["steps"], metrics["train_seconds"]))
    return {"job": "xbt stage 2" if job == "xbt" else "base", "ranks": ranks,
            "steps_per_s": steps / seconds, "samples_per_s": steps * batch / seconds,
            "train_seconds": seconds, "wall_seconds": wall,
            "max_weight_diff_vs_1_rank": _largest_difference(art, reference, files)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from training.distributed import check_gpus

    ranks = sorted({int(r) for r in args.ranks})
    if ranks[0] != 1:
        raise SystemExit("--ranks must include 1: the other runs are compared with it")
    backend = check_gpus(ranks[-1], args.device)
    data = _data(args.images)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-distributed-") as tmp:
        out = Path(tmp)
        reference: dict[str, Any] = {}
        for job in ("base", "xbt"):
            files = ("model.safetensors",) if job == "base" else \
                ("adapters.safetensors", "projector.safetensors")
            for n in ranks:
                start = time.perf_counter()
                art = (_base(n, args, data, out) if job == "base"
                       else _xbt(n, args, data, reference["base"], out))
                wall = time.perf_counter() - start
                reference.setdefault(job, art)
                rows.append(_row(job, n, art, wall, reference[job], files, args.batch_size))
    return {"backend": backend, "device": args.device or ("cuda" if torch.cuda.is_available()
                                                          else "cpu"),
            "cpu_threads": torch.get_num_threads(), "images": args.images,
            "global_batch": args.batch_size, "steps": args.steps, "rows": rows}


def render(result: dict[str, Any]) -> str:
    lines = [(f"backend {result['backend']} on {result['device']}; global batch "
              f"{result['global_batch']}, {result['steps']} steps, {result['images']} images"),
             "job          ranks  steps/s  samples/s  train s  wall s  max |dW| vs 1 rank"]
    for r in result["rows"]:
        lines.append(f"{r['job']:12} {r['ranks']:5}  {r['steps_per_s']:7.2f}  "
                     f"{r['samples_per_s']:9.1f}  {r['train_seconds']:7.1f}  "
                     f"{r['wall_seconds']:6.1f}  {r['max_weight_diff_vs_1_rank']:.2e}")
    return "\n".join(lines)


def register(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="data-parallel training: steps/s with 1, 2, ... ranks and "
                                  "the weights' difference from one process")
    p.add_argument("--ranks", type=csv_list, default=["1", "2"],
                   help="rank counts, comma-separated; must include 1 (default 1,2)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="cuda: one NCCL rank per GPU; cpu: gloo processes (default: cuda "
                        "when present)")
    p.add_argument("--steps", type=int, default=20, help="measured optimizer steps per run")
    p.add_argument("--batch-size", type=int, default=64, help="global batch (split over ranks)")
    p.add_argument("--images", type=int, default=512, help="synthetic training images")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=report_command(run, render))
