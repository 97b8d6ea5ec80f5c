"""The OpenAPI document is the API: every status an operation answers is declared, with the
error body for errors; live responses validate against the declared schemas; the search
rules (exactly one query, a strict and bounded top_k) are in the schema; /metrics is text.
A slow schemathesis run fuzzes every operation from the document."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import ADMIN
from fastapi.testclient import TestClient
from openapi_check import load, operation_of, problems
from PIL import Image

SEARCH = "/v1/galleries/{gallery}/search"
JSON = {"content-type": "application/json"}


def png(side: int = 16) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (side, side), (200, 30, 30)).save(buf, format="PNG")
    return buf.getvalue()


PNG_B64 = base64.b64encode(png()).decode()
Call = Callable[[TestClient], object]


def calls(artifact: Path) -> list[Call]:
    """Good and bad requests to every operation (order matters: later ones delete)."""
    post, get, delete = "post", "get", "delete"

    def r(method: str, url: str, **kwargs: object) -> Call:
        return lambda c: c.request(method.upper(), url, **kwargs)

    items = "/v1/galleries/shapes/items"
    search = "/v1/galleries/shapes/search"
    migration = "/v1/galleries/shapes/migration"
    plans = "/v1/galleries/shapes/plans"
    return [
        r(get, "/healthz"), r(get, "/readyz"), r(get, "/readyz", headers=ADMIN),
        r(get, "/metrics"), r(get, "/metrics", headers=ADMIN),
        r(get, "/healthz", headers={"content-length": str(2**40)}),
        r(post, items, headers=ADMIN, json={"items": [
            {"id": "a", "text": "a red circle", "image_base64": PNG_B64},
            {"id": "b", "text": "a blue square"}]}),
        r(post, items, headers=ADMIN, files=[("images", ("c.png", png()))]),
        r(post, items, headers=ADMIN, json={"items": []}),
        r(post, items, content=b"x", headers={**ADMIN, "content-type": "text/plain"}),
        r(post, items, json={"items": [{"id": "x", "text": "y"}]}),
        r(post, "/v1/galleries/nope/items", headers=ADMIN, json={"items": [{"id": "x",
                                                                            "text": "y"}]}),
        r(post, search, json={"text": "a red circle", "top_k": 2}),
        r(post, search, json={"image_base64": PNG_B64, "kind": "text"}),
        r(post, search, files={"image": ("q.png", png())}, data={"top_k": "1"}),
        r(post, search, json={"text": "a", "image_base64": PNG_B64}),
        r(post, search, json={"text": "a", "top_k": "10"}),
        r(post, search, json={"image_base64": base64.b64encode(b"no image").decode()}),
        r(post, search, content=b"{", headers=JSON),
        r(post, search, content=b"a", headers={"content-type": "text/plain"}),
        r(post, search, content=b"--x\r\n", headers={"content-type": "multipart/form-data"}),
        r(post, search, files={"text": (None, "a"), "filter": (None, "x" * (2**20 + 1))}),
        r(post, search, data={"text": "a", "top_k": "5.0"}),
        r(post, search, content=b'{"text": "' + b"x" * 9000 + b'"}', headers=JSON),
        r(post, "/v1/galleries/nope/search", json={"text": "a"}),
        r(get, "/v1/galleries/shapes/items/a/thumbnail"),
        r(get, "/v1/galleries/shapes/items/b/thumbnail"),
        r(post, f"{items}/delete", headers=ADMIN, json={"ids": ["b"]}),
        r(post, f"{items}/delete", headers=ADMIN, json={"ids": []}),
        r(delete, f"{items}/b", headers=ADMIN), r(delete, f"{items}/b"),
        r(get, "/v1/galleries", headers=ADMIN), r(get, "/v1/galleries"),
        r(get, "/v1/galleries/shapes", headers=ADMIN),
        r(get, "/v1/galleries/nope", headers=ADMIN),
        r(post, "/v1/galleries", headers=ADMIN, json={"name": "other", "space": "v1"}),
        r(post, "/v1/galleries", headers=ADMIN, json={"name": "other", "space": "v1"}),
        r(post, "/v1/galleries", headers=ADMIN, json={"name": "Bad!", "space": "v1"}),
        r(post, "/v1/galleries", content=b"\xff", headers={**ADMIN, **JSON}),
        r(delete, "/v1/galleries/other", headers=ADMIN),
        r(get, "/v1/models", headers=ADMIN), r(get, "/v1/models/v1", headers=ADMIN),
        r(get, "/v1/models/nope", headers=ADMIN),
        r(post, "/v1/models", headers=ADMIN, json={"source": str(artifact)}),
        r(post, "/v1/models", headers=ADMIN, json={"source": "/nonexistent"}),
        r(post, "/v1/models/v2/promote", headers=ADMIN, json={"gallery": "shapes"}),
        r(post, "/v1/models/v1/promote", headers=ADMIN, json={"gallery": "shapes"}),
        r(post, "/v1/models/v1/rollback", headers=ADMIN, json={"gallery": "shapes"}),
        r(post, "/v1/models/v3/rollback", headers=ADMIN, json={"gallery": "shapes"}),
        r(delete, "/v1/models/v1", headers=ADMIN), r(delete, "/v1/models/v4", headers=ADMIN),
        r(post, "/v1/jobs", headers=ADMIN, json={"kind": "evaluate", "gallery": "shapes",
                                                 "params": {"version": "v2"}}),
        r(post, "/v1/jobs", headers=ADMIN, json={"kind": "nope", "gallery": "shapes"}),
        r(get, "/v1/jobs", headers=ADMIN), r(get, "/v1/jobs/j-nope", headers=ADMIN),
        r(delete, "/v1/jobs/j-nope", headers=ADMIN), r(get, "/v1/jobs"),
        r(post, f"{migration}", headers=ADMIN, json={}),
        r(post, f"{migration}", headers=ADMIN, json={"shards": 0}),
        r(get, f"{migration}", headers=ADMIN),
        r(post, f"{migration}/switch", headers=ADMIN, json={}),
        r(post, f"{migration}/rollback", headers=ADMIN, json={}),
        r(post, f"{migration}/retire", headers=ADMIN),
        r(post, f"{migration}/cancel", headers=ADMIN),
        r(post, f"{migration}/pause", headers=ADMIN),
        r(post, f"{migration}/resume", headers=ADMIN),
        r(post, f"{migration}/keep", headers=ADMIN, json={"mode": "hybrid"}),
        r(post, f"{migration}/keep", headers=ADMIN, json={"mode": "both"}),
        r(post, plans, headers=ADMIN, json={"new": {"version": "v3"}}),
        r(post, plans, headers=ADMIN, json={"new": {"version": "v3"}, "objective": "x"}),
        r(get, plans, headers=ADMIN), r(get, f"{plans}/j-nope", headers=ADMIN),
        r(post, f"{plans}/j-nope/apply", headers=ADMIN, json={"option": "migrate"}),
        r(post, f"{plans}/j-nope/apply", headers=ADMIN, json={"option": "x", "force": True}),
    ]


def test_every_live_response_is_declared(gateway_factory, micro_versions: dict[str, Path],
                                         tmp_path: Path) -> None:
    artifact = tmp_path / "v4"
    shutil.copytree(micro_versions["v1"], artifact)
    manifest = json.loads((artifact / "manifest.json").read_text())
    (artifact / "manifest.json").write_text(json.dumps({**manifest, "version_id": "v4"}))
    with gateway_factory(max_json_bytes=8192, max_image_pixels=64 * 64) as client:
        spec = client.get("/openapi.json").json()
        responses = [call(client) for call in calls(artifact)]
    schema = load(spec)
    found = [problem for response in responses for problem in problems(schema, response)]
    assert found == []
    called = {f"{operation.path} {operation.method.upper()}"
              for operation in (operation_of(schema, r) for r in responses) if operation}
    declared = {f"{path} {method.upper()}" for path, item in spec["paths"].items()
                for method in item}
    assert declared - called == set(), "operations this test never calls"
    statuses = {r.status_code for r in responses}
    assert {200, 201, 400, 401, 404, 409, 413, 415, 422, 503} <= statuses, sorted(statuses)


def test_every_error_status_is_declared_with_the_error_body(gateway_factory) -> None:
    with gateway_factory(top_k_max=20) as client:
        spec = client.get("/openapi.json").json()
    error = {"$ref": "#/components/schemas/ErrorBody"}
    for path, item in spec["paths"].items():
        for method, op in item.items():
            statuses = {int(s) for s in op["responses"]}
            assert {413, 500} <= statuses, (path, method)
            if path.startswith("/v1/"):
                assert {401, 404, 422} <= statuses, (path, method)
            for status, response in op["responses"].items():
                if int(status) >= 400:
                    assert response["content"] == {"application/json": {"schema": error}}
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    metrics = spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(metrics) == ["text/plain"]


def test_the_search_rules_are_in_the_schema(gateway_factory) -> None:
    with gateway_factory(top_k_max=20) as client:
        spec = client.get("/openapi.json").json()
        body = spec["paths"][SEARCH]["post"]["requestBody"]["content"]
        for media, required in (("application/json", "image_base64"),
                                ("multipart/form-data", "image")):
            schema = body[media]["schema"]
            top_k = schema["properties"]["top_k"]
            assert (top_k["type"], top_k["minimum"], top_k["maximum"]) == ("integer", 1, 20)
            assert [b["required"] for b in schema["oneOf"]] == [["text"], [required]], media
        url = SEARCH.format(gallery="shapes")
        for top_k in ("10", True, 1.5, 0, 21):  # true used to mean 1
            r = client.post(url, json={"text": "a red circle", "top_k": top_k})
            assert r.status_code == 422, (top_k, r.text)
        assert client.post(url, json={"text": "a red circle", "top_k": 20}).status_code == 200
        r = client.post(url, data={"text": "a red circle", "top_k": "3"})  # form fields are text
        assert r.status_code == 200, r.text


PLANS = "/v1/galleries/{gallery}/plans"
JOBS = "/v1/jobs"
NOT_ONE_MODEL: list[dict] = [{}, {"pretrained": "openai"}, {"version": None, "arch": None},
                             {"arch": "", "model_config": ""},
                             {"version": "v3", "arch": "ViT-B-32"},
                             {"version": "v3", "model_config": "/m.json", "arch": "RN50"}]
ONE_MODEL = "exactly one of version, arch or model_config"


def body_validator(spec: dict, path: str) -> Any:
    """A JSON Schema validator of POST ``path``'s JSON body as the document states it."""
    import jsonschema_rs

    schema = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return jsonschema_rs.Draft202012Validator({**schema, "components": spec["components"]})


