"""The whole service on one machine: ``launch`` (``make serve``: bootstrap, the embedded
worker, the gateway), ``bootstrap`` (first start: a tiny v1 and the gallery ``demo``) and
``demo`` (``nobackfill demo``: the story of DESIGN.md driven through the API)."""
