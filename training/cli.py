"""The ``nobackfill`` command line. Each subcommand is a small function; heavy
imports happen inside them so ``--help`` stays fast.

The library's own commands are defined here. Commands that need more than the library
(``demo`` runs the gateway and a worker; ``bench serve`` runs gateways) are plugged in
from outside through entry points (``pyproject.toml``): group ``nobackfill.commands``
for top-level commands and ``nobackfill.benchmarks`` for ``bench NAME``, each naming a
``register(subparsers, name)`` function. The library never names the packages that
provide them, so ``nobackfill`` works with ``training/`` alone.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from training.console import csv_list, emit
from training.errors import NobackfillError

if TYPE_CHECKING:
    from training.config import MethodConfig
    from training.upgrades.registry import UpgradeMethod

Handler = Callable[[argparse.Namespace], int]


_csv = csv_list


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
    from training.data import open_dataset as open_data

    return open_data(path, skip_bad)


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
    from training.contrastive import train_contrastive
    from training.distributed import check_batches, train_artifact
    from training.trainer import TrainConfig

    check_batches(args.gpus, batch_size=args.batch_size)

    cfg = TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                      weight_decay=args.weight_decay, warmup=args.warmup, seed=args.seed,
                      checkpoint_every=args.checkpoint_every)
    dataset = open_dataset(args.data, args.skip_bad)
    eval_data = open_dataset(args.eval_data) if args.eval_data else None
    art = train_artifact(args.gpus, train_contrastive, {
        "spec": model_spec_from(args), "dataset": dataset, "cfg": cfg, "out": args.out,
        "languages": args.languages, "eval_dataset": eval_data, "version_id": args.version_id,
        "checkpoint_dir": Path(args.out).with_name(Path(args.out).name + ".checkpoints")
        if args.checkpoint_every else None})
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
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="steps; 0 disables. Saved under OUT.checkpoints; a run that finds a "
                        "saved state there resumes from it")
    add_gpus_option(p)
    p.add_argument("--version-id", help="default: generated")
    p.add_argument("--skip-bad", action="store_true", help="skip rows with bad images")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_train_base)


def add_gpus_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", type=int, default=1,
                   help="data-parallel ranks on this host: one per GPU (NCCL), or CPU "
                        "processes (gloo) without CUDA; the batch size is the global batch")


# ---------------------------------------------------------------- eval / info
def cmd_eval(args: argparse.Namespace) -> int:
    from training.artifacts import load_artifact
    from training.compatibility import compatibility_of_artifacts
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


# ---------------------------------------------------------------- method settings
def _assignment(value: str) -> tuple[str, str]:
    key, sep, rest = value.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {value!r}")
    return key.strip().replace("-", "_"), rest.strip()


def add_settings(p: argparse.ArgumentParser, example: str) -> None:
    """``--set KEY=VALUE``: the one way every method (upgrade or continual) takes its
    settings; ``MethodConfig.from_dict`` parses them strictly."""
    p.add_argument("--set", dest="settings", action="append", type=_assignment, default=[],
                   metavar="KEY=VALUE", help=f"a field of the method's config, e.g. --set "
                                             f"{example} (repeatable; - or _ in KEY)")


def settings_help(config: type[MethodConfig], skip: Sequence[str] = (),
                  title: str = "settings") -> str:
    """The epilog of a method's ``--help``: every setting with its default and help."""
    from training.config import describe

    return f"{title} (--set KEY=VALUE), with their defaults:\n{describe(config, skip)}"


class MethodHelp(argparse.Action):
    """``--help`` that, after ``--method NAME``, also lists NAME's settings: the method's
    module (and torch) is imported only then, so plain ``--help`` stays fast."""

    def __init__(self, option_strings: Sequence[str], dest: str,
                 settings: Callable[[str], str], **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)
        self.settings = settings

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        text = parser.format_help()
        if getattr(namespace, "method", None):
            try:
                text += "\n" + self.settings(namespace.method) + "\n"
            except NobackfillError as exc:
                parser.error(str(exc))
        sys.stdout.write(text)
        parser.exit()


