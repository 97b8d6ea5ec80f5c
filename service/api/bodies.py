"""Routes that take either JSON or a multipart upload read their body here, by
Content-Type (FastAPI can declare only one body kind per route)."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

from fastapi import Request
from starlette.datastructures import FormData, UploadFile

from service.state.errors import InvalidInput, TooLarge, UnsupportedMedia, shown

JSON = "application/json"
MULTIPART = "multipart/form-data"
URLENCODED = "application/x-www-form-urlencoded"  # a form without files: accepted too
MAX_FILES = 1024


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def is_form(request: Request) -> bool:
    """True for a form body, False for JSON; 415 for anything else."""
    kind = media_type(request)
    if kind not in (JSON, MULTIPART, URLENCODED, "") and not kind.endswith("+json"):
        raise UnsupportedMedia(f"send {JSON} or {MULTIPART}, not '{shown(kind)}'")
    return kind in (MULTIPART, URLENCODED)


def form(request: Request) -> AbstractAsyncContextManager[FormData]:
    """``async with form(request) as data``: parsed form whose uploads close afterwards."""
    return request.form(max_files=MAX_FILES, max_fields=MAX_FILES)


def text_fields(form: FormData, multi: tuple[str, ...] = ()) -> dict[str, Any]:
    """Non-file fields; names in ``multi`` collect every value into a list."""
    fields: dict[str, Any] = {}
    for name, value in form.multi_items():
        if isinstance(value, UploadFile):
            continue
        if name in multi:
            fields.setdefault(name, []).append(value)
        else:
            fields[name] = value
    return fields


def files(form: FormData, name: str) -> list[UploadFile]:
    found = [v for v in form.getlist(name) if isinstance(v, UploadFile)]
    if any(not isinstance(v, UploadFile) for v in form.getlist(name)):
        raise InvalidInput(f"form field '{name}' must be a file upload")
    return found


async def file_bytes(upload: UploadFile, max_bytes: int) -> bytes:
    data = await upload.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise TooLarge(f"upload '{shown(upload.filename)}' is over the {max_bytes}-byte "
                       "limit")
    return data
