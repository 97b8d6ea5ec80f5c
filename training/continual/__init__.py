"""Continual training phases: strategies registered by name, run by one phase runner.

A phase starts from a model version artifact and writes a new one in the same
embedding space (``training.continual.phase.run_phase``). What differs between
methods lives in a ``Strategy`` subclass registered here under its name; the
runner and the training loop never branch on the method.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from training.continual.strategy import Strategy
from training.errors import ConfigError

STRATEGIES: dict[str, type[Strategy]] = {}

S = TypeVar("S", bound=type[Strategy])


def register_strategy(name: str) -> Callable[[S], S]:
    """Class decorator: make a strategy available as ``--method NAME``."""
    def wrap(cls: S) -> S:
        if name in STRATEGIES:
            raise ConfigError(f"continual strategy '{name}' is registered twice")
        cls.name = name
        STRATEGIES[name] = cls
        return cls
    return wrap


def get_strategy(name: str) -> type[Strategy]:
    """The strategy class registered as ``name``; ConfigError listing the known names."""
    if name not in STRATEGIES:
        raise ConfigError(f"unknown continual method '{name}'; known methods: "
                          f"{', '.join(sorted(STRATEGIES))}")
    return STRATEGIES[name]


# The built-in strategies register themselves on import; they need the registry above.
from training.continual import ctp, dns, modx, seqft, teir  # noqa: F401
