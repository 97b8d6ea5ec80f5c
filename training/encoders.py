"""Load open_clip models and encode text and images to normalised embeddings.

Three ways to get a model (``ModelSpec``):
1. ``arch`` + ``pretrained`` tag (weights from the hub; fails fast when unreachable),
2. ``arch`` + ``checkpoint`` (a local weights file),
3. ``config`` (an open_clip model config dict, e.g. from a JSON file, for tiny
   models) + optional ``checkpoint``.
"""

from __future__ import annotations

import copy
import json
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import open_clip
import torch
from open_clip.factory import load_state_dict
from open_clip.model import get_model_preprocess_cfg, set_model_preprocess_cfg
from open_clip.transform import (
    MaybeConvertMode,
    MaybeToTensor,
    PreprocessCfg,
    image_transform_v2,
    merge_preprocess_dict,
)
from PIL import Image
from torchvision import transforms

from training.errors import ModelLoadError

HUB_HOST = ("huggingface.co", 443)
HUB_PROBE_TIMEOUT_S = 3.0
PAD_ID = 0  # open_clip's SimpleTokenizer pads with token id 0


def pick_device(device: str | torch.device | None = None) -> torch.device:
    """The requested device, else CUDA when present, else CPU."""
    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass
class ModelSpec:
    """Where a model's architecture and weights come from."""

    arch: str | None = None  # open_clip architecture name, e.g. "ViT-B-32"
    pretrained: str | None = None  # open_clip pretrained tag, e.g. "laion2b_s34b_b79k"
    checkpoint: str | None = None  # local weights file (.safetensors, .pt, .bin)
    config: dict[str, Any] | None = None  # open_clip model config (embed_dim, vision_cfg, text_cfg)
    preprocess: dict[str, Any] = field(default_factory=dict)  # overrides of PreprocessCfg fields
    # Vocabulary extension of the tokenizer: {"added_merges": [[a, b], ...]}, BPE merges
    # appended after the base tokenizer's own (a continual language phase writes it).
    tokenizer: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if (self.arch is None) == (self.config is None):
            raise ModelLoadError("a model spec needs exactly one of `arch` or `config`")
        if self.pretrained and self.checkpoint:
            raise ModelLoadError("give either a pretrained tag or a local checkpoint, not both")
        if self.config is not None and self.pretrained:
            raise ModelLoadError("a pretrained tag needs an open_clip architecture name (`arch`)")

    @classmethod
    def from_json(cls, path: str | Path, checkpoint: str | None = None) -> ModelSpec:
        """A spec from a JSON model config file (open_clip's format, or ``{"model_cfg": ...}``)."""
        try:
            raw = json.loads(Path(path).read_text())
        except FileNotFoundError as exc:
            raise ModelLoadError(f"model config file not found: {path}") from exc
        except json.JSONDecodeError as exc:
            raise ModelLoadError(f"model config {path} is not valid JSON: {exc}") from exc
        config = raw.get("model_cfg", raw)
        for key in ("embed_dim", "vision_cfg", "text_cfg"):
            if key not in config:
                raise ModelLoadError(f"model config {path} lacks the required key '{key}'")
        return cls(config=config, checkpoint=checkpoint, preprocess=raw.get("preprocess_cfg", {}))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSpec:
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def without_weights(self) -> ModelSpec:
        """The same architecture with no weight source (weights come from elsewhere)."""
        return ModelSpec(arch=self.arch, config=copy.deepcopy(self.config),
                         preprocess=dict(self.preprocess),
                         tokenizer=copy.deepcopy(self.tokenizer))

    def describe(self) -> str:
        if self.arch:
            source = self.pretrained or self.checkpoint or "random init"
            return f"{self.arch} ({source})"
        return f"config embed_dim={self.config['embed_dim']} ({self.checkpoint or 'random init'})"


def _hub_reachable() -> bool:
    try:
        socket.create_connection(HUB_HOST, timeout=HUB_PROBE_TIMEOUT_S).close()
        return True
    except OSError:
        return False


def _cached_hub_file(tag_cfg: dict[str, Any]) -> str | None:
    """A locally cached weights file for a pretrained tag, if the hub cache holds one."""
    repo = (tag_cfg.get("hf_hub") or "").strip("/")
    if not repo:
        return None
    from huggingface_hub import try_to_load_from_cache

    for filename in ("open_clip_model.safetensors", "open_clip_pytorch_model.bin"):
        found = try_to_load_from_cache(repo, filename)
        if isinstance(found, str):
            return found
    return None


