"""Validation-selected stage 2 (issue 24): XBT scores its route new->old on a validation
split at step 0 (stage 1 alone, adapters off) and every ``select_every`` steps, and ships
the best checkpoint. Tiny real open_clip models, real peft LoRA, a real worker."""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ADMIN
from test_worker import TINY_XBT, gateway, job_settings, submit, until, worker_process, world

from tests.conftest import MICRO_CONFIG, MICRO_PREPROCESS
from training.artifacts import WEIGHTS, load_artifact, write_artifact
from training.contrastive import train_contrastive
from training.data import PairDataset, generate_items
from training.encoders import Encoder, ModelSpec, create_tokenizer
from training.errors import ConfigError, DataError
from training.evaluate import cross_metrics
from training.routes import native_model
from training.trainer import TrainConfig
from training.upgrades.artifact import ADAPTERS_FILE, write_upgrade
from training.upgrades.prepare import prepare
from training.upgrades.run import upgrade
from training.upgrades.xbt import selection
from training.upgrades.xbt.config import XbtConfig
from training.upgrades.xbt.projector import ProjectorHead
from training.upgrades.xbt.selection import HELD_OUT, hold_out
from training.upgrades.xbt.stage1 import cache_text, pretrain_fresh
from training.upgrades.xbt.stage2 import train_stage2
from training.versions import load_encoder

__all__ = ["world"]  # test_worker's dataset fixture, for the job test

OLD_STEPS = 400  # OLD's own R@1 on the validation split: about 0.3 (chance: about 0.03)


def spec(embed_dim: int) -> ModelSpec:
    config = copy.deepcopy(MICRO_CONFIG)
    config["embed_dim"] = embed_dim
    return ModelSpec(config=config, preprocess=dict(MICRO_PREPROCESS))


@pytest.fixture(scope="module")
def pairs() -> PairDataset:
    return PairDataset.from_synth(generate_items(400, seed=5, languages=("en",), id_prefix="p-"),
                                  image_size=32)


@pytest.fixture(scope="module")
def validation() -> PairDataset:
    """Another draw of the world: never trained on."""
    return PairDataset.from_synth(generate_items(48, seed=6, languages=("en",), id_prefix="v-"),
                                  image_size=32)


@pytest.fixture(scope="module")
def old(tmp_path_factory: pytest.TempPathFactory, pairs: PairDataset):
    """v1: a micro model trained enough to retrieve well above chance."""
    cfg = TrainConfig(steps=OLD_STEPS, batch_size=32, lr=2e-3, warmup=0.1)
    return train_contrastive(spec(32), pairs, cfg, tmp_path_factory.mktemp("v1") / "v1",
                             version_id="v1", show_progress=False)


def twin(old, out: Path):
    """OLD's weights as a version of a space of its own: an upgrade whose stage 1 can make
    the route OLD's own embedding (phi starts as the Procrustes fit of identical pairs)."""
    manifest = {"version_id": "twin", "space": "twin", "model_spec": old.manifest["model_spec"],
                "embed_dim": old.manifest["embed_dim"]}
    return write_artifact(out, manifest, {WEIGHTS: old.tensors(WEIGHTS)})


def recall_against_old(encoder: Encoder, old, validation: PairDataset) -> tuple[float, float]:
    """(t2i, i2t) R@1 of ``encoder``'s queries against OLD's embeddings of the split."""
    old_encoder = load_encoder(old, device="cpu")
    images = [validation.load_image(i) for i in range(len(validation))]
    texts, _ = validation.captions("en")
    cell = cross_metrics(encoder.encode_texts(texts), encoder.encode_images(images),
                         old_encoder.encode_images(images), old_encoder.encode_texts(texts),
                         validation.relevance("en"), ks=(1,))
    return cell["t2i"]["R@1"], cell["i2t"]["R@1"]


