"""Typed errors of the ML library. Each names the problem and, where possible, the fix."""


class NobackfillError(Exception):
    """Base class of every error the library raises on purpose."""


class ConfigError(NobackfillError, ValueError):
    """A configuration value or combination is invalid."""


class DataError(NobackfillError, ValueError):
    """A dataset, manifest, image or caption is missing, corrupt or unusable."""


class ModelLoadError(NobackfillError, RuntimeError):
    """A model could not be created or its weights could not be loaded."""


class ArtifactError(NobackfillError, RuntimeError):
    """A model version artifact is missing, incomplete or altered."""
