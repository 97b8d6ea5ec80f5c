"""The manual's reference pages are rendered from the code (``docs/hooks/reference_pages.py``,
an MkDocs hook), so they change when the code does: each test hands a renderer the object
it documents with one thing added (a setting, a route, a command, a job kind, a method
setting) and finds it on the page, and not on the page of the object as it is. Also: the
README keeps the front door's shape, and the paths the manual names exist."""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "docs" / "hooks"))

import reference_pages as pages


# ---------------------------------------------------------------- settings
def test_a_new_setting_appears_on_the_settings_page() -> None:
    from service.state.config import Settings

    class More(Settings):
        tour_colour: str = Field("teal", description="the colour of the guided tour")

    before, after = pages.settings_page(Settings), pages.settings_page(More)
    assert "NOBACKFILL_TOUR_COLOUR" not in before
    row = next(line for line in after.splitlines() if "`NOBACKFILL_TOUR_COLOUR`" in line)
    assert "`teal`" in row and "the colour of the guided tour" in row and "`str`" in row
    # every field of the real class is there, by its environment variable
    for name in Settings.model_fields:
        assert f"`NOBACKFILL_{name.upper()}`" in before


def test_settings_are_rendered_from_defaults_not_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOBACKFILL_TOP_K_MAX", "7")
    assert pages.default_settings().top_k_max == 100


# ---------------------------------------------------------------- HTTP API
def gateway_app(tmp_path: Path) -> Any:
    from service.api.app import create_app
    from service.state.config import Settings

    return create_app(Settings(data_dir=tmp_path, qdrant_path=":memory:"))


class TourOut(BaseModel):
    """Where the guided tour of a gallery starts."""

    first_item: str = Field(description="the item the tour opens with")


def test_a_new_route_appears_on_the_http_api_page(tmp_path: Path) -> None:
    before = pages.openapi_page(gateway_app(tmp_path).openapi())
    app = gateway_app(tmp_path)

    @app.get("/v1/galleries/{gallery}/tour", response_model=TourOut, tags=["galleries"])
    async def tour(gallery: str) -> TourOut:
        """Open a guided tour of the gallery."""
        return TourOut(first_item="x")

    after = pages.openapi_page(app.openapi())
    assert "/tour" not in before
    section = after.split("### `GET /v1/galleries/{gallery}/tour`", 1)[1].split("\n### ")[0]
    assert "Open a guided tour of the gallery." in section
    assert "[TourOut](#schema-tourout)" in section and "**Key:** none." in section
    schema = after.split("### TourOut {#schema-tourout}", 1)[1].split("\n### ")[0]
    assert "`first_item`" in schema and "the item the tour opens with" in schema


def test_the_http_api_page_lists_every_operation_with_its_key(tmp_path: Path) -> None:
    document = gateway_app(tmp_path).openapi()
    page = pages.openapi_page(document)
    for path, methods in document["paths"].items():
        for method in methods:
            assert f"### `{method.upper()} {path}`" in page
    search = page.split("### `POST /v1/galleries/{gallery}/search`", 1)[1].split("\n### ")[0]
    assert "**Key:** optional" in search  # no read key set: search is public
    create = page.split("### `POST /v1/galleries`", 1)[1].split("\n### ")[0]
    assert "**Key:** needed" in create and "[422](#errors)" in create
    for ref in set(re.findall(r"\(#(schema-[a-z0-9-]+)\)", page)):
        assert f"{{#{ref}}}" in page, f"a link to #{ref} has no section"


# ---------------------------------------------------------------- CLI
def test_a_new_command_appears_on_the_cli_page() -> None:
    from training.cli import build_parser

    parser = build_parser()
    before = pages.cli_page(parser)
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    tour = commands.add_parser("tour", help="walk a gallery, one item at a time")
    tour.add_argument("--gallery", required=True, help="the gallery to walk")
    tour.add_argument("--pace", type=float, default=1.5, help="seconds per item")
    after = pages.cli_page(parser)
    assert "nobackfill tour" not in before
    section = after.split("## `nobackfill tour`", 1)[1].split("\n## ")[0]
    assert "walk a gallery, one item at a time" in section
    assert "| `--gallery` | required | the gallery to walk |" in section
    assert "| `--pace` | `1.5` | seconds per item |" in section


