"""The synthetic image-text world: seeded scenes of shapes, their captions and renderings.

Each item is one or two coloured shapes on a plain or textured background, described by
attributes (a `dict[str, str]`), captioned several times in several languages from random
subsets of those attributes, and rendered from exact parameters kept on the item, so an
image can be re-rendered at any size without the generator. An image is relevant to a
caption when it has every attribute the caption mentions (`is_relevant`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from random import Random
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from training.data.languages import PHRASEBOOKS
from training.errors import DataError

LANGUAGES: tuple[str, ...] = ("en", "de", "es", "ru")

# Nominal RGB of the object colours: far apart in RGB so a tiny ViT separates them easily.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 170, 40),
    "blue": (30, 70, 220),
    "yellow": (240, 210, 20),
    "purple": (140, 40, 180),
    "orange": (245, 130, 20),
    "white": (250, 250, 250),
    "black": (20, 20, 20),
}
PLAIN_BACKGROUNDS: dict[str, tuple[int, int, int]] = {
    "grey": (200, 200, 200),
    "white": (245, 245, 245),
    "black": (25, 25, 25),
}
# Textures are two pale grey tones so any object colour except white stands out.
TEXTURES: dict[str, tuple[tuple[int, int, int], tuple[int, int, int]]] = {
    "stripes": ((235, 235, 235), (195, 195, 195)),
    "dots": ((235, 235, 235), (170, 170, 170)),
    "checks": ((235, 235, 235), (195, 195, 195)),
    "gradient": ((245, 245, 245), (130, 130, 130)),
}
SIZES: dict[str, float] = {"small": 0.18, "large": 0.3}  # radius / image side
POSITIONS: dict[str, tuple[float, float]] = {
    "left": (0.28, 0.5),
    "right": (0.72, 0.5),
    "top": (0.5, 0.28),
    "bottom": (0.5, 0.72),
    "centre": (0.5, 0.5),
}
RELATIONS: tuple[str, ...] = ("left-of", "above")
# Below this RGB distance an object would blend into its background.
_MIN_CONTRAST = 100.0


@dataclass(frozen=True)
class DomainSpec:
    """A family of scenes; continual phases move from one domain to the next."""

    name: str
    shapes: tuple[str, ...]
    backgrounds: tuple[str, ...]
    objects: int  # 1: single object with size/position; 2: a pair with a relation
    description: str


_BASIC = ("circle", "square", "triangle")
_POLYGONS = ("pentagon", "hexagon", "diamond")
_PLAIN = tuple(PLAIN_BACKGROUNDS)

DOMAINS: dict[str, DomainSpec] = {
    spec.name: spec
    for spec in (
        DomainSpec("basic", _BASIC, _PLAIN, 1, "one basic shape on a plain background"),
        DomainSpec("polygons", _POLYGONS, _PLAIN, 1, "one polygon on a plain background"),
        DomainSpec(
            "symbols", ("star", "cross", "heart"), _PLAIN, 1, "one symbol on a plain background"
        ),
        DomainSpec(
            "textures",
            _BASIC + _POLYGONS,
            tuple(TEXTURES),
            1,
            "one basic shape or polygon on a textured background",
        ),
        DomainSpec("pairs", _BASIC + _POLYGONS, _PLAIN, 2, "two shapes and their relation"),
    )
}
DEFAULT_DOMAINS: tuple[str, ...] = tuple(DOMAINS)


@dataclass(frozen=True)
class SynthItem:
    """One synthetic image with its attributes and parallel captions.

    `captions[lang][k]` mentions exactly `caption_attributes[k]` in every language, so
    caption k of one language is a translation of caption k of another.
    """

    id: str
    domain: str
    attributes: dict[str, str]
    captions: dict[str, list[str]]
    caption_attributes: list[dict[str, str]]
    render: dict[str, Any]

    def __hash__(self) -> int:
        # The generated hash would fail on the dict fields; ids are unique within a stream.
        return hash(self.id)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SynthItem:
        fields = ("id", "domain", "attributes", "captions", "caption_attributes", "render")
        return cls(**{name: data[name] for name in fields})


def _rgb_distance(a: Sequence[int], b: Sequence[int]) -> float:
    return math.dist(a, b)


def _background_tones(background: str) -> tuple[tuple[int, int, int], ...]:
    if background in PLAIN_BACKGROUNDS:
        return (PLAIN_BACKGROUNDS[background],)
    return TEXTURES[background]


def _contrasting_colours(background: str) -> tuple[str, ...]:
    tones = _background_tones(background)
    return tuple(
        name
        for name, rgb in COLOURS.items()
        if min(_rgb_distance(rgb, tone) for tone in tones) >= _MIN_CONTRAST
    )


CONTRASTING: dict[str, tuple[str, ...]] = {
    background: _contrasting_colours(background) for background in (*PLAIN_BACKGROUNDS, *TEXTURES)
}


def check_domains(domains: Sequence[str]) -> None:
    """DataError unless `domains` is non-empty and every name is a known domain."""
    if not domains:
        raise DataError(f"no domains given; known domains: {', '.join(DOMAINS)}")
    unknown = [name for name in domains if name not in DOMAINS]
    if unknown:
        raise DataError(f"unknown domain(s) {unknown}; known domains: {', '.join(DOMAINS)}")


def check_languages(languages: Sequence[str]) -> None:
    """DataError unless `languages` is non-empty and every code has a phrasebook."""
    if not languages:
        raise DataError(f"no languages given; known languages: {', '.join(LANGUAGES)}")
    unknown = [code for code in languages if code not in PHRASEBOOKS]
    if unknown:
        raise DataError(f"unknown language(s) {unknown}; known languages: {', '.join(LANGUAGES)}")


def sample_attributes(rng: Random, spec: DomainSpec) -> dict[str, str]:
    """Attributes of one scene of `spec`; object colours always contrast with the background."""
    background = rng.choice(spec.backgrounds)
    colours = CONTRASTING[background]
    if spec.objects == 1:
        return {
            "shape": rng.choice(spec.shapes),
            "colour": rng.choice(colours),
            "size": rng.choice(tuple(SIZES)),
            "position": rng.choice(tuple(POSITIONS)),
            "background": background,
        }
    first = (rng.choice(spec.shapes), rng.choice(colours))
    second = first
    while second == first:  # two identical objects would make the relation unreadable
        second = (rng.choice(spec.shapes), rng.choice(colours))
    return {
        "a.shape": first[0],
        "a.colour": first[1],
        "b.shape": second[0],
        "b.colour": second[1],
        "relation": rng.choice(RELATIONS),
        "background": background,
    }


def _single_mention_keys(rng: Random, k: int) -> set[str]:
    if k == 0:  # the first caption always says everything
        return {"shape", "colour", "size", "position", "background"}
    if k == 1:  # and the second nearly everything
        keys = {"shape", "colour"}
        optional_p = 0.6
    else:
        keys = {key for key in ("shape", "colour") if rng.random() < 0.8}
        keys = keys or {rng.choice(("shape", "colour"))}
        optional_p = 0.35
    return keys | {key for key in ("size", "position", "background") if rng.random() < optional_p}


def _pair_mention_keys(rng: Random, k: int) -> set[str]:
    keys = {"a.shape", "b.shape", "relation"}
    if k == 0:
        return keys | {"a.colour", "b.colour", "background"}
    colour_p, background_p = (1.0, 0.5) if k == 1 else (0.6, 0.3)
    keys |= {key for key in ("a.colour", "b.colour") if rng.random() < colour_p}
    return keys | ({"background"} if rng.random() < background_p else set())


def choose_mention(rng: Random, attributes: Mapping[str, str], k: int) -> dict[str, str]:
    """Attributes caption k mentions: a random subset, in the item's key order."""
    pick = _pair_mention_keys if "relation" in attributes else _single_mention_keys
    keys = pick(rng, k)
    return {key: value for key, value in attributes.items() if key in keys}


