"""The shared state layer: the records, settings and paths the gateway and the workers
both read and write; the bottom layer of ``service`` (``tests/test_layout.py`` checks it).
Where vectors are embedded and written (ingest, the spool, a backfill) is
``service.vectors``, above it.

- ``config``      the process settings (one pydantic-settings class, ``NOBACKFILL_*``)
- ``errors``      typed errors, mapped to HTTP statuses once by ``service.api.errors``
- ``registry/``   model versions, the atomic locked index, each gallery's space, active
                  version and history
- ``gallery/``    Qdrant access (one collection per gallery behind an alias), the
                  gallery write lock, a gallery's sample for adapter fits
- ``jobs/``       job records, the table of job kinds and their parameter checks, the
                  Celery wiring (task name, queue, broker), the workers' liveness records
- ``paths``       the allowed roots: every path a request names must lie under one
- ``thumbnails``  PNG thumbnails of ingested images beside the vectors

Nothing here imports FastAPI, Celery workers or the runtime.
"""
