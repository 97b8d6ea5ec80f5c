"""Decode untrusted image bytes into an RGB image, or fail with a typed error.

Pixel counts are checked from the header before any pixel is decoded, so an image
bomb costs nothing; truncated or corrupt data fails while decoding.
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings

from PIL import Image

from service.state.errors import BadImage, TooLarge


def png_base64(image: Image.Image) -> str:
    """An image as base64 PNG text (what the JSON API takes in ``image_base64``)."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def from_base64(text: str, max_bytes: int) -> bytes:
    """Bytes of a base64 (or ``data:...;base64,``) image string."""
    if text.startswith("data:") and "," in text:
        text = text.split(",", 1)[1]
    if len(text) * 3 // 4 > max_bytes:
        raise TooLarge(f"image is over the {max_bytes}-byte limit")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadImage(f"image_base64 is not valid base64: {exc}") from exc


def decode_image(data: bytes, max_pixels: int, max_bytes: int) -> Image.Image:
    if not data:
        raise BadImage("the image is empty")
    if len(data) > max_bytes:
        raise TooLarge(f"image of {len(data)} bytes is over the {max_bytes}-byte limit")
    image = _open(data)
    width, height = image.size
    if width * height > max_pixels:
        raise TooLarge(f"image of {width}x{height} pixels is over the {max_pixels}-pixel limit")
    try:
        image.load()
        return image.convert("RGB")
    except Exception as exc:  # PIL decoders raise many types on hostile input
        raise BadImage(f"the image is truncated or corrupt: {exc}") from exc


def _open(data: bytes) -> Image.Image:
    """Read the header only (size, format)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            return Image.open(io.BytesIO(data))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise TooLarge(f"image is too large: {exc}") from exc
    except Exception as exc:  # PIL raises many types for non-image bytes
        raise BadImage(f"the data is not an image PIL can read: {exc}") from exc
