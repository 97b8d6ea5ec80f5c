"""nobackfill gateway: search, ingest, registry, galleries and hot swap (FastAPI).

Imports ``training``; never imports ``worker`` (jobs are enqueued by task name). The
folders are its layers, each importing only the ones below it:

- ``api/``       HTTP: the app (``api/app.py``), routes per resource, request/response
                 schemas, ``Annotated`` deps, error mapping, middleware. Every route calls
                 one use case and nothing else (a migration's routes: the ``migrate``
                 kind's control).
- ``usecases/``  what the routes do, one module per operation family: ``search``,
                 ``items``, ``galleries``, ``models``, ``jobs``, ``health``
- ``runtime/``   serving: the process's ``Gateway``, loaded versions (embedders), dynamic
                 batching of forwards and searches, the hot-swap snapshot, the registry
                 watcher, metrics
- ``jobkinds/``  one registration object per job kind (parameters, runner, gateway hooks)
                 and one module per kind (``migrate/``: a migration's whole control); the
                 gateway hands itself to the hooks, so the worker imports the kinds too
- ``state/``     the shared state layer (the worker imports it, ``jobkinds`` and
                 ``vectors``): settings, typed errors, registry, gallery store and the one
                 ingest pipeline, job records, thumbnails
- ``stack/``     the whole service on one machine: ``launch`` (``make serve``),
                 ``bootstrap`` (first start), ``demo`` (``nobackfill demo``)
- ``bench/``     ``nobackfill bench serve``
- ``web/``       the single page

``python -m service`` runs the gateway alone; both CLI commands above are plugged into
``nobackfill`` through entry points (``pyproject.toml``).
"""
