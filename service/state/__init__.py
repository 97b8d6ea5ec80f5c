"""The shared state layer: what the gateway and the workers both read and write, and the
only part of ``service`` a worker imports (``tests/test_layout.py`` checks it).

- ``config``      the process settings (one pydantic-settings class, ``NOBACKFILL_*``)
- ``errors``      typed errors, mapped to HTTP statuses once by ``service.api.errors``
- ``registry/``   model versions, the atomic locked index, each gallery's space, active
                  version and history
- ``gallery/``    Qdrant access (one collection per gallery behind an alias) and the one
                  ingest pipeline and payload schema every path that stores items uses
- ``jobs/``       job records, the table of job kinds and their parameter checks, the
                  Celery wiring (task name, queue, broker), the workers' liveness records
- ``paths``       the allowed roots: every path a request names must lie under one
- ``thumbnails``  PNG thumbnails of ingested images beside the vectors

Nothing here imports FastAPI, Celery workers or the runtime.
"""
