"""Vocabulary expansion for a new language (CLL-CLIP, Yang et al., AAAI 2024, Sec. 3.1).

BPE training continues on the new language's captions from the current tokenizer's
own segmentation: the most frequent adjacent token pair becomes a new merge, ranked
after every existing one. Continuing (rather than training a fresh BPE and taking the
tokens it lacks) keeps every new merge reachable: applying a tokenizer fires all old
merges first, so a fresh BPE's merges often never match the old segmentation.
Existing ids never change; new tokens get ids at the end and the embedding matrix only
grows. The learned merges are written into the model spec (``tokenizer.added_merges``),
from which ``training.encoders.create_tokenizer`` rebuilds the same tokenizer.
"""

from __future__ import annotations

import copy
import itertools
from collections import Counter
from collections.abc import Sequence
from typing import Any

import open_clip
import torch

from training.encoders import ModelSpec, extend_vocabulary
from training.errors import ConfigError

Merge = tuple[str, str]


def pretokenize(tokenizer: Any, text: str) -> list[str]:
    """The byte-level words ``SimpleTokenizer.encode`` would segment with BPE."""
    words = tokenizer.pat.findall(tokenizer.clean_fn(text))  # a `regex` pattern
    return ["".join(tokenizer.byte_encoder[b] for b in word.encode("utf-8")) for word in words]


def _pair_counts(segments: dict[str, list[str]], words: Counter) -> Counter:
    counts: Counter = Counter()
    for word, pieces in segments.items():
        for pair in itertools.pairwise(pieces):
            counts[pair] += words[word]
    return counts


def learn_merges(tokenizer: Any, texts: Sequence[str], max_merges: int,
                 min_count: int = 2) -> list[Merge]:
    """Up to ``max_merges`` new BPE merges for ``texts`` (each seen at least ``min_count``
    times), continuing from ``tokenizer``'s segmentation. ``tokenizer`` is not changed."""
    work = copy.deepcopy(tokenizer)
    words = Counter(word for text in texts for word in pretokenize(work, text))
    segments = {word: work.bpe(word).split(" ") for word in words}
    merges: list[Merge] = []
    while len(merges) < max_merges:
        counts = _pair_counts(segments, words)
        if not counts:
            break
        # most frequent pair; ties broken by the pair itself so the result is deterministic
        best, count = max(counts.items(), key=lambda item: (item[1], item[0]))
        if count < min_count:
            break
        extend_vocabulary(work, [best])
        merges.append(best)
        for word, pieces in segments.items():
            if any(pair == best for pair in itertools.pairwise(pieces)):
                segments[word] = work.bpe(word).split(" ")  # exactly what encode() will do
    return merges


def check_expandable(model: torch.nn.Module, tokenizer: Any) -> None:
    """ConfigError unless the text tower is open_clip's token-embedding transformer and the
    tokenizer is its BPE tokenizer with one embedding row per token."""
    embedding = getattr(model, "token_embedding", None)
    if not isinstance(embedding, torch.nn.Embedding):
        raise ConfigError("a language phase trains token embeddings: the model needs an "
                          "open_clip CLIP text tower with a `token_embedding` table")
    if not isinstance(tokenizer, open_clip.tokenizer.SimpleTokenizer):
        raise ConfigError(f"vocabulary expansion needs open_clip's BPE SimpleTokenizer, not "
                          f"{type(tokenizer).__name__}")
    if embedding.num_embeddings != len(tokenizer.encoder):
        raise ConfigError(f"the token embedding has {embedding.num_embeddings} rows but the "
                          f"tokenizer {len(tokenizer.encoder)} tokens; they must match to grow")


def grow_embedding(model: torch.nn.Module, rows: int, init: str, std: float,
                   generator: torch.Generator) -> None:
    """Append ``rows`` token embeddings: TEIR draws them from N(mu, sigma) with mu and sigma
    the mean and std of every entry of the current matrix; ``normal`` from N(0, std)."""
    old = model.token_embedding.weight.detach()  # [V, width]
    mu, sigma = (old.mean().item(), old.std().item()) if init == "teir" else (0.0, std)
    new = torch.randn(rows, old.shape[1], generator=generator) * sigma + mu  # [rows, width]
    grown = torch.nn.Embedding(old.shape[0] + rows, old.shape[1]).to(old.device)
    grown.weight.data.copy_(torch.cat([old, new.to(old)]))
    model.token_embedding = grown
    model.vocab_size = grown.num_embeddings


def use_eos_pooling(model: torch.nn.Module, eos_id: int) -> None:
    """Pool text at the end-of-text token instead of the highest id: appended tokens have
    higher ids than EOT, which breaks open_clip's default argmax pooling. For text without
    new tokens the two pick the same position, so old embeddings do not change."""
    model.text_pool_type, model.text_eos_id = "eos", eos_id


def expanded_spec(spec: ModelSpec, model: torch.nn.Module, tokenizer: Any,
                  merges: Sequence[Merge]) -> ModelSpec:
    """The spec of the grown model: vocab size, EOS pooling and the appended merges."""
    config = copy.deepcopy(spec.config) if spec.config else open_clip.get_model_config(spec.arch)
    if config is None:
        raise ConfigError(f"no open_clip config for architecture '{spec.arch}'")
    config["text_cfg"] = {**config["text_cfg"], "vocab_size": len(tokenizer.encoder),
                          "pool_type": "eos", "eos_id": tokenizer.eot_token_id}
    preprocess = dict(spec.preprocess) if spec.config else dict(model.visual.preprocess_cfg)
    earlier = list((spec.tokenizer or {}).get("added_merges", []))
    return ModelSpec(config=config, preprocess=preprocess,
                     tokenizer={"added_merges": earlier + [list(m) for m in merges]})
