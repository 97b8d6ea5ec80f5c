"""Dependencies as ``Annotated`` aliases: the gateway, and who is calling."""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader
from pydantic import SecretStr
from starlette.types import Scope

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
    if gateway.settings.read_api_key is None:
        return
    if not is_keyed(gateway, key):
        raise Unauthorized(f"search needs a valid read key in the {API_KEY_HEADER} header")


def is_keyed(gateway: GatewayDep, key: KeyDep) -> bool:
    """The caller holds the read key or an admin key (never True without a key, even when
    search is open): what unlocks /readyz's details. Never raises: a probe without a key
    must still learn whether the replica is ready."""
    settings = gateway.settings
    readers = dict(settings.admin_api_keys)
    if settings.read_api_key is not None:
        readers["reader"] = settings.read_api_key
    return key_owner(key, readers) is not None


AdminDep = Annotated[str, Depends(require_admin)]
ReaderDep = Annotated[None, Depends(require_reader)]
KeyedDep = Annotated[bool, Depends(is_keyed)]
KEY_CHECKS: tuple[Callable[..., Any], ...] = (require_admin, require_reader)


def key_checks(route: object) -> list[Callable[..., Any]]:
    """The key checks among a route's dependencies (at any depth), in KEY_CHECKS order."""
    found: set[Callable[..., Any]] = set()
    stack = [getattr(route, "dependant", None)]
    while stack:
        dependant = stack.pop()
        if dependant is None:
            continue
        if dependant.call in KEY_CHECKS:
            found.add(dependant.call)
        stack.extend(dependant.dependencies)
    return [check for check in KEY_CHECKS if check in found]


def check_key_first(scope: Scope) -> None:
    """Run the matched route's key checks from the raw request, before its body is read:
    FastAPI reads and validates a declared body before any dependency runs, so without
    this an unauthenticated malformed body would get 422 instead of 401. Raises
    Unauthorized; the dependencies still run afterwards (and give the admin's name)."""
    checks = key_checks(scope.get("route"))
    if not checks:
        return
    request = Request(scope)
    gateway, key = get_gateway(request), request.headers.get(API_KEY_HEADER)
    for check in checks:
        check(gateway, key)
