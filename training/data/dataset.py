"""Image-caption datasets: synthetic items in memory, manifests on disk, Karpathy splits.

A `PairDataset` is a list of records, each one image and its captions per language. It
knows which images are relevant to which captions: by attributes when every record has
them (the synthetic world), otherwise a caption is relevant only to its own image.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from training.data.synth import SynthItem, render
from training.errors import DataError

_IMAGE_ERRORS = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)


@dataclass
class Record:
    """One image and its captions (language -> list of captions)."""

    id: str
    captions: dict[str, list[str]]
    image_path: Path | None = None
    synth: SynthItem | None = None
    attributes: dict[str, str] | None = None
    caption_attributes: list[dict[str, str]] | None = None
    domain: str | None = None


class _BadRow(Exception):
    """A row the caller may skip (missing/corrupt image, no captions); message says why."""


def open_image(path: Path) -> Image.Image:
    """The image at `path` as RGB; DataError naming the file if it is missing or corrupt."""
    if not path.is_file():
        raise DataError(f"image file not found: {path}")
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except _IMAGE_ERRORS as exc:
        raise DataError(f"cannot read image file {path}: {exc}") from exc


def _verify_image(path: Path) -> None:
    """Raise _BadRow unless `path` exists and PIL can parse it."""
    if not path.is_file():
        raise _BadRow(f"image file not found: {path}")
    try:
        with Image.open(path) as image:
            image.verify()
    except _IMAGE_ERRORS as exc:
        raise _BadRow(f"corrupt image file {path}: {exc}") from exc


class PairDataset:
    """Images with captions in one or more languages and their relevance structure."""

    def __init__(self, records: Sequence[Record], skipped: int = 0, image_size: int = 64):
        self.records = list(records)
        self.skipped = skipped  # rows dropped by skip_bad when this dataset was loaded
        self.image_size = image_size  # render size of synthetic records

    def __len__(self) -> int:
        return len(self.records)

    def __repr__(self) -> str:
        return (
            f"PairDataset({len(self)} images, languages={self.languages()}, skipped={self.skipped})"
        )

    @classmethod
    def from_synth(cls, items: Sequence[SynthItem], image_size: int = 64) -> PairDataset:
        records = [
            Record(
                id=item.id,
                captions=item.captions,
                synth=item,
                attributes=item.attributes,
                caption_attributes=item.caption_attributes,
                domain=item.domain,
            )
            for item in items
        ]
        return cls(records, image_size=image_size)

    def load_image(self, i: int) -> Image.Image:
        """Image i as RGB; DataError naming the file if it is missing or corrupt."""
        record = self.records[i]
        if record.synth is not None:
            return render(record.synth, self.image_size)
        if record.image_path is None:
            raise DataError(f"record {record.id!r} has neither an image file nor a synthetic item")
        return open_image(record.image_path)

    def languages(self) -> list[str]:
        """Languages with at least one caption, in order of first appearance."""
        seen: dict[str, None] = {}
        for record in self.records:
            seen.update((code, None) for code, texts in record.captions.items() if texts)
        return list(seen)

    def captions(self, language: str = "en") -> tuple[list[str], list[int]]:
        """Flat caption texts in `language` and the record index each belongs to."""
        texts: list[str] = []
        owners: list[int] = []
        for index, record in enumerate(self.records):
            for text in record.captions.get(language, ()):
                texts.append(text)
                owners.append(index)
        if not texts:
            raise DataError(f"no captions in language {language!r}; available: {self.languages()}")
        return texts, owners

    def stored_captions(self, language: str = "en") -> dict[int, int]:
        """Record index -> the index (in ``captions``) of its first caption in `language`:
        the one a gallery stores with the item. Records without one are left out."""
        _, owners = self.captions(language)
        stored: dict[int, int] = {}
        for c, owner in enumerate(owners):
            stored.setdefault(owner, c)
        return stored

    def attribute_sets(
        self, language: str = "en"
    ) -> tuple[list[dict[str, str]], list[dict[str, str]]] | None:
        """(attributes per caption in `language`, attributes per image), or None when some
        record lacks attributes or has fewer caption attribute sets than captions."""
        mentions: list[dict[str, str]] = []
        images: list[dict[str, str]] = []
        for record in self.records:
            count = len(record.captions.get(language, ()))
            if record.attributes is None or record.caption_attributes is None:
                return None
            if len(record.caption_attributes) < count:
                return None
            mentions.extend(record.caption_attributes[:count])
            images.append(record.attributes)
        return mentions, images

    def relevance(self, language: str = "en") -> np.ndarray:
        """Bool [n_captions, n_images]: attribute relevance if available, else pair identity."""
        texts, owners = self.captions(language)
        sets = self.attribute_sets(language)
        if sets is not None:
            return attribute_relevance(*sets)
        matrix = np.zeros((len(texts), len(self.records)), dtype=bool)
        matrix[np.arange(len(texts)), owners] = True
        return matrix

    def subset(self, indices: Sequence[int]) -> PairDataset:
        return PairDataset([self.records[i] for i in indices], self.skipped, self.image_size)

    def domains(self) -> list[str]:
        """Domains present, in order of first appearance (records without one are left out)."""
        return list(dict.fromkeys(r.domain for r in self.records if r.domain is not None))

    def filter(
        self, domains: Sequence[str] | None = None, language: str | None = None
    ) -> PairDataset:
        """Records in any of `domains` that have captions in `language` (None: no condition)."""
        keep = [
            i
            for i, record in enumerate(self.records)
            if (domains is None or record.domain in domains)
            and (language is None or record.captions.get(language))
        ]
        if not keep:
            raise DataError(
                f"no records match domains={list(domains) if domains else None}, "
                f"language={language!r}; available domains: {self.domains()}, "
                f"languages: {self.languages()}"
            )
        return self.subset(keep)

    def split(self, fractions: Sequence[float], seed: int) -> list[PairDataset]:
        """Shuffled disjoint parts with the given fractions of the records.

        When the fractions sum to 1 the last part takes the rounding remainder.
        """
        if not fractions or any(f <= 0 for f in fractions) or sum(fractions) > 1 + 1e-9:
            raise DataError(f"split fractions must be positive and sum to at most 1: {fractions}")
        order = np.random.default_rng(seed).permutation(len(self.records))
        bounds = np.rint(np.cumsum(fractions) * len(self.records)).astype(int)
        if abs(sum(fractions) - 1) < 1e-9:
            bounds[-1] = len(self.records)
        starts = [0, *bounds[:-1]]
        return [self.subset(order[a:b].tolist()) for a, b in zip(starts, bounds)]


def attribute_relevance(
    mentions: Sequence[Mapping[str, str]], images: Sequence[Mapping[str, str]]
) -> np.ndarray:
    """Bool [len(mentions), len(images)]: image has every key/value the mention names.

    Vectorised over integer codes per attribute key: code 0 in a mention means "not
    mentioned" (matches anything), -1 in an image means "absent" (matches no mention).
    """
    keys = sorted({key for m in mentions for key in m})
    vocab: dict[tuple[str, str], int] = {}

    def code(key: str, value: str) -> int:
        return vocab.setdefault((key, value), len(vocab) + 1)

    wanted = np.array([[code(k, m[k]) if k in m else 0 for k in keys] for m in mentions])
    wanted = wanted.reshape(len(mentions), len(keys))  # [C, K], also when K == 0
    have = np.array([[code(k, a[k]) if k in a else -1 for k in keys] for a in images])
    have = have.reshape(len(images), len(keys))  # [I, K]
    matrix = np.ones((len(mentions), len(images)), dtype=bool)
    for j in range(len(keys)):
        column = wanted[:, j : j + 1]  # [C, 1]
        matrix &= (column == 0) | (column == have[None, :, j])
    return matrix


# ---------------------------------------------------------------------------------------
# Manifests


def _resolve(image: str, base: Path) -> Path:
    path = Path(image).expanduser()
    return path if path.is_absolute() else base / path


def _check_row(record: Record, verify: bool) -> None:
    """Raise _BadRow if the record has no captions or its image is missing (or corrupt)."""
    if not any(record.captions.values()):
        raise _BadRow("no captions")
    if record.image_path is None:
        raise _BadRow("no image path")
    if verify:
        _verify_image(record.image_path)
    elif not record.image_path.is_file():
        raise _BadRow(f"image file not found: {record.image_path}")


def _collect(rows: Iterable[tuple[str, Record]], skip_bad: bool, source: Path) -> PairDataset:
    """Check each (location, record): raise on a bad one, or skip and count it if skip_bad.

    Without skip_bad only existence is checked here; decoding every image up front would
    make loading a large real dataset slow, and load_image names a corrupt file anyway.
    """
    records: list[Record] = []
    first_seen: dict[str, str] = {}
    skipped = 0
    for where, record in rows:
        try:
            _check_row(record, verify=skip_bad)
        except _BadRow as exc:
            if not skip_bad:
                raise DataError(f"{where}: {exc}") from None
            skipped += 1
            continue
        if record.id in first_seen:
            raise DataError(
                f"{where}: duplicate id {record.id!r} (first at {first_seen[record.id]})"
            )
        first_seen[record.id] = where
        records.append(record)
    if not records:
        raise DataError(f"{source}: no usable records ({skipped} skipped)")
    return PairDataset(records, skipped=skipped)


def _captions_from_json(obj: Mapping[str, Any], where: str) -> dict[str, list[str]]:
    if "captions" in obj:
        value = obj["captions"]
        if isinstance(value, list):  # a bare list is English
            value = {"en": value}
        if not isinstance(value, dict) or not all(isinstance(v, list) for v in value.values()):
            raise DataError(f"{where}: 'captions' must be {{language: [caption, ...]}}")
        return {lang: [str(t).strip() for t in texts] for lang, texts in value.items()}
    if "caption" in obj:
        return {"en": [str(obj["caption"]).strip()]}
    return {}


def _check_parallel(
    captions: Mapping[str, list[str]], caption_attributes: Sequence[Any], where: str
) -> None:
    # Caption k pairs with caption_attributes[k]; dropping an empty caption would shift
    # every later pairing, so empties are an error here rather than silently removed.
    for lang, texts in captions.items():
        if len(texts) > len(caption_attributes):
            raise DataError(
                f"{where}: {len(texts)} '{lang}' captions but only "
                f"{len(caption_attributes)} caption_attributes"
            )
        if not all(texts):
            raise DataError(f"{where}: empty '{lang}' caption in a row with caption_attributes")


def _record_from_json(obj: Any, where: str, base: Path) -> Record:
    if not isinstance(obj, dict) or not isinstance(obj.get("image"), str):
        raise DataError(f"{where}: expected an object with an 'image' path")
    captions = _captions_from_json(obj, where)
    caption_attributes = obj.get("caption_attributes")
    if caption_attributes is None:
        captions = {lang: [t for t in texts if t] for lang, texts in captions.items()}
    else:
        _check_parallel(captions, caption_attributes, where)
    return Record(
        id=str(obj.get("id", Path(obj["image"]).stem)),
        captions=captions,
        image_path=_resolve(obj["image"], base),
        attributes=obj.get("attributes"),
        caption_attributes=caption_attributes,
        domain=obj.get("domain"),
    )


def _jsonl_rows(path: Path) -> Iterable[tuple[str, Record]]:
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{path.name} line {number}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{where}: malformed JSON ({exc.msg})") from exc
            yield where, _record_from_json(obj, where, path.parent)


def _csv_rows(path: Path) -> Iterable[tuple[str, Record]]:
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        missing = {"image", "caption"} - set(reader.fieldnames or ())
        if missing:
            raise DataError(f"{path.name}: missing CSV column(s) {sorted(missing)}")
        grouped: dict[str, tuple[str, Record]] = {}
        for number, row in enumerate(reader, start=2):  # line 1 is the header
            image = (row["image"] or "").strip()
            key = (row.get("id") or "").strip() or image
            where = f"{path.name} line {number}"
            if not image:
                raise DataError(f"{where}: empty 'image' value")
            if key not in grouped:
                record = Record(id=key, captions={}, image_path=_resolve(image, path.parent))
                grouped[key] = (where, record)
            text = (row["caption"] or "").strip()
            language = (row.get("language") or "").strip() or "en"
            captions = grouped[key][1].captions.setdefault(language, [])
            if text:
                captions.append(text)
    return grouped.values()


def load_manifest(path: Path | str, skip_bad: bool = False) -> PairDataset:
    """Load a .jsonl or .csv manifest of image paths and captions.

    Image paths are relative to the manifest's folder or absolute. Missing images and rows
    without captions raise DataError naming the file and line; with `skip_bad=True` those
    rows, and rows whose image PIL cannot parse, are dropped and counted in `.skipped`.
    Malformed JSON or a missing CSV column always raises: the manifest itself is broken.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"manifest not found: {path}")
    return _collect(manifest_rows(path), skip_bad, path)


