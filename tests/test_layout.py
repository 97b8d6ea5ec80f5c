"""The layout is the architecture: dependencies point one way and no module imports itself
back through others.

Rules (DESIGN.md, "Parts and where they live"):
- ``training`` is a library: it imports neither ``service`` nor ``worker``, nor any web or
  queue framework, not even by string (``importlib.import_module``, ``__import__``).
- ``worker`` imports only the shared state layer of the gateway (``service.state``) and
  where vectors are embedded and written (``service.vectors``).
- ``service.vectors`` imports only ``service.state`` (and ``training``).
- ``service`` never imports ``worker``.
- Inside ``service``, layers point down (``SERVICE_LAYERS``): ``api -> usecases -> runtime
  -> jobkinds -> vectors -> state``; a module imports its own layer and those below, and
  no layer imports the entry points above them (``service.stack``, ``service.bench``; only
  ``service.api`` imports the page, ``service.web``).
- No import cycle between modules (imports inside functions count too, and so do modules
  named by string: ``import_module("x")``, a constant ``"x"`` or ``"x:attr"`` naming a
  project module, and the entry points of ``pyproject.toml``, from the module that loads
  their group).

Run this file alone (``pytest tests/test_layout.py -q -s``) to print the import graph's
summary.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Collection, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("training", "service", "worker")
FRAMEWORKS = ("fastapi", "celery", "uvicorn", "starlette", "kombu")
WORKER_MAY_IMPORT = ("service.state", "service.vectors", "service.jobkinds")  # of service
# service's layers, top to bottom (README, "where / what"): each imports only its own and
# those below it. ``jobkinds`` sits under the runtime: a kind's gateway hooks get the gateway
# as an argument (``service.jobkinds.base.GatewayPort``), so the worker, which imports
# every kind, never loads the runtime.
SERVICE_LAYERS = ("service.api", "service.usecases", "service.runtime", "service.jobkinds",
                  "service.vectors", "service.state")
VECTORS_MAY_IMPORT = ("service.state", "service.vectors")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[module_name(path)] = path
    return found


def _string_imports(node: ast.Call) -> Iterator[str]:
    """``importlib.import_module("x")`` / ``import_module("x")`` / ``__import__("x")``."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name in ("import_module", "__import__") and node.args:
        first = node.args[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            yield first.value


def imported_names(path: Path, module: str,
                   known: Collection[str] = ()) -> Iterator[str]:
    """Every dotted name ``path`` imports, anywhere in the file (functions included).
    ``from a import b`` names ``a.b`` when that is a module in ``known`` (importing a
    submodule runs its package first, which is not a dependency on the package's own
    code), and ``a`` when ``b`` is a name defined in ``a``."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, module, is_package)
            names = [f"{base}.{alias.name}" for alias in node.names]
            yield from names
            if not known or any(name not in known for name in names):
                yield base
        elif isinstance(node, ast.Call):
            yield from _string_imports(node)


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    parent = parts if is_package else parts[:-1]
    parent = parent[:len(parent) - (node.level - 1)]
    return ".".join(parent + ([node.module] if node.module else []))


def edges() -> dict[str, set[str]]:
    """module -> the project modules it imports (``from a import b`` names a.b when b is a
    module, else a)."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        targets = set()
        for name in imported_names(path, module, known):
            if name in known and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def external(module: str) -> set[str]:
    """Top-level names of everything ``module`` imports (project or not)."""
    path = modules()[module]
    return {name.split(".")[0] for name in imported_names(path, module) if name}


def violations() -> list[str]:
    graph = edges()
    found = []
    for module, targets in sorted(graph.items()):
        top = module.split(".")[0]
        for target in sorted(targets):
            if top == "training" and target.split(".")[0] in ("service", "worker"):
                found.append(f"{module} -> {target} (training is a library)")
            if top == "worker" and target.startswith("service") \
                    and not target.startswith(WORKER_MAY_IMPORT):
                found.append(f"{module} -> {target} (worker may import "
                             f"{' and '.join(WORKER_MAY_IMPORT)} only)")
            if module.startswith("service.vectors") and target.startswith("service") \
                    and not target.startswith(VECTORS_MAY_IMPORT):
                found.append(f"{module} -> {target} (service.vectors imports service.state "
                             f"only)")
            if top == "service" and target.startswith("worker"):
                found.append(f"{module} -> {target} (service never imports worker)")
            found += _layer_violations(module, target)
        if top == "training":
            found += [f"{module} -> {name} (training imports no web or queue framework)"
                      for name in sorted(external(module) & set(FRAMEWORKS))]
            found += [f"{module} names {text!r} (training is a library, even by string)"
                      for text in upward_strings(modules()[module])]
    return found


def layer_of(module: str) -> int | None:
    """The index of ``module``'s layer in SERVICE_LAYERS (0: top); None outside them."""
    for n, layer in enumerate(SERVICE_LAYERS):
        if module == layer or module.startswith(layer + "."):
            return n
    return None


def _layer_violations(module: str, target: str) -> list[str]:
    mine, theirs = layer_of(module), layer_of(target)
    if mine is None or not target.startswith("service"):
        return []
    if theirs is not None and theirs < mine:
        return [(f"{module} -> {target} ({SERVICE_LAYERS[mine]} is below "
                 f"{SERVICE_LAYERS[theirs]}: layers point down)")]
    if theirs is None and not (target == "service" or (
            mine == 0 and target.startswith("service.web"))):
        return [f"{module} -> {target} (the layers import no entry point above them)"]
    return []


def string_edges(known: Collection[str]) -> dict[str, set[str]]:
    """module -> the project modules it names by string: a constant that is a module's
    dotted name, or ``"module:attr"`` (an entry-point or app string), and for the module
    that loads an entry-point group (names the group), every entry point in that group."""
    groups = entry_point_groups()
    found: dict[str, set[str]] = {}
    for module, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            named = {node.value.split(":")[0]} | groups.get(node.value, set())
            found.setdefault(module, set()).update(n for n in named
                                                   if n in known and n != module)
    return found


def entry_point_groups() -> dict[str, set[str]]:
    """``pyproject.toml``'s entry-point groups: group -> the modules its points name."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {group: {value.split(":")[0] for value in points.values()}
            for group, points in project.get("entry-points", {}).items()}


def upward_strings(path: Path) -> list[str]:
    """String constants that name a service/worker module (``"service.bench"``): a module
    named by string and imported later is still an import."""
    return sorted({node.value for node in ast.walk(ast.parse(path.read_text()))
                   if isinstance(node, ast.Constant) and isinstance(node.value, str)
                   and node.value.split(".")[0] in ("service", "worker")
                   and all(part.isidentifier() for part in node.value.split("."))})


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def summary() -> str:
    graph = edges()
    lines = [f"{len(graph)} modules, {sum(map(len, graph.values()))} import edges"]
    bad = violations()
    lines.append(f"{len(bad)} layer violation(s)")
    lines += [f"  {v}" for v in bad]
    loops = cycles(graph)
    lines.append(f"{len(loops)} import cycle(s)")
    lines += [f"  {' <-> '.join(c)}" for c in loops]
    return "\n".join(lines)


def test_the_graph_reader_sees_string_and_function_level_imports(tmp_path: Path) -> None:
    source = ("import importlib\n"
              "def f():\n"
              "    from service.api import app\n"
              "    importlib.import_module('worker.tasks')\n"
              "    __import__('service.bench')\n")
    path = tmp_path / "probe.py"
    path.write_text(source)
    names = set(imported_names(path, "training.probe"))
    assert {"service.api", "service.api.app", "worker.tasks", "service.bench"} <= names


def test_cycle_finder_finds_a_loop_and_only_loops() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_dependencies_point_one_way() -> None:
    assert violations() == []


def test_no_import_cycles() -> None:
    assert cycles(edges()) == []


def test_no_cycles_through_string_imports_and_entry_points() -> None:
    graph = edges()
    for module, named in string_edges(set(graph)).items():
        graph[module] = graph[module] | named
    assert cycles(graph) == []


def test_the_string_reader_sees_module_names_and_entry_points() -> None:
    named = string_edges(set(modules()))
    assert {"service.stack.demo", "service.bench"} <= named["training.cli"]


@pytest.mark.parametrize(("module", "target", "bad"), [
    ("service.usecases.jobs", "service.api.schemas.jobs", True),
    ("service.runtime.gateway", "service.usecases.jobs", True),
    ("service.state.jobs.store", "service.jobkinds", True),
    ("service.jobkinds.base", "service.runtime.gateway", True),
    ("service.vectors.writer", "service.jobkinds.base", True),
    ("service.state.paths", "service.stack.launch", True),
    ("service.api.routes.jobs", "service.usecases.jobs", False),
    ("service.api.routes.web", "service.web", False),
    ("service.usecases.applier", "service.jobkinds", False),
    ("service.jobkinds.ingest", "service.vectors.ingest", False),
    ("service.stack.launch", "service.api.app", False),
])
def test_service_layers_point_down(module: str, target: str, bad: bool) -> None:
    assert bool(_layer_violations(module, target)) is bad


def test_top_level_layout() -> None:
    for name in ("pyproject.toml", "training", "service", "worker", "deploy", "tests",
                 "README.md", "Makefile", ".ci/run", "docker-compose.yml", ".env.example"):
        assert (ROOT / name).exists(), name
    loose = sorted(p.name for p in (ROOT / "service").glob("*.py"))
    assert loose == ["__init__.py", "__main__.py"]


@pytest.mark.parametrize("table", ["README.md"])
def test_readme_layout_table_names_paths_that_exist(table: str) -> None:
    """Every path in the README's layout table (``| `path` | ...``) exists."""
    rows = [line for line in (ROOT / table).read_text().splitlines()
            if line.startswith("| `")]
    paths = [cell.strip().strip("`") for row in rows
             for cell in row.split("|")[1].split(",") if cell.strip().startswith("`")]
    assert paths, "the README has no layout table"
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert missing == []


if __name__ == "__main__":
    print(summary())
    sys.exit(0)
