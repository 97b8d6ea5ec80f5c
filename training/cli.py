"""The ``nobackfill`` command line. Each subcommand is a small function; heavy
imports happen inside them so ``--help`` stays fast."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from training.errors import NobackfillError

Handler = Callable[[argparse.Namespace], int]


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def emit(args: argparse.Namespace, result: Any, text: str) -> None:
    """Print JSON with --json, else the human-readable text."""
    print(json.dumps(result, indent=2, default=str) if getattr(args, "json", False) else text)


# ---------------------------------------------------------------- synth
def cmd_synth(args: argparse.Namespace) -> int:
    from training.data import write_dataset

    manifest = write_dataset(args.out, n=args.n, seed=args.seed, domains=args.domains,
                             languages=args.languages, image_size=args.image_size,
                             show_progress=True)
    emit(args, {"manifest": str(manifest), "items": args.n}, f"wrote {args.n} items: {manifest}")
    return 0


def add_synth(sub: argparse._SubParsersAction) -> None:
    from training.data import DEFAULT_DOMAINS, LANGUAGES

    p = sub.add_parser("synth", help="write a synthetic shapes-world dataset (PNGs + manifest)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--n", type=int, default=1000, help="number of images")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--domains", type=_csv, default=list(DEFAULT_DOMAINS),
                   help=f"comma-separated domains (default: {','.join(DEFAULT_DOMAINS)})")
    p.add_argument("--languages", type=_csv, default=list(LANGUAGES))
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_synth)


# ---------------------------------------------------------------- data / model options
def open_dataset(path: str, skip_bad: bool = False) -> Any:
    """A dataset from a manifest file or a directory holding ``manifest.jsonl``."""
    from training.data import load_manifest

    target = Path(path)
    if target.is_dir():
        target = target / "manifest.jsonl"
    return load_manifest(target, skip_bad=skip_bad)


def add_model_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model (one of --arch or --model-config)")
    g.add_argument("--arch", help="open_clip architecture name, e.g. ViT-B-32")
    g.add_argument("--pretrained", help="open_clip pretrained tag (needs the model hub)")
    g.add_argument("--checkpoint", help="local weights file for --arch or --model-config")
    g.add_argument("--model-config", help="JSON model config (open_clip format), e.g. "
                                          "training/configs/tiny-old.json")


def model_spec_from(args: argparse.Namespace) -> Any:
    from training.encoders import ModelSpec

    if args.model_config:
        return ModelSpec.from_json(args.model_config, checkpoint=args.checkpoint)
    return ModelSpec(arch=args.arch, pretrained=args.pretrained, checkpoint=args.checkpoint)


# ---------------------------------------------------------------- train-base
def cmd_train_base(args: argparse.Namespace) -> int:
    from training.base import train_base
    from training.trainer import TrainConfig

    cfg = TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                      weight_decay=args.weight_decay, warmup=args.warmup, seed=args.seed,
                      checkpoint_every=args.checkpoint_every)
    dataset = open_dataset(args.data, args.skip_bad)
    eval_data = open_dataset(args.eval_data) if args.eval_data else None
    art = train_base(model_spec_from(args), dataset, cfg, args.out, languages=args.languages,
                     eval_dataset=eval_data, version_id=args.version_id,
                     checkpoint_dir=Path(args.out).with_name(Path(args.out).name + ".checkpoints")
                     if args.checkpoint_every else None)
    emit(args, art.manifest, f"wrote {art.version_id} to {art.path}\n"
         + json.dumps(art.manifest["metrics"], indent=2))
    return 0


def add_train_base(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train-base", help="train a CLIP model contrastively; write an artifact")
    p.add_argument("--data", required=True, help="manifest (.jsonl/.csv) or dataset directory")
    p.add_argument("--eval-data", help="held-out dataset to report recall on")
    p.add_argument("--out", required=True, help="artifact directory to create")
    add_model_options(p)
    p.add_argument("--languages", type=_csv, default=["en"])
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--warmup", type=float, default=0.05, help="warmup fraction of steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps; 0 disables")
    p.add_argument("--version-id", help="default: generated")
    p.add_argument("--skip-bad", action="store_true", help="skip rows with bad images")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_train_base)


# ---------------------------------------------------------------- eval / info
def cmd_eval(args: argparse.Namespace) -> int:
    from training.artifacts import load_artifact
    from training.compat import compatibility_of_artifacts
    from training.evaluate import format_matrix

    dataset = open_dataset(args.data, args.skip_bad)
    artifacts = [load_artifact(p) for p in args.artifacts]
    matrix = compatibility_of_artifacts(artifacts, dataset, args.language)
    emit(args, matrix, format_matrix(matrix))
    return 0


def add_eval(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="compatibility matrix of one or more artifacts on a dataset")
    p.add_argument("artifacts", nargs="+", help="artifact directories (query and gallery models)")
    p.add_argument("--data", required=True, help="manifest or dataset directory")
    p.add_argument("--language", default="en")
    p.add_argument("--skip-bad", action="store_true")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_eval)


def cmd_info(args: argparse.Namespace) -> int:
    from training.artifacts import load_artifact

    art = load_artifact(args.artifact)
    print(json.dumps(art.manifest, indent=2))
    return 0


def add_info(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="print an artifact's manifest (verifies checksums)")
    p.add_argument("artifact")
    p.set_defaults(func=cmd_info)


# ---------------------------------------------------------------- bench
def add_bench(sub: argparse._SubParsersAction) -> None:
    from training.bench import BENCHMARKS

    p = sub.add_parser("bench", help="benchmarks on the synthetic world")
    bench_sub = p.add_subparsers(dest="bench", required=True)
    for name, (register, _) in BENCHMARKS.items():
        register(bench_sub, name)


PARSERS = [add_synth, add_train_base, add_eval, add_info, add_bench]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nobackfill", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for add in PARSERS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except NobackfillError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
