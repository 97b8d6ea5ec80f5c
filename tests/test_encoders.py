"""The three loading paths of open_clip models, encoding, and preprocessing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import open_clip
import pytest
import torch
from safetensors.torch import save_file

from tests.conftest import MICRO_CONFIG
from training import encoders
from training.artifacts import model_state
from training.encoders import Encoder, ModelSpec, create_model, create_tokenizer, pick_device
from training.errors import ModelLoadError

TEXTS = ["a red circle", "a big blue square on the left", "a green star", "a small triangle"]


def _images(dataset, n: int = 5):
    return [dataset.load_image(i) for i in range(n)]


def test_config_path_encodes_normalised_float32(micro_config_file: Path, small_world) -> None:
    enc = Encoder.from_spec(ModelSpec.from_json(micro_config_file), device="cpu")
    text = enc.encode_texts(TEXTS, batch_size=3)
    image = enc.encode_images(_images(small_world), batch_size=2)
    assert text.dtype == np.float32 and image.dtype == np.float32
    assert text.shape == (4, 32) and image.shape == (5, 32)
    np.testing.assert_allclose(np.linalg.norm(text, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(image, axis=1), 1.0, atol=1e-5)
    # batching does not change results
    np.testing.assert_allclose(enc.encode_texts(TEXTS, batch_size=64), text, atol=1e-5)
    np.testing.assert_allclose(enc.encode_images(_images(small_world), batch_size=64), image,
                               atol=1e-5)


def test_preprocessing_follows_model_config(micro_config_file: Path, small_world) -> None:
    enc = Encoder.from_spec(ModelSpec.from_json(micro_config_file), device="cpu")
    cfg = enc.model.visual.preprocess_cfg
    assert tuple(cfg["size"]) == (32, 32)
    assert list(cfg["mean"]) == [0.5, 0.5, 0.5] and cfg["interpolation"] == "bilinear"
    pixels = enc.image_tensors(_images(small_world, 1))
    assert pixels.shape == (1, 3, 32, 32)
    # a white pixel maps to (1 - 0.5) / 0.25 = 2.0 with this mean/std
    white = enc.preprocess(small_world.load_image(0).point(lambda _: 255))
    assert torch.allclose(white, torch.full_like(white, 2.0))


def test_config_plus_checkpoint_reproduces_weights(micro_spec, tmp_path: Path) -> None:
    model = create_model(micro_spec)
    ckpt = tmp_path / "w.safetensors"
    save_file(model_state(model), str(ckpt))
    spec = ModelSpec(config=micro_spec.config, checkpoint=str(ckpt), preprocess=micro_spec.preprocess)
    a = Encoder(model, create_tokenizer(micro_spec), "cpu").encode_texts(TEXTS)
    b = Encoder.from_spec(spec, "cpu").encode_texts(TEXTS)
    np.testing.assert_array_equal(a, b)


def test_arch_name_plus_local_checkpoint(micro_spec, tmp_path: Path) -> None:
    cfg_file = tmp_path / "nbf-micro-arch.json"
    cfg_file.write_text(json.dumps(MICRO_CONFIG))
    open_clip.add_model_config(cfg_file)  # registers the architecture name "nbf-micro-arch"
    source = create_model(ModelSpec(arch="nbf-micro-arch"))
    ckpt = tmp_path / "weights.pt"
    torch.save(source.state_dict(), ckpt)
    loaded = Encoder.from_spec(ModelSpec(arch="nbf-micro-arch", checkpoint=str(ckpt)), "cpu")
    expected = Encoder(source, loaded.tokenizer, "cpu").encode_texts(TEXTS)
    np.testing.assert_array_equal(loaded.encode_texts(TEXTS), expected)


def test_pretrained_tag_fails_fast_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(encoders, "HUB_HOST", ("127.0.0.1", 9))  # nothing listens: offline
    monkeypatch.setattr(encoders, "_cached_hub_file", lambda cfg: None)
    with pytest.raises(ModelLoadError, match="could not fetch the weights.*local checkpoint"):
        create_model(ModelSpec(arch="ViT-B-32", pretrained="laion2b_s34b_b79k"))


def test_unknown_tag_lists_known_tags() -> None:
    with pytest.raises(ModelLoadError, match="unknown pretrained tag 'nope'.*laion2b_s34b_b79k"):
        create_model(ModelSpec(arch="ViT-B-32", pretrained="nope"))


@pytest.mark.parametrize("kwargs, message", [
    ({}, "exactly one of"),
    ({"arch": "ViT-B-32", "config": MICRO_CONFIG}, "exactly one of"),
    ({"arch": "ViT-B-32", "pretrained": "openai", "checkpoint": "x.pt"}, "not both"),
])
def test_bad_specs_are_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(ModelLoadError, match=message):
        ModelSpec(**kwargs)


def test_missing_and_mismatched_checkpoints(micro_spec, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="checkpoint file not found"):
        create_model(ModelSpec(config=micro_spec.config, checkpoint=str(tmp_path / "none.pt")))
    wrong = tmp_path / "wrong.safetensors"
    save_file({"foo": torch.zeros(2)}, str(wrong))
    with pytest.raises(ModelLoadError, match="does not match the architecture"):
        create_model(ModelSpec(config=micro_spec.config, checkpoint=str(wrong)))
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(ModelLoadError, match="could not be read"):
        create_model(ModelSpec(config=micro_spec.config, checkpoint=str(garbage)))


def test_bad_json_configs(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not found"):
        ModelSpec.from_json(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        ModelSpec.from_json(bad)
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"embed_dim": 8}))
    with pytest.raises(ModelLoadError, match="vision_cfg"):
        ModelSpec.from_json(partial)


def test_device_auto_selection() -> None:
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert pick_device().type == expected
    assert pick_device("cpu").type == "cpu"


def test_packed_text_forward_equals_the_padded_one(micro_spec) -> None:
    """Texts are encoded end to end without their padding (causal tower, EOT pooling): the
    result is the padded forward's, for one text, for a batch of mixed lengths, and when
    the batch is split over several packs."""
    torch.manual_seed(0)
    model = create_model(micro_spec).eval()
    tokens = create_tokenizer(micro_spec)(TEXTS + ["a very small blue square in the corner"])
    inner = tokens[:1].clone()
    inner[0, 2] = 0  # id 0 ("!" inside a word) is also the padding id: a text may hold it
    tokens = torch.cat([tokens, inner])
    lengths = encoders.text_lengths(tokens)
    assert lengths[-1] == lengths[0] == int((tokens[0] != 0).sum())
    assert int(lengths.max()) < tokens.shape[1]
    with torch.inference_mode():
        full = model.encode_text(tokens)
        packed = encoders.encode_text_packed(model, tokens)
        alone = encoders.encode_text_packed(model, tokens[:1])
        split = encoders.encode_text_packed(model, tokens, pack_tokens=int(lengths.max()) + 1)
    for out in (packed, split):
        assert torch.allclose(out, full, atol=1e-5)
    assert torch.allclose(alone, full[:1], atol=1e-5)
    # the Encoder path uses it
    enc = Encoder(model, create_tokenizer(micro_spec), "cpu")
    np.testing.assert_allclose(enc.encode_texts(TEXTS), torch.nn.functional.normalize(
        full[:len(TEXTS)], dim=-1).numpy(), atol=1e-5)


def test_packing_runs_no_padding_column(micro_spec, monkeypatch) -> None:
    """The transformer sees one row holding exactly the texts' tokens, not B padded rows."""
    model = create_model(micro_spec).eval()
    tokens = create_tokenizer(micro_spec)(TEXTS)
    shapes = []
    forward = model.transformer.forward
    monkeypatch.setattr(model.transformer, "forward",
                        lambda x, attn_mask=None: shapes.append(tuple(x.shape[:2]))
                        or forward(x, attn_mask=attn_mask))
    with torch.inference_mode():
        encoders.encode_text_packed(model, tokens)
    assert shapes == [(1, int(encoders.text_lengths(tokens).sum()))]


