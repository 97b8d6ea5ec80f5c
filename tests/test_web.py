"""The web page's server side: thumbnails (stored at ingest, served with the read-key rule,
removed with their item, safe for any id) and the page and assets themselves."""

from __future__ import annotations

import hashlib
import io
import re
import shutil
from pathlib import Path
from urllib.parse import quote

import pytest
from conftest import ADMIN
from fastapi.testclient import TestClient
from PIL import Image
from test_service_api import b64, png

from service import web
from service.state.thumbnails import MAX_SIDE, ThumbnailStore, file_name, make_thumbnail
from training.data import generate_items, render

ITEMS = generate_items(6, seed=11, languages=("en",))
ODD_IDS = ["../../etc/passwd", "dir/sub/x.png", "ünï cødé ✓", "a" * 256, ".", "..", "%2F"]


def image_items(size: int = 64) -> list[dict]:
    """Synthetic items with a caption and a rendered image each."""
    return [{"id": it.id, "text": it.captions["en"][0], "image_base64": b64(png(render(it, size))),
             "payload": {"domain": it.domain}} for it in ITEMS]


def add(client: TestClient, items: list[dict]) -> None:
    r = client.post("/v1/galleries/shapes/items", headers=ADMIN, json={"items": items})
    assert r.status_code == 200, r.text


def thumb_url(item_id: str, gallery: str = "shapes") -> str:
    """The id travels percent-encoded, slashes included; the route takes the rest of the path."""
    return f"/v1/galleries/{gallery}/items/{quote(item_id, safe='')}/thumbnail"


def assert_not_found(response) -> None:
    assert response.status_code == 404, response.text
    body = response.json()
    assert set(body) == {"error"} and {"code", "message"} <= set(body["error"])