# ---------------------------------------------------------------- upgrade
def new_model_from(args: argparse.Namespace) -> Any:
    """--new ARTIFACT, or a model spec from --new-model-config / --new-arch options."""
    from training.artifacts import load_artifact
    from training.encoders import ModelSpec
    from training.errors import ConfigError

    given = [args.new, args.new_model_config, args.new_arch]
    if sum(v is not None for v in given) != 1:
        raise ConfigError("give the new model as exactly one of --new ARTIFACT_DIR, "
                          "--new-model-config JSON or --new-arch NAME")
    if args.new:
        return load_artifact(args.new)
    if args.new_model_config:
        return ModelSpec.from_json(args.new_model_config, checkpoint=args.new_checkpoint)
    return ModelSpec(arch=args.new_arch, pretrained=args.new_pretrained,
                     checkpoint=args.new_checkpoint)


def cmd_upgrade(args: argparse.Namespace) -> int:
    from training.artifacts import load_artifact
    from training.distributed import check_batches, train_artifact
    from training.upgrades import get_upgrade
    from training.upgrades.run import upgrade
    from training.upgrades.xbt.config import PRESETS

    settings = {**PRESETS[args.preset or "default"], **dict(args.settings)}
    cfg = get_upgrade(args.upgrade).configure(settings)  # before any loading
    check_batches(args.gpus, batch_size=cfg.batch_size, pretrain_batch_size=cfg.pretrain_batch_size)
    old, new = load_artifact(args.old), new_model_from(args)
    art = train_artifact(args.gpus, upgrade, {
        "old": old, "new": new, "corpus": args.corpus, "out": args.out, "cfg": cfg,
        "pairs": open_dataset(args.pairs, args.skip_bad), "version_id": args.version_id,
        "target_space": args.target_space,
        "validation": open_dataset(args.validation, args.skip_bad) if args.validation else None,
        "checkpoint_dir": args.checkpoint_dir, "checkpoint_every": args.checkpoint_every,
        }, device=args.device)
    emit(args, art.manifest, f"wrote {art.version_id} to {art.path}: space '{art.space}', "
         f"route into '{art.manifest['target_space']}'\n"
         + json.dumps(art.manifest["metrics"], indent=2))
    return 0


def add_new_model_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("new model (one of --new, --new-model-config, --new-arch)")
    g.add_argument("--new", help="artifact directory of the new model")
    g.add_argument("--new-model-config", help="JSON model config (open_clip format)")
    g.add_argument("--new-arch", help="open_clip architecture name, e.g. ViT-L-14")
    g.add_argument("--new-pretrained", help="open_clip pretrained tag (needs the model hub)")
    g.add_argument("--new-checkpoint", help="local weights file of the new model")


def add_upgrade_inputs(p: argparse.ArgumentParser) -> None:
    """What every upgrade method reads and writes, whatever the method."""
    from training.upgrades.xbt.config import PRESETS  # torch-free

    p.add_argument("--old", required=True, help="artifact of the old version (gallery model)")
    add_new_model_options(p)
    p.add_argument("--corpus", required=True,
                   help="stage 1 captions: a text file, one caption per line, or synth:N")
    p.add_argument("--pairs", required=True, help="paired set: manifest or dataset directory")
    p.add_argument("--validation", help="xbt: the split stage 2's checkpoints are scored on "
                                        "(select_every; never the test set); default: "
                                        "select_holdout of --pairs, held out of training")
    p.add_argument("--preset", choices=sorted(PRESETS), help="a named configuration; --set "
                                                           "values apply on top (paper: the "
                                                           "paper's recipe, no selection)")
    p.add_argument("--out", required=True, help="artifact directory to create")
    p.add_argument("--version-id", help="default: generated")
    p.add_argument("--target-space", help="space to map into (default: the old version's root)")
    p.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda when present)")
    add_gpus_option(p)
    p.add_argument("--checkpoint-dir", help="save each stage's whole training state here; a "
                                            "run that finds a saved state resumes from it")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="steps between saves (needs --checkpoint-dir; xbt's stage 2 also saves "
                        "at every selection point); 0 disables")
    p.add_argument("--skip-bad", action="store_true", help="skip pairs with bad images")
    p.add_argument("--json", action="store_true")


