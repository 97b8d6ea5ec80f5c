"""Methods by name: one ``MethodRegistry`` shape for continual strategies and upgrade methods.

A method class registers itself under the name users give (``--method NAME``,
``nobackfill upgrade NAME``, a job's ``method``), so the code that runs methods
looks them up and never branches on a name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from training.errors import ConfigError

T = TypeVar("T", bound=type)


class MethodRegistry(dict[str, T], Generic[T]):
    """name -> method class; ``kind`` ("continual method", ...) names them in errors."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def register(self, name: str) -> Callable[[T], T]:
        """Class decorator: file the class under ``name`` (and set its ``name``)."""
        def wrap(cls: T) -> T:
            if name in self:
                raise ConfigError(f"{self.kind} '{name}' is registered twice")
            cls.name = name  # type: ignore[attr-defined]
            self[name] = cls
            return cls
        return wrap

    def lookup(self, name: str) -> T:
        """The class registered as ``name``; ConfigError listing the known names."""
        if name not in self:
            raise ConfigError(f"unknown {self.kind} '{name}'; known methods: "
                              f"{', '.join(sorted(self))}")
        return self[name]