def decoded(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    assert image.format == "PNG"
    return image


# ---------------------------------------------------------------- the store alone
def test_make_thumbnail_shrinks_and_keeps_the_aspect() -> None:
    wide = decoded(make_thumbnail(Image.new("RGB", (400, 100), (200, 30, 30))))
    assert wide.size == (MAX_SIDE, MAX_SIDE // 4)
    small = decoded(make_thumbnail(Image.new("L", (20, 30))))  # never enlarged, made RGB
    assert small.size == (20, 30) and small.mode == "RGB"


def test_store_save_read_delete_and_odd_ids(tmp_path: Path) -> None:
    store = ThumbnailStore(tmp_path / "thumbs")
    data = make_thumbnail(Image.new("RGB", (50, 50), (0, 90, 200)))
    for item_id in ODD_IDS:
        assert store.read("g1", item_id) is None
        store.save("g1", item_id, data)
        assert store.read("g1", item_id) == data
    files = sorted(p.name for p in (tmp_path / "thumbs" / "g1").iterdir())
    # One flat file per id, named by its sha256: nothing escapes the gallery directory.
    assert files == sorted(file_name(i) for i in ODD_IDS)
    assert all(re.fullmatch(r"[0-9a-f]{64}\.png", f) for f in files)
    assert file_name("x") == hashlib.sha256(b"x").hexdigest() + ".png"
    assert {p.parent for p in tmp_path.rglob("*") if p.is_file()} == {tmp_path / "thumbs" / "g1"}
    assert store.read("g2", ODD_IDS[0]) is None  # galleries are separate
    store.delete("g1", [ODD_IDS[0], "never-there"])
    assert store.read("g1", ODD_IDS[0]) is None and store.read("g1", ODD_IDS[1]) == data


def test_store_refuses_names_that_cannot_be_galleries(tmp_path: Path) -> None:
    store = ThumbnailStore(tmp_path / "thumbs")
    data = make_thumbnail(Image.new("RGB", (8, 8)))
    for gallery in ("..", "../x", "a/b", "", "UPPER", "x" * 80):
        assert store.path(gallery, "id") is None and store.read(gallery, "id") is None
        with pytest.raises(ValueError):
            store.save(gallery, "id", data)
        store.delete(gallery, ["id"])  # a no-op, not an error
    assert not (tmp_path / "thumbs").exists()
    # replace() logs instead of raising: the vectors are stored already.
    store.replace("..", {"id": data})


def test_replace_saves_and_drops(tmp_path: Path) -> None:
    store = ThumbnailStore(tmp_path)
    data = make_thumbnail(Image.new("RGB", (8, 8)))
    store.replace("g", {"a": data, "b": data})
    store.replace("g", {"a": None})  # "a" was replaced by an item without an image
    assert store.read("g", "a") is None and store.read("g", "b") == data


# ---------------------------------------------------------------- over HTTP
@pytest.fixture
def client(gateway_factory):
    with gateway_factory() as c:
        add(c, image_items())
        yield c


def test_ingest_stores_and_the_gateway_serves_thumbnails(client: TestClient) -> None:
    items = image_items()
    r = client.get(thumb_url(items[0]["id"]))
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    image = decoded(r.content)
    assert image.size == (64, 64)  # smaller than the limit: kept as it is
    big = [{"id": "big", "image_base64": b64(png(Image.new("RGB", (300, 150), (9, 9, 9))))}]
    add(client, big)
    assert decoded(client.get(thumb_url("big")).content).size == (MAX_SIDE, MAX_SIDE // 2)


def test_missing_thumbnails_are_404_in_the_error_shape(client: TestClient) -> None:
    add(client, [{"id": "caption-only", "text": "a purple heart"}])
    assert_not_found(client.get(thumb_url("caption-only")))  # a text item has no picture
    assert_not_found(client.get(thumb_url("never-added")))
    assert_not_found(client.get(thumb_url(image_items()[0]["id"], gallery="nope")))
    assert_not_found(client.get("/v1/galleries/..%2F..%2Fetc/items/x/thumbnail"))


def test_odd_ids_round_trip(client: TestClient) -> None:
    picture = b64(png(Image.new("RGB", (40, 20), (250, 200, 0))))
    # URL parsers fold dot segments; TestClient decodes paths twice, so "%" is checked
    # against a real server in test_web_browser.py.
    odd = [i for i in ODD_IDS if i not in (".", "..") and "%" not in i]
    add(client, [{"id": i, "image_base64": picture} for i in odd])
    for item_id in odd:
        r = client.get(thumb_url(item_id))
        assert r.status_code == 200, (item_id, r.text)
        assert decoded(r.content).size == (40, 20)


def test_deleting_items_removes_their_thumbnails(client: TestClient, tmp_path: Path) -> None:
    ids = [it["id"] for it in image_items()]
    r = client.delete(f"/v1/galleries/shapes/items/{ids[0]}", headers=ADMIN)
    assert r.status_code == 200
    assert_not_found(client.get(thumb_url(ids[0])))
    r = client.post("/v1/galleries/shapes/items/delete", headers=ADMIN, json={"ids": ids[1:3]})
    assert r.status_code == 200
    for item_id in ids[1:3]:
        assert_not_found(client.get(thumb_url(item_id)))
    assert client.get(thumb_url(ids[3])).status_code == 200
    # Replacing an item by one without an image drops its picture too.
    add(client, [{"id": ids[3], "text": "now only a caption"}])
    assert_not_found(client.get(thumb_url(ids[3])))
    left = list((tmp_path / "data" / "thumbnails" / "shapes").glob("*.png"))
    assert len(left) == len(ids) - 4


def test_search_does_not_need_thumbnails(client: TestClient, tmp_path: Path) -> None:
    shutil.rmtree(tmp_path / "data" / "thumbnails")
    r = client.post("/v1/galleries/shapes/search", json={"text": "a red circle", "top_k": 3})
    assert r.status_code == 200 and len(r.json()["hits"]) == 3


def test_thumbnails_follow_the_read_key(gateway_factory) -> None:
    with gateway_factory(read_api_key="reader-key") as c:
        add(c, image_items()[:1])
        url = thumb_url(image_items()[0]["id"])
        r = c.get(url)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
        assert c.get(url, headers={"X-API-Key": "wrong"}).status_code == 401
        assert c.get(url, headers={"X-API-Key": "reader-key"}).status_code == 200
        assert c.get(url, headers=ADMIN).status_code == 200


# ---------------------------------------------------------------- the page
def test_page_and_assets(client: TestClient) -> None:
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in r.headers["content-security-policy"]
    assert "/web/app.js" in r.text and "/web/app.css" in r.text
    for name in ("/web/app.js", "/web/views.js", "/web/app.css"):
        asset = client.get(name)
        assert asset.status_code == 200, name
        assert asset.headers["content-type"].split(";")[0] in ("text/javascript", "text/css")
    # The page names its icon, so a browser does not ask for /favicon.ico (a 404).
    assert '<link rel="icon" href="/web/favicon.svg"' in r.text
    icon = client.get("/web/favicon.svg")
    assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
    assert icon.text.startswith("<svg ")
    for bad in ("/web/nope.js", "/web/index.html.bak", "/web/..%2F__init__.py"):
        assert_not_found(client.get(bad))
    assert "/" not in {route for route in client.get("/openapi.json").json()["paths"]}


def test_static_files_load_nothing_from_elsewhere() -> None:
    """No CDN and no inline script: the page must work offline and under its CSP."""
    for path in web.STATIC.iterdir():
        text = path.read_text()
        assert not re.search(r"(src|href)=\"(https?:)?//", text), path.name
        assert not re.search(r"\bimport\b[^;]*from\s+\"https?:", text), path.name
    assert "<script>" not in (web.STATIC / web.PAGE).read_text()