def add_upgrade_method(methods: argparse._SubParsersAction, name: str,
                       method: type[UpgradeMethod]) -> None:
    """``upgrade NAME``: one subcommand per registered upgrade method."""
    p = methods.add_parser(name, help=method.summary, description=method.summary,
                           epilog=settings_help(method.Config, skip=("method",)),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    add_upgrade_inputs(p)
    add_settings(p, "anchor=true")
    p.set_defaults(func=cmd_upgrade)


def add_upgrade(sub: argparse._SubParsersAction) -> None:
    from training.upgrades import UPGRADES  # torch-free: the methods import their code when run

    p = sub.add_parser("upgrade", help="make a new model compatible with an old gallery")
    methods = p.add_subparsers(dest="upgrade", required=True, metavar="METHOD")
    for name, method in UPGRADES.items():
        add_upgrade_method(methods, name, method)
    add_adapter(methods)


def cmd_adapter(args: argparse.Namespace) -> int:
    from training.artifacts import load_artifact
    from training.upgrades.adapter.config import AdapterFitConfig
    from training.upgrades.adapter.fit import fit_adapter, sample_from_dataset
    from training.upgrades.inputs import target_space_of

    cfg = AdapterFitConfig.from_dict(dict(args.settings))
    old = load_artifact(args.old)
    target = target_space_of(old, args.target_space)
    sample = sample_from_dataset(old, open_dataset(args.sample, args.skip_bad), args.k,
                                 seed=cfg.seed, language=cfg.language, space=target)
    art = fit_adapter(new_model_from(args), sample, cfg, target, args.out, old=old,
                      version_id=args.version_id, device=args.device)
    emit(args, art.manifest, f"wrote {art.version_id} to {art.path}: space '{art.space}', "
         f"{cfg.method} route into '{target}'\n" + json.dumps(art.manifest["metrics"], indent=2))
    return 0


def add_adapter(methods: argparse._SubParsersAction) -> None:
    """``upgrade adapter``: an adapter route fitted on a sample (``training.upgrades.adapter``)."""
    from training.upgrades.adapter.config import AdapterFitConfig

    summary = ("an adapter route (procrustes, affine, residual-mlp; optional SLERP) fitted on "
               "a sample's old vectors and the new model's embeddings of the same items")
    p = methods.add_parser("adapter", help=summary, description=summary,
                           epilog=settings_help(AdapterFitConfig),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old", required=True, help="artifact of the old version (gallery model)")
    add_new_model_options(p)
    p.add_argument("--sample", required=True,
                   help="items to fit on: manifest or dataset directory (OLD embeds them, as "
                        "the gallery would store them; an adapter job reads them instead)")
    p.add_argument("--k", type=int, default=10_000, help="sample size (items)")
    p.add_argument("--out", required=True, help="artifact directory to create")
    p.add_argument("--version-id", help="default: generated")
    p.add_argument("--target-space", help="space to map into (default: the old version's root)")
    p.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda when present)")
    p.add_argument("--skip-bad", action="store_true", help="skip items with bad images")
    add_settings(p, "method=affine")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_adapter)


