"""Image-text data: the synthetic benchmark world, caption corpora and dataset loaders."""

from training.data.corpus import caption_corpus, parallel_corpus
from training.data.dataset import (
    PairDataset,
    Record,
    attribute_relevance,
    load_karpathy,
    load_manifest,
    open_dataset,
    open_image,
)
from training.data.synth import (
    DEFAULT_DOMAINS,
    DOMAINS,
    LANGUAGES,
    DomainSpec,
    SynthItem,
    generate_items,
    is_relevant,
    render,
    write_dataset,
)

__all__ = [
    "DEFAULT_DOMAINS",
    "DOMAINS",
    "LANGUAGES",
    "DomainSpec",
    "PairDataset",
    "Record",
    "SynthItem",
    "attribute_relevance",
    "caption_corpus",
    "generate_items",
    "is_relevant",
    "load_karpathy",
    "load_manifest",
    "open_dataset",
    "open_image",
    "parallel_corpus",
    "render",
    "write_dataset",
]