# ---------------------------------------------------------------------------- the two cases
def test_a_stage2_that_only_hurts_ships_stage1_alone(old, pairs, validation, tmp_path) -> None:
    """Stage 1 makes the route OLD itself (twin model, Procrustes start); a stage 2 at a
    learning rate far too high only wrecks it: the artifact is stage 1's phi on the
    untouched new model."""
    cfg = XbtConfig(pretrain_steps=1, pretrain_batch_size=64, pretrain_lr=1e-6,
                    init="procrustes", steps=6, batch_size=16, lr=0.05, prompt_lr=5.0,
                    select_every=2)
    p = prepare(old, twin(old, tmp_path / "twin"), "synth:2000", pairs, cfg,
                   show_progress=False, validation=validation)
    assert len(p.pairs.pixels) == len(pairs)  # a validation set given: nothing held out
    cache, anchors = cache_text(p, cfg, show_progress=False)
    phi, _ = pretrain_fresh(p, cache, cfg, show_progress=False)
    stage1_phi = copy.deepcopy(phi)
    stage2 = train_stage2(p.adapters, phi, p.pairs, cfg, anchors, show_progress=False)
    sel = stage2.selection
    curve = sel["curve"]
    assert [c["step"] for c in curve] == [0, 2, 4, 6]
    first = curve[0]
    assert first["t2i"] > 0.3 and first["i2t"] > 0.3  # stage 1 alone: a good route
    # the premise: no later checkpoint is as good as stage 1 alone
    assert all(c["score"] < first["score"] or c["t2i"] < first["t2i"] or c["i2t"] < first["i2t"]
               for c in curve[1:])
    assert sel["chosen_step"] == 0 and sel["chosen"] == first == sel["stage1"]
    assert sel["validation"] == {"source": "given", "images": 48,
                                 "captions": len(validation.captions("en")[0])}
    assert p.adapters.enabled is False  # the in-memory route is the chosen one too

    art = write_upgrade(p, phi, cfg, stage2.metrics(), tmp_path / "v2", version_id="v2")
    manifest = load_artifact(art.path).manifest
    route = manifest["routes"]["v1"]
    assert route["adapters"] is None and route["adapter_config"] is None
    assert ADAPTERS_FILE not in manifest["files"]
    assert manifest["metrics"]["selection"]["chosen_step"] == 0
    # the shipped route: stage 1's phi on the untouched new model
    head = ProjectorHead(stage1_phi)
    stage1 = Encoder(native_model(load_artifact(tmp_path / "twin")).eval(),
                     create_tokenizer(spec(32)), "cpu", text_head=head, image_head=head)
    shipped = load_encoder(load_artifact(art.path), space="v1", device="cpu")
    images = [validation.load_image(i) for i in range(8)]
    texts = validation.captions("en")[0][:8]
    np.testing.assert_allclose(shipped.encode_images(images), stage1.encode_images(images),
                               atol=1e-6)
    np.testing.assert_allclose(shipped.encode_texts(texts), stage1.encode_texts(texts),
                               atol=1e-6)
    assert recall_against_old(shipped, old, validation) == (first["t2i"], first["i2t"])


def test_a_stage2_that_helps_ships_its_best_checkpoint(old, pairs, validation,
                                                       tmp_path) -> None:
    """Stage 1 barely trains phi (a random start, one step at a tiny rate: the route is near
    chance), so stage 2 (pair anchor: new queries against OLD's cached embeddings of the
    pairs) has room beyond the one-sided test over the 48 validation items: a later
    checkpoint is kept (here a middle one), and the artifact's route scores exactly what
    the curve recorded for it."""
    new = train_contrastive(spec(48), pairs, TrainConfig(steps=OLD_STEPS, batch_size=32,
                                                         lr=2e-3, warmup=0.1, seed=1),
                            tmp_path / "new", version_id="new", show_progress=False)
    cfg = XbtConfig(init="random", pretrain_steps=1, pretrain_batch_size=64,
                    pretrain_lr=1e-6, steps=40, batch_size=32, lr=3e-3, pair_anchor=True,
                    select_every=10)
    art = upgrade(old, new, "synth:500", pairs, tmp_path / "v2", cfg, version_id="v2",
                     show_progress=False, validation=validation)
    sel = art.manifest["metrics"]["selection"]
    curve = {c["step"]: c for c in sel["curve"]}
    assert list(curve) == [0, 10, 20, 30, 40]
    assert sel["chosen_step"] > 0
    chosen = sel["chosen"]
    assert chosen == curve[sel["chosen_step"]]
    assert chosen["t2i"] >= curve[0]["t2i"] and chosen["i2t"] >= curve[0]["i2t"]
    assert chosen["score"] - curve[0]["score"] > chosen["margin"] > 0  # beyond noise
    # no later checkpoint beat it beyond its own margin (the noise rule kept the earlier one)
    for step, point in curve.items():
        if step > sel["chosen_step"]:
            assert (point["score"] - chosen["score"] <= point["margin"]
                    or point["t2i"] < curve[0]["t2i"] or point["i2t"] < curve[0]["i2t"])
    assert art.manifest["routes"]["v1"]["adapters"] == ADAPTERS_FILE
    shipped = load_encoder(load_artifact(art.path), space="v1", device="cpu")
    assert recall_against_old(shipped, old, validation) == pytest.approx(
        (chosen["t2i"], chosen["i2t"]), abs=1e-9)


# ---------------------------------------------------------------------------- pieces
def test_hold_out_is_disjoint_seeded_and_refuses_a_too_small_set(pairs) -> None:
    train, held = hold_out(pairs, 0.1, seed=3)
    ids = [r.id for r in pairs.records]
    train_ids, held_ids = [r.id for r in train.records], [r.id for r in held.records]
    assert len(held_ids) == 40 and len(train_ids) == 360
    assert set(train_ids) | set(held_ids) == set(ids) and not set(train_ids) & set(held_ids)
    assert train_ids == [i for i in ids if i in set(train_ids)]  # the paired set's order
    assert [r.id for r in hold_out(pairs, 0.1, seed=3)[1].records] == held_ids
    assert [r.id for r in hold_out(pairs, 0.1, seed=4)[1].records] != held_ids
    with pytest.raises(DataError, match="select_every=0"):
        hold_out(pairs.subset([0, 1]), 0.1, seed=0)


