"""Base training: a CLIP model trained (from scratch or fine-tuned) with the plain
contrastive loss, written as a model version artifact in its own embedding space."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from training.artifacts import (
    WEIGHTS,
    Artifact,
    load_artifact,
    model_state,
    new_version_id,
    write_artifact,
)
from training.data import PairDataset
from training.distributed import World, gather, on_main
from training.encoders import Encoder, ModelSpec, create_model, create_tokenizer, model_embed_dim
from training.errors import ConfigError
from training.evaluate import retrieval_metrics
from training.losses import clip_loss
from training.pairs import build_pairs, pair_batches
from training.trainer import Progress, TrainConfig, TrainResult, seed_everything, train


class ContrastiveTask:
    """Model + plain CLIP loss; the logit scale is learned. Under torch.distributed the
    loss is over the global batch (features gathered with their gradients)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def losses(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        pixels, tokens = batch
        device = self.model.logit_scale.device
        image = gather(self.model.encode_image(pixels.to(device), normalize=True))  # [B, D]
        text = gather(self.model.encode_text(tokens.to(device), normalize=True))  # [B, D]
        return {"contrastive_loss": clip_loss(image, text, self.model.logit_scale.exp())}


def evaluate_encoder(encoder: Encoder, dataset: PairDataset, language: str = "en",
                     pixels: torch.Tensor | None = None) -> dict[str, Any]:
    """Retrieval metrics of one encoder on a dataset (both directions)."""
    texts, _ = dataset.captions(language)
    if pixels is None:
        images = encoder.encode_images([dataset.load_image(i) for i in range(len(dataset))])
    else:
        images = encoder.encode_image_tensors(pixels)
    return retrieval_metrics(images, encoder.encode_texts(texts), dataset.relevance(language))


def _checkpointer(model: torch.nn.Module, directory: Path | None) -> Callable[[int], None] | None:
    if directory is None:
        return None

    def save(step: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / "checkpoint.safetensors.tmp"
        save_file(model_state(model), str(tmp), metadata={"step": str(step)})
        tmp.replace(directory / "checkpoint.safetensors")  # atomic: never a torn checkpoint
    return save


def train_contrastive(spec: ModelSpec, dataset: PairDataset, cfg: TrainConfig, out: str | Path,
               languages: Sequence[str] = ("en",), eval_dataset: PairDataset | None = None,
               version_id: str | None = None, device: str | None = None,
               show_progress: bool = True, checkpoint_dir: str | Path | None = None,
               on_progress: Callable[[Progress], None] | None = None) -> Artifact:
    """Train ``spec`` contrastively on ``dataset`` and write an artifact at ``out``.

    Data-parallel under torch.distributed (``training.distributed.run_ranks``): rank 0
    evaluates and writes the artifact and checkpoints, the other ranks read it back."""
    out = Path(out)
    if out.exists():
        raise ConfigError(f"{out} already exists; choose another output directory")
    seed_everything(cfg.seed)
    model = create_model(spec)
    encoder = Encoder(model, create_tokenizer(spec), device)
    pairs = build_pairs(dataset, encoder, languages, show_progress)
    model.train()
    result = train(ContrastiveTask(model), pair_batches(pairs, cfg.batch_size, cfg.seed),
                   [{"params": [p for p in model.parameters() if p.requires_grad]}], cfg,
                   desc="train-base", show_progress=show_progress, on_progress=on_progress,
                   on_checkpoint=_checkpointer(model, Path(checkpoint_dir) if checkpoint_dir else None),
                   state_dir=checkpoint_dir)
    model.eval()
    return on_main(lambda: _write_base(model, encoder, spec, dataset, cfg, out, languages,
                                       eval_dataset, version_id, result),
                   lambda: load_artifact(out))


def _write_base(model: torch.nn.Module, encoder: Encoder, spec: ModelSpec, dataset: PairDataset,
                cfg: TrainConfig, out: Path, languages: Sequence[str],
                eval_dataset: PairDataset | None, version_id: str | None,
                result: TrainResult) -> Artifact:
    metrics: dict[str, Any] = {"final_loss": result.final_loss, "train_seconds": result.seconds,
                               "train_images": len(dataset), "ranks": World.current().size}
    if eval_dataset is not None:
        metrics["eval"] = evaluate_encoder(encoder, eval_dataset, languages[0])
    vid = version_id or new_version_id()
    manifest = {"version_id": vid, "space": vid, "kind": "base", "parent": None,
                "model_spec": spec.without_weights().to_dict(),
                "base_model": spec.describe(), "embed_dim": model_embed_dim(model),
                "preprocess": dict(model.visual.preprocess_cfg), "languages": list(languages),
                "hyperparameters": cfg.to_dict(), "metrics": metrics}
    return write_artifact(out, manifest, {WEIGHTS: model_state(model)})
