"""``MethodConfig``: the one contract for the settings of every method, continual or upgrade.

A method's config is a dataclass whose fields carry their help text in
``metadata["help"]`` (``setting``). Settings that come from outside (``--set KEY=VALUE``
on the command line, a job's ``config``) go through ``from_dict``: strict, so a typo
fails naming the key instead of silently training with the default, and string values
are parsed by the field's type. Only configs read back from artifacts, which another
version of the library may have written, use ``lenient=True``: keys this version does
not know are ignored there. ``describe`` renders the fields for ``--help``.
"""

from __future__ import annotations

import dataclasses
import difflib
import textwrap
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from training.errors import ConfigError

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11

TRUE, FALSE = ("true", "1", "yes"), ("false", "0", "no")
EXPECTED = {bool: "true or false", int: "an integer", float: "a number"}


def setting(default: Any, help: str) -> Any:
    """A config field with its help text (what ``describe`` and ``--help`` show)."""
    return dataclasses.field(default=default, metadata={"help": help})


@dataclass
class MethodConfig:
    """Base of every method's config: ``to_dict``/``from_dict`` and the parsing of settings.

    Subclasses are dataclasses; ``__post_init__`` validates and raises ``ConfigError``
    with a message that says what to change.
    """

    # Keys ``to_dict`` writes beyond the fields (e.g. the library version): ``from_dict``
    # accepts and drops them, so a config round-trips through an artifact strictly.
    RECORD_KEYS: ClassVar[frozenset[str]] = frozenset()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values: tuples become lists (``from_dict`` turns them back)."""
        return {k: list(v) if isinstance(v, tuple) else v
                for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], lenient: bool = False) -> Self:
        """A validated config from ``values``; strings are parsed by field type.

        Strict by default: unknown keys are a ConfigError naming them. ``lenient=True``
        ignores them; use it only to read back what an artifact recorded."""
        known = field_map(cls)
        unknown = sorted(set(values) - set(known) - cls.RECORD_KEYS)
        if unknown and not lenient:
            raise ConfigError(unknown_message(cls, unknown, list(known)))
        return cls(**{k: parse(known[k], v) for k, v in values.items() if k in known})


def field_map(cls: type[MethodConfig]) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def unknown_message(cls: type, unknown: list[str], known: list[str]) -> str:
    """Names the unknown keys, the closest known field of each, and every field."""
    hints = [f"{key} -> {close[0]}" for key in unknown
             if (close := difflib.get_close_matches(key, known, n=1))]
    hint = f" (did you mean: {', '.join(hints)}?)" if hints else ""
    return f"{cls.__name__} has no field(s) {unknown}{hint}; its fields: {', '.join(known)}"


def default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()  # type: ignore[misc]


def parse(f: dataclasses.Field, value: Any) -> Any:
    """``value`` as the type of field ``f``'s default; strings come from the command line,
    lists from JSON (a tuple field)."""
    default = default_of(f)
    kind = type(default)
    if not isinstance(value, str) or kind is str or default is None:
        return tuple(value) if kind is tuple and isinstance(value, list) else value
    try:
        return _from_string(kind, value)
    except ValueError:
        expected = EXPECTED.get(kind, f"a {kind.__name__}")
        raise ConfigError(f"{f.name} expects {expected}, got {value!r}") from None


def _from_string(kind: type, value: str) -> Any:
    if kind is bool:
        if value.lower() not in TRUE + FALSE:
            raise ValueError(value)
        return value.lower() in TRUE
    if kind is tuple:
        return tuple(v.strip() for v in value.split(",") if v.strip())
    return kind(value)


def shown(value: Any) -> str:
    """A default as it is written in ``--set KEY=VALUE``."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def describe(cls: type[MethodConfig], skip: Collection[str] = (), width: int = 88) -> str:
    """One entry per field, ``name = default`` then its help: what a method's ``--help``
    lists, so the settings are documented where they are given."""
    lines = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        lines.append(f"  {f.name} = {shown(default_of(f))}")
        lines += textwrap.wrap(help_of(cls, f.name), width, initial_indent=" " * 6,
                               subsequent_indent=" " * 6)
    return "\n".join(lines)


def help_of(cls: type, name: str) -> str:
    """The help of field ``name``: a subclass that only changes a default inherits it."""
    for klass in cls.__mro__:
        f = getattr(klass, "__dataclass_fields__", {}).get(name)
        if f is not None and f.metadata.get("help"):
            return str(f.metadata["help"])
    return ""