def _create_from_tag(spec: ModelSpec) -> torch.nn.Module:
    """Arch + pretrained tag: use the local hub cache, else download; fail fast offline."""
    tag_cfg = open_clip.get_pretrained_cfg(spec.arch, spec.pretrained)
    if not tag_cfg:
        known = open_clip.list_pretrained_tags_by_model(spec.arch)
        raise ModelLoadError(f"unknown pretrained tag '{spec.pretrained}' for {spec.arch}; "
                             f"known tags: {', '.join(known) or 'none'}")
    preprocess = merge_preprocess_dict(tag_cfg, spec.preprocess)
    cached = _cached_hub_file(tag_cfg)
    if cached is None and not _hub_reachable():
        raise ModelLoadError(
            f"could not fetch the weights of {spec.arch}/{spec.pretrained}: the model hub "
            f"({HUB_HOST[0]}) is unreachable and the weights are not cached. Download them "
            f"where the hub is reachable and pass the file as a local checkpoint "
            f"(--checkpoint PATH, or ModelSpec(arch='{spec.arch}', checkpoint=PATH)).")
    try:
        return open_clip.create_model(spec.arch, pretrained=cached or spec.pretrained,
                                      force_preprocess_cfg=preprocess)
    except RuntimeError as exc:
        raise ModelLoadError(
            f"could not fetch the weights of {spec.arch}/{spec.pretrained}: {exc}. Pass a local "
            f"checkpoint instead (--checkpoint PATH).") from exc


def _create_from_config(config: dict[str, Any], preprocess: dict[str, Any]) -> torch.nn.Module:
    cfg = copy.deepcopy(config)
    custom_text = cfg.pop("custom_text", False)
    cls = open_clip.CustomTextCLIP if custom_text else open_clip.CLIP
    try:
        model = cls(**cfg)
    except TypeError as exc:
        raise ModelLoadError(f"invalid open_clip model config: {exc}") from exc
    merged = merge_preprocess_dict(PreprocessCfg(), preprocess)
    merged["size"] = model.visual.image_size
    set_model_preprocess_cfg(model, merged)
    return model


def load_weights(model: torch.nn.Module, checkpoint: str | Path) -> None:
    """Load a full-model state dict (safetensors or torch file), strictly."""
    path = Path(checkpoint)
    if not path.is_file():
        raise ModelLoadError(f"checkpoint file not found: {path}")
    try:
        state = load_state_dict(str(path))
    except Exception as exc:  # corrupt files raise many types (pickle, safetensors, zip)
        raise ModelLoadError(f"checkpoint {path} could not be read: {exc}") from exc
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ModelLoadError(f"checkpoint {path} does not match the architecture: {exc}") from exc


def create_model(spec: ModelSpec) -> torch.nn.Module:
    """Instantiate the open_clip model a spec describes, weights included, in eval mode."""
    if spec.pretrained:
        model = _create_from_tag(spec)
    elif spec.arch:
        try:
            model = open_clip.create_model(spec.arch, force_preprocess_cfg=spec.preprocess or None)
        except RuntimeError as exc:
            raise ModelLoadError(f"unknown open_clip architecture '{spec.arch}': {exc}") from exc
    else:
        model = _create_from_config(spec.config or {}, spec.preprocess)
    if spec.checkpoint:
        load_weights(model, spec.checkpoint)
    return model.eval()


def create_tokenizer(spec: ModelSpec) -> Callable[..., torch.Tensor]:
    if spec.arch:
        tokenizer = open_clip.get_tokenizer(spec.arch)
    else:
        context = (spec.config or {}).get("text_cfg", {}).get("context_length", 77)
        tokenizer = open_clip.tokenizer.SimpleTokenizer(context_length=context)
    if spec.tokenizer and spec.tokenizer.get("added_merges"):
        extend_vocabulary(tokenizer, spec.tokenizer["added_merges"])
    return tokenizer


def extend_vocabulary(tokenizer: Any, merges: Sequence[Sequence[str]]) -> list[str]:
    """Append BPE merges to an open_clip ``SimpleTokenizer`` in place; returns the new tokens.

    Each merge ranks after every existing one (old merges keep priority) and its
    result, when not already a token, gets the next id, so existing ids never change
    and the ids follow from the merge list alone.
    """
    if not isinstance(tokenizer, open_clip.tokenizer.SimpleTokenizer):
        raise ModelLoadError(f"only open_clip's BPE SimpleTokenizer can be extended, not "
                             f"{type(tokenizer).__name__}")
    added: list[str] = []
    for merge in merges:
        first, second = (str(part) for part in merge)
        if first not in tokenizer.encoder or second not in tokenizer.encoder:
            raise ModelLoadError(f"vocabulary merge {merge!r} joins an unknown token")
        if (first, second) in tokenizer.bpe_ranks:
            continue
        tokenizer.bpe_ranks[(first, second)] = len(tokenizer.bpe_ranks)
        token = first + second
        if token not in tokenizer.encoder:
            tokenizer.encoder[token] = len(tokenizer.encoder)
            tokenizer.decoder[tokenizer.encoder[token]] = token
            added.append(token)
    tokenizer.vocab_size = len(tokenizer.encoder)
    # bpe() memoises segmentations made with the old merges; keep only the specials
    tokenizer.cache = {tokenizer.decoder[i]: tokenizer.decoder[i] for i in tokenizer.all_special_ids}
    return added


