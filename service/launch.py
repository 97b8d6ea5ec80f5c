"""``make serve`` (``python -m service.launch``): the whole service on one machine.

Bootstraps a demo on first start (``service.bootstrap``), starts one embedded worker
(``python -m worker``, a child process on the same settings: filesystem broker unless
``NOBACKFILL_BROKER_URL`` is set), then runs the gateway in the foreground. Ctrl-C
stops both.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from service.__main__ import main as run_gateway
from service.bootstrap import bootstrap
from service.core.config import Settings

log = logging.getLogger("nobackfill.launch")
REPO = Path(__file__).resolve().parents[1]


def start_worker() -> subprocess.Popen:
    env = {**os.environ, "NOBACKFILL_WORKER_NAME": os.environ.get(
        "NOBACKFILL_WORKER_NAME", "embedded@localhost")}
    log.info("starting the embedded worker (python -m worker)")
    return subprocess.Popen([sys.executable, "-m", "worker"], env=env, cwd=REPO,
                            start_new_session=True)


def stop(process: subprocess.Popen, timeout_s: float = 20) -> None:
    """Stop a child started in its own session, and everything it started (its group)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = Settings()
    if not settings.admin_api_keys:
        log.warning("no admin key is set, so admin routes (ingest, models, jobs) answer 401; "
                    "set one: NOBACKFILL_ADMIN_API_KEYS='{\"ops\": \"change-me\"}' make serve")
    bootstrap(settings)
    worker = start_worker()
    try:
        log.info("gateway on http://%s:%d/ (API docs at /docs)", settings.host, settings.port)
        run_gateway()
    finally:
        stop(worker)


if __name__ == "__main__":
    main()
