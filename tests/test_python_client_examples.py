"""The Python client examples of the manual (``docs/how-to/python-client.md``) compile,
call only paths the gateway has (with a method it answers), and send only JSON keys that
the route's body model takes, nested objects included; a body written out whole also
validates against that model. Nothing is sent: the examples are read, not run."""

from __future__ import annotations

import ast
import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest
from fastapi import FastAPI
from pydantic import BaseModel, TypeAdapter
from test_reference_examples import schema_models

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "how-to" / "python-client.md"
METHODS = ("get", "post", "put", "patch", "delete")
# What the page must show a body for (method, route path).
MAIN = {("POST", "/v1/galleries/{gallery}/search"), ("POST", "/v1/galleries/{gallery}/items"),
        ("POST", "/v1/jobs"), ("POST", "/v1/galleries/{gallery}/migration"),
        ("POST", "/v1/galleries/{gallery}/plans"),
        ("POST", "/v1/galleries/{gallery}/plans/{plan_id}/apply")}


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), re.MULTILINE | re.DOTALL)


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    """The gateway as the manual's reference pages build it (tests/test_docs_reference.py)."""
    from service.api.app import create_app
    from service.state.config import Settings

    return create_app(Settings(data_dir=tmp_path_factory.mktemp("data"), qdrant_path=":memory:"))


def api_routes(app: FastAPI) -> list[Any]:
    """Every APIRoute of the app, included routers' too."""
    from fastapi.routing import APIRoute

    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:  # older FastAPI: the app's routes are the routes
        routes: Any = app.routes
    else:
        routes = iter_route_contexts(app.routes)
    return [r for r in routes if isinstance(getattr(r, "original_route", r), APIRoute)]


def body_type(app: FastAPI, route: Any, method: str) -> Any:
    """The type a route parses its JSON body as: its body parameter's (with the field's
    metadata), or, for a route that reads the request itself, the model its hand-written
    OpenAPI body names (``title``)."""
    field = route.body_field
    if field is not None:
        info = field.field_info
        return Annotated[(info.annotation, *info.metadata)] if info.metadata \
            else info.annotation
    operation = app.openapi()["paths"][route.path][method.lower()]
    title = operation["requestBody"]["content"]["application/json"]["schema"]["title"]
    return schema_models()[title]


def calls(tree: ast.AST) -> Iterator[tuple[ast.Call, str, str]]:
    """(call, METHOD, path) of every ``client.<method>(path, ...)``; an f-string's
    placeholders become ``x``."""
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in METHODS and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "client" and node.args):
            continue
        first = node.args[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            path = first.value
        elif isinstance(first, ast.JoinedStr):
            path = "".join(v.value if isinstance(v, ast.Constant) else "x"
                           for v in first.values)
        else:
            pytest.fail(f"line {node.lineno}: the path is not written out: {ast.unparse(first)}")
        yield node, node.func.attr.upper(), path


def route_of(app: FastAPI, method: str, path: str) -> Any:
    for route in api_routes(app):
        if method in route.methods and route.path_regex.match(path):
            return route
    return None


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation holds (through Optional, unions, Annotated and lists)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in models_in(arg)]


def pick(models: list[type[BaseModel]], node: ast.Dict) -> type[BaseModel]:
    """The member of a union a dict literal is: the one whose ``kind`` it names."""
    if len(models) == 1:
        return models[0]
    given = {k.value: v for k, v in zip(node.keys, node.values, strict=True)
             if isinstance(k, ast.Constant)}
    kind = given.get("kind")
    for model in models:
        field = model.model_fields.get("kind")
        if field is not None and isinstance(kind, ast.Constant) \
                and kind.value in typing.get_args(field.annotation):
            return model
    return models[0]


def unknown_keys(node: ast.AST, annotation: Any, where: str) -> list[str]:
    """Keys of the dict literals in ``node`` that the models of ``annotation`` do not
    take, nested objects and lists (literal or comprehension) included; an object the
    model leaves free (``dict[str, Any]``) is not looked into."""
    if isinstance(node, ast.Dict):
        models = models_in(annotation)
        if not models:
            return []
        model = pick(models, node)
        fields = {(f.alias or name): f for name, f in model.model_fields.items()}
        found = []
        for key, value in zip(node.keys, node.values, strict=True):
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                found.append(f"{where}: a key that is not written out")
            elif key.value not in fields:
                found.append(f"{where}: '{key.value}' is not a field of {model.__name__}")
            else:
                found += unknown_keys(value, fields[key.value].annotation,
                                      f"{where}.{key.value}")
        return found
    if isinstance(node, ast.List | ast.Tuple):
        return [p for element in node.elts for p in unknown_keys(element, annotation, where)]
    if isinstance(node, ast.ListComp):
        return unknown_keys(node.elt, annotation, where + "[]")
    return []


def test_the_page_has_python_examples_that_compile() -> None:
    blocks = python_blocks()
    assert len(blocks) >= 6
    for n, block in enumerate(blocks):
        compile(block, f"{PAGE.name}, block {n + 1}", "exec")
    compile("\n".join(blocks), PAGE.name, "exec")  # later blocks use earlier ones


def test_every_path_the_examples_call_exists(app: FastAPI) -> None:
    tree = ast.parse("\n".join(python_blocks()))
    found = list(calls(tree))
    assert len(found) >= 10
    missing = [f"{method} {path}" for _, method, path in found
               if route_of(app, method, path) is None]
    assert missing == [], "the examples call paths the gateway does not have"
    used = {(method, route_of(app, method, path).path) for _, method, path in found}
    assert MAIN <= used, MAIN - used


def test_every_json_key_the_examples_send_is_a_field_of_the_body_model(app: FastAPI) -> None:
    tree = ast.parse("\n".join(python_blocks()))
    problems, sent = [], set()
    for call, method, path in calls(tree):
        body = next((k.value for k in call.keywords if k.arg == "json"), None)
        if body is None:
            continue
        route = route_of(app, method, path)
        target = body_type(app, route, method)
        sent.add((method, route.path))
        where = f"line {call.lineno} {method} {route.path}"
        assert isinstance(body, ast.Dict), f"{where}: the body is not written out"
        problems += unknown_keys(body, target, where)
        try:
            value = ast.literal_eval(body)
        except ValueError:  # it uses the example's variables
            continue
        TypeAdapter(target).validate_python(value)
    assert problems == []
    assert MAIN <= sent, MAIN - sent


def test_a_key_the_model_does_not_take_is_found(app: FastAPI) -> None:
    """The check itself: a misspelt key, top-level or nested, is reported."""
    route = route_of(app, "POST", "/v1/jobs")
    target = body_type(app, route, "POST")
    body = ast.parse('{"kind": "plan", "gallery": "demo", "params": {"new": {"versoin": "v2"}},'
                     ' "auto_promte": True}', mode="eval").body
    assert unknown_keys(body, target, "jobs") == [
        "jobs.params.new: 'versoin' is not a field of ModelRef",
        "jobs: 'auto_promte' is not a field of PlanJobIn"]