def image_preprocess(model: torch.nn.Module) -> Callable[[Image.Image], torch.Tensor]:
    """Eval-time preprocessing from the model's own config (size, mean/std, interpolation)."""
    cfg = PreprocessCfg(**get_model_preprocess_cfg(model))
    return image_transform_v2(cfg, is_train=False)


def pixels_many(preprocess: Callable[[Image.Image], torch.Tensor], images: Iterable[Image.Image],
                one: Callable[[Image.Image], torch.Tensor] | None = None) -> list[torch.Tensor]:
    """``preprocess`` of each image (an RGB conversion first), the same values, with its
    tensor steps (to-tensor, normalize: elementwise) run once on the stacked images instead
    of once per image, and in numpy, not torch. Where images are prepared beside a thread
    that runs the model (a gateway's decode threads, a backfill's reader), each small step
    would wait for the interpreter lock, and a torch operation starts an OpenMP team in
    the calling thread whose workers, once the process holds more such threads than cores,
    sleep between operations, the model's forwards included (``service.runtime.threads``;
    measured: the rerank fill's preprocessing 5x slower in the gateway than alone, and the
    forward 1.6x). Each image is brought to the model's size as it comes (only that is
    kept). A preprocess of another shape runs image by image (``one``: default
    ``preprocess`` after the RGB conversion)."""
    if one is None:
        def one(image: Image.Image) -> torch.Tensor:
            return preprocess(image.convert("RGB"))
    steps = list(getattr(preprocess, "transforms", ()))
    cut = next((n for n, t in enumerate(steps)
                if type(t) in (transforms.ToTensor, MaybeToTensor)), len(steps))
    tail = steps[cut + 1:]
    if cut == len(steps) or not all(isinstance(t, transforms.Normalize) for t in tail):
        return [one(image) for image in images]
    sized: list[np.ndarray | torch.Tensor] = []
    for image in images:
        image = image if image.mode == "RGB" else image.convert("RGB")
        for step in steps[:cut]:
            if not _unchanged(step, image):
                image = step(image)
        if isinstance(image, Image.Image) and image.mode == "RGB":
            sized.append(np.asarray(image))  # [H, W, 3] uint8
        else:  # a step made something else: the rest of the preprocess on it alone
            for step in steps[cut:]:
                image = step(image)
            sized.append(image)
    out: list[torch.Tensor | None] = [None] * len(sized)
    shapes = {a.shape for a in sized if isinstance(a, np.ndarray)}
    for shape in shapes:  # one stack per size (one size, for a cropping preprocess)
        rows = [n for n, a in enumerate(sized) if isinstance(a, np.ndarray)
                and a.shape == shape]
        # [N, 3, H, W] as bytes first, so each channel's constants below run along its
        # H x W contiguous values (along a last axis of 3, the same steps took 3x longer)
        batch = np.ascontiguousarray(np.stack([sized[n] for n in rows]).transpose(
            0, 3, 1, 2)).astype(np.float32)
        batch /= np.float32(255)  # to_tensor's and normalize's own float32 steps, in
        for step in tail:  # order, element by element: the same values
            batch -= np.asarray(step.mean, np.float32).reshape(-1, 1, 1)
            batch /= np.asarray(step.std, np.float32).reshape(-1, 1, 1)
        stacked = torch.from_numpy(batch)
        for n, pixels in zip(rows, stacked, strict=True):
            out[n] = pixels
    return [p if p is not None else sized[n] for n, p in enumerate(out)]  # type: ignore


