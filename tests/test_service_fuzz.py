"""Schema-driven fuzzing: walk the OpenAPI spec and send generated, mutated and random
bodies (JSON and multipart) to every operation, with and without keys. No input may
produce a 5xx, every error has the shared JSON shape, and every response is one the
document declares (status, media type, body schema). The quick version of the schemathesis
run in test_service_openapi.py (marked slow)."""

from __future__ import annotations

import base64
import io
import json
import random
import string
from typing import Any

from conftest import ADMIN
from openapi_check import load, problems
from PIL import Image

SEED = 20240601
CASES_PER_OPERATION = 30
NASTY_STRINGS = ["", " ", "shapes", "v1", "v2", "v3", "nope", "a" * 3000, "\x00", "\ud800",
                 "ü漢字🙂", "../../etc/passwd", "%2e%2e/", "null", "{}", "-1", "1e309", "NaN",
                 "data:image/png;base64,AAAA", "iVBORw0KGgo=", "' OR 1=1 --"]
NASTY_VALUES: list[Any] = [None, True, -1, 0, 2**63, -(2**70), 1.5, 1e308, "", [], {},
                           [[[[[]]]]], {"a": {"b": {"c": None}}}, "x" * 5000]
RAW_BODIES = [b"", b"{", b"}", b"[", b"null", b"{\"text\": }", b"\xff\xfe\x00", b"NaN",
              b"{\"text\": NaN}", b"[" * 5000 + b"]" * 5000, b"{\"a\":" * 3000 + b"1" +
              b"}" * 3000, b"1" * 10000, b"{\"text\": \"\\ud800\"}", b"{\"top_k\": 1e400}"]


def png(size: tuple[int, int] = (16, 16)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buf, format="PNG")
    return buf.getvalue()


IMAGES = [png(), png()[:40], b"GIF89a", b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, b"", png((1, 1))]
PNG_B64 = base64.b64encode(png()).decode()
# Valid starting points, so mutations also reach the code behind validation.
EXAMPLES: dict[str, list[dict]] = {
    "/v1/galleries/{gallery}/search": [
        {"text": "a red circle", "top_k": 5}, {"image_base64": PNG_B64, "kind": "text"},
        {"text": "a shape", "filter": {"domain": ["basic", "pairs"], "n": 1}}],
    "/v1/galleries/{gallery}/items": [
        {"items": [{"id": "f1", "text": "a red circle", "image_base64": PNG_B64,
                    "payload": {"domain": "basic"}}, {"id": "f2", "text": "a blue square"}]}],
    "/v1/galleries/{gallery}/items/delete": [{"ids": ["f1", "nope"]}],
    "/v1/galleries": [{"name": "fuzzed", "space": "v1"}, {"name": "f3", "space": "v3"}],
    "/v1/models": [{"source": "/nonexistent/artifact", "move": False}],
    "/v1/models/{version_id}/promote": [{"gallery": "shapes"},
                                        {"gallery": "shapes", "force": True, "reason": "fuzz"}],
    "/v1/models/{version_id}/rollback": [{"gallery": "shapes", "reason": "fuzz"}],
}


class Fuzzer:
    def __init__(self, spec: dict, rng: random.Random) -> None:
        self.spec = spec
        self.rng = rng

    def resolve(self, schema: dict) -> dict:
        while "$ref" in schema:
            schema = self.spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
        return schema

    def value(self, schema: dict, depth: int = 0) -> Any:
        """A value shaped like the schema (often valid, sometimes at its edges)."""
        schema = self.resolve(schema)
        rng = self.rng
        if depth > 4:
            return None
        for key in ("anyOf", "oneOf"):
            if key in schema and "properties" in schema:  # a rule over the object's fields
                branch = rng.choice(schema[key])
                rest = {k: v for k, v in schema.items() if k != key}
                required = [*rest.get("required", ()), *branch.get("required", ())]
                return self.obj({**rest, "required": required}, depth)
            if key in schema:  # alternatives
                return self.value(rng.choice(schema[key]), depth + 1)
        if "enum" in schema:
            return rng.choice(schema["enum"])
        kind = schema.get("type")
        if kind == "object":
            return self.obj(schema, depth)
        if kind == "array":
            low = schema.get("minItems", 0)
            return [self.value(schema.get("items", {}), depth + 1)
                    for _ in range(rng.randint(low, low + 3))]
        if kind == "string":
            return self.string(schema)
        if kind == "integer":
            return rng.choice([schema.get("minimum", 0), schema.get("maximum", 10**6), 1, 3, 5,
                               10, rng.randint(-10, 200)])
        if kind == "number":
            return rng.uniform(-1e6, 1e6)
        if kind == "boolean":
            return rng.random() < 0.5
        if kind == "null":
            return None
        return rng.choice(NASTY_VALUES)

    def obj(self, schema: dict, depth: int) -> dict:
        props = schema.get("properties", {})
        required = set(schema.get("required", ()))
        out = {name: self.value(sub, depth + 1) for name, sub in props.items()
               if name in required or self.rng.random() < 0.6}
        if schema.get("additionalProperties") and self.rng.random() < 0.5:
            out[self.string({})] = self.value(schema["additionalProperties"]
                                              if isinstance(schema["additionalProperties"], dict)
                                              else {}, depth + 1)
        return out

    def string(self, schema: dict) -> str:
        if schema.get("format") == "binary":
            return "binary"
        if self.rng.random() < 0.5:
            return self.rng.choice(NASTY_STRINGS)
        n = self.rng.randint(schema.get("minLength", 0), min(schema.get("maxLength", 40), 40))
        return "".join(self.rng.choice(string.printable) for _ in range(n))

    def mutate(self, value: Any) -> Any:
        """Replace one node of a generated value with something hostile."""
        rng = self.rng
        if isinstance(value, dict) and value and rng.random() < 0.7:
            key = rng.choice(list(value))
            return {**value, key: self.mutate(value[key])}
        if isinstance(value, list) and value and rng.random() < 0.7:
            i = rng.randrange(len(value))
            return [*value[:i], self.mutate(value[i]), *value[i + 1:]]
        return rng.choice(NASTY_VALUES + NASTY_STRINGS)


