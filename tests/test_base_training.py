"""Base contrastive training: a smoke run whose loss falls, artifacts, bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from training.artifacts import load_artifact
from training.contrastive import train_contrastive
from training.data import PairDataset
from training.errors import ConfigError, DataError
from training.trainer import TrainConfig, lr_factor, make_optimizer
from training.versions import load_encoder


def test_smoke_run_loss_falls_and_artifact_round_trips(micro_spec, small_world: PairDataset,
                                                      tmp_path: Path) -> None:
    cfg = TrainConfig(steps=60, batch_size=32, lr=2e-3, warmup=0.1, seed=0, checkpoint_every=20)
    art = train_contrastive(micro_spec, small_world, cfg, tmp_path / "v1", eval_dataset=small_world,
                     version_id="v1", show_progress=False, checkpoint_dir=tmp_path / "ckpt")
    losses = art.manifest["metrics"]
    assert losses["final_loss"] < 3.0  # log(32) = 3.47 is chance level
    assert (tmp_path / "ckpt" / "checkpoint.safetensors").is_file()
    loaded = load_artifact(tmp_path / "v1")
    assert loaded.manifest["hyperparameters"]["steps"] == 60
    assert loaded.manifest["space"] == "v1" and loaded.manifest["embed_dim"] == 32
    assert 0.0 <= loaded.manifest["metrics"]["eval"]["t2i"]["R@1"] <= 1.0
    enc = load_encoder(loaded, device="cpu")
    texts, _ = small_world.captions("en")
    emb = enc.encode_texts(texts[:10])
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)


def test_loss_falls_over_training(micro_spec, small_world: PairDataset, tmp_path: Path) -> None:
    from training.contrastive import ContrastiveTask
    from training.encoders import Encoder, create_model, create_tokenizer
    from training.pairs import build_pairs, pair_batches
    from training.trainer import train

    model = create_model(micro_spec).train()
    pairs = build_pairs(small_world, Encoder(model, create_tokenizer(micro_spec), "cpu"))
    model.train()
    cfg = TrainConfig(steps=50, batch_size=32, lr=2e-3, warmup=0.1)
    result = train(ContrastiveTask(model), pair_batches(pairs, 32, 0),
                   [{"params": list(model.parameters())}], cfg, show_progress=False)
    assert np.mean(result.losses[-10:]) < np.mean(result.losses[:10]) - 0.3


def test_training_is_seeded(micro_spec, small_world: PairDataset, tmp_path: Path) -> None:
    cfg = TrainConfig(steps=5, batch_size=16, lr=1e-3, seed=7)
    a = train_contrastive(micro_spec, small_world, cfg, tmp_path / "a", show_progress=False)
    b = train_contrastive(micro_spec, small_world, cfg, tmp_path / "b", show_progress=False)
    assert a.manifest["metrics"]["final_loss"] == b.manifest["metrics"]["final_loss"]
    assert a.manifest["files"]["model.safetensors"] == b.manifest["files"]["model.safetensors"]


def test_plain_adamw_runs_fused_and_matches_the_unfused_update() -> None:
    torch.manual_seed(0)
    weights = [torch.nn.Parameter(torch.randn(5, 3)) for _ in range(2)]
    twins = [torch.nn.Parameter(w.detach().clone()) for w in weights]
    cfg = TrainConfig(steps=10)
    fused = make_optimizer([{"params": iter(weights)}], cfg)  # a generator is read once only
    plain = make_optimizer([{"params": twins}], cfg, optimizer_cls=_AdamWSubclass)
    assert fused.defaults["fused"] is True and not plain.defaults.get("fused")
    assert len(fused.param_groups[0]["params"]) == 2
    for _ in range(3):
        for opt, params in ((fused, weights), (plain, twins)):
            opt.zero_grad()
            sum((p ** 2).sum() for p in params).backward()
            opt.step()
    for a, b in zip(weights, twins, strict=True):
        torch.testing.assert_close(a, b)


class _AdamWSubclass(torch.optim.AdamW):
    """A custom AdamW (like TEIR's row-scaled one) keeps the unfused code path."""


def test_schedule_warmup_then_cosine() -> None:
    cfg = TrainConfig(steps=100, warmup=0.1)
    assert lr_factor(0, cfg) == pytest.approx(0.1)
    assert lr_factor(9, cfg) == pytest.approx(1.0)
    assert lr_factor(10, cfg) == pytest.approx(1.0)
    assert lr_factor(99, cfg) < 0.01


@pytest.mark.parametrize("kwargs, message", [
    ({"steps": 0}, "steps"), ({"batch_size": 1}, "batch_size"), ({"lr": 0}, "lr"),
    ({"warmup": 1.5}, "warmup"), ({"schedule": "step"}, "schedule"),
])
def test_bad_train_config(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**kwargs)


def test_existing_output_and_empty_data(micro_spec, small_world: PairDataset,
                                        tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    cfg = TrainConfig(steps=2, batch_size=8)
    with pytest.raises(ConfigError, match="already exists"):
        train_contrastive(micro_spec, small_world, cfg, tmp_path / "taken", show_progress=False)
    with pytest.raises(DataError):
        train_contrastive(micro_spec, small_world.subset([]), cfg, tmp_path / "v", show_progress=False)
    assert not (tmp_path / "v").exists()
    with pytest.raises(DataError, match="xx"):
        train_contrastive(micro_spec, small_world, cfg, tmp_path / "w", languages=("xx",),
                   show_progress=False)
    assert not (tmp_path / "w").exists()


def test_bench_base_targets_each_fail_on_their_own() -> None:
    from training.bench.base_models import check_targets

    def model(t2i: float, i2t: float, seconds: float) -> dict:
        return {"t2i": {"R@1": t2i}, "i2t": {"R@1": i2t}, "seconds": seconds}

    assert all(check_targets(model(0.81, 0.8, 600), model(0.94, 0.9, 800)).values())
    missed = check_targets(model(0.79, 0.8, 600), model(0.92, 0.79, 901))
    assert {k for k, ok in missed.items() if not ok} == {
        "old_t2i_r1>=0.80", "new_t2i_r1>=0.93", "new_better_i2t", "new_under_15_min"}
