"""The web page's job form sends what the API takes: every body its form builder
(``jobBody`` in ``service/web/static/app.js``, run here in node) makes, for every kind the
form offers and every choice of its selects, validates against the job union of the
OpenAPI document (each kind's parameters, ``service.jobkinds``) and against the model
behind it. (The page once sent ``params.steps`` to an ``xbt`` job; nothing caught it.)"""

from __future__ import annotations

import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

STATIC = Path(__file__).resolve().parents[1] / "service" / "web" / "static"
# The form builder and the helpers it calls: from the first helper to the function after it.
BUILDER_FROM, BUILDER_TO = "const field = (form, name)", "async function startJob("

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="needs node")


class FormFields(HTMLParser):
    """The job form's fields: kinds (radios), selects and their options, other inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.inside = False
        self.kinds: list[str] = []
        self.selects: dict[str, list[str]] = {}
        self.inputs: dict[str, dict[str, str]] = {}  # name -> attributes
        self._select: str | None = None
        self._option: dict[str, str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form" and a.get("id") == "job-form":
            self.inside = True
        if not self.inside:
            return
        if tag == "input" and a.get("name") == "job-kind":
            self.kinds.append(a["value"])
        elif tag == "input" and a.get("name"):
            self.inputs[a["name"]] = a
        elif tag == "select":
            self._select = a["name"]
            self.selects[self._select] = []
        elif tag == "option" and self._select is not None:
            self._option = a

    def handle_data(self, data: str) -> None:
        if self._option is not None and self._select is not None:
            self.selects[self._select].append(self._option.get("value") or data.strip())
            self._option = None

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self._select = None
        elif tag == "form":
            self.inside = False


def form_fields() -> FormFields:
    fields = FormFields()
    fields.feed((STATIC / "index.html").read_text())
    assert fields.kinds and fields.selects, "index.html has no job form"
    return fields


def filled(fields: FormFields, kind: str, choice: dict[str, str], numbers: bool,
           promote: bool) -> dict[str, Any]:
    """The form's elements (name -> {value, checked}) as a user fills them in."""
    elements: dict[str, Any] = {"job-kind": {"value": kind}}
    for name, options in fields.selects.items():
        elements[name] = {"value": choice.get(name, options[0])}
    for name, attrs in fields.inputs.items():
        if attrs.get("type") == "checkbox":
            elements[name] = {"value": "on", "checked": promote}
        elif attrs.get("type") == "number":
            elements[name] = {"value": str(max(int(attrs.get("min") or 1), 2)) if numbers
                              else ""}
        else:
            elements[name] = {"value": attrs.get("value") or f"{name}-1"}
    return elements


def forms(fields: FormFields) -> list[dict[str, Any]]:
    """Every kind, with each option of each select (the others at their first), numbers
    set or left empty, promote on or off."""
    choices = [{}] + [{name: option} for name, options in fields.selects.items()
                      for option in options[1:]]
    return [filled(fields, kind, choice, numbers, promote) for kind in fields.kinds
            for choice in choices for numbers in (True, False) for promote in (True, False)]