def _unchanged(step: Callable[[Any], Any], image: Any) -> bool:
    """Whether the preprocess step ``step`` gives ``image`` (a PIL image) back with the
    same pixels: a resize or centre crop to the size it has, a conversion to the mode it
    has (the model's own size: a gallery made for the model). ``pixels_many`` skips it
    (at most it copies; for 15 images of 64 px, skipping the three steps took
    ``pixels_many`` from 0.42 to 0.26 ms)."""
    if not isinstance(image, Image.Image):
        return False
    width, height = image.size
    if type(step) is MaybeConvertMode:
        return image.mode == step.mode
    if type(step) is transforms.CenterCrop:  # its size is always (height, width)
        return list(step.size) == [height, width]
    if type(step) is transforms.Resize:  # torchvision returns the image itself then
        size = [step.size] if isinstance(step.size, int) else list(step.size)
        return (size == [height, width]
                or (len(size) == 1 and step.max_size is None and size[0] == min(width, height)))
    return False


def stacked(pixels: Sequence[torch.Tensor]) -> torch.Tensor:
    """[N, 3, H, W] of equal-shaped [3, H, W] tensors, stacked in numpy (see
    ``pixels_many``: no torch operation outside the thread that runs the model)."""
    return torch.from_numpy(np.stack([p.numpy() for p in pixels]))


