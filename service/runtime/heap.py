"""The gateway's heap and Python's cyclic garbage collector.

A full collection walks every container object the process holds: in the gateway that is
over half a million before a model is loaded (torch, open_clip's tokenizer, the web
stack), and a walk took about 300 ms on this project's 2-core machine, holding the
interpreter lock, so every search in flight waited for it. Writes allocate fast (each
point's payload and record), so during a migration such walks came every few seconds:
they were the ~400 ms stalls of every client at once in ``bench migrate``'s run B.

What is loaded for good (the modules, each version's model) is moved out of the
collector's sight once it is in place (``gc.freeze``): later collections walk only what
was made since. Frozen objects are still freed by reference counting; only a cycle
among them would stay, until ``release`` (the gateway's shutdown) hands them back.
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger(__name__)


def settle(collect: bool = False) -> None:
    """Hide every object alive now from later collections; ``collect`` first frees what is
    already garbage (a full walk: at startup, before anything is served)."""
    started = time.perf_counter()
    if collect:
        gc.collect()
    gc.freeze()
    log.debug("heap settled in %.0f ms: %d objects frozen", (time.perf_counter() - started)
              * 1e3, gc.get_freeze_count())


def release() -> None:
    """Hand every frozen object back to the collector (at shutdown: what is left in
    cycles is freed before the interpreter exits, as extension modules expect)."""
    gc.unfreeze()
