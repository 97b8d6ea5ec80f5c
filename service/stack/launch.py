"""``make serve`` (``python -m service.stack.launch``): the whole service on one machine.

Bootstraps a demo on first start (``service.stack.bootstrap``), starts one embedded worker
(``python -m worker``, a child process on the same settings: filesystem broker unless
``NOBACKFILL_BROKER_URL`` is set) under a supervisor that restarts it whenever it exits
(``service.stack.supervisor``: exponential backoff, every exit logged with its code),
then runs the gateway in the foreground. Ctrl-C or SIGTERM stops all three.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx

from service.__main__ import main as run_gateway
from service.stack.bootstrap import bootstrap
from service.stack.supervisor import Supervisor
from service.state.config import Settings
from service.state.lifeline import parent_env, tie_to_parent

log = logging.getLogger("nobackfill.launch")
REPO = Path(__file__).resolve().parents[2]  # the checkout: children run from it


Env = Mapping[str, str | None]


def child_env(env: Env | None) -> dict[str, str]:
    """This process's environment with ``env`` applied (a None value removes the name)."""
    merged = {**os.environ, **(env or {})}
    return {k: v for k, v in merged.items() if v is not None}


def start_worker(env: Env | None = None, log_file: Path | None = None) -> subprocess.Popen:
    """``python -m worker`` as a child in its own session (``stop`` ends it and its pool;
    it dies with this process: ``service.state.lifeline``); ``env`` adds settings, ``log_file`` takes its output (appended: a restarted worker
    keeps its predecessor's lines; default: this process's)."""
    env = {**child_env(env), **parent_env()}
    env.setdefault("NOBACKFILL_WORKER_NAME", "embedded@localhost")
    log.info("starting the embedded worker (python -m worker)")
    out = open(log_file, "a") if log_file else None  # noqa: SIM115 (the child keeps it)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "worker"], env=env, cwd=REPO,
                                start_new_session=True, stdout=out,
                                stderr=subprocess.STDOUT if out else None)
    finally:
        if out:
            out.close()
    log.info("embedded worker started (pid %d)", proc.pid)
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def gateway_process(env: Env, log: Path,
                    ready_timeout_s: float = 600.0) -> Iterator[str]:
    """``python -m service`` as a child on ``env`` (NOBACKFILL_* settings; a free port is
    picked), its output in ``log``; yields its base URL once /readyz answers, stops it on
    exit."""
    with gateway_child(env, log, ready_timeout_s) as (url, _):
        yield url


@contextlib.contextmanager
def gateway_child(env: Env, log: Path, ready_timeout_s: float = 600.0,
                  ) -> Iterator[tuple[str, subprocess.Popen]]:
    """``gateway_process``, yielding the child too (its pid leads its own session; it
    dies with this process)."""
    port = free_port()
    env = {**child_env(env), **parent_env(), "NOBACKFILL_PORT": str(port),
           "NOBACKFILL_HOST": "127.0.0.1"}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "service"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, ready_timeout_s, log)
        yield url, proc
    finally:
        stop(proc, 30)


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the gateway exited with {proc.returncode}; see {log}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"the gateway was not ready after {timeout_s:.0f}s; see {log}")


def stop(process: subprocess.Popen, timeout_s: float = 20) -> None:
    """Stop a child started in its own session, and everything it started (its group)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main() -> None:
    tie_to_parent()  # started by a benchmark or a test: dies with it
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = Settings()
    if not settings.admin_api_keys:
        log.warning("no admin key is set, so admin routes (ingest, models, jobs) answer 401; "
                    "set one: NOBACKFILL_ADMIN_API_KEYS='{\"ops\": \"change-me\"}' make serve")
    # SIGTERM (docker stop, kill) must unwind through the finally below like Ctrl-C does:
    # uvicorn re-raises the signal it caught once it has shut down, and the default
    # SIGTERM action would end this process there and orphan the worker.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    bootstrap(settings)
    worker = supervised_worker().start()
    try:
        log.info("gateway on http://%s:%d/ (API docs at /docs)", settings.host, settings.port)
        run_gateway()
    finally:
        worker.stop()


def supervised_worker(env: Env | None = None, log_file: Path | None = None,
                      **backoff: float) -> Supervisor:
    """The embedded worker under a supervisor (not started yet); ``backoff`` tunes it."""
    return Supervisor("embedded worker", lambda: start_worker(env, log_file), stop, **backoff)


if __name__ == "__main__":
    main()