def _jitter_rgb(rng: Random, rgb: Sequence[int], amount: int) -> list[int]:
    return [min(255, max(0, c + rng.randint(-amount, amount))) for c in rgb]


def _jitter_brightness(rng: Random, rgb: Sequence[int], amount: int) -> list[int]:
    # Same shift on every channel: backgrounds vary in brightness but never take on a hue.
    shift = rng.randint(-amount, amount)
    return [min(255, max(0, c + shift)) for c in rgb]


def _background_params(rng: Random, background: str) -> dict[str, Any]:
    if background in PLAIN_BACKGROUNDS:
        return {"kind": "plain", "rgb": _jitter_brightness(rng, PLAIN_BACKGROUNDS[background], 8)}
    light, dark = TEXTURES[background]
    params: dict[str, Any] = {
        "kind": background,
        "rgb": _jitter_brightness(rng, light, 8),
        "rgb2": _jitter_brightness(rng, dark, 8),
        "period": round(rng.uniform(0.1, 0.16), 4),
    }
    if background in ("stripes", "gradient"):
        params["angle"] = rng.choice(
            (0, 45, 90, 135) if background == "stripes" else (0, 90, 180, 270)
        )
    return params


def _object_params(
    rng: Random, shape: str, colour: str, radius: float, centre: tuple[float, float]
) -> dict[str, Any]:
    # Keep the whole shape inside the frame whatever the jitter did.
    low, high = radius * 1.15, 1 - radius * 1.15
    cx = min(high, max(low, centre[0]))
    cy = min(high, max(low, centre[1]))
    return {
        "shape": shape,
        "cx": round(cx, 4),
        "cy": round(cy, 4),
        "r": round(radius, 4),
        "rotation": 0.0 if shape == "circle" else round(rng.uniform(-12, 12), 2),
        "rgb": _jitter_rgb(rng, COLOURS[colour], 10),
    }


