"""nobackfill gateway: search, ingest, registry, galleries and hot swap (FastAPI).

Imports ``training``; never imports ``worker`` internals.

Layout (``python -m service`` or ``uvicorn service.api.app:app``; settings ``NOBACKFILL_*``):

- ``core/``      settings (one pydantic-settings class), typed errors, Prometheus metrics
- ``registry/``  model versions, the atomic locked index, per-gallery active version and
                 history (no FastAPI: the worker records results through it too)
- ``gallery/``   Qdrant access: one collection per gallery behind an alias
- ``runtime/``   loaded versions (embedders), dynamic batching, the hot-swap snapshot,
                 the registry watcher
- ``search.py``, ``ingest.py``, ``galleries.py``, ``media.py``: what the routes do
- ``api/``       routes per resource, schemas, ``Annotated`` deps, error mapping, middleware
- ``bench/``     ``nobackfill bench serve`` (registered with the CLI by module path)
"""
