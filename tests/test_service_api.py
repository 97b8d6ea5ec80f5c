"""The gateway's HTTP API: every endpoint, auth, every bad input, the 409 space check,
idempotent ingest, and the CLI entry of the serving benchmark."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import shutil
from pathlib import Path

import pytest
from conftest import ADMIN
from fastapi.testclient import TestClient
from PIL import Image

from training.data import generate_items, render

EN_ITEMS = generate_items(10, seed=5, languages=("en",))


def png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def world_items(n: int = 8) -> list[dict]:
    """Synthetic items with a caption, a rendered image and a payload each."""
    return [{"id": it.id, "text": it.captions["en"][0], "image_base64": b64(png(render(it, 32))),
             "payload": {"domain": it.domain, "background": it.attributes["background"]}}
            for it in EN_ITEMS[:n]]


def add(client: TestClient, items: list[dict], gallery: str = "shapes") -> dict:
    r = client.post(f"/v1/galleries/{gallery}/items", headers=ADMIN, json={"items": items})
    assert r.status_code == 200, r.text
    return r.json()


def search(client: TestClient, status: int = 200, headers: dict | None = None,
           gallery: str = "shapes", **body: object) -> dict:
    r = client.post(f"/v1/galleries/{gallery}/search", json=body, headers=headers or {})
    assert r.status_code == status, r.text
    return r.json()


def assert_error(response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and {"code", "message"} <= set(body["error"])
    if code is not None:
        assert body["error"]["code"] == code, body
    return body["error"]


@pytest.fixture
def client(gateway_factory):
    with gateway_factory(max_image_pixels=64 * 64, top_k_max=20) as c:
        add(c, world_items())
        yield c


# ---------------------------------------------------------------- search and ingest
def test_search_by_text_and_image(client: TestClient) -> None:
    items = world_items()
    out = search(client, text=EN_ITEMS[0].captions["en"][0], top_k=5)
    assert (out["gallery"], out["version"], out["route"], out["space"], out["kind"]) == \
        ("shapes", "v1", "native", "v1", "image")
    assert len(out["hits"]) == 5 and all(h["version"] == "v1" for h in out["hits"])
    scores = [h["score"] for h in out["hits"]]
    assert scores == sorted(scores, reverse=True)
    # An item's own image is its own nearest image (cosine 1).
    out = search(client, image_base64=items[3]["image_base64"], top_k=1)
    assert out["hits"][0]["id"] == items[3]["id"]
    assert out["hits"][0]["score"] == pytest.approx(1.0, abs=1e-4)
    assert out["hits"][0]["payload"] == items[3]["payload"]
    # ... and a caption is its own nearest text.
    out = search(client, text=items[2]["text"], kind="text", top_k=1)
    assert out["hits"][0]["id"] == items[2]["id"] and out["kind"] == "text"


def test_multipart_search_and_filters(client: TestClient) -> None:
    items = world_items()
    image = base64.b64decode(items[4]["image_base64"])
    r = client.post("/v1/galleries/shapes/search", files={"image": ("q.png", image)},
                    data={"top_k": "2"})
    assert r.status_code == 200, r.text
    assert r.json()["hits"][0]["id"] == items[4]["id"]
    domain = items[1]["payload"]["domain"]
    out = search(client, text="a shape", top_k=20, filter={"domain": domain})
    assert out["hits"] and {h["payload"]["domain"] for h in out["hits"]} == {domain}
    out = search(client, text="a shape", top_k=20, filter={"domain": ["basic", "pairs"]})
    assert {h["payload"]["domain"] for h in out["hits"]} <= {"basic", "pairs"}
    r = client.post("/v1/galleries/shapes/search", data={"text": "a shape",
                                                         "filter": json.dumps({"domain": domain})})
    assert {h["payload"]["domain"] for h in r.json()["hits"]} == {domain}


def test_ingest_is_idempotent_by_id(client: TestClient) -> None:
    items = world_items()
    assert client.get("/v1/galleries/shapes", headers=ADMIN).json()["items"] == len(items)
    again = add(client, items)
    assert (again["count"], again["version"], again["space"]) == (len(items), "v1", "v1")
    changed = [{**items[0], "payload": {"domain": "changed"}}]
    add(client, changed)
    assert client.get("/v1/galleries/shapes", headers=ADMIN).json()["items"] == len(items)
    out = search(client, image_base64=items[0]["image_base64"], top_k=1)
    assert out["hits"][0]["payload"] == {"domain": "changed"}


def test_text_only_and_multipart_image_items(client: TestClient) -> None:
    add(client, [{"id": "caption-only", "text": "a purple heart on a black background"}])
    out = search(client, text="a purple heart on a black background", kind="text", top_k=1)
    assert out["hits"][0]["id"] == "caption-only"
    out = search(client, text="a purple heart", kind="image", top_k=20)
    assert "caption-only" not in {h["id"] for h in out["hits"]}  # it has no image
    upload = png(Image.new("RGB", (20, 20), (250, 0, 0)))
    r = client.post("/v1/galleries/shapes/items", headers=ADMIN,
                    files=[("images", ("red.png", upload)), ("images", ("red2.png", upload))],
                    data={"ids": ["red-a", "red-b"], "payloads": json.dumps([{"n": 1}, None])})
    assert r.status_code == 200, r.text
    hits = search(client, image_base64=b64(upload), top_k=2)["hits"]
    assert {h["id"] for h in hits} == {"red-a", "red-b"}
    assert {json.dumps(h["payload"]) for h in hits} == {'{"n": 1}', "{}"}
    r = client.post("/v1/galleries/shapes/items", headers=ADMIN,
                    files=[("images", ("blue.png", upload))])  # id defaults to the file name
    assert r.status_code == 200 and r.json()["count"] == 1


def test_delete_items(client: TestClient) -> None:
    items = world_items()
    r = client.post("/v1/galleries/shapes/items/delete", headers=ADMIN,
                    json={"ids": [items[0]["id"], "never-there"]})
    assert r.status_code == 200 and r.json() == {"gallery": "shapes", "deleted": 2}
    r = client.delete(f"/v1/galleries/shapes/items/{items[1]['id']}", headers=ADMIN)
    assert r.status_code == 200
    ids = {h["id"] for h in search(client, text="shape", top_k=20)["hits"]}
    assert ids == {it["id"] for it in items[2:]}


# ---------------------------------------------------------------- bad input
def test_bad_search_inputs(client: TestClient) -> None:
    good = png(render(EN_ITEMS[0], 32))
    cases = [
        ({"image_base64": b64(b"definitely not an image")}, 422, "bad_image"),
        ({"image_base64": b64(good[: len(good) // 2])}, 422, "bad_image"),  # truncated
        ({"image_base64": b64(png(Image.new("RGB", (65, 64))))}, 413, "too_large"),
        ({"image_base64": "%%% not base64 %%%"}, 422, "bad_image"),
        ({"image_base64": ""}, 422, "bad_image"),
        ({"text": ""}, 422, "invalid_input"),
        ({"text": "   \n"}, 422, "invalid_input"),
        ({}, 422, "invalid_input"),
        ({"text": "a", "image_base64": b64(good)}, 422, "invalid_input"),
        ({"text": "a", "top_k": 0}, 422, "invalid_request"),
        ({"text": "a", "top_k": 21}, 422, "invalid_input"),  # over top_k_max
        ({"text": "a", "top_k": "many"}, 422, "invalid_request"),
        ({"text": "a", "kind": "video"}, 422, "invalid_request"),
        ({"text": "a", "filter": {"bad key!": 1}}, 422, "invalid_request"),
        ({"text": "a", "filter": {"n": 1.5}}, 422, "invalid_request"),
        ({"text": "a", "filter": {"n": [1, "a"]}}, 422, "invalid_request"),
        ({"text": "a", "filter": {"n": [True]}}, 422, "invalid_request"),
        ({"text": "a", "filter": {"n": 2**70}}, 422, "invalid_request"),
        ({"text": "a", "filter": {"n": []}}, 422, "invalid_request"),
        ({"text": "a", "surprise": 1}, 422, "invalid_request"),
        ({"text": 5}, 422, "invalid_request"),
    ]
    for body, status, code in cases:
        r = client.post("/v1/galleries/shapes/search", json=body)
        assert_error(r, status, code)
    for raw in (b"{not json", b"", b"[1, 2]", b"null", b"\xff\xfe"):
        r = client.post("/v1/galleries/shapes/search", content=raw,
                        headers={"content-type": "application/json"})
        assert_error(r, 422)
    r = client.post("/v1/galleries/shapes/search", content=b"text=a",
                    headers={"content-type": "text/plain"})
    assert_error(r, 415, "unsupported_media_type")
    assert_error(client.post("/v1/galleries/nope/search", json={"text": "a"}), 404,
                 "gallery_not_found")


def test_bad_multipart_inputs(client: TestClient) -> None:
    url = "/v1/galleries/shapes/search"
    assert_error(client.post(url, files={"image": ("x.png", b"GIF89a-broken")}), 422, "bad_image")
    assert_error(client.post(url, files={"image": ("x.png", b"")}), 422, "bad_image")
    assert_error(client.post(url, data={"text": "a", "filter": "{oops"}), 422)
    assert_error(client.post(url, data={"text": "a", "top_k": "x"}), 422)
    assert_error(client.post(url, data={"image": "not a file"}), 422)
    big = png(Image.new("RGB", (100, 100)))
    assert_error(client.post(url, files={"image": ("big.png", big)}), 413)
    items = "/v1/galleries/shapes/items"
    assert_error(client.post(items, headers=ADMIN, data={"ids": "a"}), 422)
    assert_error(client.post(items, headers=ADMIN, files=[("images", ("a.png", big))]), 413)
    assert_error(client.post(items, headers=ADMIN, data={"ids": ["a", "b"]},
                             files=[("images", ("a.png", png(Image.new("RGB", (8, 8)))))]), 422)


def test_bad_ingest_rejects_the_whole_batch(client: TestClient) -> None:
    before = client.get("/v1/galleries/shapes", headers=ADMIN).json()["items"]
    new = [{"id": "fresh", "text": "a new caption"}]
    cases = [
        [*new, {"id": "bad", "image_base64": b64(b"not an image")}],
        [*new, {"id": "empty", "text": " "}],
        [*new, {"id": "nothing"}],
        [*new, {"id": "fresh", "text": "duplicate id"}],
        [*new, {"id": "", "text": "no id"}],
    ]
    for items in cases:
        r = client.post("/v1/galleries/shapes/items", headers=ADMIN, json={"items": items})
        assert_error(r, 422)
    r = client.post("/v1/galleries/shapes/items", headers=ADMIN, json={"items": []})
    assert_error(r, 422)
    r = client.post("/v1/galleries/nope/items", headers=ADMIN, json={"items": new})
    assert_error(r, 404)
    assert client.get("/v1/galleries/shapes", headers=ADMIN).json()["items"] == before


def test_limits(gateway_factory) -> None:
    with gateway_factory(ingest_max_items=2, max_request_bytes=4096) as client:
        r = client.post("/v1/galleries/shapes/items", headers=ADMIN,
                        json={"items": [{"id": str(i), "text": "t"} for i in range(3)]})
        assert "limit is 2" in assert_error(r, 422)["message"]
        r = client.post("/v1/galleries/shapes/search", json={"text": "x" * 5000})
        assert_error(r, 413, "too_large")


# ---------------------------------------------------------------- auth
def test_admin_routes_need_an_admin_key(client: TestClient) -> None:
    admin_calls = [("get", "/v1/models", None), ("get", "/v1/models/v1", None),
                   ("post", "/v1/models", {"source": "/x"}),
                   ("post", "/v1/models/v2/promote", {"gallery": "shapes"}),
                   ("post", "/v1/models/v1/rollback", {"gallery": "shapes"}),
                   ("get", "/v1/galleries", None), ("get", "/v1/galleries/shapes", None),
                   ("post", "/v1/galleries", {"name": "g2", "space": "v1"}),
                   ("post", "/v1/galleries/shapes/items", {"items": [{"id": "a", "text": "b"}]}),
                   ("post", "/v1/galleries/shapes/items/delete", {"ids": ["a"]}),
                   ("delete", "/v1/galleries/shapes/items/a", None)]
    for method, url, body in admin_calls:
        for headers in ({}, {"X-API-Key": "wrong"}, {"X-API-Key": ""}):
            kwargs = {"json": body} if body is not None else {}
            r = client.request(method, url, headers=headers, **kwargs)
            assert_error(r, 401, "unauthorized")
    assert client.get("/v1/models", headers=ADMIN).status_code == 200


def test_optional_read_key(gateway_factory) -> None:
    with gateway_factory(read_api_key="reader-key") as client:
        body = {"text": "a red circle"}
        assert_error(client.post("/v1/galleries/shapes/search", json=body), 401)
        assert_error(client.post("/v1/galleries/shapes/search", json=body,
                                 headers={"X-API-Key": "nope"}), 401)
        search(client, headers={"X-API-Key": "reader-key"}, **body)
        search(client, headers=ADMIN, **body)
        assert_error(client.get("/v1/models", headers={"X-API-Key": "reader-key"}), 401)


# ---------------------------------------------------------------- models and galleries
def test_model_listing(client: TestClient) -> None:
    versions = client.get("/v1/models", headers=ADMIN).json()
    assert [v["version_id"] for v in versions] == ["v1", "v2", "v3"]
    v2 = versions[1]
    assert v2["gate"]["passed"] is True and v2["manifest"]["space"] == "v1"
    assert (v2["gate"]["gallery"], v2["gates"][0]["current"]) == ("shapes", True)
    assert v2["routes"] == ["v1"] and "files" in v2["manifest"]
    assert client.get("/v1/models/v3", headers=ADMIN).json()["space"] == "v3"
    assert_error(client.get("/v1/models/nope", headers=ADMIN), 404, "version_not_found")


def test_register_through_the_api(client: TestClient, micro_versions: dict[str, Path],
                                  tmp_path: Path) -> None:
    source = tmp_path / "v4"
    shutil.copytree(micro_versions["v1"], source)
    manifest = json.loads((source / "manifest.json").read_text())
    (source / "manifest.json").write_text(json.dumps({**manifest, "version_id": "v4"}))
    r = client.post("/v1/models", headers=ADMIN,
                    json={"source": str(source), "gate": {"passed": True, "r1": 0.9}})
    assert "gate report cannot be supplied" in assert_error(r, 422, "invalid_request")["message"]
    r = client.post("/v1/models", headers=ADMIN, json={"source": str(source)})
    assert r.status_code == 201, r.text
    assert r.json()["gate"] is None and r.json()["registered_by"] == "ops"
    assert_error(client.post("/v1/models", headers=ADMIN, json={"source": str(tmp_path / "no")}),
                 422, "invalid_artifact")
    (source / "model.safetensors").write_bytes(b"tampered")
    (source / "manifest.json").write_text(json.dumps({**manifest, "version_id": "v5"}))
    assert_error(client.post("/v1/models", headers=ADMIN, json={"source": str(source)}),
                 422, "invalid_artifact")
    r = client.post("/v1/models", headers=ADMIN, json={"source": str(source), "gate": {"x": 1}})
    assert_error(r, 422, "invalid_request")
    r = client.post("/v1/models", headers=ADMIN, json={"source": str(source), "extra": 1})
    assert_error(r, 422, "invalid_request")


def test_promote_and_rollback_through_the_api(client: TestClient) -> None:
    before = search(client, text="a red circle", top_k=3)
    r = client.post("/v1/models/v2/promote", headers=ADMIN,
                    json={"gallery": "shapes", "reason": "continual phase 1"})
    assert r.status_code == 200, r.text
    gallery = r.json()
    assert gallery["active"] == "v2" and gallery["serving"]["version"] == "v2"
    assert gallery["history"][-1] | {"at": None} == {
        "action": "promote", "version": "v2", "previous": "v1", "by": "ops", "at": None,
        "reason": "continual phase 1", "forced": False, "overrides": [], "space": None}
    after = search(client, text="a red circle", top_k=3)
    assert after["version"] == "v2" and after["space"] == "v1"
    assert after["hits"] != before["hits"]  # other weights, other query embedding
    assert all(h["version"] == "v1" for h in after["hits"])  # gallery never re-embedded
    r = client.post("/v1/models/v1/promote", headers=ADMIN, json={"gallery": "shapes"})
    assert_error(r, 409, "gate_failed")
    r = client.post("/v1/models/v1/rollback", headers=ADMIN,
                    json={"gallery": "shapes", "reason": "regression"})
    assert r.status_code == 200 and r.json()["active"] == "v1"
    assert search(client, text="a red circle", top_k=3) == before
    assert_error(client.post("/v1/models/v3/rollback", headers=ADMIN, json={"gallery": "shapes"}),
                 409, "conflict")
    assert_error(client.post("/v1/models/v2/promote", headers=ADMIN, json={"gallery": "nope"}),
                 404, "gallery_not_found")
    assert_error(client.post("/v1/models/v9/promote", headers=ADMIN, json={"gallery": "shapes"}),
                 404, "version_not_found")


def test_a_version_without_a_route_into_the_space_gets_409(client: TestClient) -> None:
    r = client.post("/v1/models/v3/promote", headers=ADMIN, json={"gallery": "shapes"})
    assert "no route into space 'v1'" in assert_error(r, 409, "space_mismatch")["message"]
    r = client.post("/v1/models/v3/promote", headers=ADMIN, json={"gallery": "shapes",
                                                                  "force": True})
    assert "reason" in assert_error(r, 422)["message"]
    r = client.post("/v1/models/v3/promote", headers=ADMIN,
                    json={"gallery": "shapes", "force": True, "reason": "drill"})
    assert r.status_code == 200 and r.json()["history"][-1]["overrides"] == ["space"]
    for body in ({"text": "a red circle"}, {"image_base64": world_items(1)[0]["image_base64"]}):
        error = assert_error(client.post("/v1/galleries/shapes/search", json=body), 409,
                             "space_mismatch")
        assert "'v1'" in error["message"] and "'v3'" in error["message"]
    r = client.post("/v1/galleries/shapes/items", headers=ADMIN,
                    json={"items": [{"id": "x", "text": "y"}]})
    assert_error(r, 409, "space_mismatch")  # nothing is ingested into the wrong space either
    assert client.get("/readyz").status_code == 200  # a deliberate state, not a broken replica
    client.post("/v1/models/v1/rollback", headers=ADMIN, json={"gallery": "shapes"})
    assert search(client, text="a red circle")["version"] == "v1"


def test_gallery_endpoints(client: TestClient) -> None:
    r = client.post("/v1/galleries", headers=ADMIN, json={"name": "natives", "space": "v3"})
    assert r.status_code == 201, r.text
    assert (r.json()["active"], r.json()["serving"]["route"]) == ("v3", "native")
    names = [g["name"] for g in client.get("/v1/galleries", headers=ADMIN).json()]
    assert names == ["natives", "shapes"]
    shapes = client.get("/v1/galleries/shapes", headers=ADMIN).json()
    assert (shapes["space"], shapes["active"], shapes["items"]) == ("v1", "v1", 8)
    assert shapes["history"][0]["action"] == "create" and shapes["history"][0]["by"] == "ops"
    assert search(client, gallery="natives", text="a circle")["hits"] == []
    cases = [({"name": "shapes", "space": "v1"}, 409), ({"name": "Bad!", "space": "v1"}, 422),
             ({"name": "g3", "space": "nowhere"}, 409),
             ({"name": "g3", "space": "v1", "version": "v3"}, 409),
             ({"name": "g3", "space": "v1", "version": "nope"}, 404), ({"name": "g3"}, 422)]
    for body, status in cases:
        assert_error(client.post("/v1/galleries", headers=ADMIN, json=body), status)
    assert_error(client.get("/v1/galleries/nope", headers=ADMIN), 404)


# ---------------------------------------------------------------- health, metrics, docs
def test_health_ready_metrics_docs(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ready"}  # no key: ready, nothing more
    ready = client.get("/readyz", headers=ADMIN).json()
    assert ready["status"] == "ready" and ready["galleries"] == {"shapes": "v1"}
    search(client, text="a red circle")
    search(client, image_base64=world_items(1)[0]["image_base64"])
    client.post("/v1/models/v2/promote", headers=ADMIN, json={"gallery": "shapes"})
    text = client.get("/metrics", headers=ADMIN).text  # gallery-level series need a key
    route = 'route="/v1/galleries/{gallery}/search"'
    assert f'nobackfill_requests_total{{method="POST",{route},status="200"}}' in text
    assert f'nobackfill_request_seconds_bucket{{le="0.25",method="POST",{route}}}' in text
    assert 'nobackfill_batch_size_count{modality="text"}' in text
    assert 'nobackfill_batch_size_count{modality="image"}' in text
    assert 'nobackfill_active_version{gallery="shapes",space="v1",version="v2"} 1.0' in text
    assert 'version="v1"' not in text.split("nobackfill_active_version")[-1]
    assert 'nobackfill_swaps_total{gallery="shapes"} 1.0' in text
    assert client.get("/docs").status_code == 200
    paths = client.get("/openapi.json").json()["paths"]
    assert "/v1/galleries/{gallery}/search" in paths and "/readyz" in paths
    assert_error(client.get("/v1/nothing-here"), 404, "not_found")
    assert_error(client.put("/healthz"), 405, "method_not_allowed")


def test_readyz_fails_while_a_version_cannot_load(gateway_factory, micro_versions) -> None:
    def broken(artifact, space):
        raise RuntimeError("GPU fell off")
    with gateway_factory() as client:
        client.app.state.gateway.runtime._load = broken
        r = client.post("/v1/models/v2/promote", headers=ADMIN, json={"gallery": "shapes"})
        assert r.status_code == 200 and "GPU fell off" in r.json()["serving"]["problem"]
        keyed = assert_error(client.get("/readyz", headers=ADMIN), 503, "unavailable")
        assert "GPU fell off" in keyed["message"]
        public = assert_error(client.get("/readyz"), 503, "unavailable")["message"]
        assert "GPU" not in public and "shapes" not in public and "v2" not in public
        assert search(client, text="still answering")["version"] == "v1"  # the old one serves on


def test_bench_serve_is_registered_with_the_cli(capsys: pytest.CaptureFixture) -> None:
    from training.cli import build_parser

    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["bench", "serve", "--help"])
    assert exc.value.code == 0 and "--quick" in capsys.readouterr().out


def test_bench_serve_pools_rounds_over_every_request() -> None:
    """A cell measured in rounds: counts and seconds add up, percentiles come from every
    request of every round (not an average of per-round percentiles)."""
    from service.bench.server import pool

    fast = {"concurrency": 4, "seconds": 2.0, "errors": 0, "first_error": None,
            "latencies_ms": [10.0] * 90}
    slow = {"concurrency": 4, "seconds": 3.0, "errors": 2, "first_error": "503: busy",
            "latencies_ms": [100.0] * 10}
    cell = pool([fast, slow])
    assert cell["requests"] == 100 and cell["errors"] == 2 and cell["rounds"] == 2
    assert cell["qps"] == pytest.approx(100 / 5.0) and cell["first_error"] == "503: busy"
    assert cell["p50_ms"] == 10.0 and cell["p99_ms"] == 100.0
    assert cell["mean_ms"] == pytest.approx(19.0)


def test_bench_load_generator_speaks_http_keep_alive() -> None:
    """The load generator's own HTTP/1.1 client: bodies arrive intact, responses with a
    Content-Length or chunked are read whole, non-200s count as errors, a server that
    closes the connection gets a new one, and the warm-up is not measured."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from service.bench.load import drive

    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            status = 503 if body["text"] == "busy" else 200
            self.send_response(status)
            if body["text"] == "chunked":
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.write(b"3\r\nabc\r\n0\r\n\r\n")
                return
            payload = b'{"ok": true}'
            self.send_header("Content-Length", str(len(payload)))
            if body["text"] == "close":
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1/galleries/g/search"
        bodies = [{"text": t} for t in ("a red circle", "chunked", "close", "busy")]
        result = asyncio.run(drive(url, bodies, concurrency=2, duration=0.5, warmup=0.3))
    finally:
        server.shutdown()
    busy = sum(b["text"] == "busy" for b in seen)
    assert busy > 0 and result["errors"] == busy and result["first_error"].startswith("503")
    # only what completed in the measured window counts: not the warm-up's requests
    assert 0 < result["requests"] < len(seen) - busy
    assert result["qps"] == pytest.approx(result["requests"] / 0.5)
    assert len(result["latencies_ms"]) == result["requests"]
    assert {b["text"] for b in seen} == {"a red circle", "chunked", "close", "busy"}


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from service.state.config import Settings

    monkeypatch.setenv("NOBACKFILL_ADMIN_API_KEYS", '{"ops": "s3cret"}')
    monkeypatch.setenv("NOBACKFILL_QDRANT_PATH", ":memory:")
    monkeypatch.setenv("NOBACKFILL_DATA_DIR", "/srv/nobackfill")
    monkeypatch.setenv("NOBACKFILL_BATCH_MAX_SIZE", "1")
    settings = Settings()
    assert settings.admin_api_keys["ops"].get_secret_value() == "s3cret"
    assert "s3cret" not in repr(settings)
    assert settings.qdrant_location == ":memory:" and settings.batch_max_size == 1
    assert settings.registry_dir == Path("/srv/nobackfill/registry")


