"""``python -m worker``: one Celery worker process for one GPU, on the training queue.

Run one per GPU (``CUDA_VISIBLE_DEVICES=1 NOBACKFILL_WORKER_NAME=gpu1@host python -m
worker``). Extra arguments go to ``celery worker`` (e.g. ``--loglevel DEBUG``).
"""

from __future__ import annotations

import sys

from service.state.lifeline import tie_to_parent
from worker.app import app, node_name, settings


def main(argv: list[str] | None = None) -> None:
    tie_to_parent()  # started by make serve or a benchmark: dies with it
    args = ["worker", "--queues", settings.training_queue, "--concurrency", "1",
            "--pool", "prefork", "--prefetch-multiplier", "1", "--max-tasks-per-child", "1",
            "--hostname", node_name(), "--loglevel", "INFO", "--without-gossip",
            "--without-mingle", *(sys.argv[1:] if argv is None else argv)]
    app.worker_main(args)


if __name__ == "__main__":
    main()
