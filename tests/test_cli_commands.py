"""Every ``nobackfill`` command, the library's own and the plugged-in ones, answers
``--help``; plugins come from entry points, and a broken one cannot break the CLI."""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
from collections.abc import Iterator

import pytest

from training import cli


def command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = (),
                  ) -> Iterator[tuple[str, ...]]:
    """Every command path of the parser tree, e.g. ("bench", "serve")."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name)
                yield from command_paths(sub, (*prefix, name))


ALL = sorted(command_paths(cli.build_parser()))


def test_the_tree_has_the_library_and_the_plugged_in_commands() -> None:
    for path in [("synth",), ("train-base",), ("continual",), ("upgrade",), ("bench", "base"),
                 ("bench", "xbt"), ("demo",), ("bench", "serve"), ("bench", "migrate"),
                 ("bench", "images"), ("bench", "rerank"), ("bench", "store"), ("bench", "edge-shards"),
                 ("plan", "start"),
                 ("plan", "show"), ("plan", "list"), ("plan", "apply"), ("store", "move")]:
        assert path in ALL, path


@pytest.mark.parametrize("path", ALL, ids=[" ".join(p) for p in ALL])
def test_help_on_every_command(path: tuple[str, ...], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args([*path, "--help"])
    assert exc.value.code == 0
    assert "usage: nobackfill " + " ".join(path) in " ".join(capsys.readouterr().out.split())


def test_plugins_are_declared_as_entry_points() -> None:
    commands = {p.name: p.value for p in importlib.metadata.entry_points(
        group=cli.COMMAND_PLUGINS)}
    benches = {p.name: p.value for p in importlib.metadata.entry_points(group=cli.BENCH_PLUGINS)}
    assert commands == {"demo": "service.stack.demo:register",
                        "migrate": "service.stack.migrate_cli:register",
                        "plan": "service.stack.plan_cli:register",
                        "store": "service.stack.store_cli:register"}
    assert benches == {"serve": "service.bench:register",
                       "migrate": "service.bench.migrate:register",
                       "images": "service.bench.images:register",
                       "transform": "service.bench.transform:register",
                       "rerank": "service.bench.rerank:register",
                       "store": "service.bench.store:register",
                       "edge-shards": "service.bench.edge_shards:register",
                       "host-report": "service.bench.host:register",
                       "tutorial": "service.bench.tutorial:register"}


def test_a_broken_plugin_is_reported_and_left_out(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture) -> None:
    broken = importlib.metadata.EntryPoint(name="ghost", value="no_such_package.cli:register",
                                           group=cli.COMMAND_PLUGINS)
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group: [broken] if group == cli.COMMAND_PLUGINS else [])
    parser = cli.build_parser()
    assert "no_such_package" in capsys.readouterr().err
    assert parser.parse_args(["info", "somewhere"]).command == "info"
    with pytest.raises(SystemExit):
        parser.parse_args(["ghost"])


def test_the_library_cli_starts_without_the_service_package(tmp_path) -> None:
    """``training`` alone: the service's modules cannot be imported, the CLI still runs
    its own commands (the plugins are reported missing)."""
    blocker = tmp_path / "service"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('service is not installed')\n")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from training.cli import main; "
            "sys.exit(main(['synth', '--help']))")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, check=False,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage: nobackfill synth" in done.stdout
    assert "could not be loaded" in done.stderr
