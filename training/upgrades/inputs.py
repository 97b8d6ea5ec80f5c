"""Inputs of an upgrade (XBT, Direct, an adapter fit), resolved and checked before training.

Every bad input (a caption corpus that is empty, a paired set with missing images,
an old version with no route into the target space, embedding dims or tokenizers
that do not fit their models) fails here with a typed error, so a failed upgrade
never trains for minutes first and never leaves a partial artifact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from training.artifacts import Artifact
from training.data import caption_corpus
from training.encoders import ModelSpec, create_model, model_embed_dim
from training.errors import ConfigError, DataError
from training.routes import artifact_spec, native_model

SYNTH_PREFIX = "synth:"
CORPUS_SEED = 7_000  # the synthetic corpus differs from every image set's captions


def read_corpus(source: str | Path | Sequence[str]) -> list[str]:
    """Captions for stage 1: a list, ``synth:N`` (synthetic corpus) or a file, one per line."""
    if isinstance(source, (list, tuple)):
        captions = [str(c).strip() for c in source]
    elif str(source).startswith(SYNTH_PREFIX):
        count = str(source)[len(SYNTH_PREFIX):]
        if not count.isdigit() or int(count) < 1:
            raise DataError(f"corpus {source!r}: write synth:N with N >= 1, e.g. synth:100000")
        captions = caption_corpus(int(count), seed=CORPUS_SEED)
    else:
        path = Path(str(source))
        if not path.is_file():
            raise DataError(f"caption corpus not found: {path} (a text file with one caption "
                            f"per line, or synth:N)")
        captions = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    captions = [c for c in captions if c]
    if not captions:
        raise DataError(f"the caption corpus {source if isinstance(source, (str, Path)) else ''}"
                        f" is empty: stage 1 needs captions")
    return captions


def target_space_of(old: Artifact, space: str | None = None) -> str:
    """The gallery's space the upgrade maps into: by default the old version's root space.

    An XBT version (v2) is itself compatible with its target (v1's space), so upgrading
    onto v2 targets v1's space too: every version of a chain maps into the root space.
    """
    target = space or old.manifest.get("target_space") or old.space
    if target not in old.routes:
        raise ConfigError(
            f"the old version '{old.version_id}' has no route into space '{target}' (its "
            f"routes: {sorted(old.routes)}); upgrade onto a version that embeds into the "
            f"gallery's space, or pick one of those spaces as the target")
    return target


def declared_dim(old: Artifact, space: str) -> int:
    """The embedding dim the old version's manifest promises for ``space``."""
    route = old.routes[space]
    dim = route.get("embed_dim", old.manifest.get("embed_dim"))
    if dim is None:
        raise ConfigError(f"old version '{old.version_id}' records no embed_dim for '{space}'")
    return int(dim)


def check_dim(who: str, declared: int, actual: int) -> None:
    if declared != actual:
        raise ConfigError(f"dimension mismatch: {who} declares {declared}-d embeddings but its "
                          f"model produces {actual}-d ones; the artifact does not match its model")


def new_model_of(new: Artifact | ModelSpec) -> tuple[ModelSpec, nn.Module, str | None]:
    """(spec without weights, model with weights, native space or None) of the NEW model."""
    if isinstance(new, Artifact):
        model = native_model(new)
        check_dim(f"new version '{new.version_id}'", int(new.manifest.get("embed_dim", -1)),
                  model_embed_dim(model))
        return artifact_spec(new).without_weights(), model, new.space
    return new.without_weights(), create_model(new), None


def _token_table(model: nn.Module) -> nn.Embedding | None:
    table = getattr(model, "token_embedding", None)
    if table is None:
        table = getattr(getattr(model, "text", None), "token_embedding", None)
    return table if isinstance(table, nn.Embedding) else None


def check_tokenizer(who: str, model: nn.Module, tokenizer: Callable[..., torch.Tensor],
                    sample: Sequence[str]) -> None:
    """The tokenizer's ids and context length must fit the text tower (else: index errors
    deep inside training, or silently truncated positions)."""
    tokens = tokenizer(list(sample))  # [S, ctx]
    context = int(getattr(model, "context_length", tokens.shape[1]))
    if tokens.shape[1] != context:
        raise ConfigError(f"tokenizer mismatch: {who}'s tokenizer pads to {tokens.shape[1]} "
                          f"tokens but its text tower takes {context}")
    table = _token_table(model)
    if table is None:
        return
    top = max(int(tokens.max()), int(getattr(tokenizer, "vocab_size", 0)) - 1)
    if top >= table.num_embeddings:
        raise ConfigError(f"tokenizer mismatch: {who}'s tokenizer produces token ids up to "
                          f"{top} but its text tower has {table.num_embeddings} token "
                          f"embeddings; use the tokenizer the model was trained with")

