"""Benchmarks on the synthetic world, registered by name for ``nobackfill bench NAME``.

Each entry maps a name to its ``register(subparsers, name)``; the registered command
runs the benchmark and prints it with ``training.console.emit``. Benchmarks that need
more than the library (``bench serve`` runs gateways) are plugged in through the
``nobackfill.benchmarks`` entry point group (``training.cli.add_plugins``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from training.bench import (
    base_models,
    continual,
    distributed,
    frontier,
    language,
    plan,
    upgrade,
    xbt,
    xbt_ablation,
)

BENCHMARKS: dict[str, Callable[[Any, str], None]] = {
    "base": base_models.register,
    "xbt": xbt.register,
    "xbt-ablation": xbt_ablation.register,
    "upgrade": upgrade.register,
    "continual": continual.register,
    "language": language.register,
    "distributed": distributed.register,
    "frontier": frontier.register,
    "plan": plan.register,
}