def hits(t2i: list[bool], i2t: list[bool]) -> dict[str, np.ndarray]:
    return {"t2i": np.array(t2i), "i2t": np.array(i2t)}


class StubRoute:
    """What the selector touches of the adapters and phi (the scores are scripted)."""

    model = None

    def disabled(self):
        return contextlib.nullcontext()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"w": torch.zeros(1)}

    def train_mode(self) -> None: ...

    def train(self) -> None: ...


def selected_step(monkeypatch, curve: list[dict[str, np.ndarray]]) -> tuple[int, list]:
    scripted = iter(curve)
    monkeypatch.setattr(selection, "route_hits", lambda *args: next(scripted))
    route = StubRoute()
    selector = selection.Selector(None, route, route, every=1)  # type: ignore[arg-type]
    selector.stage1()
    for step in range(1, len(curve)):
        selector.at_step(step)
    return selector.best.step, [c.margin for c in selector.curve]


def test_a_later_checkpoint_ships_only_when_better_beyond_the_noise(monkeypatch) -> None:
    """Stage 1 alone; a checkpoint one query better net in each direction but with 21
    queries changed (within the bootstrap error: stage 1 ships); one far better with no
    losses (beyond it: that one ships); one churning a net query better than that (within:
    the earlier stays). A gain that costs stage 1 a direction never ships."""
    stage1 = hits([True] * 50 + [False] * 50, [True] * 50 + [False] * 50)
    churn = [False] * 10 + [True] * 51 + [False] * 39  # 10 lost, 11 gained
    clear = [True] * 80 + [False] * 20  # 30 gained, none lost
    clear_churn = [False] * 10 + [True] * 81 + [False] * 9  # against clear: 10 lost, 11 gained
    step, margins = selected_step(monkeypatch, [stage1, hits(churn, churn)])
    assert step == 0 and margins[0] == 0.0 and margins[1] > 0.01  # 0.01 better: noise
    step, margins = selected_step(monkeypatch, [stage1, hits(churn, churn), hits(clear, clear),
                                                hits(clear_churn, clear_churn)])
    assert step == 2 and margins[2] < 0.3 and margins[3] > 0.01
    lopsided = hits([True] * 100, [True] * 49 + [False] * 51)
    assert selected_step(monkeypatch, [stage1, lopsided])[0] == 0


def test_selection_settings_and_the_paper_preset() -> None:
    assert XbtConfig().select_every > 0 and XbtConfig().select_holdout > 0  # selects by default
    paper = XbtConfig.preset("paper", steps=7)
    assert paper.select_every == 0 and paper.steps == 7
    # The paper's 10 visual soft prompts; none by default (issue 24's ablation).
    assert paper.prompts == 10 and XbtConfig().prompts == 0
    assert paper.adapter_config().prompts == 10 and XbtConfig().adapter_config().prompts == 0
    assert XbtConfig.preset("default") == XbtConfig()
    with pytest.raises(ConfigError, match="known: default, paper"):
        XbtConfig.preset("nope")
    for bad in ({"select_every": -1}, {"select_holdout": 1.0}, {"select_holdout": -0.1}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            XbtConfig(**bad)


# ---------------------------------------------------------------------------- the job
def test_an_xbt_job_records_the_validation_curve_and_the_chosen_step(micro_versions, world,
                                                                      tmp_path) -> None:
    """A real worker (embedded broker): the job's result carries the curve and the chosen
    step, the registered artifact holds the chosen route, and the gate ran on it."""
    values = job_settings(tmp_path / "data", world, broker=False, queue="training")
    with gateway(values, micro_versions, world) as client, \
            worker_process(values, tmp_path / "worker.log") as proc:
        config = {**TINY_XBT, "select_every": 1}
        up_job = submit(client, "xbt", {"new": {"version": "v3"}, "corpus": "synth:300",
                                        "pairs": str(world), "config": config})
        done = until(client, up_job["id"], ("succeeded", "failed"), proc)
        assert done["status"] == "succeeded", done["error"]
        stored = client.get(f"/v1/models/{done['version']}", headers=ADMIN).json()
    sel = done["result"]["selection"]
    assert [c["step"] for c in sel["curve"]] == [0, 1, 2]
    assert sel["validation"]["source"] == HELD_OUT and sel["validation"]["images"] == 4
    assert sel["chosen"] == sel["curve"][sel["chosen_step"]]
    manifest = stored["manifest"]
    assert manifest["metrics"]["selection"] == sel
    assert manifest["metrics"]["pair_images"] == 36  # 40 minus the 4 held out
    # the registered route is the chosen checkpoint (stage 1 alone: no adapters), and the
    # gate's report is about that artifact
    assert (manifest["routes"]["v1"]["adapters"] is None) == (sel["chosen_step"] == 0)
    assert stored["gate"]["candidate"] == done["version"] and "checks" in done["gate"]
