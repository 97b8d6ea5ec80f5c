"""Benchmarks on the synthetic world, registered by name for ``nobackfill bench NAME``.

Each entry maps a name to ``(register(subparsers, name), run(args) -> dict)``.
"""

from __future__ import annotations

from training.bench import base

BENCHMARKS = {
    "base": (base.register, base.run),
}
