"""nobackfill gateway: search, ingest, registry, galleries and hot swap (FastAPI).

Imports ``training``; never imports ``worker`` internals.
"""