def json_body(fuzzer: Fuzzer, schema: dict, examples: list[dict]) -> tuple[bytes, str]:
    rng = fuzzer.rng
    roll = rng.random()
    if examples and roll > 0.6:
        value = rng.choice(examples)
        return json.dumps(fuzzer.mutate(value) if roll > 0.85 else value).encode(), \
            "application/json"
    if roll < 0.15:
        return rng.choice(RAW_BODIES), "application/json"
    if roll < 0.2:
        return bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 64))), \
            rng.choice(["application/json", "text/plain", "application/xml", ""])
    value = fuzzer.value(schema)
    if roll < 0.6:
        value = fuzzer.mutate(value)
    return json.dumps(value, allow_nan=True).encode(), "application/json"


def multipart_body(fuzzer: Fuzzer, schema: dict) -> tuple[dict, list]:
    rng = fuzzer.rng
    data: dict[str, Any] = {}
    files: list = []
    for name, sub in fuzzer.resolve(schema).get("properties", {}).items():
        binary = sub.get("format") == "binary" or sub.get("items", {}).get("format") == "binary"
        if binary:
            for _ in range(rng.randint(0, 3)):
                files.append((name, (rng.choice(NASTY_STRINGS[:8]) or "f.png",
                                     rng.choice(IMAGES), "image/png")))
        elif rng.random() < 0.7:
            value = fuzzer.value(sub)
            text = value if isinstance(value, str) else json.dumps(value)
            data[name] = text.encode("utf-8", "surrogatepass")  # lone surrogates as raw bytes
    if rng.random() < 0.3:
        data[rng.choice(NASTY_STRINGS[1:8])] = rng.choice(NASTY_STRINGS).encode(
            "utf-8", "surrogatepass")
    return data, files


def path_for(template: str, rng: random.Random) -> str:
    while "{" in template:
        start, end = template.index("{"), template.index("}")
        value = rng.choice(["shapes"] * 6 + ["v1", "v2", "v3", "nope", "a" * 300, "ü", "%20",
                                             "..", "-"])
        template = template[:start] + value + template[end + 1:]
    return template


def test_no_input_produces_a_server_error(gateway_factory) -> None:
    rng = random.Random(SEED)
    with gateway_factory(max_image_pixels=64 * 64) as client:
        spec = client.get("/openapi.json").json()
        fuzzer = Fuzzer(spec, rng)
        document = load(spec)
        operations = [(path, method, op) for path, item in spec["paths"].items()
                      for method, op in item.items()]
        assert len(operations) >= 14
        failures = []
        for path, method, op in operations:
            content = op.get("requestBody", {}).get("content", {})
            for _ in range(CASES_PER_OPERATION):
                headers = ADMIN if rng.random() < 0.85 else rng.choice(
                    [{}, {"X-API-Key": "wrong"}, {"X-API-Key": "\x7f"}])
                kwargs: dict[str, Any] = {}
                if "multipart/form-data" in content and rng.random() < 0.4:
                    data, files = multipart_body(fuzzer, content["multipart/form-data"]["schema"])
                    kwargs = {"data": data, "files": files or None}
                elif content or rng.random() < 0.2:
                    schema = content.get("application/json", {}).get("schema", {})
                    body, ctype = json_body(fuzzer, schema, EXAMPLES.get(path, []))
                    kwargs = {"content": body, "headers": {**headers, "content-type": ctype}}
                url = path_for(path, rng)
                response = client.request(method.upper(), url, **kwargs,
                                          **({} if "headers" in kwargs else {"headers": headers}))
                found = problems(document, response)
                if response.status_code >= 500 or not _shaped(response) or found:
                    failures.append((method, url, kwargs.get("content", kwargs.get("data")),
                                     response.status_code, response.text[:300], found))
        assert failures == []


def _shaped(response) -> bool:
    """Errors carry {"error": {"code", "message"}}; successes are whatever they are."""
    if response.status_code < 400:
        return True
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(error, dict) and {"code", "message"} <= set(error)


def test_odd_texts_are_answered(gateway_factory) -> None:
    texts = ["\ud800 lone surrogate", "\x00\x01\x02", "🙂" * 500, "a " * 1000, "\u200b"]
    with gateway_factory() as client:
        for text in texts:
            for kind in ("search", "items"):
                body = {"text": text} if kind == "search" else {"items": [{"id": text or "x",
                                                                           "text": text}]}
                r = client.post(f"/v1/galleries/shapes/{kind}", content=json.dumps(body),
                                headers={**ADMIN, "content-type": "application/json"})
                assert r.status_code in (200, 422), r.text
