"""What the shell commands that talk to the gateway share (``nobackfill migrate``,
``nobackfill plan``): one request with the standard library only (``urllib.request``), the
gateway's error answers as ``GatewayError``, the connection options and small formatters.

The gateway is ``--gateway`` (default ``$NOBACKFILL_GATEWAY``, else http://127.0.0.1:8000)
and the admin key ``--key`` (default ``$NOBACKFILL_API_KEY``)."""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.request
from typing import Any

DEFAULT_GATEWAY = "http://127.0.0.1:8000"


class GatewayError(Exception):
    """A non-2xx answer of the gateway (or no answer at all: status 0)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}" if status else message)
        self.status, self.code, self.message = status, code, message


def call(gateway: str, method: str, path: str, key: str | None = None,
         body: dict[str, Any] | None = None, timeout: float = 60) -> Any:
    """One request; the answer's JSON (None when empty). Raises ``GatewayError``."""
    headers = {"Accept": "application/json"}
    if key:
        headers["X-API-Key"] = key
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(gateway.rstrip("/") + path, data=data, method=method,
                                     headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            text = response.read().decode()
    except urllib.error.HTTPError as exc:
        raw = exc.read().decode(errors="replace")
        try:
            error = json.loads(raw).get("error") or {}
        except (ValueError, AttributeError):
            error = {}
        if not isinstance(error, dict):
            error = {}
        raise GatewayError(exc.code, str(error.get("code") or "http_error"),
                           str(error.get("message") or raw.strip() or exc.reason)) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise GatewayError(0, "unreachable", f"cannot reach the gateway at {gateway}: "
                                             f"{reason}") from None
    return json.loads(text) if text.strip() else None


def add_connection_args(parser: argparse.ArgumentParser) -> None:
    """``--gateway``, ``--key`` and ``--json`` (print the gateway's JSON)."""
    parser.add_argument("--gateway", default=os.environ.get("NOBACKFILL_GATEWAY",
                                                            DEFAULT_GATEWAY),
                        help="the gateway's URL (default $NOBACKFILL_GATEWAY or "
                             f"{DEFAULT_GATEWAY})")
    parser.add_argument("--key", default=os.environ.get("NOBACKFILL_API_KEY"),
                        help="an admin API key (default $NOBACKFILL_API_KEY)")
    parser.add_argument("--json", action="store_true", help="print the gateway's JSON")


# ------------------------------------------------------------------ formatting
def pct(value: Any) -> str:
    """A fraction as "37.0%"; "–" for anything that is not a number."""
    return f"{100 * value:.1f}%" if isinstance(value, int | float) else "–"


def share(point: Any) -> str:
    """``{share, se}`` (or a bare number) as "37.0% ± 4.1%"."""
    if isinstance(point, dict) and "share" in point:
        se = point.get("se")
        return pct(point.get("share")) + (f" ± {pct(se)}" if isinstance(se, int | float)
                                          else "")
    return pct(point)


def table(rows: list[tuple[str, str]]) -> str:
    """(field, value) rows, the fields aligned."""
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def shown(answer: Any, as_json: bool, out: Any, text: str) -> int:
    """Print the gateway's answer (``--json``) or ``text``; exit code 0."""
    print(json.dumps(answer, indent=2) if as_json else text, file=out)
    return 0
