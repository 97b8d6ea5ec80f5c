"""Decode untrusted image bytes into an RGB image, or fail with a typed error.

Pixel counts are checked from the header before any pixel is decoded, so an image
bomb costs nothing; truncated or corrupt data fails while decoding. Messages are fixed
texts: PIL's exception texts carry object reprs and internals (``<_io.BytesIO object at
0x...>``), so they stay the error's cause (``from exc``) and never reach the caller.
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
        raise BadImage("image_base64 is not base64 (nor a base64 data: URL)") from exc


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
        raise BadImage("the image is truncated or corrupt") from exc


def _open(data: bytes) -> Image.Image:
    """Read the header only (size, format)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            return Image.open(io.BytesIO(data))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise TooLarge("the image has too many pixels to decode") from exc
    except Exception as exc:  # PIL raises many types for non-image bytes
        raise BadImage("the data is not a readable image; send PNG, JPEG or another "
                       "common format") from exc