def test_packing_leaves_a_non_causal_tower_alone(micro_spec, monkeypatch) -> None:
    torch.manual_seed(0)
    model = create_model(micro_spec).eval()
    model.attn_mask = None  # bidirectional: padding would change the result, so no cut
    tokens = create_tokenizer(micro_spec)(TEXTS)
    calls = []
    monkeypatch.setattr(model, "encode_text", lambda t: calls.append(t.shape) or t.float())
    encoders.encode_text_packed(model, tokens)
    assert calls == [tokens.shape]


def test_one_forward_gives_the_routes_vector_and_the_towers_own(micro_spec) -> None:
    """``encode_*_both``: the head's output and the towers' own, equal to what two encoders
    (the route's, the native one) give apart; and an embedder shares its towers with the
    same version's native embedder only where both run the version's unchanged towers."""
    from concurrent.futures import ThreadPoolExecutor

    from service.runtime.embedder import Batching, Embedder

    torch.manual_seed(0)
    model = create_model(micro_spec)
    tokenizer = create_tokenizer(micro_spec)
    dim = Encoder(model, tokenizer, "cpu").embed_dim
    head = torch.nn.Linear(dim, 6)
    routed = Encoder(model, tokenizer, "cpu", text_head=head, image_head=head,
                     native_towers=True)
    native = Encoder(model, tokenizer, "cpu", native_towers=True)
    a, b = routed.encode_texts_both(TEXTS)
    np.testing.assert_allclose(a, routed.encode_texts(TEXTS), atol=1e-5)
    np.testing.assert_allclose(b, native.encode_texts(TEXTS), atol=1e-5)
    pixels = torch.rand(3, 3, 32, 32)
    a, b = routed.encode_image_tensors_both(pixels)
    np.testing.assert_allclose(a, routed.encode_image_tensors(pixels), atol=1e-5)
    np.testing.assert_allclose(b, native.encode_image_tensors(pixels), atol=1e-5)
    lane, batching = ThreadPoolExecutor(1), Batching(8, 0.001)
    route_e = Embedder(routed, "v2", "v1", "adapter", lane, batching)
    native_e = Embedder(native, "v2", "v2", "native", lane, batching)
    assert route_e.shares_towers(native_e)
    assert not route_e.shares_towers(Embedder(native, "v3", "v3", "native", lane, batching))
    lora = Encoder(model, tokenizer, "cpu", text_head=head, image_head=head)  # towers changed
    assert not Embedder(lora, "v2", "v1", "projector", lane, batching).shares_towers(native_e)
    lane.shutdown()


