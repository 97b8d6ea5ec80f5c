"""XBT: projector, visual prompts, LoRA/LayerNorm adapters, the two stages, the Direct
baseline, the "projector" route, chained upgrades, and bad input (nothing written)."""

from __future__ import annotations

import copy
import gc
import json
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from tests.conftest import MICRO_CONFIG, MICRO_PREPROCESS
from training.artifacts import WEIGHTS, load_artifact, write_artifact
from training.cli import main
from training.compatibility import compatibility_of_artifacts
from training.contrastive import train_contrastive
from training.data import PairDataset, generate_items, write_dataset
from training.encoders import Encoder, ModelSpec, create_model, create_tokenizer
from training.errors import ConfigError, DataError
from training.losses import clip_loss
from training.trainer import TrainConfig
from training.upgrades import prepare as preparation
from training.upgrades.artifact import ADAPTERS_FILE, PROJECTOR_FILE, write_upgrade
from training.upgrades.direct import train as direct_training
from training.upgrades.prepare import prepare
from training.upgrades.run import train_upgrade, upgrade
from training.upgrades.xbt import stage1, stage2
from training.upgrades.xbt.adapters import Adapters, LoraSelfAttention
from training.upgrades.xbt.config import XbtConfig
from training.upgrades.xbt.projector import Projector, ProjectorHead, to_old_space
from training.upgrades.xbt.prompts import VisualPrompts
from training.upgrades.xbt.stage1 import PretrainTask, TextCache, cache_text
from training.upgrades.xbt.stage2 import XbtTask, stage2_groups, train_stage2
from training.versions import load_encoder

# The paper's stage 2 (no validation selection): these tests check the method's mechanics;
# tests/test_xbt_selection.py checks the selection.
TINY = {"pretrain_steps": 2, "pretrain_batch_size": 16, "steps": 1, "batch_size": 8,
        "select_every": 0, "prompts": 10}  # the paper's prompts: their code path is tested
CORPUS = [f"a {c} {s}" for c in ("red", "blue", "green", "yellow") for s in ("circle", "square",
                                                                             "star", "heart")] * 3


def spec(embed_dim: int = 32, **vision: object) -> ModelSpec:
    config = copy.deepcopy(MICRO_CONFIG)
    config["embed_dim"] = embed_dim
    config["vision_cfg"].update(vision)
    return ModelSpec(config=config, preprocess=dict(MICRO_PREPROCESS))


def resnet_spec() -> ModelSpec:
    config = copy.deepcopy(MICRO_CONFIG)
    config["vision_cfg"] = {"image_size": 32, "layers": [1, 1, 1, 1], "width": 16, "head_width": 16}
    return ModelSpec(config=config, preprocess=dict(MICRO_PREPROCESS))


@pytest.fixture(scope="module")
def world() -> PairDataset:
    items = generate_items(48, seed=5, languages=("en",), id_prefix="x-")
    return PairDataset.from_synth(items, image_size=32)  # the micro models read 32 px


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory, world: PairDataset) -> dict:
    """v1 (old, 32-d) and a NEW model artifact (48-d), each trained a few steps."""
    root = tmp_path_factory.mktemp("bases")
    cfg = TrainConfig(steps=2, batch_size=16)
    return {"v1": train_contrastive(spec(32), world, cfg, root / "v1", version_id="v1",
                             show_progress=False),
            "new": train_contrastive(spec(48), world, cfg, root / "new", version_id="new",
                              show_progress=False)}


def run_upgrade(old, new, world, out: Path, **cfg) -> object:
    return upgrade(old, new, CORPUS, world, out, XbtConfig(**{**TINY, **cfg}),
                      version_id=out.name, show_progress=False)


