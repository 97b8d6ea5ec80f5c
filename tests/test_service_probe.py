"""What an outside probe of the gateway found, each pinned: bodies are limited while they
arrive (chunked ones too), metric labels stay bounded whatever clients send, errors echo
neither internals nor long inputs, the key is checked before a body is parsed, and
/readyz names galleries and versions only to a read or admin key."""

from __future__ import annotations

import base64
import contextlib
import io
import random
import socket
import string
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from conftest import ADMIN
from fastapi.testclient import TestClient
from PIL import Image
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.state.errors import shown

SEARCH = "/v1/galleries/shapes/search"
LONG = "a" * 5000
NO_KEYS: tuple[dict[str, str], ...] = ({}, {"X-API-Key": "wrong"})


def noise_png(side: int) -> bytes:
    """A PNG that does not compress: about 3 bytes per pixel."""
    rng = random.Random(side)
    image = Image.frombytes("RGB", (side, side), bytes(rng.getrandbits(8)
                                                       for _ in range(side * side * 3)))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def error_of(response: httpx.Response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert code is None or error["code"] == code, error
    return error


# ---------------------------------------------------------------- 1. body limits
def test_json_bodies_have_a_smaller_limit_than_uploads(gateway_factory) -> None:
    upload = noise_png(48)
    assert len(upload) > 4096
    with gateway_factory(max_json_bytes=4096, max_image_pixels=64 * 64) as client:
        r = client.post(SEARCH, json={"text": "a red circle", "filter": {"n": "x" * 5000}})
        assert "multipart" in error_of(r, 413, "too_large")["message"]
        r = client.post(SEARCH, files={"image": ("q.png", upload)}, data={"top_k": "1"})
        assert r.status_code == 200, r.text  # as large, but an upload


def test_a_chunked_body_is_counted_as_it_arrives(gateway_factory) -> None:
    """No Content-Length (chunked transfer): the limit still holds."""
    def chunks() -> Iterator[bytes]:
        yield b'{"text": "'
        for _ in range(64):
            yield b"x" * 1024

    with gateway_factory(max_json_bytes=16 * 1024) as client:
        r = client.post(SEARCH, content=chunks(), headers={"content-type": "application/json"})
        assert "content-length" not in {k.lower() for k in r.request.headers}
        error_of(r, 413, "too_large")


def test_a_chunked_body_over_the_limit_is_refused_unread(gateway_factory) -> None:
    """Against a real server: a 64 MiB chunked JSON body gets 413 once about the limit's
    worth went into the app, not after the whole body was buffered. (uvicorn hands the
    app what piled up since its last read: one message may be a few hundred KiB.)"""
    limit, chunk, total = 256 * 1024, 64 * 1024, 64 * 2**20
    with gateway_factory(max_json_bytes=limit) as client:
        app = BodySpy(client.app)
        with served(app) as url:
            body = (b"x" * chunk for _ in range(total // chunk))
            r = httpx.post(url + SEARCH, content=body, timeout=60,
                           headers={"content-type": "application/json"})
    error_of(r, 413, "too_large")
    assert app.received <= limit + 512 * 1024, app.received


class BodySpy:
    """Counts the body bytes the app took from the server."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.received = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def counted() -> Message:
            message = await receive()
            self.received += len(message.get("body", b""))
            return message

        await self.app(scope, counted, send)


@contextlib.contextmanager
def served(app: ASGIApp) -> Iterator[str]:
    """``app`` on a real uvicorn server (its lifespan already ran under TestClient)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


# ---------------------------------------------------------------- 2. metric labels
def test_metric_series_stay_bounded_whatever_clients_send(gateway_factory) -> None:
    rng = random.Random(11)
    paths = ["/healthz", SEARCH, "/v1/galleries/shapes", "/nope/{junk}", "/v1/{junk}/x"]

    def probe() -> None:
        for _ in range(15):
            method = "".join(rng.choices(string.ascii_uppercase + string.digits, k=8))
            junk = "".join(rng.choices(string.ascii_lowercase, k=12))
            for path in paths:
                client.request(method, path.format(junk=junk))
                client.get(path.format(junk=junk))

    def series() -> int:
        lines = client.get("/metrics").text.splitlines()
        return sum(line.startswith(("nobackfill_requests_total{",
                                    "nobackfill_request_seconds_count{")) for line in lines)

    with gateway_factory() as client:
        probe()
        series()  # its own GET /metrics is counted once it has answered
        before = series()
        probe()
        assert series() == before
        text = client.get("/metrics").text
    assert 'method="OTHER"' in text and 'route="unmatched"' in text
    assert 'route="/nope' not in text


# ---------------------------------------------------------------- 6. error messages
def test_errors_echo_no_long_input(gateway_factory) -> None:
    with gateway_factory() as client:
        responses = [
            client.get(f"/v1/galleries/{LONG}", headers=ADMIN),
            client.post(f"/v1/galleries/{LONG}/search", json={"text": "a"}),
            client.post(f"/v1/galleries/{LONG}/items", headers=ADMIN,
                        json={"items": [{"id": "a", "text": "b"}]}),
            client.get(f"/v1/models/{LONG}", headers=ADMIN),
            client.delete(f"/v1/models/{LONG}", headers=ADMIN),
            client.delete(f"/v1/galleries/{LONG}", headers=ADMIN),
            client.post("/v1/models/v1/rollback", headers=ADMIN, json={"gallery": LONG[:128]}),
            client.post(f"/v1/models/{LONG}/promote", headers=ADMIN, json={"gallery": "shapes"}),
            client.get(f"/v1/galleries/shapes/items/{LONG}/thumbnail"),
            client.get(f"/web/{LONG}"),
            client.post(SEARCH, json={"text": "a", LONG: 1}),
            client.post(SEARCH, json={"text": "a", "filter": {LONG: 1}}),
            client.post(SEARCH, content=b"x", headers={"content-type": f"text/{LONG}"}),
            client.post("/v1/galleries", headers=ADMIN, json={"name": LONG, "space": "v1"}),
            client.post("/v1/galleries/shapes/items", headers=ADMIN,
                        json={"items": [{"id": "d" * 256, "text": "b"}] * 2}),
        ]
        # Job ids are checked against their pattern first (service/state/jobs/store.py).
        assert len(client.get(f"/v1/jobs/{LONG}", headers=ADMIN).text) < 300
    for r in responses:
        assert 400 <= r.status_code < 500, r.text[:300]
        assert "a" * 65 not in r.text and "d" * 65 not in r.text, r.text[:300]
        assert len(r.text) < 2000, r.text[:300]


def test_a_bad_image_gets_a_fixed_message(gateway_factory) -> None:
    """PIL's exception texts (``cannot identify image file <_io.BytesIO object at 0x..>``)
    never reach the caller."""
    junk = b"definitely not an image"
    with gateway_factory() as client:
        responses = [
            client.post(SEARCH, json={"image_base64": base64.b64encode(junk).decode()}),
            client.post(SEARCH, files={"image": ("x.png", junk)}),
            client.post(SEARCH, files={"image": ("x.png", noise_png(16)[:60])}),  # truncated
            client.post("/v1/galleries/shapes/items", headers=ADMIN,
                        files=[("images", ("x.png", b"GIF89a-broken"))]),
            client.post(SEARCH, json={"image_base64": "%%% not base64 %%%"}),
        ]
    for r in responses:
        message = error_of(r, 422, "bad_image")["message"]
        assert not any(s in message for s in ("0x", "<", "BytesIO", "identify", "Error")), message


def test_shown_bounds_and_cleans_an_echoed_value() -> None:
    assert shown("gallery") == "gallery"
    assert shown("x" * 5000) == "x" * 64 + "\u2026"
    assert shown("a\nb\x00c\ud800", 100) == "a?b?c?"
    assert len(shown(LONG, 10)) == 11


# ---------------------------------------------------------------- 8. key before body
READ_OPERATIONS = {("post", SEARCH.replace("shapes", "{gallery}")), ("get", "/readyz"),
                   ("get", "/v1/galleries/{gallery}/items/{item_id}/thumbnail")}
MALFORMED: list[tuple[bytes, str]] = [
    (b"{not json", "application/json"), (b"\xff\xfe\x00", "application/json"),
    (b"[1, 2]", "application/json"), (b'{"a":' * 3000, "application/json"),
    (b"", "application/json"), (b"--x\r\nbroken", "multipart/form-data; boundary=x"),
    (b"name=%%%", "application/x-www-form-urlencoded"), (b"\x00\x01", "text/plain"),
]


def admin_operations(spec: dict) -> list[tuple[str, str]]:
    """Every operation that needs the key header (none allows an anonymous call), less
    the read ones: the admin routes."""
    return [(method, path) for path, item in spec["paths"].items()
            for method, op in item.items()
            if op.get("security") and {} not in op["security"]
            and (method, path) not in READ_OPERATIONS]


def test_admin_routes_check_the_key_before_the_body(client_with_items) -> None:
    client = client_with_items
    operations = admin_operations(client.get("/openapi.json").json())
    assert len(operations) >= 15 and ("post", "/v1/galleries") in operations
    for method, template in operations:
        url = template.format(gallery="shapes", version_id="v2", job_id="j1", item_id="a",
                              plan_id="j1")
        for body, ctype in MALFORMED:
            for headers in NO_KEYS:
                r = client.request(method.upper(), url, content=body,
                                   headers={**headers, "content-type": ctype})
                error_of(r, 401, "unauthorized")
    # With the key the same bodies are judged on their merits (never a 5xx).
    r = client.post("/v1/galleries", content=b"{not json",
                    headers={**ADMIN, "content-type": "application/json"})
    error_of(r, 422, "invalid_request")


@pytest.fixture
def client_with_items(gateway_factory) -> Iterator[TestClient]:
    with gateway_factory() as client:
        r = client.post("/v1/galleries/shapes/items", headers=ADMIN,
                        json={"items": [{"id": "a", "text": "a red circle"}]})
        assert r.status_code == 200, r.text
        yield client


def test_a_read_key_is_checked_before_the_body(gateway_factory) -> None:
    with gateway_factory(read_api_key="reader-key") as client:
        for body, ctype in MALFORMED:
            r = client.post(SEARCH, content=body, headers={"content-type": ctype})
            error_of(r, 401, "unauthorized")


# ---------------------------------------------------------------- /readyz
def test_readyz_details_need_a_read_or_admin_key(gateway_factory) -> None:
    with gateway_factory(read_api_key="reader-key") as client:
        for headers in NO_KEYS:
            assert client.get("/readyz", headers=headers).json() == {"status": "ready"}
        for headers in (ADMIN, {"X-API-Key": "reader-key"}):
            ready = client.get("/readyz", headers=headers).json()
            assert ready["galleries"] == {"shapes": "v1"} and ready["revision"] >= 0
    # Without a read key configured (search open), details still need a key: see
    # test_service_api.py::test_health_ready_metrics_docs.


# ---------------------------------------------------------------- 9. gallery-level metrics
GALLERY_SERIES = ("nobackfill_active_version", "nobackfill_swaps", "nobackfill_load_errors")
FORCED = {"force": True, "reason": "metrics test"}  # whatever the gate says of v2


def gallery_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(GALLERY_SERIES)]


def test_gallery_metrics_need_a_key(gateway_factory) -> None:
    """Public /metrics has the process-level series (bounded labels, no gallery, no
    version); the read key or an admin key also gets the gallery-level ones."""
    with gateway_factory(read_api_key="reader-key") as client:
        r = client.post("/v1/models/v2/promote", headers=ADMIN,
                        json=FORCED | {"gallery": "shapes"})
        assert r.status_code == 200, r.text
        for headers in NO_KEYS:
            public = client.get("/metrics", headers=headers).text
            assert "nobackfill_requests_total{" in public
            assert gallery_lines(public) == [] and "shapes" not in public, public
            assert 'version="' not in public and "gallery=" not in public
        for headers in (ADMIN, {"X-API-Key": "reader-key"}):
            keyed = client.get("/metrics", headers=headers).text
            assert 'nobackfill_active_version{gallery="shapes",space="v1",version="v2"} 1.0' \
                in keyed
            assert 'nobackfill_swaps_total{gallery="shapes"} 1.0' in keyed
            assert "nobackfill_requests_total{" in keyed


def test_deleted_galleries_and_retired_versions_drop_their_series(gateway_factory) -> None:
    """A deleted gallery's series (active version, swaps) and a retired version's load
    errors leave /metrics: the number of series does not grow with every gallery ever
    created."""
    failing = {"v2"}

    def load(artifact, space):
        from training.versions import load_encoder

        if artifact.version_id in failing:
            raise RuntimeError("no such GPU")
        return load_encoder(artifact, space, "cpu")

    with gateway_factory(load=load) as client:
        for n in range(3):
            name = f"gone{n}"
            r = client.post("/v1/galleries", headers=ADMIN,
                            json={"name": name, "space": "v1", "version": "v1"})
            assert r.status_code == 201, r.text
            if n == 0:  # a version that fails to load: counted per version
                client.post("/v1/models/v2/promote", headers=ADMIN,
                            json=FORCED | {"gallery": name})
                failing.clear()
                client.post("/v1/models/v1/rollback", headers=ADMIN, json={"gallery": name})
            r = client.post("/v1/models/v2/promote", headers=ADMIN,
                            json=FORCED | {"gallery": name})
            assert r.status_code == 200, r.text
            keyed = "\n".join(gallery_lines(client.get("/metrics", headers=ADMIN).text))
            assert f'nobackfill_active_version{{gallery="{name}",space="v1",version="v2"}} 1.0' \
                in keyed and f'nobackfill_swaps_total{{gallery="{name}"}}' in keyed, keyed
            assert client.delete(f"/v1/galleries/{name}", headers=ADMIN).status_code == 200
            keyed = "\n".join(gallery_lines(client.get("/metrics", headers=ADMIN).text))
            assert f'"{name}"' not in keyed, keyed
        assert 'nobackfill_load_errors_total{version="v2"} 1.0' in keyed
        assert client.delete("/v1/models/v2", headers=ADMIN).status_code == 200
        keyed = "\n".join(gallery_lines(client.get("/metrics", headers=ADMIN).text))
    assert 'version="v2"' not in keyed and "gone" not in keyed, keyed
    assert 'nobackfill_active_version{gallery="shapes",space="v1",version="v1"} 1.0' in keyed


# ---------------------------------------------------------------- 10. 401 before 413
def test_a_bad_key_gets_401_whatever_size_it_declares(gateway_factory, tmp_path) -> None:
    """A declared Content-Length over the limit is judged after the key: a bad key gets
    401 whatever it sends (as chunked bodies already did); a good key gets 413, unread."""
    big = {"content-length": "100000000", "content-type": "application/json"}
    upload = {"content-length": str(2**40), "content-type": "multipart/form-data; boundary=x"}
    with gateway_factory(read_api_key="reader-key") as client:
        for headers in NO_KEYS:
            for url in ("/v1/jobs", "/v1/galleries", "/v1/models/v2/promote", SEARCH):
                error_of(client.post(url, content=b"{}", headers={**headers, **big}), 401,
                         "unauthorized")
            r = client.post("/v1/galleries/shapes/items", content=b"--x--",
                            headers={**headers, **upload})
            error_of(r, 401, "unauthorized")
        for url in ("/v1/jobs", "/v1/galleries"):
            error_of(client.post(url, content=b"{}", headers={**ADMIN, **big}), 413, "too_large")
        r = client.post("/v1/galleries/shapes/items", content=b"--x--", headers={**ADMIN, **upload})
        assert "uploads" in error_of(r, 413, "too_large")["message"]
        error_of(client.post(SEARCH, content=b"{}", headers={"X-API-Key": "reader-key", **big}),
                 413, "too_large")
    with gateway_factory(data_dir=tmp_path / "open") as client:  # search needs no key here
        error_of(client.post(SEARCH, content=b"{}", headers=big), 413, "too_large")


# ---------------------------------------------------------------- 11. spec and parser agree
def test_options_allows_every_method_of_a_path(gateway_factory) -> None:
    """405 (OPTIONS included) lists every method some operation answers at that URL, not
    only those of the first route that matched its path."""
    import re

    with gateway_factory() as client:
        spec = client.get("/openapi.json").json()
        patterns = {template: re.compile(re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(template)))
                    for template in spec["paths"]}
        shared = 0
        for template in spec["paths"]:
            url = template.format(gallery="shapes", version_id="v1", job_id="j1", item_id="a",
                                  plan_id="j1")
            r = client.options(url)
            error_of(r, 405, "method_not_allowed")
            allowed = {m.strip() for m in r.headers["allow"].split(",")}
            declared = {m.upper() for other, pattern in patterns.items()
                        if pattern.fullmatch(url) for m in spec["paths"][other]}
            assert allowed == declared, (url, r.headers["allow"])
            shared += len(declared) > 1
        assert shared >= 7
        r = client.put("/v1/galleries")
        assert error_of(r, 405)["code"] and r.headers["allow"] == "GET, POST"


def test_the_spec_says_which_operations_need_a_key(gateway_factory, tmp_path) -> None:
    """Public operations allow an anonymous call ({} among their security requirements);
    search needs the key only where a read key is set."""
    reads = {("post", "/v1/galleries/{gallery}/search"),
             ("get", "/v1/galleries/{gallery}/items/{item_id}/thumbnail")}
    public = {("get", "/healthz"), ("get", "/readyz"), ("get", "/metrics")}
    for read_key, open_search in ((None, True), ("reader-key", False)):
        with gateway_factory(read_api_key=read_key, data_dir=tmp_path / str(read_key)) as client:
            spec = client.get("/openapi.json").json()
        keyed = {(method, path) for path, item in spec["paths"].items()
                 for method, op in item.items() if op.get("security")}
        anonymous = {(method, path) for path, item in spec["paths"].items()
                     for method, op in item.items() if {} in op.get("security", [{}])}
        assert public <= anonymous and (reads <= anonymous) == open_search
        assert open_search or not reads & anonymous
        assert reads | public - {("get", "/healthz")} <= keyed
        admin = keyed - reads - public
        assert len(admin) >= 15 and not admin & anonymous
        assert admin == set(admin_operations(spec))


def test_force_is_a_strict_boolean_and_needs_a_reason(gateway_factory) -> None:
    with gateway_factory() as client:
        for force in ("true", 1, "yes"):
            r = client.post("/v1/models/v3/promote", headers=ADMIN,
                            json={"gallery": "shapes", "force": force, "reason": "drill"})
            assert "force" in error_of(r, 422, "invalid_request")["message"], force
        for reason in (None, "", "  "):
            body = {"gallery": "shapes", "force": True, **({} if reason is None else
                                                           {"reason": reason})}
            r = client.post("/v1/models/v3/promote", headers=ADMIN, json=body)
            assert "reason" in error_of(r, 422)["message"], reason
        r = client.post("/v1/galleries/shapes/migration/switch", headers=ADMIN,
                        json={"force": "true", "reason": "x"})
        assert "force" in error_of(r, 422, "invalid_request")["message"]
        spec = client.get("/openapi.json").json()
        promote = client.get("/openapi.json").json()["components"]["schemas"]["PromoteIn"]
    for schema in (promote, spec["components"]["schemas"]["SwitchIn"]):
        assert schema["properties"]["force"]["type"] == "boolean"
        assert schema["if"]["properties"]["force"] == {"const": True}
        assert "reason" in schema["then"]["required"]
        assert "reason" in schema["properties"]["force"]["description"]


def test_a_multipart_top_k_is_digits_only(gateway_factory) -> None:
    with gateway_factory() as client:
        for top_k in ("5.0", " 5 ", "+5", "5e0", "0x5", "5_0", "٥", ""):
            r = client.post(SEARCH, data={"text": "a red circle", "top_k": top_k})
            assert "top_k" in error_of(r, 422, "invalid_request")["message"], top_k
        r = client.post(SEARCH, data={"text": "a red circle", "top_k": "5"})
        assert r.status_code == 200 and len(r.json()["hits"]) <= 5, r.text


def test_unreadable_multipart_searches_are_declared(gateway_factory) -> None:
    """A multipart body without a boundary, or with a field over the parser's 1 MiB: 400,
    which the document declares for search."""
    from openapi_check import load, problems

    with gateway_factory() as client:
        responses = [
            client.post(SEARCH, content=b"--x\r\n", headers={"content-type":
                                                               "multipart/form-data"}),
            client.post(SEARCH, data={"text": "a", "filter": "x" * (1024 * 1024 + 10)}),
            client.post(SEARCH, files={"text": (None, "a"),
                                       "filter": (None, "x" * (1024 * 1024 + 10))}),
        ]
        schema = load(client.get("/openapi.json").json())
    for r in responses:
        error_of(r, 400, "bad_request")
        assert problems(schema, r) == []


def test_job_params_are_typed_by_kind(gateway_factory) -> None:
    """The body of POST /v1/jobs is a union on ``kind``; each member's ``params`` is that
    kind's parameters, so the document states them, and a bad one is a 422 naming it."""
    from service.jobkinds import KINDS

    with gateway_factory() as client:
        spec = client.get("/openapi.json").json()
        schemas = spec["components"]["schemas"]
        body = spec["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]
        union = body["schema"]
        assert union["discriminator"]["propertyName"] == "kind"
        assert set(union["discriminator"]["mapping"]) == set(KINDS)
        for kind, ref in union["discriminator"]["mapping"].items():
            member = schemas[ref.rsplit("/", 1)[1]]
            assert member["properties"]["kind"]["const"] == kind
            params = member["properties"]["params"]
            params = schemas[params["$ref"].rsplit("/", 1)[1]] if "$ref" in params else params
            assert set(params["properties"]) == {
                f.alias or n for n, f in KINDS[kind].params.model_fields.items()}, kind
        assert schemas["ContinualParams"]["required"] == ["method", "data"]
        cases = [({"kind": "evaluate", "params": {}}, "params.version"),
                 ({"kind": "evaluate", "params": {"version": "v2", "steps": 3}}, "params.steps"),
                 ({"kind": "continual", "params": {"method": "seqft", "data": "x", "steps": 0}},
                  "params.steps"),
                 ({"kind": "migrate", "params": {"shards": 0}}, "params.shards"),
                 ({"kind": "xbt", "params": {"new": {"version": "v3", "arch": "x"},
                                             "corpus": "synth:3", "pairs": "x"}}, "exactly one"),
                 ({"kind": "a" * 500}, "continual"), ({}, "kind")]
        for job, needle in cases:
            r = client.post("/v1/jobs", headers=ADMIN, json={"gallery": "shapes", **job})
            message = error_of(r, 422)["message"]
            assert needle in message and "a" * 65 not in message, (job, message)
        r = client.post("/v1/jobs", headers=ADMIN, json={"kind": "evaluate", "gallery": "shapes",
                                                         "params": {"version": "v9"}})
        assert "'v9' is not registered" in error_of(r, 422, "invalid_input")["message"]
        r = client.post("/v1/jobs", headers=ADMIN, json={"kind": "evaluate", "gallery": "shapes",
                                                         "params": {"version": "v2"}})
        error_of(r, 503)  # checked, then no live worker to run it