@pytest.mark.slow
def test_bench_serve_quick(tmp_path: Path) -> None:
    """``nobackfill bench serve --quick``: gateway subprocesses, load generator, report."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "training.cli", "bench", "serve", "--quick",
                           "--concurrency", "1,4", "--out", str(tmp_path), "--json"],
                          capture_output=True, text=True, timeout=900, check=True)
    out = done.stdout
    result = json.loads(out[out.index("{"):])
    assert result["device"] == "cpu"  # --device auto, and no CUDA here
    phases = [line for line in done.stderr.splitlines() if line.startswith("bench serve: [")]
    assert [line.split("]")[0] for line in phases] == [f"bench serve: [{n}/4" for n in
                                                       range(1, 5)]
    assert all(" [+" in line and " s] " in line for line in phases)
    assert "text queries: 1, 4 clients" in phases[2] and "image queries" in phases[3]
    assert result["targets"]["no_errors"]["met"]
    assert result["batched"]["text"]["4"]["requests"] > 0


def test_a_search_never_shows_why_a_version_failed_to_load(tmp_path, micro_versions) -> None:
    """No version ever loaded for the gallery: a search gets a fixed 503 message; the cause
    is for keyed /readyz (and the admin gallery view, tested above) only."""
    from fastapi.testclient import TestClient

    from service.api.app import create_app
    from service.state.config import Settings
    from service.state.registry import Registry

    def broken(artifact, space):
        raise RuntimeError("GPU fell off at 0x7f00")
    settings = Settings(data_dir=tmp_path / "data", qdrant_path=":memory:",
                        admin_api_keys={"ops": "admin-key"}, registry_poll_interval_s=0)
    registry = Registry(settings.registry_dir)
    registry.register(micro_versions["v1"], by="fixture")
    registry.create_gallery("shapes", "v1", by="fixture", version="v1")
    with TestClient(create_app(settings, broken)) as client:
        r = client.post("/v1/galleries/shapes/search", json={"text": "a red square"})
        assert r.status_code == 503 and "GPU" not in r.json()["error"]["message"]
        assert "could not be loaded" in r.json()["error"]["message"]
        keyed = client.get("/readyz", headers={"X-API-Key": "admin-key"}).json()
        assert "GPU fell off" in keyed["error"]["message"]


def test_the_gateway_hides_what_it_loaded_from_the_collector_until_it_stops(
        gateway_factory) -> None:
    """A full collection walks every object the process holds (~300 ms here, every search
    waiting): what startup and each version's load brought in is frozen out of those walks
    (service/runtime/heap.py), and handed back when the gateway stops."""
    import gc

    with gateway_factory() as c:
        started = gc.get_freeze_count()
        assert started > 100_000  # the modules and the model, out of the walks
        assert c.post("/v1/galleries/shapes/search", json={"text": "a red circle",
                                                           "top_k": 1}).status_code == 200
        gc.collect()  # the frozen stay frozen (those freed by reference counting leave)
        assert gc.get_freeze_count() > 0.9 * started
    assert gc.get_freeze_count() == 0
