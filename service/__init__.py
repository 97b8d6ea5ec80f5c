"""nobackfill gateway: search, ingest, registry, galleries and hot swap (FastAPI).

Imports ``training``; never imports ``worker`` (jobs are enqueued by task name). The
folders are its layers, each importing only the ones below it:

- ``api/``       HTTP: the app (``api/app.py``), routes per resource, request/response
                 schemas, ``Annotated`` deps, error mapping, middleware. Every route calls
                 one use case and nothing else.
- ``usecases/``  what the routes do, one module per operation family: ``search``,
                 ``items``, ``galleries``, ``models``, ``jobs``, ``health``
- ``runtime/``   serving: the process's ``Gateway``, loaded versions (embedders), dynamic
                 batching of forwards and searches, the hot-swap snapshot, the registry
                 watcher, metrics
- ``state/``     the shared state layer, the only part a worker imports: settings, typed
                 errors, registry, gallery store and the one ingest pipeline, job records
                 and kinds, thumbnails
- ``stack/``     the whole service on one machine: ``launch`` (``make serve``),
                 ``bootstrap`` (first start), ``demo`` (``nobackfill demo``)
- ``bench/``     ``nobackfill bench serve``
- ``web/``       the single page

``python -m service`` runs the gateway alone; both CLI commands above are plugged into
``nobackfill`` through entry points (``pyproject.toml``).
"""
