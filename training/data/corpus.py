"""Captions-only corpora for text-only training: attributes and templates, no rendering.

Uses the same attribute sampler, mention choice and phrasebooks as the image generator, so
the captions come from the same distribution as those of `generate_items`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from random import Random

from training.data.languages import PHRASEBOOKS
from training.data.synth import (
    DEFAULT_DOMAINS,
    DOMAINS,
    check_domains,
    check_languages,
    choose_mention,
    sample_attributes,
)
from training.errors import DataError


def parallel_corpus(
    n: int,
    seed: int,
    languages: Sequence[str] = ("en",),
    domains: Sequence[str] = DEFAULT_DOMAINS,
) -> dict[str, list[str]]:
    """`n` captions per language; row i of every language mentions the same attributes.

    Parallel rows are what text-to-text alignment of a new language needs (foreign
    caption i pairs with English caption i). Domains are interleaved evenly.
    """
    if n < 1:
        raise DataError(f"n must be at least 1, got {n}")
    check_domains(domains)
    check_languages(languages)
    # One generator for the whole corpus: per-row seeding would dominate the cost.
    rng = Random(f"nobackfill-corpus:{seed}")
    specs = [DOMAINS[name] for name in domains]
    books = [PHRASEBOOKS[code] for code in languages]
    rows: list[list[str]] = [[] for _ in books]
    for i in range(n):
        attributes = sample_attributes(rng, specs[i % len(specs)])
        # Index 2 onwards is the sparse mention mix; 0 and 1 are reserved for full captions.
        mention = choose_mention(rng, attributes, rng.choice((0, 1, 2, 2, 2)))
        flipped = rng.random() < 0.5
        for column, book in zip(rows, books):
            column.append(book.caption(rng, mention, flipped))
    return {code: column for code, column in zip(languages, rows)}


def caption_corpus(
    n: int,
    seed: int,
    languages: Sequence[str] = ("en",),
    domains: Sequence[str] = DEFAULT_DOMAINS,
) -> list[str]:
    """`n` captions, languages interleaved (caption i is in languages[i % len(languages)])."""
    if n < 1:
        raise DataError(f"n must be at least 1, got {n}")
    rows = math.ceil(n / max(1, len(languages)))
    parallel = parallel_corpus(rows, seed, languages, domains)
    columns = [parallel[code] for code in languages]
    interleaved = [caption for row in zip(*columns) for caption in row]
    return interleaved[:n]
