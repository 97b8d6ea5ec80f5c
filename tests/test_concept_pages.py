"""The concept pages say what the code says, where that is cheap to read: the phases on the
migration page's table are the lifecycle table's, the route values the spaces page lists
include every one a search answer can carry, and every setting default a concept page
quotes is the settings class's default."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CONCEPTS = REPO / "docs" / "concepts"
PREFIX = "NOBACKFILL_"
NUMBER = r"[-+]?[0-9](?:[0-9_]|,(?=[0-9]))*(?:\.[0-9]+)?"  # 5,000 and 0.5, not "99,"
VALUE = rf"{NUMBER}|unset|true|false|[a-z][a-z0-9_-]*"


def section(text: str, heading: str) -> str:
    """The text under ``heading`` (a Markdown heading line), up to the next heading of the
    same or a higher level."""
    level = heading.split(" ", 1)[0]
    start = text.index(f"\n{heading}\n")
    rest = text[start + len(heading) + 2:]
    end = re.search(rf"^#{{1,{len(level)}}} ", rest, re.MULTILINE)
    return rest[:end.start()] if end else rest


def tables(text: str) -> list[list[list[str]]]:
    """Every Markdown table of ``text``: its rows (the header first) as lists of cells."""
    found, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            if not re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", line.strip()):
                current.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif current:
            found.append(current)
            current = []
    return found


# ---------------------------------------------------------------- phases
def test_the_migration_pages_phase_table_is_the_lifecycle_table() -> None:
    from service.jobkinds.migrate.lifecycle import PHASES

    page = (CONCEPTS / "migrations.md").read_text()
    table = next(t for t in tables(page) if t[0][0] == "phase")
    named = [re.fullmatch(r"`([a-z_]+)`", row[0]).group(1) for row in table[1:]]
    assert len(named) == len(set(named)), "a phase is listed twice"
    assert set(named) == set(PHASES), (
        f"missing on the page: {sorted(set(PHASES) - set(named))}; "
        f"not a phase: {sorted(set(named) - set(PHASES))}")


# ---------------------------------------------------------------- routes
def answered_routes() -> set[str]:
    """Every value of a search answer's ``route``: the literals ``search.py`` answers with,
    and for an answer with its embedder's route, every registered route kind."""
    import training.upgrades.routes  # noqa: F401  (registers the upgrade methods' kinds)
    from training.routes import ROUTE_KINDS

    tree = ast.parse((REPO / "service" / "usecases" / "search.py").read_text())
    values: set[str] = set()
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Name) and n.func.id == "Answer"]
    assert calls, "no Answer(...) in search.py: where is the route set now?"
    for call in calls:
        route = next((k.value for k in call.keywords if k.arg == "route"), None)
        if route is None:
            route = call.args[2]
        if isinstance(route, ast.Constant) and isinstance(route.value, str):
            values.add(route.value)
        elif isinstance(route, ast.Attribute) and route.attr == "route":
            values |= set(ROUTE_KINDS)  # an embedder's route: its route kind
        else:
            raise AssertionError(f"a route this test cannot read: {ast.unparse(route)}")
    return values


def test_the_spaces_page_lists_every_route_an_answer_can_carry() -> None:
    routes = answered_routes()
    assert {"native", "rerank", "hybrid"} <= routes
    listed = set(re.findall(r"`([a-z_]+)`", section(
        (CONCEPTS / "spaces.md").read_text(), "## Routes")))
    assert routes <= listed, f"not on the spaces page: {sorted(routes - listed)}"


# ---------------------------------------------------------------- setting defaults
def quoted_defaults(text: str, fields: set[str]) -> list[tuple[str, str]]:
    """(setting, value) for every default ``text`` quotes of a setting in ``fields``: a
    table with a ``default`` column whose row names the setting (``NOBACKFILL_X`` or
    ``x``), and in prose `` `NOBACKFILL_X` = V``, `` `NOBACKFILL_X` (V)``,
    `` `NOBACKFILL_X` (default V`` and `` `NOBACKFILL_X`, default V``."""
    found = []
    for table in tables(text):
        head = [c.lower() for c in table[0]]
        if "default" not in head:
            continue
        column = head.index("default")
        for row in table[1:]:
            name = re.fullmatch(r"`(?:NOBACKFILL_)?([A-Za-z0-9_]+)`", row[0])
            value = re.fullmatch(r"`([^`]*)`|([^`|]+)", row[column]) if len(row) > column \
                else None
            if name and name.group(1).lower() in fields and value:
                found.append((name.group(1).lower(), (value.group(1) or value.group(2)).strip()))
    flat = " ".join(text.split())
    for pattern in (rf"`{PREFIX}([A-Z0-9_]+)` = `?({VALUE})",
                    rf"`{PREFIX}([A-Z0-9_]+)` \(`?({NUMBER})`?\)",
                    rf"`{PREFIX}([A-Z0-9_]+)`,? \(?default:? `?({VALUE})"):
        for name, value in re.findall(pattern, flat):
            if name.lower() in fields:
                found.append((name.lower(), value))
    return found


def same(quoted: str, default: Any) -> bool:
    if default is None:
        return quoted == "unset"
    if isinstance(default, bool):
        return quoted == str(default).lower()
    if isinstance(default, (int, float)):
        try:
            return float(quoted.replace(",", "").replace("_", "")) == float(default)
        except ValueError:
            return False
    return quoted == str(default)


def setting_defaults() -> dict[str, Any]:
    from service.state.config import Settings

    return {name: f.default_factory() if f.default_factory is not None else f.default
            for name, f in Settings.model_fields.items()}


def test_the_defaults_the_concept_pages_quote_are_the_settings_defaults() -> None:
    defaults = setting_defaults()
    quoted: dict[str, list[str]] = {}
    wrong = []
    for page in sorted(CONCEPTS.glob("*.md")):
        for name, value in quoted_defaults(page.read_text(), set(defaults)):
            quoted.setdefault(name, []).append(value)
            if not same(value, defaults[name]):
                wrong.append(f"{page.name}: {name} quoted {value}, the code's default is "
                             f"{defaults[name]!r}")
    assert wrong == []
    # the rerank page's bounds are quoted, and so checked
    assert {"rerank_k", "rerank_k_max", "rerank_embed_max_per_request",
            "rerank_budget_ms"} <= set(quoted)
    rerank = dict(quoted_defaults((CONCEPTS / "rerank.md").read_text(), set(defaults)))
    assert {"rerank_k", "rerank_k_max", "rerank_embed_max_per_request"} <= set(rerank)


def test_a_wrong_default_is_found() -> None:
    """The reader finds each form of quote, so a page quoting a stale default fails."""
    fields = set(setting_defaults())
    text = ("| setting | default |\n|---|---|\n| `NOBACKFILL_RERANK_K` | `21` |\n\n"
            "at most `NOBACKFILL_RERANK_K_MAX` =\n 99, `NOBACKFILL_RERANK_EMBED_MAX_PER_REQUEST`"
            " (31) embeddings, `NOBACKFILL_RERANK_BUDGET_MS` (default 200) and "
            "`NOBACKFILL_GATE_MAX_NEGATIVE_FLIP` (default: unset)")
    found = quoted_defaults(text, fields)
    assert found == [("rerank_k", "21"), ("rerank_k_max", "99"),
                     ("rerank_embed_max_per_request", "31"), ("rerank_budget_ms", "200"),
                     ("gate_max_negative_flip", "unset")]
    defaults = setting_defaults()
    assert [same(v, defaults[n]) for n, v in found] == [False, False, False, False,
                                                          defaults["gate_max_negative_flip"]
                                                          is None]
