"""Children that die with the process that started them.

``make serve`` and the benchmarks start the worker and the gateway as children in their own
sessions (so that ``stop`` can end a child's whole group). A parent that ends cleanly stops
them; a parent killed by SIGKILL or the OOM killer cannot, and a child in its own session
keeps running: a worker holding a GPU and a job, a gateway holding its port and its store.

The parent names itself in the child's environment (``PARENT_ENV``, ``parent_env``); the
child, first thing (``tie_to_parent``), asks the kernel for SIGKILL when its parent dies
(``PR_SET_PDEATHSIG``, Linux) and exits at once if that parent is gone already. What the
child started dies with it in turn: the worker's pool processes (Celery sets the same
signal on them) and the gateway's index builds (``state.gallery.edge``). Elsewhere than
Linux a thread polls the parent instead (once a second).

The kernel sends the signal when the *thread* that started the child ends, not only the
process: a parent starts these children from threads that outlive them (the main thread,
or a supervisor's thread that ends only after it stopped its child).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PARENT_ENV = "NOBACKFILL_PARENT_PID"
PR_SET_PDEATHSIG = 1
GONE_EXIT = 3  # the exit code of a child whose parent was gone before it was tied


def parent_env() -> dict[str, str]:
    """What a child's environment carries so that it dies with this process."""
    return {PARENT_ENV: str(os.getpid())}


def tie_to_parent() -> bool:
    """In a child started with ``parent_env``: die (SIGKILL) when that parent dies. The
    name is taken out of the environment, so that what this child starts is not tied to
    the wrong parent. Returns whether a parent was named."""
    named = os.environ.pop(PARENT_ENV, None)
    if not named:
        return False
    parent = int(named)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    else:
        threading.Thread(target=_watch, args=(parent,), name="lifeline", daemon=True).start()
    if os.getppid() != parent:  # died before the tie: nothing would signal us
        os._exit(GONE_EXIT)
    return True


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGKILL)
