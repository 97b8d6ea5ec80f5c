"""Request and response bodies (separate from what the registry and Qdrant store)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

# "force needs a reason": a rule over two fields, stated in the schema (JSON Schema if/then:
# force true requires a reason that is not blank) and checked by ``needs_reason``.
FORCE_NEEDS_REASON: dict[str, Any] = {
    "if": {"properties": {"force": {"const": True}}, "required": ["force"]},
    "then": {"properties": {"reason": {"type": "string", "pattern": r"\S"}},
             "required": ["reason"]}}


def needs_reason(force: bool, reason: str | None, what: str) -> None:
    """ValueError (a 422 naming ``reason``) for ``force`` without a non-blank reason."""
    if force and not (reason or "").strip():
        raise ValueError(f"reason: {what} needs a reason (force=true is recorded with it)")


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema with nested models inlined, for hand-written OpenAPI request
    bodies (a ``#/$defs/...`` reference would not resolve inside the OpenAPI document)."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return resolve(defs[ref.rsplit("/", 1)[1]])
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node
    return resolve(schema)
