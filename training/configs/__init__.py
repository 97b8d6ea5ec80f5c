"""The packaged tiny model configs (open_clip JSON format), found one way: ``config_path``.

``tiny-old`` is the OLD model of ``bench base`` and the demo's v1, ``tiny-new-bench`` the
NEW model of ``bench base``, ``tiny-new`` the demo's new model.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from training.errors import ConfigError


def config_path(name: str) -> Path:
    """Path of the packaged config ``NAME.json``; ConfigError listing the packaged names."""
    path = Path(str(resources.files("training.configs") / f"{name}.json"))
    if not path.is_file():
        raise ConfigError(f"no packaged model config '{name}'; packaged: "
                          f"{', '.join(packaged_names())}")
    return path


def packaged_names() -> list[str]:
    return sorted(p.stem for p in Path(str(resources.files("training.configs"))).glob("*.json"))
