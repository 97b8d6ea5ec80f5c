"""Benchmarks on the synthetic world, registered by name for ``nobackfill bench NAME``.

Each entry maps a name to ``(register(subparsers, name), run(args) -> dict)``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from training.bench import base, continual, language, xbt


def _elsewhere(module: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """An entry for a benchmark that lives outside the library (e.g. the gateway's in
    ``service/``): training/ must not import it, so the module is named by string and
    imported only when the entry is used."""
    def register(sub: Any, name: str) -> None:
        importlib.import_module(module).register(sub, name)

    def run(args: Any) -> dict:
        return importlib.import_module(module).run(args)
    return register, run


BENCHMARKS = {
    "base": (base.register, base.run),
    "xbt": (xbt.register, xbt.run),
    "continual": (continual.register, continual.run),
    "language": (language.register, language.run),
    "serve": _elsewhere("service.bench"),
}
