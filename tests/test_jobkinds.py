"""A job kind is its own module plus one registration (``service.jobkinds``): a kind defined
and registered here, in the test, and in no other file, is checked at submission, stated
in the API's job union (OpenAPI), run through the worker's dispatch, and submitted through
the real API and run by the worker's job lifecycle end to end. The xbt job takes any
registered upgrade method."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from pydantic import Field, TypeAdapter, ValidationError

from service.jobkinds import KINDS, JobKind, Params, check_job, register
from service.jobkinds.base import RunContext
from service.state.errors import InvalidInput
from service.state.paths import Roots
from service.state.registry import Registry
from tests.conftest import register_gated


class EchoParams(Params):
    words: list[str] = Field(min_length=1, description="what the job says back")

    def check(self, registry: Registry, roots: Roots) -> None:
        if "forbidden" in self.words:
            raise InvalidInput("echo job: words: 'forbidden' is refused")


def run_echo(ctx: RunContext) -> dict[str, Any]:
    p: EchoParams = ctx.params  # the model, as checked at submission
    ctx.heartbeat.progress = {"stage": "echo"}
    return {"result": {"echo": " ".join(p.words), "gallery": ctx.job.gallery}}


@pytest.fixture
def echo() -> Iterator[JobKind]:
    kind = register(JobKind("echo", EchoParams, run_echo))
    try:
        yield kind
    finally:
        KINDS.pop(kind.name)


def test_the_built_in_kinds_are_registered_once() -> None:
    assert list(KINDS) == ["continual", "xbt", "adapter", "evaluate", "ingest", "migrate",
                           "plan"]
    with pytest.raises(ValueError, match="already registered"):
        register(JobKind("xbt", EchoParams, run_echo))


def test_a_new_kind_is_checked_at_submission(echo: JobKind, tmp_path: Path,
                                             micro_versions: dict[str, Path]) -> None:
    registry = Registry(tmp_path / "registry")
    register_gated(registry, micro_versions["v1"])
    registry.create_gallery("shapes", "v1", by="test", version="v1")
    roots = Roots((tmp_path,))
    parsed = check_job("echo", "shapes", {"words": ["hi"]}, registry, roots)
    assert isinstance(parsed, EchoParams) and parsed.words == ["hi"]
    with pytest.raises(InvalidInput, match=r"echo job: params\.words"):
        check_job("echo", "shapes", {"words": []}, registry, roots)
    with pytest.raises(InvalidInput, match="'forbidden' is refused"):
        check_job("echo", "shapes", {"words": ["forbidden"]}, registry, roots)
    with pytest.raises(InvalidInput, match="echo job: gallery"):
        check_job("echo", "nowhere", {"words": ["hi"]}, registry, roots)


def test_the_api_union_states_a_new_kinds_parameters(echo: JobKind) -> None:
    from service.api.schemas.jobs import job_union

    union = job_union(KINDS)
    body = TypeAdapter(union).validate_python({"kind": "echo", "gallery": "shapes",
                                               "params": {"words": ["a", "b"]}})
    assert isinstance(body.params, EchoParams) and body.params.words == ["a", "b"]
    with pytest.raises(ValidationError, match="echo"):  # the error names the known kinds
        TypeAdapter(union).validate_python({"kind": "nope", "gallery": "shapes"})

    def submit(body: Any) -> None:
        """The job route's body, on an app of its own."""
    submit.__annotations__ = {"body": union, "return": None}  # the union, not a name
    app = FastAPI()
    app.add_api_route("/jobs", submit, methods=["POST"])
    schemas = app.openapi()["components"]["schemas"]
    mapping = next(s["discriminator"]["mapping"] for s in _walk(app.openapi())
                   if "discriminator" in s)
    assert set(mapping) == set(KINDS) and mapping["echo"].endswith("/EchoJobIn")
    assert schemas["EchoParams"]["required"] == ["words"]


