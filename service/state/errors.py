"""Typed errors of the gateway's domain code. They know nothing of HTTP: the API layer
maps each class to a status code once (``service/api/errors.py``)."""

from __future__ import annotations

SHOWN_CHARS = 64


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """A caller-given value as an error message may echo it: at most ``limit`` characters
    (then an ellipsis) with control characters and lone surrogates as ``?``. Every message
    that repeats input goes through here, so a 5,000-character name or a binary header
    never comes back whole, and a message stays one short printable line."""
    text = str(value)
    cut = text[:limit] + ("\u2026" if len(text) > limit else "")
    return "".join(c if c.isprintable() else "?" for c in cut)


class ServiceError(Exception):
    """Base of every error the gateway raises on purpose; ``code`` is stable for clients."""

    code = "error"

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else self.code


class NotFound(ServiceError):
    code = "not_found"


class GalleryNotFound(NotFound):
    code = "gallery_not_found"


class VersionNotFound(NotFound):
    code = "version_not_found"


class Conflict(ServiceError):
    code = "conflict"


class AlreadyExists(Conflict):
    code = "already_exists"


class SpaceMismatch(Conflict):
    """The active version has no route into the gallery's space: never search it silently."""

    code = "space_mismatch"


class GateFailed(Conflict):
    code = "gate_failed"


class InvalidInput(ServiceError):
    code = "invalid_input"


class BadImage(InvalidInput):
    code = "bad_image"


class InvalidArtifact(InvalidInput):
    code = "invalid_artifact"


class TooLarge(ServiceError):
    code = "too_large"


class UnsupportedMedia(ServiceError):
    code = "unsupported_media_type"


class Unauthorized(ServiceError):
    code = "unauthorized"


class Unavailable(ServiceError):
    """A dependency (model, Qdrant) is not ready; retrying later may succeed."""

    code = "unavailable"


class RegistryError(ServiceError):
    """The registry on disk is unreadable (corrupt index, wrong format)."""

    code = "registry_error"
