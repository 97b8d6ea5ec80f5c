"""The demo's synthetic world: which data each step of the story reads, and how much.

v1 knows four domains in English. The story then brings a new domain (``symbols``: a
star, a cross and a heart, shapes and words v1 never saw), a new language (German),
and a stronger model trained on more data in English and German.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from training.data import PairDataset, write_dataset

OLD_DOMAINS = ("basic", "polygons", "textures", "pairs")
NEW_DOMAIN = "symbols"
ALL_DOMAINS = (*OLD_DOMAINS, NEW_DOMAIN)
NEW_LANGUAGE = "de"


@dataclass(frozen=True)
class Profile:
    """Sizes and step counts of one run of the story."""

    name: str
    v1_images: int  # v1's training set (old domains, English)
    v1_steps: int
    gallery_images: int  # old-domain items embedded by v1 at day 0
    new_domain_gallery: int  # new-domain items ingested after the continual phase
    validation_images: int  # the gate's held-out set (every domain, English + German)
    phase_images: int  # the continual phase's new-domain training set
    phase_steps: int
    language_images: int  # parallel English/German captions for the language phase
    language_steps: int
    new_images: int  # the stronger model's training set (every domain, English + German)
    new_steps: int
    xbt_corpus: int  # stage 1 captions (text only)
    xbt_pretrain_steps: int
    xbt_pairs: int  # stage 2 image-caption pairs
    xbt_steps: int
    probes_per_domain: int  # gallery items per domain whose captions are the queries
    batch_size: int = 128
    xbt_batch_size: int = 64

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Sized to finish in well under 30 minutes on 2 CPU cores (the two base trainings take
# most of it); `nobackfill demo` prints the wall time of every step.
FULL = Profile("full", v1_images=4000, v1_steps=500, gallery_images=1600,
               new_domain_gallery=400, validation_images=500, phase_images=1000,
               phase_steps=150, language_images=1500, language_steps=300,
               new_images=8000, new_steps=800, xbt_corpus=50_000, xbt_pretrain_steps=1000,
               xbt_pairs=2000, xbt_steps=300, xbt_batch_size=128, probes_per_domain=60)
# The same story at toy size, for the test suite (the numbers mean nothing).
QUICK = Profile("quick", v1_images=96, v1_steps=3, gallery_images=60, new_domain_gallery=12,
                validation_images=40, phase_images=24, phase_steps=2, language_images=24,
                language_steps=2, new_images=96, new_steps=3, xbt_corpus=300,
                xbt_pretrain_steps=3, xbt_pairs=24, xbt_steps=2, probes_per_domain=4,
                batch_size=16, xbt_batch_size=8)
PROFILES = {p.name: p for p in (FULL, QUICK)}


@dataclass(frozen=True)
class World:
    """Dataset directories (manifest.jsonl + PNGs) that the gateway and worker read."""

    v1_train: Path
    gallery: Path  # old domains, embedded by v1
    new_domain_gallery: Path
    validation: Path
    phase: Path
    language: Path
    new_train: Path
    xbt_pairs: Path


# name -> (seed, domains, languages, size field of Profile)
SETS: dict[str, tuple[int, tuple[str, ...], tuple[str, ...], str]] = {
    "v1_train": (1, OLD_DOMAINS, ("en",), "v1_images"),
    "gallery": (2, OLD_DOMAINS, ("en", NEW_LANGUAGE), "gallery_images"),
    "new_domain_gallery": (3, (NEW_DOMAIN,), ("en", NEW_LANGUAGE), "new_domain_gallery"),
    "validation": (4, ALL_DOMAINS, ("en", NEW_LANGUAGE), "validation_images"),
    "phase": (5, (NEW_DOMAIN,), ("en",), "phase_images"),
    "language": (6, ALL_DOMAINS, ("en", NEW_LANGUAGE), "language_images"),
    "new_train": (7, ALL_DOMAINS, ("en", NEW_LANGUAGE), "new_images"),
    "xbt_pairs": (8, ALL_DOMAINS, ("en",), "xbt_pairs"),
}


def render_world(root: Path, profile: Profile) -> World:
    """Write every set once (a rerun into the same root reuses what is there)."""
    paths = {}
    for name, (seed, domains, languages, size) in SETS.items():
        n = getattr(profile, size)
        path = root / name
        if not (path / "manifest.jsonl").is_file():
            write_dataset(path, n, seed=1000 + seed, domains=domains, languages=languages,
                          id_prefix=f"{name.replace('_', '-')}-")
        paths[name] = path
    return World(**paths)


def load(path: Path) -> PairDataset:
    from training.data import open_dataset

    return open_dataset(path)