def test_the_worker_dispatches_a_new_kind(echo: JobKind, tmp_path: Path) -> None:
    from service.state.config import Settings
    from service.state.jobs import JobStore
    from worker.lifecycle import run

    settings = Settings(data_dir=tmp_path / "data")
    store = JobStore(settings.registry_dir)
    job = store.create("echo", "shapes", {"words": ["hello", "world"]}, by="test",
                       auto_promote=False)
    done = run(job.id, settings, "test-worker")
    assert done is not None and done.status == "succeeded", done
    assert done.result == {"echo": "hello world", "gallery": "shapes"}


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def test_the_xbt_job_resolves_any_registered_upgrade_method() -> None:
    """The job's ``config.method`` is looked up in the upgrade registry, and its own config
    class parses the rest: a method registered elsewhere needs no change here."""
    from dataclasses import dataclass, field

    from service.jobkinds.xbt import XbtParams
    from training.config import MethodConfig
    from training.errors import ConfigError
    from training.upgrades import UPGRADES, UpgradeMethod
    from training.upgrades.xbt.config import XbtConfig

    @dataclass
    class ToyConfig(MethodConfig):
        method: str = "toy"
        steps: int = 1
        batch_size: int = 4
        knobs: list[str] = field(default_factory=list)

    class Toy(UpgradeMethod):
        Config = ToyConfig

    def params(**config: Any) -> XbtParams:
        return XbtParams(new={"version": "v2"}, corpus="synth:10", pairs="p", config=config)

    UPGRADES.register("toy")(Toy)
    try:
        cfg = params(method="toy", steps=7).method_config()
        assert isinstance(cfg, ToyConfig) and cfg.steps == 7
        assert isinstance(params().method_config(), XbtConfig)  # the default: xbt
        assert params(method="direct").method_config().method == "direct"
        with pytest.raises(ConfigError, match="method must be one of"):
            params(method="nope").method_config()
    finally:
        UPGRADES.pop("toy")


# Run in a fresh interpreter: the kind is registered before the app is built, as a built-in
# kind is (the API's union is made from KINDS when its schemas are imported).
THROUGH_THE_API = """
import json, sys
sys.path.insert(0, sys.argv[1])
from test_jobkinds import EchoParams, run_echo
from service.jobkinds import JobKind, register
register(JobKind("echo", EchoParams, run_echo))  # the kind's one registration line

from fastapi.testclient import TestClient
from service.api.app import create_app
from service.state.config import Settings
from service.state.jobs.workers import Heartbeat
from worker.lifecycle import run

settings = Settings(data_dir=sys.argv[2], qdrant_path=":memory:",
                    admin_api_keys={"ops": "k"}, allowed_roots=(sys.argv[2],))
admin = {"X-API-Key": "k"}
beat = Heartbeat(settings, "echo-worker")  # a live worker: the gateway accepts jobs
beat.start()
try:
    with TestClient(create_app(settings)) as client:
        made = client.post("/v1/galleries", headers=admin,
                           json={"name": "shapes", "space": "v1", "version": "v1"})
        assert made.status_code == 201, made.text
        spec = client.get("/openapi.json").json()
        bad = client.post("/v1/jobs", headers=admin, json={
            "kind": "echo", "gallery": "shapes", "params": {"words": []}})
        refused = client.post("/v1/jobs", headers=admin, json={
            "kind": "echo", "gallery": "shapes", "params": {"words": ["forbidden"]}})
        job = client.post("/v1/jobs", headers=admin, json={
            "kind": "echo", "gallery": "shapes", "params": {"words": ["hello", "world"]}})
        assert job.status_code == 202, job.text
        run(job.json()["id"], settings, "echo-worker")  # what the worker's task calls
        done = client.get(f"/v1/jobs/{job.json()['id']}", headers=admin).json()
finally:
    beat.stop()
print(json.dumps({"schemas": sorted(spec["components"]["schemas"]), "bad": bad.status_code,
                  "bad_detail": bad.text, "refused": refused.status_code,
                  "refused_detail": refused.text, "done": done}))
"""


def test_a_new_kind_runs_through_the_api_and_the_worker(tmp_path: Path,
                                                       micro_versions: dict[str, Path]) -> None:
    import json
    import subprocess
    import sys

    from service.state.config import Settings

    data = tmp_path / "data"
    register_gated(Registry(Settings(data_dir=data).registry_dir), micro_versions["v1"])
    run = subprocess.run([sys.executable, "-c", THROUGH_THE_API, str(Path(__file__).parent),
                          str(data)], capture_output=True, text=True, timeout=300,
                         check=False, cwd=Path(__file__).parents[1])
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert {"EchoJobIn", "EchoParams"} <= set(out["schemas"])
    assert out["bad"] == 422 and "words" in out["bad_detail"]
    assert out["refused"] == 422 and "forbidden" in out["refused_detail"]
    assert out["done"]["status"] == "succeeded", out["done"]
    assert out["done"]["result"] == {"echo": "hello world", "gallery": "shapes"}
