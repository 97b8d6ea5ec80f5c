"""Dependencies as ``Annotated`` aliases: the gateway, and who is calling."""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader
from pydantic import SecretStr

from service.runtime.gateway import Gateway
from service.state.errors import Unauthorized

API_KEY_HEADER = "X-API-Key"
api_key = APIKeyHeader(name=API_KEY_HEADER, auto_error=False)


def get_gateway(request: Request) -> Gateway:
    return request.app.state.gateway


GatewayDep = Annotated[Gateway, Depends(get_gateway)]
KeyDep = Annotated[str | None, Security(api_key)]


def key_owner(key: str | None, keys: Mapping[str, SecretStr]) -> str | None:
    """The name of the key that matches, compared in constant time."""
    if not key:
        return None
    given = key.encode()
    found = None
    for name, secret in keys.items():
        if hmac.compare_digest(given, secret.get_secret_value().encode()):
            found = name
    return found


def require_admin(gateway: GatewayDep, key: KeyDep) -> str:
    """The admin's name (recorded in gallery history); 401 without a valid admin key."""
    name = key_owner(key, gateway.settings.admin_api_keys)
    if name is None:
        raise Unauthorized(f"admin routes need a valid admin key in the {API_KEY_HEADER} header")
    return name


def require_reader(gateway: GatewayDep, key: KeyDep) -> None:
    """Search is open unless a read key is configured; admin keys can always read."""
    settings = gateway.settings
    if settings.read_api_key is None:
        return
    readers = {**settings.admin_api_keys, "reader": settings.read_api_key}
    if key_owner(key, readers) is None:
        raise Unauthorized(f"search needs a valid read key in the {API_KEY_HEADER} header")


AdminDep = Annotated[str, Depends(require_admin)]
ReaderDep = Annotated[None, Depends(require_reader)]
