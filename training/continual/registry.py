"""The continual strategies by name (``nobackfill continual --method NAME``).

Strategy modules import ``register_strategy`` from here, not from the package: the
package imports them to register the built-ins, so importing back from it would make
a package <-> module import cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from training.continual.strategy import Strategy
from training.method_registry import MethodRegistry

STRATEGIES: MethodRegistry[type[Strategy]] = MethodRegistry("continual method")

S = TypeVar("S", bound=type[Strategy])


def register_strategy(name: str) -> Callable[[S], S]:
    """Class decorator: make a strategy available as ``--method NAME``."""
    return STRATEGIES.register(name)  # type: ignore[return-value]


def get_strategy(name: str) -> type[Strategy]:
    """The strategy class registered as ``name``; ConfigError listing the known names."""
    return STRATEGIES.lookup(name)
