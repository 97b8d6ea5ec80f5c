"""The HTTP reference shows an example request and response for the main routes (search,
items, jobs, migrations, plans). The examples live in the code
(``service/api/schemas/examples.py``, attached to the models and routes), reach the
OpenAPI document, and the reference page renders them (``docs/hooks/reference_pages.py``).
Every example the document shows for an operation validates against that operation's own
body or answer model, so an example cannot drift from the schema; and every one is on the
rendered page."""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest
from fastapi import Body, FastAPI
from pydantic import BaseModel, TypeAdapter

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "docs" / "hooks"))

import reference_pages as pages

# (method, path): the operations that must show an example request (if they take a body)
# and an example response.
MAIN = {
    ("POST", "/v1/galleries/{gallery}/search"): True,
    ("POST", "/v1/galleries/{gallery}/items"): True,
    ("POST", "/v1/jobs"): True,
    ("GET", "/v1/jobs/{job_id}"): False,
    ("POST", "/v1/galleries/{gallery}/migration"): True,
    ("GET", "/v1/galleries/{gallery}/migration"): False,
    ("POST", "/v1/galleries/{gallery}/plans"): True,
    ("GET", "/v1/galleries/{gallery}/plans/{plan_id}"): False,
    ("POST", "/v1/galleries/{gallery}/plans/{plan_id}/apply"): True,
}


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    from service.api.app import create_app
    from service.state.config import Settings

    return create_app(Settings(data_dir=tmp_path_factory.mktemp("data"), qdrant_path=":memory:"))


def api_routes(app: FastAPI) -> Iterator[Any]:
    """Every APIRoute of the app, included routers' too (FastAPI keeps those behind an
    included-router object from 0.16x on: ``iter_route_contexts`` reaches them)."""
    from fastapi.routing import APIRoute

    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:  # older FastAPI: the app's routes are the routes
        routes: Any = app.routes
    else:
        routes = iter_route_contexts(app.routes)
    for route in routes:
        if isinstance(getattr(route, "original_route", route), APIRoute):
            yield route


def schema_models() -> dict[str, type[BaseModel]]:
    """Every model of ``service.api.schemas`` by class name (a hand-written request body
    names its model in its schema's ``title``)."""
    import service.api.schemas as package

    found: dict[str, type[BaseModel]] = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, BaseModel):
                found.setdefault(value.__name__, value)
    return found


def body_adapter(route: Any, operation: dict[str, Any]) -> TypeAdapter:
    """What the route parses its JSON body with: its body parameter's type (with the
    field's metadata: a discriminator), or, for a route that reads the request itself,
    the model its hand-written schema names."""
    field = route.body_field
    if field is not None:
        info = field.field_info
        return TypeAdapter(Annotated[(info.annotation, *info.metadata)] if info.metadata
                           else info.annotation)
    title = operation["requestBody"]["content"]["application/json"]["schema"]["title"]
    return TypeAdapter(schema_models()[title])


def shown_examples(app: FastAPI) -> list[tuple[str, str, str, Any, TypeAdapter]]:
    """(method, path, request|response, example, the model it must satisfy) of every
    example the document shows for an operation."""
    document = app.openapi()
    components = document["components"]["schemas"]
    found = []
    for route in api_routes(app):
        for method in sorted(route.methods):
            operation = document["paths"].get(route.path, {}).get(method.lower())
            if operation is None:
                continue
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            if body is not None:
                example = pages.example_of(body, components)
                if example is not None:
                    found.append((method, route.path, "request", example,
                                  body_adapter(route, operation)))
            for status, answer in operation["responses"].items():
                content = answer.get("content", {}).get("application/json")
                if status.startswith("2") and content is not None:
                    example = pages.example_of(content, components)
                    if example is not None:
                        found.append((method, route.path, "response", example,
                                      TypeAdapter(route.response_model)))
    return found


def test_every_shown_example_validates_against_its_operations_model(app: FastAPI) -> None:
    found = shown_examples(app)
    for method, path, which, example, adapter in found:
        try:
            adapter.validate_python(example)
        except Exception as exc:  # noqa: BLE001 - named in the failure
            pytest.fail(f"the example {which} of {method} {path} does not validate: {exc}")
    shown = {(method, path, which) for method, path, which, _, _ in found}
    for (method, path), has_body in MAIN.items():
        assert (method, path, "response") in shown, f"{method} {path}: no example response"
        if has_body:
            assert (method, path, "request") in shown, f"{method} {path}: no example request"


