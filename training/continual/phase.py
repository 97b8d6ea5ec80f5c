"""The one phase runner: a model version artifact in, a new one out (its parent).

A continual phase keeps the embedding space of its parent (``space`` = the parent's,
so a gallery embedded by earlier versions stays valid) and records its own version
id. State that must survive between phases (CTP queues, DNS statistics, TEIR token
frequencies, the replay memory) travels in ``state.safetensors`` as ``namespace/key``
tensors; a phase updates the namespaces of its own method and carries the others
over unchanged. Every check runs before training, and the artifact is written
atomically, so a failed phase leaves nothing behind.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from training.artifacts import (
    WEIGHTS,
    Artifact,
    load_artifact,
    model_state,
    new_version_id,
    write_artifact,
)
from training.continual import get_strategy
from training.continual.strategy import (
    PhaseContext,
    PhaseOptions,
    State,
    Strategy,
    StrategyConfig,
)
from training.data import PairDataset
from training.distributed import World, on_main
from training.encoders import create_tokenizer, model_embed_dim, pick_device
from training.errors import ConfigError
from training.routes import artifact_spec, native_model
from training.trainer import Progress, TrainConfig, TrainResult, seed_everything, train

STATE = "state.safetensors"
DOMAIN_CAPTIONS = "en"  # domain phases train on the English captions


def load_state(artifact: Artifact) -> State:
    """The continual state saved with a version, by namespace (empty for a base model)."""
    if STATE not in artifact.manifest.get("files", {}):
        return {}
    state: State = {}
    for key, tensor in artifact.tensors(STATE).items():
        namespace, name = key.split("/", 1)
        state.setdefault(namespace, {})[name] = tensor
    return state


def phase_data(strategy: Strategy, data: PairDataset, options: PhaseOptions) -> PairDataset:
    """The records the phase trains on; DataError when none match, ConfigError when the
    selector does not fit the method's kind."""
    domains = [options.domain] if options.domain else None
    if strategy.kind == "language":
        if not options.language:
            raise ConfigError(f"'{strategy.name}' adds a language: pass --language CODE")
        return data.filter(domains=domains, language=options.language)
    if options.language:
        raise ConfigError(f"'{strategy.name}' trains on a domain's image-caption pairs; "
                          f"--language is for the language methods (teir, cll-clip)")
    return data.filter(domains=domains, language=DOMAIN_CAPTIONS)


def open_phase(parent: Artifact, data: PairDataset, options: PhaseOptions) -> PhaseContext:
    spec = artifact_spec(parent)
    device = pick_device(options.device)
    return PhaseContext(parent=parent, spec=spec, model=native_model(parent).to(device),
                        tokenizer=create_tokenizer(spec), data=data, options=options,
                        state=load_state(parent), device=device,
                        languages=list(parent.manifest.get("languages", ["en"])))


def run_phase(parent: Artifact | str | Path, method: str, data: PairDataset, out: str | Path,
              config: StrategyConfig | None = None, options: PhaseOptions | None = None,
              prior: PairDataset | None = None,
              on_progress: Callable[[Progress], None] | None = None,
              device: str | None = None) -> Artifact:
    """Train one continual phase of ``method`` from ``parent`` on ``data``; write ``out``.

    ``prior``: a sample of data the parent already serves (e.g. gallery items); methods
    that keep between-phase state (DNS statistics, replay memory) record it first when
    the parent has none. ``device`` overrides ``options.device`` (a rank's own device
    under ``training.distributed.run_ranks``, where rank 0 alone writes ``out``).
    """
    options, out, started = options or PhaseOptions(), Path(out), time.perf_counter()
    if device is not None:
        options = replace(options, device=device)
    if out.exists():
        raise ConfigError(f"{out} already exists; choose another --out")
    parent = parent if isinstance(parent, Artifact) else load_artifact(parent)
    strategy = get_strategy(method)(config)
    ctx = open_phase(parent, phase_data(strategy, data, options), options)
    strategy.check(ctx)
    seed_everything(options.seed)
    if prior is not None:
        strategy.seed(ctx, prior)
    setup = strategy.setup(ctx)
    train_cfg = replace(strategy.config.train_config(options.steps, options.batch_size,
                                                     options.seed),
                        checkpoint_every=options.checkpoint_every)
    ctx.model.train()
    result = train(setup.task, setup.batches, setup.groups, train_cfg,
                   desc=f"continual-{strategy.name}", show_progress=options.show_progress,
                   on_progress=on_progress, before_step=setup.before_step,
                   after_step=setup.after_step, optimizer_cls=setup.optimizer_cls,
                   state_dir=options.checkpoint_dir)
    ctx.model.eval()
    strategy.finish(ctx)  # every rank: a strategy's statistics may be reduced over ranks
    return on_main(lambda: write_phase(ctx, strategy, train_cfg, result, out,
                                       time.perf_counter() - started),
                   lambda: load_artifact(out))


def write_phase(ctx: PhaseContext, strategy: Strategy, train_cfg: TrainConfig,
                result: TrainResult, out: Path, seconds: float) -> Artifact:
    parent, options = ctx.parent, ctx.options
    manifest: dict[str, Any] = {
        "version_id": options.version_id or new_version_id(), "space": parent.space,
        "kind": "continual", "parent": parent.version_id,
        "model_spec": ctx.spec.without_weights().to_dict(),
        "base_model": parent.manifest.get("base_model"), "embed_dim": model_embed_dim(ctx.model),
        "preprocess": parent.manifest.get("preprocess"), "languages": ctx.languages,
        "phase": {"method": strategy.name, "domain": options.domain,
                  "language": options.language, "train_images": len(ctx.data),
                  "state": sorted(ctx.state), **strategy.report()},
        "hyperparameters": {"strategy": strategy.config.to_dict(), "train": train_cfg.to_dict()},
        "metrics": {"final_loss": result.final_loss, "train_seconds": result.seconds,
                    "ranks": World.current().size,
                    "seconds_per_step": result.seconds / max(result.steps, 1),
                    "phase_seconds": seconds},
    }
    tensors = {WEIGHTS: model_state(ctx.model)}
    flat = {f"{ns}/{key}": t.detach().cpu().contiguous()
            for ns, items in ctx.state.items() for key, t in items.items()}
    if flat:
        tensors[STATE] = flat
    return write_artifact(out, manifest, tensors)