def _single_objects(rng: Random, attributes: Mapping[str, str]) -> list[dict[str, Any]]:
    radius = SIZES[attributes["size"]] + rng.uniform(-0.01, 0.01)
    x, y = POSITIONS[attributes["position"]]
    centre = (x + rng.uniform(-0.03, 0.03), y + rng.uniform(-0.03, 0.03))
    return [_object_params(rng, attributes["shape"], attributes["colour"], radius, centre)]


def _pair_objects(rng: Random, attributes: Mapping[str, str]) -> list[dict[str, Any]]:
    objects = []
    for role, main in (("a", 0.26), ("b", 0.74)):
        # The relation axis separates the objects; the other axis only jitters a little.
        along, across = main + rng.uniform(-0.03, 0.03), 0.5 + rng.uniform(-0.1, 0.1)
        centre = (along, across) if attributes["relation"] == "left-of" else (across, along)
        radius = rng.uniform(0.15, 0.2)
        shape, colour = attributes[f"{role}.shape"], attributes[f"{role}.colour"]
        objects.append(_object_params(rng, shape, colour, radius, centre))
    return objects


def sample_render(rng: Random, attributes: Mapping[str, str]) -> dict[str, Any]:
    """Exact render parameters (fractions of the image side) for a scene's attributes."""
    place = _pair_objects if "relation" in attributes else _single_objects
    background = _background_params(rng, attributes["background"])
    return {"background": background, "objects": place(rng, attributes)}


def _item_rng(seed: int, index: int, stream: str) -> Random:
    # String seeds hash with SHA-512, stable across processes and platforms; one stream per
    # purpose keeps e.g. the English captions unchanged when another language is added.
    return Random(f"nobackfill-synth:{seed}:{index}:{stream}")


def make_item(
    index: int,
    seed: int,
    domain: str,
    languages: Sequence[str] = LANGUAGES,
    captions_per_image: int = 5,
    id_prefix: str = "",
) -> SynthItem:
    """Item `index` of the seeded stream; independent of how many items are generated."""
    rng = _item_rng(seed, index, "scene")
    attributes = sample_attributes(rng, DOMAINS[domain])
    render_params = sample_render(rng, attributes)
    mentions = [choose_mention(rng, attributes, k) for k in range(captions_per_image)]
    flips = [rng.random() < 0.5 for _ in mentions]
    captions = {}
    for code in languages:
        words = _item_rng(seed, index, code)
        book = PHRASEBOOKS[code]
        captions[code] = [book.caption(words, m, f) for m, f in zip(mentions, flips)]
    return SynthItem(
        f"{id_prefix}{domain}-{index:06d}", domain, attributes, captions, mentions, render_params
    )


