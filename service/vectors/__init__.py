"""Where vectors are embedded and written: every path that puts items into a gallery.

- ``embed``     the one embed function (items -> per item, kind -> vector) and the encoder
                views it runs through (``Pixels``: a batch preprocessed off the forward)
- ``writer``    ``GalleryWriter``, what a batch of embedded items is handed to, and its
                ``DirectWriter`` (into the gallery's Qdrant sides now)
- ``spool``     its ``SpooledWriter`` (a worker's job spool; the gateway's applier then
                writes each batch with a ``DirectWriter``) and the spool's file format
- ``ingest``    the one ingest pipeline and payload schema: the items API, an ``ingest``
                job, the first-start bootstrap and ``bench serve``'s gallery
- ``backfill``  a migration's re-embedding of a shard from the items' origins
- ``sources``   the kept originals a re-embedding reads

Imports ``service.state`` and ``training`` only; the worker imports it (tests/test_layout.py).
"""
