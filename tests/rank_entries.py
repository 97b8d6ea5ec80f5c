"""Rank entry points of the launcher tests (tests/test_distributed.py): spawned ranks import
this module to find them, so it imports nothing heavier than torch."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from training.distributed import World


def fail_on_rank_one(world: World, payload: Any, report: Any) -> None:
    """Rank 1 raises; rank 0 waits in a collective that can never finish."""
    if world.rank == 1:
        raise ValueError("rank one cannot read its shard")
    torch.distributed.barrier()


def train_forever(world: World, pid_dir: Path, report: Any) -> None:
    """Steps that never end (a collective each), rank 0 reporting each; every rank writes
    its pid so the test can check that none outlives the launch."""
    (pid_dir / f"rank{world.rank}.pid").write_text(str(os.getpid()))
    step = 0
    while True:
        torch.distributed.all_reduce(torch.ones(1))
        step += 1
        if report is not None:
            report(step)
        time.sleep(0.01)


class Stopped(Exception):
    """A rank's run stopped on purpose (as if its worker were killed there)."""


def upgrade_stopped_at(world: World, payload: Any, report: Any) -> None:
    """``training.upgrades.run.upgrade(**kwargs)`` on this rank; rank 0 raises ``Stopped`` when
    it reports step ``step`` of the stage whose progress name contains ``stage`` (before
    that step's save), which fails the launch and stops the other rank."""
    from training.upgrades.run import upgrade

    kwargs, (stage, step) = payload

    def progress(p: Any) -> None:
        if stage in p.stage and p.step == step:
            raise Stopped(f"stopped at {p.stage} step {step}")

    upgrade(**kwargs, device=str(world.device), on_progress=progress if world.is_main else None)
