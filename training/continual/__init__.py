"""Continual training phases: strategies registered by name, run by one phase runner.

A phase starts from a model version artifact and writes a new one in the same
embedding space (``training.continual.phase.run_phase``). What differs between
methods lives in a ``Strategy`` subclass registered under its name
(:mod:`training.continual.registry`); the runner and the training loop never branch
on the method. Importing this package registers the built-in strategies.
"""

from __future__ import annotations

from training.continual import ctp, dns, modx, seqft, teir  # noqa: F401  (register on import)
from training.continual.registry import STRATEGIES, get_strategy, register_strategy

__all__ = ["STRATEGIES", "get_strategy", "register_strategy"]