class Encoder:
    """An open_clip model plus its tokenizer and preprocessing; encodes in batches.

    ``text_head`` / ``image_head`` are optional modules applied after the towers
    (e.g. an XBT projector); outputs are L2-normalised float32 numpy arrays.
    ``native_towers``: the towers are the version's own model, unchanged (its native route,
    or a route that only adds heads), so one forward gives both the route's vector and the
    native one (``encode_texts_both``).
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Callable[..., torch.Tensor],
                 device: torch.device | str | None = None,
                 text_head: torch.nn.Module | None = None,
                 image_head: torch.nn.Module | None = None,
                 native_towers: bool = False) -> None:
        self.native_towers = native_towers
        self.device = pick_device(device)
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.preprocess = image_preprocess(model)
        self.text_head = text_head.to(self.device).eval() if text_head is not None else None
        self.image_head = image_head.to(self.device).eval() if image_head is not None else None

    @classmethod
    def from_spec(cls, spec: ModelSpec, device: str | torch.device | None = None) -> Encoder:
        return cls(create_model(spec), create_tokenizer(spec), device)

    @property
    def context_length(self) -> int:
        return int(getattr(self.model, "context_length", 77))

    def tokenize(self, texts: Sequence[str]) -> torch.Tensor:
        return self.tokenizer(list(texts))

    def image_tensors(self, images: Sequence[Image.Image]) -> torch.Tensor:
        """[N, 3, H, W] preprocessed images (the tensor steps in numpy, ``pixels_many``:
        a backfill's reader thread runs this beside the forward)."""
        return stacked(pixels_many(self.preprocess, images))

    @torch.inference_mode()
    def encode_texts(self, texts: Sequence[str], batch_size: int = 256) -> np.ndarray:
        chunks = []
        for start in range(0, len(texts), batch_size):
            chunks.append(self._finish(self._text_features(texts[start:start + batch_size]),
                                       self.text_head))
        return _concat(chunks, self.embed_dim)

    @torch.inference_mode()
    def encode_image_tensors(self, pixels: torch.Tensor, batch_size: int = 256) -> np.ndarray:
        chunks = []
        for start in range(0, len(pixels), batch_size):
            batch = pixels[start:start + batch_size].to(self.device, dtype=torch.float32)
            chunks.append(self._finish(self.model.encode_image(batch), self.image_head))
        return _concat(chunks, self.embed_dim)

    @torch.inference_mode()
    def encode_texts_both(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """([N, D] through the heads, [N, D_towers] without them) from one forward."""
        features = self._text_features(texts)
        return self._finish(features, self.text_head), self._finish(features, None)

    def _text_features(self, texts: Sequence[str]) -> torch.Tensor:
        """The text tower's output for ``texts`` (before any head)."""
        return encode_text_packed(self.model, self.tokenize(texts).to(self.device))

    @torch.inference_mode()
    def encode_image_tensors_both(self, pixels: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """``encode_texts_both`` for preprocessed images [N, 3, H, W]."""
        features = self.model.encode_image(pixels.to(self.device, dtype=torch.float32))
        return self._finish(features, self.image_head), self._finish(features, None)

    def encode_images(self, images: Sequence[Image.Image], batch_size: int = 256) -> np.ndarray:
        chunks = [self.encode_image_tensors(self.image_tensors(images[s:s + batch_size]))
                  for s in range(0, len(images), batch_size)]
        return _concat(chunks, self.embed_dim)

    @property
    def embed_dim(self) -> int:
        head = self.text_head
        if head is not None and hasattr(head, "out_dim"):
            return int(head.out_dim)
        return model_embed_dim(self.model)

    @staticmethod
    def _finish(features: torch.Tensor, head: torch.nn.Module | None) -> np.ndarray:
        if head is not None:
            features = head(features)
        features = torch.nn.functional.normalize(features.float(), dim=-1)
        return features.cpu().numpy().astype(np.float32)


PACK_TOKENS = 1024  # most tokens in one packed row (its attention mask is PACK_TOKENS^2)


def text_lengths(tokens: torch.Tensor) -> torch.Tensor:
    """[B] per row: columns up to and including its last non-padding (non-zero) token.

    Not a count of non-zero ids: "!" is token id 0 too, and may sit inside a text."""
    used = (tokens != PAD_ID).long() * torch.arange(1, tokens.shape[1] + 1,
                                                    device=tokens.device)
    return used.max(dim=1).values.clamp(min=1)


def _packable(model: torch.nn.Module) -> bool:
    # A causal text tower pooled at the EOT/EOS token: no position attends to a later one,
    # and the pooled position is never padding, so padding columns cannot change the output.
    return (isinstance(model, open_clip.CLIP) and getattr(model, "attn_mask", None) is not None
            and getattr(model, "text_pool_type", None) in ("argmax", "eos"))


def encode_text_packed(model: torch.nn.Module, tokens: torch.Tensor,
                       pack_tokens: int = PACK_TOKENS) -> torch.Tensor:
    """``model.encode_text(tokens)`` computed on the texts' own tokens, without padding.

    open_clip pads every text to the full context (77 for ViT-B-32) and runs the tower
    over the padding: a short query is mostly padding, and a batch of queries of mixed
    lengths carries the longest one's length in every row. For a causal tower pooled at
    the end-of-text token, the texts are instead laid end to end in one row (a pack of at
    most ``pack_tokens`` tokens; positions restart at 0 for each text) with a
    block-diagonal causal mask, so each token still sees exactly the earlier tokens of its
    own text: the same embeddings (up to float rounding) for the real tokens' compute.
    Any other text tower (bidirectional, HF text, first/last pooling) runs unchanged.
    """
    if not _packable(model):
        return model.encode_text(tokens)
    lengths = text_lengths(tokens).tolist()
    pooled, first, total = [], 0, 0
    for row, length in enumerate(lengths):
        if row > first and total + length > pack_tokens:
            pooled.append(_encode_pack(model, tokens[first:row], lengths[first:row]))
            first, total = row, 0
        total += length
    pooled.append(_encode_pack(model, tokens[first:], lengths[first:]))
    x = torch.cat(pooled)
    projection = model.text_projection
    if projection is None:
        return x
    return projection(x) if isinstance(projection, torch.nn.Linear) else x @ projection


def _encode_pack(model: torch.nn.Module, tokens: torch.Tensor,
                 lengths: list[int]) -> torch.Tensor:
    """[B, width] pooled features of ``tokens`` [B, L] run as one packed row."""
    device = tokens.device
    sizes = torch.tensor(lengths, device=device)
    keep = torch.arange(tokens.shape[1], device=device)[None, :] < sizes[:, None]
    flat = tokens[keep]  # [T] the texts end to end
    text = torch.repeat_interleave(torch.arange(len(lengths), device=device), sizes)
    starts = torch.cumsum(sizes, 0) - sizes
    order = torch.arange(len(flat), device=device)
    cast_dtype = model.transformer.get_cast_dtype()
    x = model.token_embedding(flat).to(cast_dtype)
    x = x + model.positional_embedding[order - starts[text]].to(cast_dtype)
    visible = (text[:, None] == text[None, :]) & (order[None, :] <= order[:, None])
    mask = torch.zeros(visible.shape, dtype=model.attn_mask.dtype, device=device)
    mask.masked_fill_(~visible, float("-inf"))
    x = model.ln_final(model.transformer(x[None], attn_mask=mask)[0])  # [T, width]
    # the pooled position of each text, found as text_global_pool finds it in a padded row
    if model.text_pool_type == "argmax":
        at = tokens.argmax(dim=-1)
    else:
        at = (tokens == model.text_eos_id).int().argmax(dim=-1)
    return x[starts + at]


def model_embed_dim(model: torch.nn.Module) -> int:
    """The joint embedding width of an open_clip model."""
    proj = getattr(model, "text_projection", None)
    if isinstance(proj, torch.Tensor):
        return int(proj.shape[1])
    if isinstance(proj, torch.nn.Linear):
        return int(proj.out_features)
    return int(model.visual.output_dim)


def _concat(chunks: list[np.ndarray], dim: int) -> np.ndarray:
    if not chunks:
        return np.zeros((0, dim), dtype=np.float32)
    return np.concatenate(chunks, axis=0)
