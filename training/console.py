"""What every command and benchmark prints: JSON with ``--json``, else a text table.

One ``emit`` for the CLI's commands, every benchmark and the commands that other
packages plug in (``training.cli`` discovers them), so none of them imports the CLI.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any


def emit(args: argparse.Namespace, result: Any, text: str) -> None:
    """Print JSON with --json, else the human-readable text."""
    print(json.dumps(result, indent=2, default=str) if getattr(args, "json", False) else text)


def csv_list(value: str) -> list[str]:
    """An argparse type: ``"a, b,,c"`` -> ``["a", "b", "c"]``."""
    return [v.strip() for v in value.split(",") if v.strip()]


def report_command(run: Callable[[argparse.Namespace], Any],
                   render: Callable[[Any], str]) -> Callable[[argparse.Namespace], int]:
    """A benchmark's command: run it, then print its result (``emit``); exit code 0."""
    def command(args: argparse.Namespace) -> int:
        result = run(args)
        emit(args, result, render(result))
        return 0
    return command