def test_every_shown_example_validates_against_the_documents_own_schema(app: FastAPI) -> None:
    """What a client generated from the document would check: each example against the
    JSON schema the document states for that body or answer."""
    import jsonschema_rs

    document = app.openapi()
    components = document["components"]
    for method, path, which, example, _ in shown_examples(app):
        operation = document["paths"][path][method.lower()]
        if which == "request":
            content = operation["requestBody"]["content"]["application/json"]
        else:
            content = next(a["content"]["application/json"] for s, a in
                           operation["responses"].items() if s.startswith("2"))
        validator = jsonschema_rs.validator_for({**content["schema"], "components": components})
        errors = [e.message for e in validator.iter_errors(example)]
        assert errors == [], (method, path, which, errors[:3])


def test_the_examples_of_jobs_name_parameters_their_kind_takes(app: FastAPI) -> None:
    """A job's ``params`` are a free object in ``JobOut``: check them against the kind's
    own parameter model, and a migration's phase against the lifecycle table."""
    from service.api.schemas import examples as ex
    from service.jobkinds import KINDS
    from service.jobkinds.migrate.lifecycle import OPERATOR, PHASES

    jobs = [ex.JOB_REQUEST, ex.QUEUED_JOB, ex.FINISHED_JOB, ex.MIGRATE_JOB, ex.PLAN_JOB,
            ex.APPLIED_RESPONSE["job"], {"kind": "plan", "params": ex.PLAN_RESPONSE["params"]}]
    for job in jobs:
        KINDS[job["kind"]].params.model_validate(job["params"])
    assert ex.APPLIED_RESPONSE["job"]["kind"] == "adapter"  # a route option starts one
    migration = ex.MIGRATION_RESPONSE
    assert migration["phase_note"] == PHASES[migration["phase"]]
    assert set(migration["options"]) <= set(OPERATOR)
    option = ex.APPLIED_RESPONSE["option"]
    assert option in [o["name"] for o in ex.PLAN_RESPONSE["plan"]["options"]]


def test_every_example_reaches_the_document_whole(app: FastAPI) -> None:
    """Each example of the module is shown somewhere, with its nulls (FastAPI drops them
    from the document; ``restore_nulls`` puts them back)."""
    from service.api.schemas import examples as ex

    shown = [example for _, _, _, example, _ in shown_examples(app)]
    for example in ex.ALL:
        assert example in shown, f"an example no operation shows: {str(example)[:80]}"
    job = next(e for e in shown if e == ex.FINISHED_JOB)
    assert job["error"] is None and "error" in job


def test_the_reference_page_shows_each_operations_examples(app: FastAPI) -> None:
    document = app.openapi()
    page = pages.openapi_page(document)
    for method, path, which, example, _ in shown_examples(app):
        section = page.split(f"### `{method} {path}`\n", 1)[1].split("\n### ")[0]
        title = "**Example request**" if which == "request" else "**Example response**"
        assert title in section, (method, path, which)
        block = "```json\n" + json.dumps(example, indent=2, ensure_ascii=False) + "\n```"
        assert block in section, (method, path, which)
    search = page.split("### `POST /v1/galleries/{gallery}/search`\n", 1)[1].split("\n### ")[0]
    assert search.index("**Example request**") < search.index("| status |") \
        < search.index("**Example response** (`200`, `application/json`)")


class Tour(BaseModel):
    stops: int


def test_an_operation_without_examples_shows_none_and_named_examples_are_rendered() -> None:
    """The hook reads a media type's ``example``, the first of its ``openapi_examples``,
    or its schema's ``examples``; an operation with none of them shows no block."""
    app = FastAPI()

    @app.post("/tour")
    async def tour(body: Annotated[Tour, Body(openapi_examples={
            "short": {"summary": "a short tour", "value": {"stops": 3}},
            "long": {"value": {"stops": 30}}})]) -> Tour:
        return body

    @app.get("/plain")
    async def plain() -> Tour:
        return Tour(stops=1)

    page = pages.openapi_page(app.openapi())
    tour_section = page.split("### `POST /tour`", 1)[1].split("\n### ")[0]
    assert '**Example request** (`application/json`):\n\n```json\n{\n  "stops": 3\n}\n```' \
        in tour_section
    plain_section = page.split("### `GET /plain`", 1)[1].split("\n### ")[0]
    assert "**Example" not in plain_section
