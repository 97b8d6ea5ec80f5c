"""Upgrade methods by name (``nobackfill upgrade NAME``, ``XbtConfig.method``).

Every upgrade method takes the same prepared inputs (``training.upgrades.prepare.Prepared``)
and returns a trained phi and its metrics, so ``train_upgrade`` and the artifact writer
look the configured method up here and never branch on its name. Each method lives in
its own folder (``training/upgrades/<name>/``); :mod:`training.upgrades` registers the
built-ins (``xbt``, ``direct``) with ``register_upgrade``, one call each. Method modules
import from here, not from the package, so no module imports the package that imports it.

Free of torch, so the CLI lists the methods and their settings without loading a
model library. ``XbtConfig`` validates its ``method`` against ``UPGRADES``, which is
why this module knows configs only as ``MethodConfig`` and inputs only as ``Any``:
naming ``Prepared`` here would import the config back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from training.config import MethodConfig
from training.errors import ConfigError
from training.method_registry import MethodRegistry

if TYPE_CHECKING:
    from training.trainer import Progress
    from training.upgrades.xbt.projector import Projector


class UpgradeMethod:
    """Base class of an upgrade method; subclasses are registered with ``register_upgrade``."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""  # one line: the method's entry in ``nobackfill upgrade -h``
    Config: ClassVar[type[MethodConfig]] = MethodConfig
    # Whether the method picks its route on a validation split (``select_every``): ``prepare``
    # holds pairs out for that only when the method uses them.
    selects: ClassVar[bool] = False

    def __init__(self, config: MethodConfig) -> None:
        if not isinstance(config, self.Config) or getattr(config, "method", self.name) != self.name:
            raise ConfigError(f"upgrade method '{self.name}' takes a {self.Config.__name__} "
                              f"with method '{self.name}', not a {type(config).__name__} with "
                              f"method {getattr(config, 'method', None)!r}")
        self.config = config

    @classmethod
    def configure(cls, settings: Mapping[str, Any]) -> MethodConfig:
        """The method's config from ``--set`` style settings (strict); the method is this one."""
        if "method" in settings:
            raise ConfigError(f"'method' is not a setting: this is method '{cls.name}'; run "
                              f"another by its name (`nobackfill upgrade NAME`, known: "
                              f"{', '.join(UPGRADES)})")
        return cls.Config.from_dict({**settings, "method": cls.name})

    @classmethod
    def check_config(cls, config: Any) -> None:
        """Raise ConfigError for settings this method cannot honour (``XbtConfig`` asks)."""

    def train(self, p: Any, show_progress: bool = True,
              on_progress: Callable[[Progress], None] | None = None,
              ) -> tuple[Projector, dict[str, Any]]:
        """Train on prepared inputs ``p`` (``Prepared``): (trained phi, method metrics)."""
        raise NotImplementedError


UPGRADES: MethodRegistry[type[UpgradeMethod]] = MethodRegistry("upgrade method")

U = TypeVar("U", bound=type[UpgradeMethod])


def register_upgrade(name: str) -> Callable[[U], U]:
    """Class decorator: make an upgrade method available as ``nobackfill upgrade NAME``."""
    return UPGRADES.register(name)  # type: ignore[return-value]


def get_upgrade(name: str) -> type[UpgradeMethod]:
    """The upgrade method registered as ``name``; ConfigError listing the known names."""
    return UPGRADES.lookup(name)