def test_the_new_model_rule_is_in_the_schema(gateway_factory) -> None:
    """An upgrade's new model is exactly one of version, arch or model_config: the
    document says so (``oneOf``), so a body the app refuses for it is one the document
    refuses too, on the plans route and as any kind's job params."""
    with gateway_factory() as client:
        spec = client.get("/openapi.json").json()
        ref = spec["components"]["schemas"]["ModelRef"]
        assert [b["required"] for b in ref["oneOf"]] == [["version"], ["arch"], ["model_config"]]
        plans, jobs = body_validator(spec, PLANS), body_validator(spec, JOBS)
        for new in NOT_ONE_MODEL:
            bodies = ((plans, PLANS.format(gallery="shapes"), {"new": new}),
                      *((jobs, JOBS, {"kind": kind, "gallery": "shapes", "params": {"new": new}})
                        for kind in ("plan", "adapter", "xbt")))
            for validator, url, body in bodies:
                assert not validator.is_valid(body), body
                r = client.post(url, headers=ADMIN, json=body)
                assert r.status_code == 422 and ONE_MODEL in r.text, (body, r.text)
        for new in ({"version": "v3"}, {"version": "v3", "arch": ""},
                    {"arch": "ViT-B-32", "pretrained": "openai", "model_config": None}):
            assert plans.is_valid({"new": new}), new
            assert jobs.is_valid({"kind": "plan", "gallery": "shapes", "params": {"new": new}})


