"""Children die with the process that started them (``service.state.lifeline``): the real
``python -m worker`` under ``make serve``'s supervisor (restarted once, so that the child
killed is one a supervisor thread started) and the real ``python -m service`` gateway, their
parent killed with SIGKILL: nothing of theirs is left, the worker's pool included."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from service.state.config import Settings
from service.state.jobs.workers import live_workers
from service.state.lifeline import GONE_EXIT, PARENT_ENV
from tests.test_supervisor import wait_for

REPO = Path(__file__).resolve().parents[1]

PARENT = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from service.stack.launch import gateway_child, supervised_worker
    env, tmp = json.loads(sys.argv[1]), Path(sys.argv[2])
    supervisor = supervised_worker(env, tmp / "worker.log", backoff_s=0.2).start()
    with gateway_child(env, tmp / "gateway.log", 300) as (url, gateway):
        shown = None
        while True:
            if supervisor.pid != shown:
                shown = supervisor.pid
                print(json.dumps({"worker": shown, "gateway": gateway.pid}), flush=True)
            time.sleep(0.1)
""")


def group_of(pgid: int) -> list[int]:
    """The live (not zombie) processes whose process group is ``pgid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(entry.name))
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_worker_and_gateway_die_with_a_killed_parent(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {k: None for k in os.environ if k.startswith("NOBACKFILL_")}
    env |= {"NOBACKFILL_DATA_DIR": str(data), "NOBACKFILL_WORKER_HEARTBEAT_S": "0.5",
            "NOBACKFILL_WORKER_NAME": "embedded@lifeline", "OMP_NUM_THREADS": "1"}
    settings = Settings(data_dir=data, worker_stale_after_s=30)
    parent = subprocess.Popen([sys.executable, "-c", PARENT, json.dumps(env), str(tmp_path)],
                              cwd=REPO, stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    groups: set[int] = set()
    try:
        first = json.loads(parent.stdout.readline())
        groups |= {first["worker"], first["gateway"]}
        wait_for(lambda: [w for w in live_workers(settings) if w.pid == first["worker"]],
                 120, "the worker")
        os.killpg(first["worker"], signal.SIGKILL)  # the supervisor's thread restarts it
        second = json.loads(parent.stdout.readline())
        assert second["worker"] != first["worker"]
        groups.add(second["worker"])
        wait_for(lambda: [w for w in live_workers(settings) if w.pid == second["worker"]],
                 120, "the restarted worker")
        assert group_of(second["worker"]) and group_of(first["gateway"])
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        wait_for(lambda: not any(group_of(g) for g in groups), 20,
                 "the children of a killed parent to end")
    finally:
        for g in groups | {parent.pid}:
            for pid in group_of(g):
                os.kill(pid, signal.SIGKILL)
    assert not any(group_of(g) for g in groups)


CHILD = ("import os\n"
         "from service.state.lifeline import PARENT_ENV, tie_to_parent\n"
         "print(tie_to_parent(), PARENT_ENV in os.environ)\n")


def run_child(parent: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != PARENT_ENV}
    if parent is not None:
        env[PARENT_ENV] = parent
    return subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, capture_output=True,
                          text=True, env=env, check=False)


def test_a_child_whose_parent_is_gone_exits_and_its_own_children_are_not_tied() -> None:
    tied = run_child(str(os.getpid()))
    assert tied.returncode == 0 and tied.stdout.split() == ["True", "False"], tied
    gone = run_child("1")  # not its parent: gone before the tie
    assert gone.returncode == GONE_EXIT and gone.stdout == "", gone
    untied = run_child(None)
    assert untied.returncode == 0 and untied.stdout.split() == ["False", "False"], untied