def randomize(adapters: Adapters) -> None:
    """Non-zero adapter weights, as after training (LoRA B starts at zero)."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in adapters.named_parameters().values():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.05)


def batch(n: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(n, 3, 32, 32, generator=gen), torch.randint(1, 1000, (n, 24), generator=gen)


# ---------------------------------------------------------------------------- phi
def test_projector_shapes_and_one_stage1_step() -> None:
    torch.manual_seed(0)
    phi = Projector(48, 32)
    assert [type(m).__name__ for m in phi] == ["Linear", "LayerNorm", "GELU", "Linear",
                                               "LayerNorm", "GELU", "Linear"]
    assert (phi.fc1.in_features, phi.fc1.out_features, phi.fc3.out_features) == (48, 128, 32)
    assert phi(torch.randn(5, 48)).shape == (5, 32)
    w_new = nn.functional.normalize(torch.randn(16, 48), dim=-1)
    cache = TextCache(w_new, nn.functional.normalize(torch.randn(16, 32), dim=-1))
    task = PretrainTask(phi, cache, sigma=0.0, scale=XbtConfig().logit_scale, seed=0)
    idx = torch.arange(16)
    before = {k: v.clone() for k, v in phi.state_dict().items()}
    opt = torch.optim.AdamW(phi.parameters(), lr=1e-3)
    loss0 = task.losses(idx)["pretrain_loss"]
    loss0.backward()
    opt.step()
    assert all(not torch.equal(before[k], v) for k, v in phi.state_dict().items())
    assert float(task.losses(idx)["pretrain_loss"].detach()) < float(loss0.detach())


def test_stage1_adds_gaussian_noise_of_sigma() -> None:
    phi = Projector(8, 4)
    seen: list[torch.Tensor] = []
    phi.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    cache = TextCache(torch.zeros(4096, 8), torch.zeros(4096, 4))  # w_new = 0: input = eps
    PretrainTask(phi, cache, sigma=0.05, scale=1.0, seed=0).losses(torch.arange(4096))
    assert abs(float(seen[0].mean())) < 0.002 and abs(float(seen[0].std()) - 0.05) < 0.002


# ---------------------------------------------------------------------------- prompts
def test_prompts_grow_tokens_and_pool_the_class_token() -> None:
    torch.manual_seed(0)
    model = create_model(spec())
    images, _ = batch()
    plain = model.encode_image(images).detach()
    prompts = VisualPrompts(10, 64)
    prompts.attach(model.visual)
    lengths = []
    model.visual.transformer.resblocks[0].register_forward_pre_hook(
        lambda m, args: lengths.append(args[0].shape[1]))
    prompted = model.encode_image(images).detach()
    assert lengths == [1 + 16 + 10]  # class token + 4x4 patches + 10 prompts
    assert (prompted - plain).abs().max() > 1e-3
    # Reference: [CLS, prompts, patches] through the blocks, pool the class token.
    visual = model.visual
    with torch.no_grad():
        x = visual._embeds(images)
        x = torch.cat([x[:, :1], prompts.tokens.expand(3, -1, -1), x[:, 1:]], dim=1)
        for block in visual.transformer.resblocks:
            x = block(x)
        reference = visual.ln_post(x[:, 0]) @ visual.proj
    torch.testing.assert_close(prompted, reference, atol=1e-5, rtol=1e-5)
    prompts.enabled = False
    assert torch.equal(model.encode_image(images).detach(), plain)


def test_resnet_tower_refuses_prompts_and_trains_without(bases, world, tmp_path) -> None:
    model = create_model(resnet_spec())
    with pytest.raises(ConfigError, match="--set prompts=0"):
        Adapters.attach(model, XbtConfig(prompts=10).adapter_config())
    with pytest.raises(ConfigError, match="--set prompts=0"):
        run_upgrade(bases["v1"], resnet_spec(), world, tmp_path / "rn", prompts=10)
    assert not (tmp_path / "rn").exists()
    art = run_upgrade(bases["v1"], resnet_spec(), world, tmp_path / "rn", prompts=0,
                      batch_size=4)
    assert art.manifest["routes"]["v1"]["adapter_config"]["prompts"] == 0
    adapted = Adapters.attach(create_model(resnet_spec()), XbtConfig(prompts=0).adapter_config())
    towers = {name.split(".")[0] for name in adapted.lora_modules()}
    assert towers == {"visual", "transformer"}  # conv LoRA in the ResNet, attn/MLP in text
    assert load_encoder(art, "v1").encode_texts(["a red star"]).shape == (1, 32)


# ---------------------------------------------------------------------------- adapters
def test_lora_sits_in_attention_and_mlp_of_both_towers() -> None:
    adapters = Adapters.attach(create_model(spec()), XbtConfig().adapter_config())
    expected = {f"{tower}resblocks.0.{m}" for tower in ("visual.transformer.", "transformer.")
                for m in ("attn", "attn.base_layer.out_proj", "mlp.c_fc", "mlp.c_proj")}
    assert set(adapters.lora_modules()) == expected
    assert isinstance(adapters.model.visual.transformer.resblocks[0].attn, LoraSelfAttention)
    norms = {n.rsplit(".", 1)[0] for n in adapters.named_layer_norm_deltas()}
    assert {"visual.ln_pre", "visual.ln_post", "ln_final", "transformer.resblocks.0.ln_1",
            "visual.transformer.resblocks.0.ln_2"} <= norms
    lora = adapters.model.transformer.resblocks[0].attn
    assert (lora.r["xbt"], lora.scaling["xbt"], lora.lora_dropout["xbt"].p) == (16, 1.0, 0.1)


def test_unmerged_lora_attention_matches_merged_reference() -> None:
    torch.manual_seed(0)
    model = create_model(spec())
    adapters = Adapters.attach(model, XbtConfig(prompts=0).adapter_config())
    randomize(adapters)
    model.eval()
    lora = model.transformer.resblocks[0].attn
    base = lora.get_base_layer()
    weight_before = base.in_proj_weight.detach().clone()
    reference = copy.deepcopy(nn.MultiheadAttention(64, 2, batch_first=True))
    with torch.no_grad():
        reference.in_proj_weight.copy_(base.in_proj_weight + lora.get_delta_weight("xbt"))
        reference.in_proj_bias.copy_(base.in_proj_bias)
        out = base.out_proj
        reference.out_proj.weight.copy_(out.base_layer.weight + out.get_delta_weight("xbt"))
        reference.out_proj.bias.copy_(out.base_layer.bias)
        x = torch.randn(2, 24, 64)
        mask = model.attn_mask
        got = lora(x, x, x, need_weights=False, attn_mask=mask)[0]
        want = reference(x, x, x, need_weights=False, attn_mask=mask)[0]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(base.in_proj_weight, weight_before)  # never merged into the base weight


def test_adapters_off_give_the_off_the_shelf_model_exactly() -> None:
    torch.manual_seed(0)
    reference = create_model(spec())
    model = copy.deepcopy(reference)
    adapters = Adapters.attach(model, XbtConfig().adapter_config())
    randomize(adapters)
    # Frozen like the adapted model's base: torch picks nn.MultiheadAttention's kernel by
    # whether its weights require grad (even under no_grad), and the two kernels differ
    # in the last bits (~1e-6).
    reference.requires_grad_(False)
    images, tokens = batch()
    with torch.no_grad():
        on = model.encode_image(images), model.encode_text(tokens)
        with adapters.disabled():
            off = model.encode_image(images), model.encode_text(tokens)
        want = reference.encode_image(images), reference.encode_text(tokens)
    assert torch.equal(off[0], want[0]) and torch.equal(off[1], want[1])
    assert (on[0] - want[0]).abs().max() > 1e-3 and (on[1] - want[1]).abs().max() > 1e-3


def test_stage2_trains_only_adapters_prompts_and_phi_layer_norms(bases, world) -> None:
    cfg = XbtConfig(**{**TINY, "steps": 2})
    p = prepare(bases["v1"], bases["new"], CORPUS, world, cfg, show_progress=False)
    phi = Projector(48, 32).to(p.device)  # stage 1 leaves it on the model's device
    mine = set(p.adapters.named_parameters())
    base_before = {k: v.clone() for k, v in p.model.state_dict().items() if k not in mine}
    phi_before = {k: v.cpu().clone() for k, v in phi.state_dict().items()}
    groups = stage2_groups(p.adapters, phi, cfg, train_phi="layer_norms")
    assert [g["lr"] for g in groups] == [1e-4, 1e-4, 1e-2]
    assert groups[2]["params"] == [p.model.visual.soft_prompts.tokens]
    trainable = {n for n, q in p.model.named_parameters() if q.requires_grad}
    assert trainable == set(p.adapters.named_parameters())
    assert all(".lora_" in n or n.endswith(("delta_weight", "delta_bias", "soft_prompts.tokens"))
               for n in trainable)
    assert {n for n, q in phi.named_parameters() if q.requires_grad} == {
        "ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias"}
    train_stage2(p.adapters, phi, p.pairs, cfg, show_progress=False)
    after = {k: v.cpu() for k, v in phi.state_dict().items()}  # trained on p.device
    assert all(torch.equal(phi_before[k], after[k]) for k in phi_before if k.startswith("fc"))
    assert not torch.equal(phi_before["ln1.weight"], after["ln1.weight"])
    state = p.model.state_dict()
    assert all(torch.equal(v, state[k]) for k, v in base_before.items())  # base never moves


# ---------------------------------------------------------------------------- the upgrade
@pytest.mark.parametrize("anchors", [{"anchor": True}, {"anchor": True, "pair_anchor": True}])
def test_old_model_is_released_before_stage2(bases, world, tmp_path, monkeypatch,
                                             anchors) -> None:
    old_refs: list[weakref.ref] = []
    calls = {"old": 0, "old_in_stage2": 0}
    in_stage2 = {"now": False}
    real_load, real_stage2 = preparation.load_encoder, stage2.train_stage2

    def spy_load(*args, **kwargs):
        encoder = real_load(*args, **kwargs)
        inner = encoder.encode_texts

        def counted(*a, **k):
            calls["old"] += 1
            calls["old_in_stage2"] += in_stage2["now"]
            return inner(*a, **k)
        encoder.encode_texts = counted
        old_refs.append(weakref.ref(encoder))
        return encoder

    def spy_stage2(*args, **kwargs):
        gc.collect()
        assert all(ref() is None for ref in old_refs), "the old model is alive in stage 2"
        in_stage2["now"] = True
        try:
            return real_stage2(*args, **kwargs)
        finally:
            in_stage2["now"] = False

    monkeypatch.setattr(preparation, "load_encoder", spy_load)
    monkeypatch.setattr(stage2, "train_stage2", spy_stage2)
    art = run_upgrade(bases["v1"], bases["new"], world, tmp_path / "v2", **anchors)
    assert calls["old"] > 0 and calls["old_in_stage2"] == 0 and len(old_refs) == 1
    hyper = art.manifest["hyperparameters"]
    assert hyper["anchor"] is True and hyper["pair_anchor"] is anchors.get("pair_anchor", False)


def test_pair_anchor_term_is_direct_loss_on_cached_old_pair_embeddings(bases, world) -> None:
    """Stage 2's pair anchor scores the batch's new projections against the old version's
    embeddings of the same images and captions, cached in stage 1 (old model released)."""
    cfg = XbtConfig(**{**TINY, "pair_anchor": True, "pair_anchor_weight": 0.5})
    p = prepare(bases["v1"], bases["new"], CORPUS, world, cfg, show_progress=False)
    _, anchors = cache_text(p, cfg, show_progress=False)
    assert anchors.corpus is None and anchors.pairs is not None
    old = load_encoder(bases["v1"], device=p.device)  # the device the anchors were made on
    want_images = old.encode_image_tensors(p.pairs.pixels)
    want_texts = old.encode_texts(p.pairs.captions)
    assert anchors.pairs.images.shape == (len(p.pairs.pixels), 32)
    assert torch.allclose(anchors.pairs.images.cpu(), torch.from_numpy(want_images), atol=1e-5)
    assert torch.allclose(anchors.pairs.texts.cpu(), torch.from_numpy(want_texts), atol=1e-5)
    phi = Projector(48, 32).to(p.device).eval()  # on the model's device, as stage 1 leaves it
    p.model.eval()
    task = XbtTask(p.model, phi, p.pairs, cfg, anchors)
    images, captions = torch.tensor([0, 2, 4]), torch.tensor([0, 10, 20])
    with torch.no_grad():
        losses = task.losses((images, captions))
        v = to_old_space(phi, p.model.encode_image(p.pairs.pixels[images].float().to(p.device)))
        w = to_old_space(phi, p.model.encode_text(p.pairs.tokens[captions].to(p.device)))
        scale = cfg.logit_scale
        by_hand = 0.5 * (clip_loss(v.cpu(), torch.from_numpy(want_texts[[0, 10, 20]]), scale)
                         + clip_loss(torch.from_numpy(want_images[[0, 2, 4]]), w.cpu(), scale))
    assert set(losses) == {"xbt_loss", "pair_anchor_loss"}
    assert torch.allclose(losses["pair_anchor_loss"].cpu(), by_hand, atol=1e-5)


@pytest.mark.parametrize("init", ["random", "procrustes"])
def test_artifact_round_trip_reproduces_in_memory_embeddings(init, bases, world,
                                                             tmp_path) -> None:
    cfg = XbtConfig(**TINY, init=init)
    p = prepare(bases["v1"], bases["new"], CORPUS, world, cfg, show_progress=False)
    phi, metrics = train_upgrade(p, cfg, show_progress=False)
    art = write_upgrade(p, phi, cfg, metrics, tmp_path / "v2", version_id="v2")
    head = ProjectorHead(phi)
    memory = Encoder(p.model, create_tokenizer(p.spec), "cpu", text_head=head, image_head=head)
    loaded = load_encoder(load_artifact(tmp_path / "v2"), space="v1", device="cpu")
    images = [world.load_image(i) for i in range(4)]
    texts = ["a red circle", "a small blue star on the left"]
    np.testing.assert_allclose(loaded.encode_images(images), memory.encode_images(images),
                               atol=1e-6)
    np.testing.assert_allclose(loaded.encode_texts(texts), memory.encode_texts(texts), atol=1e-6)
    assert loaded.embed_dim == 32
    native = load_encoder(art, device="cpu")  # new->new: the untouched new model
    off_the_shelf = load_encoder(bases["new"], device="cpu")
    assert np.array_equal(native.encode_texts(texts), off_the_shelf.encode_texts(texts))
    m = art.manifest
    assert (m["kind"], m["parent"], m["target_space"], m["space"]) == ("xbt", "v1", "v1", "new")
    assert set(m["routes"]) == {"new", "v1"} and m["routes"]["v1"]["kind"] == "projector"
    assert XbtConfig.from_dict(m["hyperparameters"]) == cfg
    assert set(m["files"]) == {WEIGHTS, ADAPTERS_FILE, PROJECTOR_FILE}
    assert m["routes"]["v1"]["projector_dims"].get("skip", False) is (init == "procrustes")


def test_three_version_chain_maps_into_the_root_space(bases, world, tmp_path,
                                                      monkeypatch) -> None:
    v2 = run_upgrade(bases["v1"], bases["new"], world, tmp_path / "v2")
    routed: list[tuple[str, str]] = []
    real_load = preparation.load_encoder

    def spy(art, space, *rest):
        routed.append((art.version_id, space))
        return real_load(art, space, *rest)
    monkeypatch.setattr(preparation, "load_encoder", spy)
    v3 = run_upgrade(v2, spec(40), world, tmp_path / "v3")
    assert routed == [("v2", "v1")]  # stage 1's "old text tower": v2 routed into v1's space
    assert (v3.manifest["parent"], v3.manifest["target_space"]) == ("v2", "v1")
    assert set(v3.routes) == {"v3", "v1"}
    assert load_encoder(v3, "v1").encode_texts(["a red star"]).shape == (1, 32)
    matrix = compatibility_of_artifacts([bases["v1"], v2, v3], world.subset(range(4)))
    assert matrix["cells"]["v3"]["v1"] is not None and matrix["cells"]["v2"]["v1"] is not None
    assert matrix["cells"]["v1"]["v3"] is None


def test_direct_baseline_trains_all_of_a_random_phi(bases, world, tmp_path,
                                                    monkeypatch) -> None:
    seen = {}
    real = direct_training.train_direct

    def spy(adapters, phi, *args, **kwargs):
        seen["fc1"] = phi.fc1.weight.detach().cpu().clone()  # trained on CUDA if present
        result = real(adapters, phi, *args, **kwargs)
        seen["trained"] = {n for n, q in phi.named_parameters() if q.requires_grad}
        return result
    monkeypatch.setattr(direct_training, "train_direct", spy)
    art = run_upgrade(bases["v1"], bases["new"], world, tmp_path / "d", method="direct")
    assert art.manifest["method"] == "direct" and "direct" in art.manifest["metrics"]
    assert seen["trained"] == {n for n, _ in Projector(48, 32).named_parameters()}
    fc1 = art.tensors(PROJECTOR_FILE)["fc1.weight"]
    assert not torch.equal(fc1, seen["fc1"])
    assert load_encoder(art, "v1").encode_texts(["a star"]).shape == (1, 32)


# ---------------------------------------------------------------------------- bad input
def _mismatched_old(bases, tmp_path: Path) -> object:
    good = bases["v1"]
    manifest = {k: v for k, v in good.manifest.items() if k not in ("files", "format")}
    return write_artifact(tmp_path / "liar", {**manifest, "embed_dim": 99},
                          {WEIGHTS: good.tensors(WEIGHTS)})


@pytest.mark.parametrize("case, error, message", [
    ("dims", ConfigError, "dimension mismatch"),
    ("tokenizer", ConfigError, "tokenizer mismatch"),
    ("space", ConfigError, "no route into space 'elsewhere'"),
    ("same space", ConfigError, "already embeds natively into space 'v1'"),
    ("corpus", DataError, "corpus"),
    ("pairs", DataError, "paired set is empty"),
])
def test_bad_input_fails_before_training_and_writes_nothing(case, error, message, bases, world,
                                                             tmp_path, monkeypatch) -> None:
    for trains in (stage1, stage2, direct_training):
        monkeypatch.setattr(trains, "train", lambda *a, **k: pytest.fail("training started"))
    old, new, corpus, pairs, target = bases["v1"], bases["new"], CORPUS, world, None
    if case == "dims":
        old = _mismatched_old(bases, tmp_path)
    elif case == "tokenizer":
        new = spec(48)
        new.config["text_cfg"]["vocab_size"] = 1000  # the tokenizer emits ids up to 49407
    elif case == "space":
        target = "elsewhere"
    elif case == "same space":
        new = old
    elif case == "corpus":
        (tmp_path / "empty.txt").write_text("\n  \n")
        corpus = str(tmp_path / "empty.txt")
    else:
        pairs = world.subset([])
    with pytest.raises(error, match=message):
        upgrade(old, new, corpus, pairs, tmp_path / "out", XbtConfig(**TINY),
                   target_space=target, show_progress=False)
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


@pytest.mark.parametrize("kwargs, message", [
    ({"method": "nope"}, "method"), ({"noise_sigma": -1}, "noise_sigma"),
    ({"prompt_lr": 0}, "prompt_lr"), ({"lora_r": 0}, "lora_r"), ({"steps": 0}, "steps"),
    ({"log_logit_scale": 5.0}, "logit scale"), ({"anchor": True, "method": "direct"}, "anchor"),
])
def test_bad_config(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        XbtConfig(**kwargs)


def test_config_from_dict_is_strict_and_reads_manifests_leniently() -> None:
    with pytest.raises(ConfigError, match=r"no field\(s\) \['anchr'\].*anchr -> anchor"):
        XbtConfig.from_dict({"anchr": "true"})
    cfg = XbtConfig.from_dict({"anchor": "true", "steps": "3", "lr": "3e-4"})
    assert (cfg.anchor, cfg.steps, cfg.lr) == (True, 3, 3e-4)
    assert XbtConfig.from_dict(cfg.to_dict()) == cfg  # package_version is a recorded key
    recorded = {**cfg.to_dict(), "from_a_newer_version": 1}
    assert XbtConfig.from_dict(recorded, lenient=True) == cfg
    with pytest.raises(ConfigError, match="from_a_newer_version"):
        XbtConfig.from_dict(recorded)


def test_upgrade_methods_are_registered_by_name() -> None:
    from training.upgrades import UPGRADES, get_upgrade
    from training.upgrades.direct.method import Direct
    from training.upgrades.xbt.method import Xbt

    assert dict(UPGRADES) == {"xbt": Xbt, "direct": Direct}
    with pytest.raises(ConfigError, match="unknown upgrade method 'nope'; known methods: "
                                          "direct, xbt"):
        get_upgrade("nope")
    with pytest.raises(ConfigError, match="method 'direct'"):
        Direct(XbtConfig())  # a config for another method


# ---------------------------------------------------------------------------- CLI
def test_cli_upgrade_then_eval_and_missing_images(bases, tmp_path, capsys) -> None:
    data = tmp_path / "pairs"
    write_dataset(data, n=24, seed=9, languages=("en",), image_size=32)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS))
    common = ["upgrade", "xbt", "--old", str(bases["v1"].path), "--corpus", str(corpus),
              "--set", "pretrain_steps=2", "--set", "pretrain-batch-size=8", "--set", "steps=1",
              "--set", "batch_size=8", "--preset", "paper", "--json"]
    assert main([*common, "--new", str(bases["new"].path), "--pairs", str(data),
                 "--out", str(tmp_path / "v2"), "--version-id", "v2", "--set", "prompts=0"]) == 0
    manifest = json.loads(capsys.readouterr().out)
    assert manifest["routes"]["v1"]["adapter_config"]["prompts"] == 0
    assert manifest["hyperparameters"]["pretrain_steps"] == 2
    assert manifest["hyperparameters"]["select_every"] == 0  # --preset paper: no selection
    assert "selection" not in manifest["metrics"] and manifest["metrics"]["pair_images"] == 24
    assert main(["eval", str(bases["v1"].path), str(tmp_path / "v2"), "--data", str(data),
                 "--json"]) == 0
    matrix = json.loads(capsys.readouterr().out)
    assert 0 <= matrix["cells"]["v2"]["v1"]["t2i"]["R@1"] <= 1
    assert matrix["cells"]["v1"]["v2"] is None
    next(data.glob("**/*.png")).unlink()
    assert main([*common, "--new", str(bases["new"].path), "--pairs", str(data),
                 "--out", str(tmp_path / "v3")]) == 2
    assert "image file not found" in capsys.readouterr().err
    assert not (tmp_path / "v3").exists()


def test_cli_upgrade_direct_runs_the_direct_baseline(bases, tmp_path, capsys) -> None:
    data = tmp_path / "pairs"
    write_dataset(data, n=16, seed=9, languages=("en",), image_size=32)
    args = ["upgrade", "direct", "--old", str(bases["v1"].path), "--new", str(bases["new"].path),
            "--corpus", "synth:20", "--pairs", str(data), "--out", str(tmp_path / "d"),
            "--set", "steps=1", "--set", "batch_size=8", "--json"]
    assert main(args) == 0
    manifest = json.loads(capsys.readouterr().out)
    assert manifest["method"] == manifest["hyperparameters"]["method"] == "direct"
    assert "direct" in manifest["metrics"] and "stage2" not in manifest["metrics"]
    assert main([*args[:-1], "--set", "anchor=true"]) == 2  # Direct takes no anchors
    assert "anchor and pair_anchor apply to method 'xbt'" in capsys.readouterr().err


def test_a_slerp_mixed_xbt_route_carries_the_old_model(bases, world, tmp_path) -> None:
    """``slerp_t``: the route answers slerp(phi(new(q)), old(q), t); at t = 1 it is OLD's
    own query, at t = 0.5 the two routes' midpoint; the artifact carries OLD's weights."""
    from dataclasses import replace

    import torch

    from training.upgrades.adapter.maps import slerp

    cfg = XbtConfig(**TINY)
    p = prepare(bases["v1"], bases["new"], CORPUS, world, cfg, show_progress=False)
    phi, metrics = train_upgrade(p, cfg, show_progress=False)
    plain = write_upgrade(p, phi, cfg, metrics, tmp_path / "plain", version_id="plain")
    ends = write_upgrade(p, phi, replace(cfg, slerp_t=1.0), metrics, tmp_path / "t1",
                            version_id="t1")
    half = write_upgrade(p, phi, replace(cfg, slerp_t=0.5), metrics, tmp_path / "t5",
                            version_id="t5")
    assert "old_model.safetensors" in load_artifact(ends.path).manifest["files"]
    texts = ["a red circle", "a small blue star on the left"]
    images = [world.load_image(i) for i in range(3)]
    old = load_encoder(bases["v1"], device="cpu")
    np.testing.assert_allclose(load_encoder(load_artifact(ends.path), "v1").encode_texts(texts),
                               old.encode_texts(texts), atol=1e-5)
    routed = load_encoder(load_artifact(plain.path), "v1").encode_images(images)
    expected = slerp(torch.from_numpy(routed), torch.from_numpy(old.encode_images(images)), 0.5)
    np.testing.assert_allclose(load_encoder(load_artifact(half.path), "v1").encode_images(images),
                               expected.numpy(), atol=1e-5)
    with pytest.raises(ConfigError, match="slerp_t"):
        XbtConfig(slerp_t=2.0)