# ---------------------------------------------------------------- continual
def cmd_continual(args: argparse.Namespace) -> int:
    from training.continual import get_strategy
    from training.continual.phase import run_phase
    from training.continual.strategy import PhaseOptions
    from training.distributed import check_batches, train_artifact

    check_batches(args.gpus, batch_size=args.batch_size)
    overrides = dict(args.settings)
    for name in ("replay", "lr"):
        if getattr(args, name) is not None:
            overrides[name] = getattr(args, name)
    config = get_strategy(args.method).Config.from_dict(overrides)
    options = PhaseOptions(steps=args.steps, batch_size=args.batch_size, seed=args.seed,
                           domain=args.domain, language=args.language,
                           version_id=args.version_id, checkpoint_dir=args.checkpoint_dir,
                           checkpoint_every=args.checkpoint_every)
    prior = open_dataset(args.prior, args.skip_bad) if args.prior else None
    art = train_artifact(args.gpus, run_phase, {
        "parent": args.parent, "method": args.method, "out": args.out, "config": config,
        "data": open_dataset(args.data, args.skip_bad), "options": options, "prior": prior},
        device=args.device)
    emit(args, art.manifest, f"wrote {art.version_id} ({args.method}) to {art.path}: parent "
         f"{art.manifest['parent']}, space '{art.space}'\n"
         + json.dumps(art.manifest["metrics"], indent=2))
    return 0


def strategy_settings(name: str) -> str:
    from training.continual import get_strategy

    return settings_help(get_strategy(name).Config, title=f"{name} settings")


def add_continual(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("continual", help="one continual phase: a new version from an old one, "
                                          "same embedding space", add_help=False,
                       epilog="`continual --method NAME --help` also lists NAME's settings")
    p.add_argument("-h", "--help", action=MethodHelp, settings=strategy_settings,
                   help="show this help (after --method NAME: with NAME's settings) and exit")
    p.add_argument("--method", required=True,
                   help="seqft, modx, ctp, dns (domain phases); teir, cll-clip (language)")
    p.add_argument("--from", dest="parent", required=True, help="artifact of the parent version")
    p.add_argument("--data", required=True, help="manifest or dataset directory")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--domain", help="domain methods: train on this domain only")
    which.add_argument("--language", help="language methods: the language to add, e.g. de")
    p.add_argument("--out", required=True, help="artifact directory to create")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, help="default: the method's (METHODS.md)")
    p.add_argument("--replay", type=int, help="replay memory size in images (reservoir)")
    p.add_argument("--prior", help="sample of data the parent already serves; seeds DNS "
                                   "statistics / the replay memory when the parent has none")
    add_settings(p, "alpha=10")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--version-id", help="default: generated")
    p.add_argument("--device", help="cpu, cuda (default: cuda when present)")
    add_gpus_option(p)
    p.add_argument("--checkpoint-dir", help="save the whole training state here; a phase "
                                            "that finds a saved state there resumes from it")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="steps between saves (needs --checkpoint-dir); 0 disables")
    p.add_argument("--skip-bad", action="store_true", help="skip rows with bad images")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_continual)


# ---------------------------------------------------------------- bench
def add_bench(sub: argparse._SubParsersAction) -> None:
    from training.bench import BENCHMARKS

    p = sub.add_parser("bench", help="benchmarks on the synthetic world")
    bench_sub = p.add_subparsers(dest="bench", required=True)
    for name, register in BENCHMARKS.items():
        register(bench_sub, name)
    add_plugins(bench_sub, BENCH_PLUGINS)


# ---------------------------------------------------------------- plugged-in commands
COMMAND_PLUGINS = "nobackfill.commands"
BENCH_PLUGINS = "nobackfill.benchmarks"


def add_plugins(sub: argparse._SubParsersAction, group: str) -> None:
    """Register the commands that installed packages declare in entry point ``group``.

    A plugin that fails to load is reported on stderr and left out, so one broken
    package cannot take the library's own commands down with it."""
    from importlib.metadata import entry_points

    for point in sorted(entry_points(group=group), key=lambda p: p.name):
        try:
            register = point.load()
        except Exception as exc:  # noqa: BLE001 (reported, not hidden: the command is missing)
            print(f"warning: command '{point.name}' ({point.value}) could not be loaded: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        register(sub, point.name)


PARSERS = [add_synth, add_train_base, add_eval, add_info, add_upgrade, add_continual,
           add_bench]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nobackfill", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for add in PARSERS:
        add(sub)
    add_plugins(sub, COMMAND_PLUGINS)
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
