"""The gateway's web page: static files (HTML, one stylesheet, two ES modules, an icon) shipped
inside the package and served as they are, with no build step.

Only the names in ``ASSETS`` can be served, so a request path never reaches the disk.
"""

from __future__ import annotations

from pathlib import Path

STATIC = Path(__file__).resolve().parent / "static"
PAGE = "index.html"
ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "views.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",  # linked from the page, so no browser asks for /favicon.ico
}
# Everything comes from the gateway itself: no CDN, no inline script, no plugins.
# Thumbnails fetched with an API key are shown through blob: URLs.
CSP = ("default-src 'self'; img-src 'self' blob: data:; script-src 'self'; "
       "style-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'")


def read(name: str) -> bytes | None:
    """The bytes of the page or of a listed asset; None for any other name."""
    if name != PAGE and name not in ASSETS:
        return None
    return (STATIC / name).read_bytes()