def test_pixels_of_many_images_equal_each_images_own(micro_spec) -> None:
    """``Embedder.pixels_many`` (the rerank fill's preprocessing: the tensor steps once for
    the stacked images, in numpy) and ``pixels`` give exactly the model's own preprocess
    of each image, whatever their sizes and modes; a preprocess of another shape falls
    back to it one by one."""
    from concurrent.futures import ThreadPoolExecutor

    from PIL import Image
    from torchvision import transforms

    from service.runtime.embedder import Batching, Embedder

    encoder = Encoder(create_model(micro_spec), create_tokenizer(micro_spec), "cpu")
    lane = ThreadPoolExecutor(1)
    embedder = Embedder(encoder, "v1", "v1", "native", lane, Batching(8, 0.001))
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
              for h, w in ((32, 32), (50, 41), (17, 90), (200, 120))]
    images += [images[1].convert("L"), images[2].convert("RGBA"), images[3].convert("P")]
    def one_by_one(image):  # the model's own preprocess, in torch, one image
        return encoder.preprocess(image.convert("RGB"))

    calls = []
    embedder._preprocess = lambda image: calls.append(image) or one_by_one(image)  # type: ignore
    many = embedder.pixels_many(images)
    assert calls == []  # the batched path ran
    assert len(many) == len(images)
    for image, pixels in zip(images, many, strict=True):
        assert torch.equal(pixels, one_by_one(image))
        assert torch.equal(embedder.pixels(image), one_by_one(image))  # one alone: the same
    assert calls == [] and embedder.pixels_many([]) == []
    steps = encoder.preprocess.transforms
    normalize = next(t for t in steps if isinstance(t, transforms.Normalize))
    for other in ([transforms.Resize(24), transforms.ToTensor(), normalize],  # sizes differ
                  [transforms.Lambda(np.array), transforms.ToTensor(), normalize]):
        encoder.preprocess = transforms.Compose(other)
        for image, pixels in zip(images, embedder.pixels_many(iter(images)), strict=True):
            assert torch.equal(pixels, one_by_one(image))
    assert calls == []
    encoder.preprocess = transforms.Compose([*steps, transforms.Lambda(lambda x: x * 2)])
    for image, pixels in zip(images, embedder.pixels_many(images), strict=True):
        assert torch.equal(pixels, one_by_one(image))  # one by one: the same again
    assert len(calls) == len(images)
    lane.shutdown()
