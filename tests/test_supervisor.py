"""``make serve``'s supervision of its embedded worker: a child that exits is restarted with
a capped exponential backoff, every exit is logged with its code, and stopping the
supervisor stops the child and restarts nothing. Real processes throughout: a tiny
crashing one, and the real ``python -m worker`` killed with SIGKILL."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from service.stack.launch import stop, supervised_worker
from service.stack.supervisor import Supervisor, describe_exit
from service.state.config import Settings
from service.state.jobs.workers import live_workers, workers


def wait_for(ok, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = ok()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_describe_exit() -> None:
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(-9) == "killed by SIGKILL (exit code -9)"


def test_a_crashing_child_is_restarted_with_a_capped_backoff(
        caplog: pytest.LogCaptureFixture) -> None:
    def start() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"],
                                start_new_session=True)
    caplog.set_level(logging.INFO, logger="nobackfill.supervisor")
    supervisor = Supervisor("crasher", start, stop, backoff_s=0.1, max_backoff_s=0.4,
                            poll_s=0.05).start()
    try:
        wait_for(lambda: supervisor.restarts >= 4, 60, "four restarts")
    finally:
        supervisor.stop()
    exits = [r.getMessage() for r in caplog.records if "exited" in r.getMessage()]
    assert all("exit code 3" in m for m in exits) and len(exits) >= 4
    delays = [float(re.search(r"restarting in ([\d.]+)s", m).group(1)) for m in exits[:4]]
    assert delays == [0.1, 0.2, 0.4, 0.4]  # doubled per quick exit, capped
    assert sum("restarted (pid" in r.getMessage() for r in caplog.records) >= 4
    restarts = supervisor.restarts
    time.sleep(0.6)
    assert supervisor.restarts == restarts  # stopped: nothing comes back


def test_the_embedded_worker_comes_back_after_sigkill(tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="nobackfill.supervisor")
    data = tmp_path / "data"
    env = {k: None for k in os.environ if k.startswith("NOBACKFILL_")}
    env |= {"NOBACKFILL_DATA_DIR": str(data), "NOBACKFILL_WORKER_HEARTBEAT_S": "0.5",
            "NOBACKFILL_WORKER_NAME": "embedded@test", "OMP_NUM_THREADS": "1"}
    settings = Settings(data_dir=data, worker_stale_after_s=30)
    log = tmp_path / "worker.log"
    supervisor = supervised_worker(env, log, backoff_s=0.2).start()
    try:
        first = wait_for(lambda: live_workers(settings), 120, f"the worker ({log})")[0]
        assert first.pid == supervisor.pid and first.name == "embedded@test"
        os.killpg(first.pid, signal.SIGKILL)
        second = wait_for(lambda: [b for b in live_workers(settings) if b.pid != first.pid],
                          120, f"a restarted worker ({log})")[0]
        assert second.pid == supervisor.pid != first.pid and supervisor.restarts == 1
        assert not alive(first.pid)
        messages = [r.getMessage() for r in caplog.records]
        assert any(f"(pid {first.pid}) exited" in m and "killed by SIGKILL" in m
                   for m in messages), messages
        assert any(f"restarted (pid {second.pid}" in m for m in messages), messages
    finally:
        supervisor.stop()
    assert not alive(second.pid)  # no orphan
    assert workers(settings) == []  # a clean stop withdraws its liveness record
    time.sleep(0.5)
    assert supervisor.restarts == 1