def manifest_rows(path: Path) -> Iterable[tuple[str, Record]]:
    """(where, record) of every row of a .jsonl or .csv manifest, image paths resolved
    against the manifest's folder; no image is opened. DataError for a broken row."""
    if path.suffix == ".jsonl":
        return _jsonl_rows(path)
    if path.suffix == ".csv":
        return _csv_rows(path)
    raise DataError(f"unsupported manifest type {path.name!r}; use .jsonl or .csv")


KARPATHY_SPLITS = ("train", "restval", "val", "test")


def open_dataset(path: Path | str, skip_bad: bool = False) -> PairDataset:
    """A dataset from a manifest file or a directory holding ``manifest.jsonl``."""
    target = Path(path)
    if target.is_dir():
        target = target / "manifest.jsonl"
    return load_manifest(target, skip_bad=skip_bad)


def _karpathy_split_names(split: str) -> set[str]:
    names = {name.strip() for name in split.split("+")}
    unknown = names - set(KARPATHY_SPLITS)
    if unknown:
        raise DataError(
            f"unknown Karpathy split(s) {sorted(unknown)}; known: {', '.join(KARPATHY_SPLITS)} "
            "(join with '+', e.g. 'train+restval')"
        )
    return names


def _karpathy_rows(
    images: Sequence[Mapping[str, Any]], wanted: set[str], root: Path, source: str
) -> Iterable[tuple[str, Record]]:
    for index, entry in enumerate(images):
        if entry.get("split") not in wanted:
            continue
        where = f"{source} images[{index}]"
        if "filename" not in entry:
            raise DataError(f"{where}: no 'filename'")
        relative = Path(entry.get("filepath", "")) / entry["filename"]
        texts = [str(s.get("raw", "")).strip() for s in entry.get("sentences", ())]
        identifier = entry.get("cocoid", entry.get("imgid", Path(entry["filename"]).stem))
        yield (
            where,
            Record(
                id=str(identifier),
                captions={"en": [t for t in texts if t]},
                image_path=root / relative,
            ),
        )


def load_karpathy(
    json_path: Path | str, image_root: Path | str, split: str = "test", skip_bad: bool = False
) -> PairDataset:
    """COCO or Flickr30k in Karpathy's split JSON; `split` may join names: 'train+restval'.

    Images are `image_root/filepath/filename` (COCO) or `image_root/filename` (Flickr30k).
    """
    json_path = Path(json_path)
    wanted = _karpathy_split_names(split)
    try:
        images = json.loads(json_path.read_text(encoding="utf-8"))["images"]
    except FileNotFoundError:
        raise DataError(f"Karpathy split file not found: {json_path}") from None
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise DataError(f"{json_path.name}: not a Karpathy split file ({exc})") from exc
    rows = list(_karpathy_rows(images, wanted, Path(image_root), json_path.name))
    if not rows:
        available = sorted({str(entry.get("split")) for entry in images})
        raise DataError(f"{json_path.name}: no images in split {split!r}; present: {available}")
    return _collect(rows, skip_bad, json_path)
