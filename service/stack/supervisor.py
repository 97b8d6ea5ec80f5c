"""Keep one child process running: ``make serve``'s embedded worker.

Why: a worker that dies (OOM killer, a crash in a native library, a stray ``kill -9``)
otherwise stays dead, and jobs queue up behind nothing. The supervisor restarts it after
an exponential backoff (``backoff_s``, doubled per consecutive quick exit, capped at
``max_backoff_s``; a child that ran ``healthy_after_s`` resets it), so a child that
crashes on start does not spin. Every exit and every restart is logged with the exit
code. ``stop`` ends the supervision first, then the child and its process group, so
nothing is restarted behind the caller's back and nothing is orphaned; a supervisor killed
with its process takes its child along (``service.state.lifeline``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable

log = logging.getLogger("nobackfill.supervisor")

Start = Callable[[], subprocess.Popen]
Stop = Callable[[subprocess.Popen], None]


def describe_exit(code: int) -> str:
    """"exit code 3" or "killed by SIGKILL (exit code -9)"."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name} (exit code {code})"
        except ValueError:
            pass
    return f"exit code {code}"


class Supervisor:
    def __init__(self, name: str, start: Start, stop: Stop, *, backoff_s: float = 1.0,
                 max_backoff_s: float = 60.0, healthy_after_s: float = 60.0,
                 poll_s: float = 0.2) -> None:
        self.name, self._start, self._stop_child = name, start, stop
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.healthy_after_s, self.poll_s = healthy_after_s, poll_s
        self.restarts = 0  # over the supervisor's life
        self._quick_exits = 0  # consecutive exits before healthy_after_s: the backoff
        self._stopping = threading.Event()
        self._stopped = threading.Event()  # the child is stopped: the watch thread may end
        self._lock = threading.Lock()  # a restart and a stop never interleave
        self._proc: subprocess.Popen | None = None
        self._since = 0.0
        self._thread = threading.Thread(target=self._watch, name=f"supervise-{name}",
                                        daemon=True)

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None else None

    def start(self) -> Supervisor:
        with self._lock:
            self._proc, self._since = self._start(), time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        """No restart after this; the child (and its group) is stopped and reaped."""
        self._stopping.set()
        with self._lock:
            proc = self._proc
        if proc is not None:
            self._stop_child(proc)
            kill_group(proc)
        self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        log.info("%s supervision stopped", self.name)

    def next_delay(self) -> float:
        """The wait before the next restart: doubled per consecutive quick exit, capped."""
        return min(self.backoff_s * 2 ** max(0, self._quick_exits - 1), self.max_backoff_s)

    def _watch(self) -> None:
        while not self._stopping.wait(self.poll_s):
            proc = self._proc
            if proc is None or proc.poll() is None:
                continue
            self._exited(proc)
        # A child this thread restarted dies when the thread ends (its parent-death signal
        # follows the thread that started it: ``service.state.lifeline``): the thread
        # outlives the child's clean stop.
        self._stopped.wait()

    def _exited(self, proc: subprocess.Popen) -> None:
        kill_group(proc)  # what the dead child left running (a pool process mid-job)
        ran = time.monotonic() - self._since
        self._quick_exits = 1 if ran >= self.healthy_after_s else self._quick_exits + 1
        delay = self.next_delay()
        log.warning("%s (pid %d) exited after %.0fs: %s; restarting in %.1fs", self.name,
                    proc.pid, ran, describe_exit(proc.returncode), delay)
        if not self._stopping.wait(delay):
            self._restart()

    def _restart(self) -> None:
        with self._lock:
            if self._stopping.is_set():
                return
            self._since = time.monotonic()
            try:
                self._proc = self._start()
            except Exception:  # the dead child stays: the next poll backs off
                log.exception("%s could not be restarted; trying again", self.name)
                return
            self.restarts += 1
            pid = self._proc.pid
        log.warning("%s restarted (pid %d, restart %d)", self.name, pid, self.restarts)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL whatever is left of an exited child's process group (it was started in its
    own session, so its pid is the group id; nothing is left: nothing happens)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