def generate_items(
    n: int,
    seed: int,
    domains: Sequence[str] = DEFAULT_DOMAINS,
    languages: Sequence[str] = LANGUAGES,
    captions_per_image: int = 5,
    id_prefix: str = "",
) -> list[SynthItem]:
    """`n` seeded items; several domains are interleaved evenly (item i: domains[i % len])."""
    if n < 1:
        raise DataError(f"n must be at least 1, got {n}")
    if captions_per_image < 1:
        raise DataError(f"captions_per_image must be at least 1, got {captions_per_image}")
    check_domains(domains)
    check_languages(languages)
    return [
        make_item(i, seed, domains[i % len(domains)], languages, captions_per_image, id_prefix)
        for i in range(n)
    ]


def is_relevant(item_attributes: Mapping[str, str], caption_attributes: Mapping[str, str]) -> bool:
    """True when the item has every attribute (key and value) that the caption mentions."""
    return all(item_attributes.get(key) == value for key, value in caption_attributes.items())


# ---------------------------------------------------------------------------------------
# Rendering


_SUPERSAMPLE = 4  # draw large and downscale: smooth edges, same look at every image size


def _regular_polygon(corners: int, radius: float, start_deg: float) -> list[tuple[float, float]]:
    step = 2 * math.pi / corners
    start = math.radians(start_deg)
    return [
        (radius * math.cos(start + i * step), radius * math.sin(start + i * step))
        for i in range(corners)
    ]


def _star() -> list[tuple[float, float]]:
    outer = _regular_polygon(5, 1.15, -90)
    inner = _regular_polygon(5, 0.48, -54)
    return [point for pair in zip(outer, inner) for point in pair]


def _cross(arm: float = 0.36, reach: float = 1.05) -> list[tuple[float, float]]:
    a, r = arm, reach
    return [
        (-a, -r), (a, -r), (a, -a), (r, -a), (r, a), (a, a),
        (a, r), (-a, r), (-a, a), (-r, a), (-r, -a), (-a, -a),
    ]  # fmt: skip


def _heart(points: int = 60) -> list[tuple[float, float]]:
    # The classic heart curve, scaled to about unit radius and centred (y points down).
    outline = []
    for i in range(points):
        t = 2 * math.pi * i / points
        x = 16 * math.sin(t) ** 3
        y = 13 * math.cos(t) - 5 * math.cos(2 * t) - 2 * math.cos(3 * t) - math.cos(4 * t)
        outline.append((x / 15.5, (-y - 2.5) / 15.5))
    return outline


# Outlines in units of the object radius, centred on the origin, y pointing down.
OUTLINES: dict[str, list[tuple[float, float]]] = {
    "square": [(-0.85, -0.85), (0.85, -0.85), (0.85, 0.85), (-0.85, 0.85)],
    "triangle": _regular_polygon(3, 1.15, -90),
    "pentagon": _regular_polygon(5, 1.0, -90),
    "hexagon": _regular_polygon(6, 1.0, 0),
    "diamond": [(0.0, -1.15), (0.72, 0.0), (0.0, 1.15), (-0.72, 0.0)],
    "star": _star(),
    "cross": _cross(),
    "heart": _heart(),
}
SHAPES: tuple[str, ...] = ("circle", *OUTLINES)


def _pixel_grid(size: int) -> tuple[np.ndarray, np.ndarray]:
    # Pixel centres as fractions of the side, so textures scale with the image.
    coords = (np.arange(size, dtype=np.float32) + 0.5) / size
    return np.meshgrid(coords, coords)  # x varies along columns, y along rows


