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
import os
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


def _threads(ranks: int, args: argparse.Namespace) -> int:
    """CPU threads per rank: ``--threads``, else the cores split over the ranks."""
    return args.threads or max(1, (os.cpu_count() or 1) // ranks)


def _base(ranks: int, args: argparse.Namespace, data: PairDataset, out: Path) -> Any:
    from training.contrastive import train_contrastive
    from training.distributed import train_artifact
    from training.encoders import ModelSpec
    from training.trainer import TrainConfig

    cfg = TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=5e-4, seed=0)
    return train_artifact(ranks, train_contrastive, {
        "spec": ModelSpec.from_json(config_path("tiny-old")), "dataset": data, "cfg": cfg,
        "out": out / f"base-{ranks}", "version_id": f"base-{ranks}", "show_progress": False},
        args.device, threads=_threads(ranks, args))


def _xbt(ranks: int, args: argparse.Namespace, data: PairDataset, old: Any, out: Path) -> Any:
    from training.distributed import train_artifact
    from training.encoders import ModelSpec
    from training.upgrades.run import upgrade
    from training.upgrades.xbt.config import XbtConfig

    # select_every=0: this bench times stage 2 and compares the trained adapters over ranks
    cfg = XbtConfig(pretrain_steps=XBT_PRETRAIN_STEPS, pretrain_batch_size=args.batch_size,
                    steps=args.steps, batch_size=args.batch_size, lora_dropout=0.0,
                    select_every=0)
    return train_artifact(ranks, upgrade, {
        "old": old, "new": ModelSpec.from_json(config_path("tiny-new-bench")), "corpus": CORPUS,
        "pairs": data, "out": out / f"xbt-{ranks}", "cfg": cfg, "version_id": f"xbt-{ranks}",
        "show_progress": False}, args.device, threads=_threads(ranks, args))


def _largest_difference(a: Any, b: Any, files: tuple[str, ...]) -> float:
    worst = 0.0
    for name in files:
        left, right = a.tensors(name), b.tensors(name)
        for key, value in left.items():
            worst = max(worst, float((value.float() - right[key].float()).abs().max()))
    return worst


def _row(job: str, ranks: int, art: Any, wall: float, reference: Any,
         args: argparse.Namespace) -> dict[str, Any]:
    metrics = art.manifest["metrics"]
    steps, seconds = ((metrics["stage2"]["steps"], metrics["stage2"]["seconds"]) if job == "xbt"
                      else (art.manifest["hyperparameters"]["steps"], metrics["train_seconds"]))
    files = ("adapters.safetensors", "projector.safetensors") if job == "xbt" else \
        ("model.safetensors",)
    return {"job": "xbt stage 2" if job == "xbt" else "base", "ranks": ranks,
            "threads_per_rank": _threads(ranks, args), "steps_per_s": steps / seconds,
            "samples_per_s": steps * args.batch_size / seconds, "train_seconds": seconds,
            "wall_seconds": wall,
            "max_weight_diff_vs_1_rank": _largest_difference(art, reference, files)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from training.distributed import check_gpus

    ranks = sorted({int(r) for r in args.ranks})
    if ranks[0] != 1:
        raise SystemExit("--ranks must include 1: the other runs are compared with it")
    backend = check_gpus(ranks[-1], args.device)
    data = _data(args.images)
    torch.set_num_threads(_threads(1, args))  # the 1-rank runs train in this process
    load = os.getloadavg()[0]  # other work on the host skews CPU timings: reported
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-distributed-") as tmp:
        out, reference = Path(tmp), {}
        for job in ("base", "xbt"):
            for n in ranks:
                start = time.perf_counter()
                art = (_base(n, args, data, out) if job == "base"
                       else _xbt(n, args, data, reference["base"], out))
                reference.setdefault(job, art)
                rows.append(_row(job, n, art, time.perf_counter() - start, reference[job], args))
    return {"backend": backend, "device": args.device or ("cuda" if torch.cuda.is_available()
                                                          else "cpu"),
            "images": args.images, "global_batch": args.batch_size, "steps": args.steps,
            "load_average_1m": [load, os.getloadavg()[0]], "rows": rows}


def render(result: dict[str, Any]) -> str:
    lines = [(f"backend {result['backend']} on {result['device']}; global batch "
              f"{result['global_batch']}, {result['steps']} steps, {result['images']} images; "
              f"host load average (1 min) before/after: {result['load_average_1m'][0]:.1f}/"
              f"{result['load_average_1m'][1]:.1f}"),
             ("job          ranks  threads/rank  steps/s  samples/s  train s  wall s  "
             "max |dW| vs 1 rank")]
    for r in result["rows"]:
        lines.append(f"{r['job']:12} {r['ranks']:5}  {r['threads_per_rank']:12}  "
                     f"{r['steps_per_s']:7.2f}  {r['samples_per_s']:9.1f}  "
                     f"{r['train_seconds']:7.1f}  {r['wall_seconds']:6.1f}  "
                     f"{r['max_weight_diff_vs_1_rank']:.2e}")
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
    p.add_argument("--threads", type=int, default=0,
                   help="CPU threads per rank (default: the cores split over the ranks)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=report_command(run, render))