def test_schemathesis_finds_no_valid_body_refused_for_a_rule_the_schema_states(
        gateway_factory) -> None:
    """Bodies schemathesis generates as valid (POSITIVE) for the operations with a
    one-of rule, on the gallery that exists: none is refused for that rule (the app may
    refuse them for what the document cannot know: a version that is not registered, a
    path outside the allowed roots, an image that does not decode)."""
    refused: list[str] = []
    with gateway_factory(max_image_pixels=64 * 64) as client:
        schema = load(client.get("/openapi.json").json())
        for path in (SEARCH, PLANS, JOBS):
            refused += refused_for_a_stated_rule(client, schema[path]["POST"])
    assert refused == []


def refused_for_a_stated_rule(client: TestClient, operation) -> list[str]:
    """40 valid bodies of ``operation`` (a fixed draw), to gallery 'shapes': the answers
    that refuse one for a rule the document states."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings

    stated = (ONE_MODEL, "exactly one of a text or an image query")
    refused: list[str] = []
    strategy = operation.as_strategy(generation_mode=schemathesis.GenerationMode.POSITIVE)

    @settings(max_examples=40, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def run(case) -> None:
        if case.path_parameters:
            case.path_parameters = {"gallery": "shapes"}
        response = send(client, case, keyed=True)
        if any(rule in response.text for rule in stated):
            refused.append(f"{operation.label}: {response.text[:200]}")

    run()
    return refused


@pytest.mark.slow
def test_schemathesis_finds_no_server_error_and_no_schema_violation(gateway_factory) -> None:
    """A few hundred generated cases (valid and invalid) over every operation of the
    document, with and without the admin key: no 5xx, every status declared, every body
    and media type as declared."""
    sent: list[int] = []
    with gateway_factory(max_image_pixels=64 * 64) as client:
        schema = load(client.get("/openapi.json").json())
        for result in schema.get_all_operations():
            for mode, keyed in PASSES:
                fuzz(client, result.ok(), mode, keyed, sent)
    assert len(sent) >= 300 and max(sent) < 500


def fuzz(client: TestClient, operation, mode: str, keyed: bool, sent: list[int]) -> None:
    """Up to a dozen cases of one operation in one generation mode, each checked."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    checks = [not_a_server_error, status_code_conformance, content_type_conformance,
              response_schema_conformance]
    strategy = operation.as_strategy(generation_mode=getattr(schemathesis.GenerationMode, mode))

    @settings(max_examples=12, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def run(case) -> None:
        response = send(client, case, keyed)
        sent.append(response.status_code)
        case.validate_response(response, checks=checks)

    with contextlib.suppress(Unsatisfiable):  # nothing to negate: no inputs
        run()


# (generation mode, with the admin key): valid and invalid inputs reach the code behind the
# key; the last pass keeps the key schemathesis made up (the 401 path).
PASSES = (("POSITIVE", True), ("NEGATIVE", True), ("POSITIVE", False))


def send(client: TestClient, case, keyed: bool) -> object:
    """The case as schemathesis serializes it for ``requests`` (its multipart and form
    encodings included), sent through the TestClient."""
    import requests

    kwargs = case.as_transport_kwargs(base_url="http://testserver")
    args = {k: v for k, v in kwargs.items()
            if k in ("method", "url", "headers", "params", "json", "data", "files", "cookies")}
    if keyed:
        args["headers"] = {**(args.get("headers") or {}), **ADMIN}
    prepared = requests.Request(**args).prepare()
    body = prepared.body.encode() if isinstance(prepared.body, str) else prepared.body
    return client.request(prepared.method, prepared.url, content=body,
                          headers=dict(prepared.headers))