def _texture_weight(params: Mapping[str, Any], size: int) -> np.ndarray:
    """Per-pixel weight of the second tone in [0, 1], shape [size, size]."""
    x, y = _pixel_grid(size)
    kind, period = params["kind"], params.get("period", 0.125)
    if kind == "gradient":
        theta = math.radians(params["angle"])
        t = (x - 0.5) * math.cos(theta) + (y - 0.5) * math.sin(theta)
        return np.clip(t + 0.5, 0.0, 1.0)
    if kind == "stripes":
        theta = math.radians(params["angle"])
        t = x * math.cos(theta) + y * math.sin(theta)
        return (np.floor(t / period) % 2).astype(np.float32)
    if kind == "checks":
        return ((np.floor(x / period) + np.floor(y / period)) % 2).astype(np.float32)
    if kind == "dots":
        dx = (x % period) - period / 2
        dy = (y % period) - period / 2
        return (dx * dx + dy * dy < (0.28 * period) ** 2).astype(np.float32)
    raise DataError(f"unknown background kind {kind!r} in render parameters")


def _background_image(params: Mapping[str, Any], size: int) -> Image.Image:
    first = np.asarray(params["rgb"], dtype=np.float32)
    if params["kind"] == "plain":
        return Image.new("RGB", (size, size), tuple(int(c) for c in first))
    second = np.asarray(params["rgb2"], dtype=np.float32)
    weight = _texture_weight(params, size)[..., None]  # [size, size, 1]
    pixels = first * (1 - weight) + second * weight  # [size, size, 3]
    return Image.fromarray(np.rint(pixels).astype(np.uint8), "RGB")


def _draw_object(draw: ImageDraw.ImageDraw, obj: Mapping[str, Any], size: int) -> None:
    cx, cy, r = obj["cx"] * size, obj["cy"] * size, obj["r"] * size
    fill = tuple(int(c) for c in obj["rgb"])
    if obj["shape"] == "circle":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
        return
    if obj["shape"] not in OUTLINES:
        raise DataError(f"unknown shape {obj['shape']!r} in render parameters")
    theta = math.radians(obj["rotation"])
    cos, sin = math.cos(theta), math.sin(theta)
    points = [
        (cx + r * (x * cos - y * sin), cy + r * (x * sin + y * cos))
        for x, y in OUTLINES[obj["shape"]]
    ]
    draw.polygon(points, fill=fill)


def render(item: SynthItem, image_size: int = 64) -> Image.Image:
    """RGB image of `item`, a pure function of `item.render` and `image_size`."""
    if image_size < 8:
        raise DataError(f"image_size must be at least 8 pixels, got {image_size}")
    size = image_size * _SUPERSAMPLE
    canvas = _background_image(item.render["background"], size)
    draw = ImageDraw.Draw(canvas)
    for obj in item.render["objects"]:
        _draw_object(draw, obj, size)
    return canvas.resize((image_size, image_size), Image.Resampling.BOX)


# ---------------------------------------------------------------------------------------
# Writing to disk


def _progress(items: Sequence[SynthItem], show: bool) -> Sequence[SynthItem]:
    if not show:
        return items
    from tqdm import tqdm  # type: ignore[import-untyped]  # imported only when asked for

    return tqdm(items, desc="rendering", unit="img")


def write_dataset(
    out_dir: Path | str,
    n: int,
    seed: int,
    domains: Sequence[str] = DEFAULT_DOMAINS,
    languages: Sequence[str] = LANGUAGES,
    image_size: int = 64,
    captions_per_image: int = 5,
    show_progress: bool = False,
    id_prefix: str = "",
) -> Path:
    """Render `n` items to `out_dir/images/<id>.png` and describe them in `manifest.jsonl`.

    Returns the manifest path. The manifest is written last and atomically, so its presence
    means every image it lists is on disk.
    """
    items = generate_items(n, seed, domains, languages, captions_per_image, id_prefix)
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    lines = []
    for item in _progress(items, show_progress):
        image_name = f"images/{item.id}.png"
        render(item, image_size).save(out / image_name, format="PNG")
        record = {"image": image_name, "image_size": image_size, **item.to_json()}
        lines.append(json.dumps(record, ensure_ascii=False))
    manifest = out / "manifest.jsonl"
    partial = out / "manifest.jsonl.partial"
    partial.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(partial, manifest)
    return manifest