def bodies(elements: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``jobBody`` of app.js on each filled-in form, run by node."""
    source = (STATIC / "app.js").read_text()
    start, end = source.find(BUILDER_FROM), source.find(BUILDER_TO)
    assert 0 <= start < end, f"app.js: the form builder between {BUILDER_FROM!r} and " \
                             f"{BUILDER_TO!r} moved; update this test's markers"
    script = (source[start:end] + "\nconst forms = JSON.parse(require('fs').readFileSync(0));"
              "\nprocess.stdout.write(JSON.stringify(forms.map((elements) => "
              "jobBody({elements}))));\n")
    run = subprocess.run(["node", "-e", script], input=json.dumps(elements), text=True,
                         capture_output=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


@pytest.fixture(scope="module")
def job_schema(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from service.api.app import create_app
    from service.state.config import Settings

    spec = create_app(Settings(data_dir=tmp_path_factory.mktemp("data"))).openapi()
    body = spec["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]
    return {**body["schema"], "components": spec["components"]}


def test_every_body_of_the_job_form_is_a_valid_job(job_schema: dict[str, Any]) -> None:
    import jsonschema_rs
    from pydantic import TypeAdapter

    from service.api.schemas.jobs import JobIn
    from service.jobkinds import KINDS

    fields = form_fields()
    assert set(fields.kinds) <= set(KINDS), "the form offers a kind the API does not know"
    made = bodies(forms(fields))
    assert {b["kind"] for b in made} == set(fields.kinds)
    validator = jsonschema_rs.validator_for(job_schema)
    model = TypeAdapter(JobIn)
    for body in made:
        errors = [e.message for e in validator.iter_errors(body)]
        assert errors == [], (body, errors)
        parsed = model.validate_python(body)  # the API's own check, model validators too
        assert parsed.kind == body["kind"]


def test_a_body_with_another_kinds_parameter_is_refused(job_schema: dict[str, Any]) -> None:
    """What the form test guards against: ``steps`` is a continual job's, not an xbt's."""
    import jsonschema_rs

    body = {"kind": "xbt", "gallery": "demo", "params": {
        "new": {"version": "v2"}, "corpus": "synth:10", "pairs": "p", "steps": 3}}
    assert not jsonschema_rs.validator_for(job_schema).is_valid(body)


# ---------------------------------------------------------------- the migration options
# ``migrationBody`` of views.js: the POST /v1/galleries/{gallery}/migration body of a row's
# migration options (transform, order, switch, sample), between these markers.
MIGRATION_FROM, MIGRATION_TO = "// MIGRATION BODY", "// END MIGRATION BODY"


def migration_bodies(forms: list[dict[str, Any]]) -> list[dict[str, Any]]:
    source = (STATIC / "views.js").read_text()
    start, end = source.find(MIGRATION_FROM), source.find(MIGRATION_TO)
    assert 0 <= start < end, f"views.js: the migration body builder between " \
                             f"{MIGRATION_FROM!r} and {MIGRATION_TO!r} moved"
    script = (source[start:end].replace("export function", "function")
              + "\nconst forms = JSON.parse(require('fs').readFileSync(0));"
              "\nprocess.stdout.write(JSON.stringify(forms.map(migrationBody)));\n")
    run = subprocess.run(["node", "-e", script], input=json.dumps(forms), text=True,
                         capture_output=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_every_body_of_the_migration_options_is_a_valid_migration(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every choice of the options (a learned order or a progressive switch left selected
    while the transform is unchecked too, as a stale form may hold them) makes a body the
    OpenAPI document and the API's own checks accept: never learned / progressive / sample
    without the transform, never candidates with it."""
    import jsonschema_rs

    from service.api.app import create_app
    from service.api.schemas.migrations import MigrationIn
    from service.state.config import Settings

    spec = create_app(Settings(data_dir=tmp_path_factory.mktemp("data"))).openapi()
    post = spec["paths"]["/v1/galleries/{gallery}/migration"]["post"]
    schema = {**post["requestBody"]["content"]["application/json"]["schema"],
              "components": spec["components"]}
    validator = jsonschema_rs.validator_for(schema)
    forms = [{"transform": transform, "order": order, "switch": switch, "sample": sample}
             for transform in (False, True)
             for order in ("id", "random", "learned", "candidates")
             for switch in ("end", "progressive") for sample in ("", "64", "3", "junk")]
    made = migration_bodies([{}, {"validation": " /data/val "}, *forms])
    assert made[0] == {}  # untouched options: the server's defaults
    assert made[1] == {"validation": "/data/val"}
    assert validator.is_valid(made[1])
    for form, body in zip(forms, made[2:], strict=True):
        errors = [e.message for e in validator.iter_errors(body)]
        assert errors == [], (form, body, errors)
        MigrationIn.model_validate(body).check(None, None)  # type: ignore[arg-type]
        assert body.get("transform", False) == form["transform"], (form, body)
        if form["transform"]:
            assert body.get("order", "id") == ("id" if form["order"] == "candidates"
                                               else form["order"])
            assert body.get("switch", "end") == form["switch"]
            assert body.get("sample") == (64 if form["sample"] == "64" else None)
        else:
            assert body.get("order", "id") == (form["order"] if form["order"] in (
                "random", "candidates") else "id")


# ---------------------------------------------------------------- the plan form
# ``planBody`` of views.js: the POST /v1/galleries/{gallery}/plans body of the plan form's
# values (index.html's #plan-form), between these markers.
PLAN_FROM, PLAN_TO = "// PLAN BODY", "// END PLAN BODY"
CONSTRAINTS = ("max_added_latency_ms", "max_negative_flip", "budget", "budget_gpu_hours")


class PlanFields(HTMLParser):
    """The plan form's fields: name -> attributes (inputs), name -> option values (selects)."""

    def __init__(self) -> None:
        super().__init__()
        self.inside = False
        self.inputs: dict[str, dict[str, str]] = {}
        self.selects: dict[str, list[str]] = {}
        self._select: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form":
            self.inside = a.get("id") == "plan-form"
        if not self.inside:
            return
        if tag == "input" and a.get("name"):
            self.inputs[a["name"]] = a
        elif tag == "select":
            self._select = a["name"]
            self.selects[self._select] = []
        elif tag == "option" and self._select is not None:
            self.selects[self._select].append(a["value"])

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self._select = None
        elif tag == "form":
            self.inside = False


def plan_bodies(forms: list[dict[str, str]]) -> list[dict[str, Any]]:
    source = (STATIC / "views.js").read_text()
    start, end = source.find(PLAN_FROM), source.find(PLAN_TO)
    assert 0 <= start < end, f"views.js: the plan body builder between {PLAN_FROM!r} and " \
                             f"{PLAN_TO!r} moved"
    script = (source[start:end].replace("export function", "function")
              + "\nconst forms = JSON.parse(require('fs').readFileSync(0));"
              "\nprocess.stdout.write(JSON.stringify(forms.map(planBody)));\n")
    run = subprocess.run(["node", "-e", script], input=json.dumps(forms), text=True,
                         capture_output=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


@pytest.fixture(scope="module")
def plan_schema(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from service.api.app import create_app
    from service.state.config import Settings

    spec = create_app(Settings(data_dir=tmp_path_factory.mktemp("data"))).openapi()
    post = spec["paths"]["/v1/galleries/{gallery}/plans"]["post"]
    return {**post["requestBody"]["content"]["application/json"]["schema"],
            "components": spec["components"]}


def test_every_body_of_the_plan_form_is_a_valid_plan(plan_schema: dict[str, Any]) -> None:
    """The plan form (its fields as index.html has them) makes, for every objective it
    offers and any mix of the sample and the four constraints set or left empty, a body
    the OpenAPI document and the API's own model accept, holding exactly what was typed;
    empty fields are left out (the server's defaults)."""
    import jsonschema_rs

    from service.api.schemas.plans import PlanIn

    fields = PlanFields()
    fields.feed((STATIC / "index.html").read_text())
    assert set(fields.inputs) == {"version", "sample", *CONSTRAINTS}, fields.inputs
    assert set(fields.selects) == {"gallery", "objective"}
    validator = jsonschema_rs.validator_for(plan_schema)
    typed = {"sample": "64", "max_added_latency_ms": "2.5", "max_negative_flip": "0.02",
             "budget": "0.1", "budget_gpu_hours": "0"}
    forms = [{"version": " v2 ", "objective": objective,
              **{name: (value if (n >> k) & 1 else "") for k, (name, value)
                 in enumerate(typed.items())}}
             for objective in fields.selects["objective"] for n in range(2 ** len(typed))]
    made = plan_bodies([{}, *forms])
    assert made[0] == {"new": {"version": ""}}  # nothing typed: the server says what's missing
    for form, body in zip(forms, made[1:], strict=True):
        errors = [e.message for e in validator.iter_errors(body)]
        assert errors == [], (form, body, errors)
        parsed = PlanIn.model_validate(body)
        assert parsed.new.version == "v2" and parsed.objective == form["objective"]
        assert body.get("sample") == (64 if form["sample"] else None)
        for name in CONSTRAINTS:
            typed_in = form[name]
            assert getattr(parsed.constraints, name) == (float(typed_in) if typed_in else None)
            assert (name in body.get("constraints", {})) == bool(typed_in), (form, body)


def test_a_plan_value_out_of_range_is_sent_for_the_server_to_refuse(
        plan_schema: dict[str, Any]) -> None:
    """Out of its range, a typed number is not dropped (a constraint dropped in silence
    would let the plan recommend what the person meant to rule out): the API refuses the
    body, and its message names the field."""
    import jsonschema_rs
    from pydantic import ValidationError

    from service.api.schemas.plans import PlanIn

    validator = jsonschema_rs.validator_for(plan_schema)
    cases = {"sample": "3", "max_negative_flip": "1.5", "budget": "-1",
             "max_added_latency_ms": "-0.5"}
    made = plan_bodies([{"version": "v2", name: value} for name, value in cases.items()])
    for (name, value), body in zip(cases.items(), made, strict=True):
        where = body if name == "sample" else body["constraints"]
        assert where[name] == float(value), body
        assert not validator.is_valid(body), body
        with pytest.raises(ValidationError, match=name):
            PlanIn.model_validate(body)