def test_the_cli_page_has_every_plugged_in_command() -> None:
    from training.cli import build_parser

    page = pages.cli_page(build_parser())
    for command in ("train-base", "upgrade xbt", "bench frontier", "migrate start",
                    "plan apply", "demo"):
        assert f"`nobackfill {command}`" in page


# ---------------------------------------------------------------- job kinds
class TourParams(BaseModel):
    """Walk the gallery and write down what it holds."""

    stops: int = Field(5, ge=1, description="items to stop at")


@dataclasses.dataclass(frozen=True)
class TourConfig:
    """Settings of the tour method."""

    pace: float = dataclasses.field(default=1.5, metadata={"help": "seconds per stop"})


def test_a_new_job_kind_and_method_appear_on_the_job_kinds_page() -> None:
    from service.jobkinds import KINDS
    from service.jobkinds.base import JobKind

    registries = pages.method_registries()
    before = pages.job_kinds_page(KINDS, registries)
    kinds = {**KINDS, "tour": JobKind("tour", TourParams, run=lambda context: {})}
    after = pages.job_kinds_page(kinds, {**registries, "Tours": {"tour": TourConfig}})
    assert "{#kind-tour}" not in before and "{#method-tour}" not in before
    kind = after.split("## `tour` {#kind-tour}", 1)[1].split("\n## ")[0]
    assert "Walk the gallery and write down what it holds." in kind
    assert "| `stops` | integer | `5` | items to stop at (≥ 1) |" in kind
    method = after.split("#### `tour` (TourConfig) {#method-tour}", 1)[1]
    assert "| `pace` | `1.5` | seconds per stop |" in method


def test_every_registered_kind_and_method_is_on_the_job_kinds_page() -> None:
    from service.jobkinds import KINDS

    registries = pages.method_registries()
    page = pages.job_kinds_page(KINDS, registries)
    for name, kind in KINDS.items():
        assert f"{{#kind-{name}}}" in page
        for field in kind.params.model_fields:
            assert f"`{field}`" in page
    for registry in registries.values():
        for method in registry:
            assert f"{{#method-{method}}}" in page
    assert "#### `modx`" in page and "#### `xbt`" in page and "`slerp_t`" in page


# ---------------------------------------------------------------- markdown
def test_inline_text_keeps_code_and_escapes_the_rest() -> None:
    assert pages.inline("from ``NOBACKFILL_*`` or NOBACKFILL_*") == \
        r"from `NOBACKFILL_*` or NOBACKFILL\_\*"
    assert pages.inline("a | b <c>") == r"a \| b &lt;c>"
    assert pages.inline("one\n   line") == "one line"
    assert pages.inline(None) == ""


def test_every_generated_page_renders() -> None:
    for page in pages.PAGES:
        text = pages.render(page)
        assert text.startswith(pages.GENERATED) and "\n# " in text, page


# ---------------------------------------------------------------- the front door
def test_the_readme_is_a_front_door() -> None:
    """At most about 200 lines, the two commands, and links that lead somewhere."""
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert re.search(r"^make serve\b", readme, re.MULTILINE) and re.search(r"^make test\b", readme, re.MULTILINE)
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme):
        if not re.match(r"[a-z]+://", target):
            assert (REPO / target).exists(), f"README links to a missing {target}"


def test_the_manual_names_paths_that_exist() -> None:
    """Every path in the manual's layout table (``| `path` | ...``) exists."""
    table = (REPO / "docs" / "design" / "index.md").read_text()
    paths = [cell.strip().strip("`") for line in table.splitlines() if line.startswith("| `")
             for cell in line.split("|")[1].split(",") if cell.strip().startswith("`")]
    assert len(paths) > 20
    assert [p for p in paths if not (REPO / p).exists()] == []


def test_every_page_of_the_manual_is_in_the_nav() -> None:
    """Hand-written pages and generated ones; the site is built with --strict in CI."""
    import yaml

    config = (REPO / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1]
    nav = set(re.findall(r":\s*([\w/.-]+\.md)\s*$", config, re.MULTILINE))
    written = {str(p.relative_to(REPO / "docs")) for p in (REPO / "docs").rglob("*.md")}
    assert written | set(pages.PAGES) == nav
    assert yaml.safe_load((REPO / "mkdocs.yml").read_text())["hooks"] == [
        "docs/hooks/reference_pages.py", "docs/hooks/phase_diagram.py"]
